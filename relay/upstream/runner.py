"""The upstream task: choose a source, resume from the relay's GTID state, reconnect with
backoff and jitter, and move to the next source after `failover_after` of failure.

Policies live in small pieces: `check_continues` (does a source hold what the relay
holds), `start_state` (where an empty log begins), `_failure` (what an ended session
means: retry, wait, or stop for good), and `Upstream.run` (the loop over sources). Each
session runs as a task this object owns: it is awaited after it is cancelled, so its
cleanup (dropping a half transaction) is done before anything else touches the log.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from relay.binlog.flavour import Flavour
from relay.binlog.gtid import GtidPosition, GtidSet, GtidState
from relay.config import OnDivergence, RulePoint, Source, StartMode
from relay.errors import (
    FatalUpstreamError,
    HookError,
    LogWriteError,
    RelayError,
    UpstreamError,
)
from relay.mysql.errors import BinlogReadFailure, binlog_read_failure
from relay.relaylog.log import RelayLog
from relay.relaylog.retention import free_bytes
from relay.rules.runtime import Rules
from relay.upstream.archive_source import ArchiveSession, inspect_archive
from relay.upstream.control import (
    PrimaryInfo,
    PrimarySettings,
    inspect_primary,
    read_settings,
    start_position,
)
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import EventSink
from relay.upstream.semisync import SemiSyncSink, SemiSyncStats
from relay.upstream.session import Session, SessionSettings

if TYPE_CHECKING:
    from relay.upstream.receive_rules import RulesSink

log = logging.getLogger("relay.upstream")

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
DISK_POLL = 0.5         # seconds between looks at the free space while paused
RESUME_MARGIN = 1 << 20  # resume once this much more is free than right after the pause
RETRY_ANYWAY = 30.0     # ... or after this long (space freed before the pause was measured)


@dataclass(frozen=True)
class UpstreamSettings:
    sources: tuple[Source, ...]
    start: StartMode
    server_id: int
    start_position: GtidPosition | None = None  # for StartMode.POSITION
    heartbeat_period: float = 5.0
    read_timeout: float = 15.0
    connect_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 10.0
    max_retries: int = 0          # consecutive failed attempts before giving up; 0 = never
    failover_after: float = 30.0
    prefer_first: bool = False     # go back to the first source once it has caught up
    prefer_check: float = 5.0      # how often to look at the first source meanwhile
    on_divergence: OnDivergence = OnDivergence.STOP
    semi_sync: bool = False        # acknowledge as the primary's semi-sync replica
    semi_sync_wait_for_replicas: int = 0  # ... once this many downstream replicas have it
    semi_sync_timeout: float = 10.0       # ... or, past this, once durable only


class Reason(Enum):
    """Why an upstream connection ended (a fixed set of metric labels)."""

    ENDED = "ended"
    FATAL = "fatal"
    UPSTREAM = "upstream"
    PROTOCOL = "protocol"
    IO = "io"
    RULES = "rules"


class SemiSyncState(Enum):
    OFF = "off"                         # not asked for ([upstream] semi_sync = false)
    ON = "on"                           # acknowledging
    NOT_ON_PRIMARY = "off (not enabled on the primary)"
    RULES = "off (receive rules in use)"


@dataclass
class UpstreamStatus:
    connected: bool = False
    active_source: str = ""
    primary_version: str = ""
    primary_server_id: int = 0
    # Why each upstream connection ended; a fixed set of labels, all exported from the start.
    reconnects: dict[Reason, int] = field(default_factory=lambda: dict.fromkeys(Reason, 0))
    last_error: str = ""
    disconnected_since: float = field(default_factory=time.time)
    stopped_by_rule: str = ""     # a receive rule failed: storing waits for a rules reload
    primary: PrimaryInfo | None = None   # as read at the last connect
    primary_settings: PrimarySettings | None = None  # read once each connect's dump runs
    primary_settings_at: float = 0.0    # when they were read
    active_since: float = 0.0     # when the relay began using the active source
    failovers: int = 0            # switches from one source to another
    last_failover: str = ""       # why the last switch happened
    waiting: str = ""             # a source that lacks the relay's transactions, waited for
    stopped: str = ""             # the upstream stopped for good (diverged history, ...)
    # The last refusal a reconnect cannot fix (access denied, a flavour or settings the
    # relay cannot follow): retried all the same (an operator may fix the grant), and
    # cleared when the source lets the relay log in again, or a stream starts.
    refused: str = ""
    semi_sync: SemiSyncState = SemiSyncState.OFF
    semi_sync_stats: SemiSyncStats = field(default_factory=SemiSyncStats)
    streams: int = 0              # dump streams started (one per successful connect)
    disk_full: str = ""           # ingest paused: the relay log's file system is full
    disk_full_pauses: int = 0
    # what the upstream account can SELECT beyond metadata (read at each connect): more
    # than the relay needs
    account_reads: list[str] = field(default_factory=list)


class DivergenceKind(Enum):
    BEHIND = "behind"          # the source lacks transactions the relay has (may catch up)
    CONFLICT = "conflict"      # its history conflicts with the relay's (never resolves)


class Divergence(FatalUpstreamError):
    """A source's history does not continue the relay's."""

    code = "diverged"

    def __init__(self, message: str, kind: DivergenceKind) -> None:
        super().__init__(message)
        self.kind = kind


def check_continues(source: Source, ours: GtidPosition, theirs: GtidPosition) -> None:
    """Raise Divergence when `theirs` (a source's gtid_binlog_pos, or MySQL's
    gtid_executed) lacks transactions the relay already holds (`ours`), naming them. A
    source of the other flavour cannot continue the relay's log at all."""
    flavour = Flavour.of_position(ours)
    if Flavour.of_position(theirs) is not flavour:
        raise Divergence(f"{source}: " + flavour.mismatch(Flavour.of_position(theirs),
                                                          "this source"),
                         DivergenceKind.CONFLICT)
    if isinstance(ours, GtidSet) and isinstance(theirs, GtidSet):
        lacking = missing_from(theirs, ours)
        if len(lacking):
            raise Divergence(f"{source} lacks transactions the relay already holds: "
                             f"{lacking} (the relay has {ours}, the source "
                             f"{theirs or 'nothing'})", DivergenceKind.BEHIND)
        return
    if not isinstance(ours, GtidState) or not isinstance(theirs, GtidState):
        raise TypeError(f"GTID positions of unknown kinds: {ours!r}, {theirs!r}")
    missing = []
    for mine in ours:
        have = theirs.get(mine.domain)
        if have is None or have.seq < mine.seq:
            first = 1 if have is None else have.seq + 1
            span = f"{first}" if first == mine.seq else f"{first}..{mine.seq}"
            missing.append(f"domain {mine.domain} seq {span} (the relay has up to {mine}, "
                           f"the source {'nothing in that domain' if have is None else have})")
    if missing:
        raise Divergence(f"{source} lacks transactions the relay already holds: "
                         + "; ".join(missing), DivergenceKind.BEHIND)


def missing_from(theirs: GtidSet, ours: GtidSet) -> GtidSet:
    """The transactions of `ours` that `theirs` lacks (MySQL GTID sets)."""
    have = dict(theirs.intervals())
    out = GtidSet()
    for (sid, tag), intervals in ours.intervals():
        other = have.get((sid, tag), [])   # sorted, disjoint
        for start, end in intervals:
            at = start
            for s, e in other:
                if e < at or s > end:
                    continue
                if s > at:
                    out.add_interval(sid, at, s - 1, tag)
                at = e + 1
                if at > end:
                    break
            if at <= end:
                out.add_interval(sid, at, end, tag)
    return out


def diverged(source: Source, exc: UpstreamError) -> Divergence | None:
    """The primary ended the dump with 1236 because the relay's history is not in its
    binlog (as opposed to a passing error): a Divergence, decided by the error number
    and the reason the primary gave."""
    if exc.server_error is None:
        return None
    reason = binlog_read_failure(exc.server_error)
    if reason in (BinlogReadFailure.DIVERGED, BinlogReadFailure.NOT_IN_BINLOG):
        return Divergence(f"{source} has a history that conflicts with the relay's: "
                          f"{exc.server_error}", DivergenceKind.CONFLICT)
    return None


class Upstream:
    def __init__(self, settings: UpstreamSettings, relay_log: RelayLog,
                 rules: Rules | None = None) -> None:
        self.settings = settings
        self.log = relay_log
        self.ingest = Ingest(relay_log)
        self.rules = rules if rules is not None else Rules()
        self.status = UpstreamStatus()
        # Called when the disk fills up (the app wakes retention with it).
        self.on_disk_full: Callable[[], None] = lambda: None
        self._rules_executor: ThreadPoolExecutor | None = None
        self._rules_sink: RulesSink | None = None
        self._dump_started = asyncio.Event()  # set when a connect's dump request is out

    def _sink(self) -> EventSink:
        """The ingest itself, or the receive rules in front of it."""
        if not self.rules.has(RulePoint.RECEIVE):
            return self.ingest
        if self._rules_executor is None:
            # One thread: batches must come back in order.
            self._rules_executor = ThreadPoolExecutor(1, thread_name_prefix="relay-receive")
        # imported here: a relay without receive rules never loads the rule engine
        from relay.upstream.receive_rules import RulesSink

        self._rules_sink = RulesSink(self.ingest, self.rules, self._rules_executor)
        return self._rules_sink

    async def _run_session(self, session: Session | ArchiveSession, state: GtidPosition,
                           watch_first: bool = False) -> bool:
        """Run a session; end it (to reconnect with the right sink) when a rules reload
        adds the first receive rule or removes the last. With `watch_first`, also end it
        once the first (preferred) source is back and has caught up: returns True then.
        A failed relay log ends it with the log's error."""
        with_rules = self.rules.has(RulePoint.RECEIVE)
        task = asyncio.create_task(session.run(state), name="upstream-session")
        next_check = time.monotonic() + self.settings.prefer_check
        back = False
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                if task.done():
                    break
                if self.log.failure is not None:
                    raise self.log.failure
                if self.rules.has(RulePoint.RECEIVE) != with_rules:
                    log.info("receive rules %s: reconnecting to apply them",
                             "added" if not with_rules else "removed")
                    break
                if watch_first and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.settings.prefer_check
                    if await self._first_caught_up():
                        back = True
                        break
        finally:
            if not task.done():
                task.cancel()
            # Owned: the session's cleanup (a half transaction dropped) is done before
            # anything else uses the log, also when this is cancelled (shutdown).
            await asyncio.wait({task})
            if self._rules_sink is not None:  # the session's sink gives its chain back
                self._rules_sink.close()
                self._rules_sink = None
        if not task.cancelled():
            task.result()  # the session's error, if it ended with one
        return back

    async def _first_caught_up(self) -> bool:
        """The preferred source answers and holds every transaction the relay holds."""
        first = self.settings.sources[0]
        try:
            info = await inspect_primary(first, timeout=self.settings.connect_timeout)
            check_continues(first, self.log.state, info.gtid_binlog_pos)
        except (RelayError, OSError):
            return False
        return True

    def _semi_sync_sink(self, inner: EventSink) -> EventSink:
        """The primary has semi-sync on: acknowledge transactions once durable."""
        if not isinstance(inner, Ingest):  # receive rules run on a thread: no exact ends
            log.warning("semi-sync acknowledgement is off while receive rules are in use")
            self.status.semi_sync = SemiSyncState.RULES
            return inner
        self.status.semi_sync = SemiSyncState.ON
        log.info("acknowledging as a semi-sync replica of %s", self.status.active_source)
        return SemiSyncSink(inner, self.log, self.status.semi_sync_stats,
                            wait_for_replicas=self.settings.semi_sync_wait_for_replicas,
                            timeout=self.settings.semi_sync_timeout)

    def _switch(self, index: int, why: str) -> None:
        source = self.settings.sources[index]
        self.status.failovers += 1
        self.status.last_failover = f"to {source}: {why}"
        log.warning("failing over to %s: %s", source, why)

    async def _wait_for_reload(self, error: HookError) -> None:
        """A receive rule stopped the stream: keep serving what is stored, store nothing
        more until the rules change (SIGHUP / relay rules reload)."""
        version = self.rules.version
        self.status.stopped_by_rule = str(error)
        log.error("receive rules stopped the upstream stream: %s; fix the rule and reload "
                  "the rules (SIGHUP or `relay rules reload`) to resume", error)
        while self.rules.version == version:
            await asyncio.sleep(1.0)
        self.status.stopped_by_rule = ""
        log.info("rules reloaded: resuming the upstream stream")

    def start_state(self, info: PrimaryInfo) -> GtidPosition:
        if self.log.segments:
            if self.log.flavour is not info.flavour:
                raise FatalUpstreamError(self.log.flavour.mismatch(
                    info.flavour, f"the primary {info.version}"))
            return self.log.state.copy()
        return start_position(info, self.settings.start, self.settings.start_position)

    def active_source(self) -> Source | None:
        """The primary followed now (before the first connect, the first configured)."""
        sources = self.settings.sources
        return next((x for x in sources if x.address == self.status.active_source),
                    sources[0] if sources else None)

    async def _connect(self, index: int, failing_since: float | None) -> bool:
        """One session with source `index`, from the relay's state; True when it ended
        because the preferred source is back (prefer_first)."""
        s = self.settings
        source = s.sources[index]
        if source.archive:
            return await self._follow_archive(index, source)
        limit = None
        if failing_since is not None and len(s.sources) > 1:
            # a source that is already failing gets no attempt past its failover deadline:
            # a frozen primary must not hold the relay for 3 x connect_timeout on top of
            # read_timeout
            limit = max(0.05, failing_since + s.failover_after - time.monotonic())
        info = await inspect_primary(source, timeout=s.connect_timeout, limit=limit)
        self.status.refused = ""   # it let the relay log in: whatever refused it before is over
        if info.server_id == s.server_id:
            raise FatalUpstreamError(
                f"{source}: the primary's server_id is {info.server_id}, the same as "
                "[relay] server_id; give the relay a unique server_id")
        if self.log.segments:
            check_continues(source, self.log.state, info.gtid_binlog_pos)
        if self.status.waiting:
            log.info("%s has caught up with the relay: resuming", source)
            self.status.waiting = ""
        self.status.primary_version = info.version
        self.status.primary_server_id = info.server_id
        self.status.primary = info
        if info.account_reads and self.status.account_reads != info.account_reads:
            log.warning("the upstream account %s can SELECT %s: replication needs REPLICATION "
                        "SLAVE and REPLICATION CLIENT only, metadata look-ups REFERENCES "
                        "(docs/security.md); revoke the SELECT", source,
                        ", ".join(info.account_reads))
        self.status.account_reads = info.account_reads
        state = self.start_state(info)
        if not self.log.segments:
            self.log.start_from(state)  # the first segment's GTID_LIST says so
        sink = self._sink()
        if s.semi_sync:  # until the session finds it on at the primary
            self.status.semi_sync = SemiSyncState.NOT_ON_PRIMARY
        session = Session(source, SessionSettings(
            s.server_id, s.heartbeat_period, s.connect_timeout, s.read_timeout),
            sink, semi_sync=self._semi_sync_sink if s.semi_sync else None,
            on_streaming=self._streaming, tally=self.ingest.stats)
        self.status.connected = True
        self._dump_started.clear()
        settings = asyncio.create_task(self._read_settings(source), name="upstream-settings")
        try:
            return await self._run_session(session, state,
                                           watch_first=s.prefer_first and index != 0)
        finally:
            settings.cancel()
            await asyncio.wait({settings})  # owned: it ends with the connect

    async def _follow_archive(self, index: int, source: Source) -> bool:
        """An archive of binlog files as the source (relay/upstream/archive_source.py):
        from the log's position, or from the archive's first file for an empty log."""
        s = self.settings
        info = await asyncio.to_thread(inspect_archive, source.archive)
        if self.log.segments and self.log.flavour is not info.flavour:
            raise FatalUpstreamError(self.log.flavour.mismatch(
                info.flavour, f"the archive {source.address} ({info.version})"))
        self.status.primary_version = info.version
        self.status.primary_server_id = info.server_id
        if not self.log.segments:
            self.log.start_from(info.first_position)  # its oldest file's header says so
        session = ArchiveSession(source.archive, self._sink(), poll=s.heartbeat_period,
                                 on_streaming=self._streaming)
        self.status.connected = True
        return await self._run_session(session, self.log.state.copy(),
                                       watch_first=s.prefer_first and index != 0)

    async def _read_settings(self, source: Source) -> None:
        """The primary's variables and status, for downstream clients: read on a second
        connection once the dump request is out, so they never delay the stream."""
        await self._dump_started.wait()
        try:
            settings = await read_settings(source, timeout=self.settings.connect_timeout)
        except (RelayError, OSError) as exc:
            log.warning("%s: cannot read its variables and status (downstream clients see "
                        "the last ones read): %s", source, exc)
            return
        self.status.primary_settings = settings
        self.status.primary_settings_at = time.time()

    async def run(self) -> None:
        s = self.settings
        index = 0
        failures = 0
        failing_since: float | None = None
        while True:
            source = s.sources[index]
            if self.status.active_source != source.address:
                self.status.active_source = source.address
                self.status.active_since = time.time()
            received_before = self.ingest.stats.events
            reason = Reason.ENDED
            back = False
            try:
                back = await self._connect(index, failing_since)
                if not back:
                    log.info("%s ended the stream", source)
            except HookError as exc:
                self._disconnected(exc)
                self.status.reconnects[Reason.RULES] += 1
                await self._wait_for_reload(exc)
                failures, failing_since = 0, None
                continue
            except LogWriteError as exc:
                self._disconnected(exc)
                if exc.errno not in DISK_FULL:
                    await self._stop_for_good(exc)
                await self._wait_for_space(exc)
                failures, failing_since = 0, None
                continue
            except Divergence as exc:
                self._disconnected(exc)
                if exc.kind is DivergenceKind.BEHIND and s.on_divergence is OnDivergence.WAIT:
                    if self.status.waiting != str(exc):
                        log.warning("%s; waiting for it to catch up (on_divergence = "
                                    "\"wait\")", exc)
                    self.status.waiting = str(exc)
                    await asyncio.sleep(s.retry_max)
                    continue
                await self._stop_for_good(exc)
            except UpstreamError as exc:
                conflict = diverged(source, exc)
                if conflict is not None:
                    self._disconnected(conflict)
                    await self._stop_for_good(conflict)
                reason = Reason.UPSTREAM if exc.retriable else Reason.FATAL
                self._disconnected(exc)
                if exc.retriable:
                    log.warning("%s", exc)
                else:
                    self.status.refused = str(exc)
                    log.error("%s", exc)
            except (RelayError, OSError) as exc:
                reason = Reason.IO if isinstance(exc, OSError) else Reason.PROTOCOL
                self._disconnected(exc)
                log.warning("%s", exc)
            finally:
                # The grace of readiness counts from the last attempt that received events
                # (one that failed before its first does not start it again).
                if self.status.connected and self.ingest.stats.events > received_before:
                    self.status.disconnected_since = time.time()
                self.status.connected = False
            if back:
                index, failures, failing_since = 0, 0, None
                self._switch(0, "the preferred source is back and has caught up "
                                "(prefer_first)")
                continue
            self.status.reconnects[reason] += 1
            if self.ingest.stats.events > received_before:
                failures, failing_since = 0, None
            failures += 1
            now = time.monotonic()
            failing_since = failing_since or now
            if s.max_retries and failures > s.max_retries:
                raise FatalUpstreamError(
                    f"giving up after {s.max_retries} failed attempts "
                    f"([upstream] max_retries): {self.status.last_error}")
            if len(s.sources) > 1 and now - failing_since >= s.failover_after:
                index = (index + 1) % len(s.sources)
                failing_since = now
                self._switch(index, f"{source} failed for {s.failover_after:g}s "
                                    f"({self.status.last_error})")
                continue  # the next source has had no failure to back off from
            delay = min(s.retry_max, s.retry_initial * 2 ** min(failures - 1, 16))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    def _streaming(self) -> None:
        self.status.streams += 1
        self.status.refused = ""
        self._dump_started.set()

    def _disconnected(self, exc: BaseException) -> None:
        self.status.last_error = str(exc)
        self.status.connected = False

    async def _wait_for_space(self, exc: LogWriteError) -> None:
        """A full disk: the session ended at the failed write; drop what was not made
        durable (the log re-opens at its last durable transaction end, so nothing torn is
        ever visible), then wait until space returns (retention, PURGE BINARY LOGS or an
        operator's clean-up) and resume from the log's GTID state: no gap, no duplicate.
        Replicas and the tap keep being served meanwhile."""
        self.status.disk_full = str(exc)
        self.status.disk_full_pauses += 1
        log.error("%s: the relay log's file system is full. Ingest paused at the last "
                  "durable transaction; it resumes by itself when space returns", exc)
        self.on_disk_full()
        while True:
            try:
                await self.log.reopen()
                break
            except (OSError, RelayError) as again:  # its own small writes did not fit either
                log.warning("relay log: re-opening after the full disk failed (%s); "
                            "trying again", again)
                await asyncio.sleep(DISK_POLL)
        baseline = free_bytes(self.log.directory)
        since = time.monotonic()
        while True:
            await asyncio.sleep(DISK_POLL)
            free = free_bytes(self.log.directory)
            if free >= baseline + RESUME_MARGIN or time.monotonic() - since >= RETRY_ANYWAY:
                break
        log.info("relay log: %d bytes free on its file system: resuming ingest", free)
        self.status.disk_full = ""

    async def _stop_for_good(self, exc: RelayError) -> None:
        """Stop taking events: never skip or invent transactions, never write past a
        failed sync. The relay keeps serving what it holds; the operator decides (fix the
        source or the disk, then restart the relay)."""
        self.status.stopped = str(exc)
        log.error("upstream stopped: %s. The relay keeps serving the transactions it holds "
                  "and takes no more until it is restarted", exc)
        await asyncio.Event().wait()

