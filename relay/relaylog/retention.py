"""Retention: which sealed segments go, oldest first, and removing them safely.

The policy (`[relaylog] retention_*`): a segment sealed longer ago than `max_age` goes, and
the oldest go while the log is over `max_size`; at least `min_segments` stay, the open
segment always stays, and so does every segment a reader still needs (the reader
registry: a live cursor or a tap subscriber's hold in it or before it). Past the hard cap
`hard_cap` the oldest go anyway: the readers that needed them lose them, and are told
(their next read fails with SegmentPurged), logged and counted. `PURGE BINARY LOGS` asks
for the same removal by name or time, with readers protected and no hard cap.

Planning is a pure function of the segment list (sizes and seal times kept in memory),
the registry's snapshot and the clock: it runs on the loop in microseconds. Removing
(`RelayLog.remove_oldest`) takes the names out of the list on the loop, rewrites the index
on the log's worker and unlinks the files in a reader thread, so a check never blocks a
dump.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from relay.relaylog import segfile
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import PositionError, segment_header
from relay.relaylog.readers import ReaderInfo, ReaderKind

log = logging.getLogger("relay.relaylog")


def free_bytes(directory: str) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class RetentionPolicy:
    max_age: float | None = None      # seconds since a segment was sealed
    max_size: int | None = None       # bytes of all segments
    min_segments: int = 2
    hard_cap: int | None = None       # bytes: past it, readers lose their segments
    hold_max: int | None = None       # a hold further behind the end protects nothing
    compress_after: int | None = None  # compress sealed segments older than the newest N
    interval: float = 10.0            # seconds between checks

    @property
    def active(self) -> bool:
        return self.max_age is not None or self.max_size is not None \
            or self.hard_cap is not None or self.compress_after is not None


@dataclass(frozen=True)
class SegmentFacts:
    name: str
    number: int
    size: int
    sealed_at: float | None           # None: the open segment


@dataclass(frozen=True)
class Holdback:
    """A reader keeps segments the policy would remove: how many bytes, from where."""

    reader: str
    kind: str
    segment: int
    bytes: int


@dataclass(frozen=True)
class Loss:
    """The hard cap removed a segment this reader still needed."""

    reader: str
    kind: str
    segment: int
    offset: int
    at: float


@dataclass
class PurgePlan:
    names: list[str] = field(default_factory=list)
    bytes: int = 0
    reason: str = ""
    forced: bool = False              # the hard cap overrides readers
    held_back: list[Holdback] = field(default_factory=list)
    blocked_by: ReaderInfo | None = None  # an explicit purge stopped before this reader


class UnknownSegment(ValueError):
    """PURGE BINARY LOGS TO a name the log does not hold."""


def facts_of(relay_log: RelayLog) -> list[SegmentFacts]:
    """The segments as retention sees them (on the loop: the open segment's size is the
    writer's)."""
    segs = relay_log.segments
    out = []
    for name in segs.names:
        size = segs.disk_size(name)  # what retention_size counts: bytes on disk
        out.append(SegmentFacts(name, segs.number_of(name),
                                size if size is not None else relay_log.open_segment_bytes(),
                                segs.sealed_at(name)))
    return out


def plan(segments: Sequence[SegmentFacts], readers: Sequence[ReaderInfo],
         policy: RetentionPolicy, now: float) -> PurgePlan:
    """What the policy removes now (oldest first)."""
    out = PurgePlan()
    readers = _still_there(segments, readers)
    may_go = max(0, len(segments) - max(policy.min_segments, 1))
    may_go = min(may_go, sum(1 for s in segments if s.sealed_at is not None))
    total = sum(s.size for s in segments)
    want = 0
    remaining = total
    reasons = []
    for s in segments[:may_go]:
        assert s.sealed_at is not None
        old = policy.max_age is not None and now - s.sealed_at > policy.max_age
        big = policy.max_size is not None and remaining > policy.max_size
        if not (old or big):
            break
        if old and "age" not in reasons:
            reasons.append("age")
        if big and not old and "size" not in reasons:
            reasons.append("size")
        want += 1
        remaining -= s.size
    if policy.hold_max is not None:
        readers = [r for r in readers if r.kind is not ReaderKind.HOLD
                   or _behind(segments, r.position) <= policy.hold_max]
    need = min((r.position[0] for r in readers), default=None)
    allowed = want if need is None else sum(1 for s in segments[:want] if s.number < need)
    go = allowed
    left = total - sum(s.size for s in segments[:go])
    if policy.hard_cap is not None and left > policy.hard_cap:
        while go < may_go and left > policy.hard_cap:
            left -= segments[go].size
            go += 1
        if go > allowed and need is not None and segments[go - 1].number >= need:
            out.forced = True
            reasons.append("hard cap")
    # What readers keep that the policy would remove: after the hard cap, which takes
    # its segments now (a reader at one of them loses it and keeps nothing). One per
    # name and kind: readers of one name (two SHOW BINLOG EVENTS, a replica and its
    # session after a reconnect) are the one furthest behind (a metric series each, and
    # a scrape with a series twice is refused whole).
    kept = segments[go:want]
    gone = segments[go - 1].number if go else None
    furthest: dict[tuple[str, ReaderKind], int] = {}
    for r in readers:
        if gone is not None and r.position[0] <= gone:
            continue  # its segment goes now (a session of its name further on may hold)
        key = (r.name, r.kind)
        furthest[key] = min(furthest.get(key, r.position[0]), r.position[0])
    for (name, kind), first in furthest.items():
        held = sum(s.size for s in kept if s.number >= first)
        if held:
            out.held_back.append(Holdback(name, kind.value, first, held))
    out.names = [s.name for s in segments[:go]]
    out.bytes = sum(s.size for s in segments[:go])
    out.reason = ", ".join(reasons)
    return out


def _still_there(segments: Sequence[SegmentFacts],
                 readers: Sequence[ReaderInfo]) -> list[ReaderInfo]:
    """Readers at a segment the log still holds: one before it (a reader the hard cap
    already took a segment from, a hold left behind) keeps nothing."""
    first = segments[0].number if segments else 0
    return [r for r in readers if r.position[0] >= first]


def _behind(segments: Sequence[SegmentFacts], position: tuple[int, int]) -> int:
    """Bytes of the log past `position`."""
    number, offset = position
    return sum(s.size - (offset if s.number == number else 0)
               for s in segments if s.number >= number)


def plan_explicit(segments: Sequence[SegmentFacts], readers: Sequence[ReaderInfo], *,
                  to: str | None = None, before: float | None = None) -> PurgePlan:
    """PURGE BINARY LOGS TO `to` (every segment before it) or BEFORE `before` (every
    segment sealed before that time): never the open segment, never one a reader needs."""
    out = PurgePlan(reason="PURGE BINARY LOGS")
    readers = _still_there(segments, readers)
    names = [s.name for s in segments]
    if to is not None:
        if to not in names:
            raise UnknownSegment(to)
        wanted = segments[: names.index(to)]
    else:
        assert before is not None
        wanted = []
        for s in segments:
            if s.sealed_at is None or s.sealed_at >= before:
                break
            wanted.append(s)
    wanted = [s for s in wanted[: len(segments) - 1] if s.sealed_at is not None]  # never
    # the newest: a server never purges its active log
    first_reader = min(readers, key=lambda r: r.position, default=None)
    go = []
    for s in wanted:
        if first_reader is not None and s.number >= first_reader.position[0]:
            out.blocked_by = first_reader
            break
        go.append(s)
    out.names = [s.name for s in go]
    out.bytes = sum(s.size for s in go)
    return out


@dataclass
class RetentionStats:
    checks: int = 0
    purged_segments: int = 0
    purged_bytes: int = 0
    last_purge: float = 0.0
    last_reason: str = ""
    held_back: list[Holdback] = field(default_factory=list)
    losses: list[Loss] = field(default_factory=list)   # the last hundred, for status
    losses_by_kind: dict[str, int] = field(   # every loss, by kind of reader (a counter)
        default_factory=lambda: dict.fromkeys((k.value for k in ReaderKind), 0))
    oldest_gtid: str = ""             # the GTID state at the start of the oldest segment
    compressed_segments: int = 0
    compressed_in: int = 0            # bytes of the segments compressed ...
    compressed_out: int = 0           # ... and what they take now


class Retention:
    """Runs the policy every `interval` (`run`, a task its owner awaits) and serves PURGE
    BINARY LOGS; one at a time (a lock), on the loop."""

    def __init__(self, relay_log: RelayLog, policy: RetentionPolicy) -> None:
        self.log = relay_log
        self.policy = policy
        self.stats = RetentionStats()
        self._kick = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception as exc:  # a file it cannot remove or read: next time again
                log.error("retention: %s (tried again in %gs)", exc, self.policy.interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.policy.interval):
                    await self._kick.wait()
            self._kick.clear()

    def wake(self) -> None:
        """Check now (the disk filled up, say)."""
        self._kick.set()

    async def check(self) -> PurgePlan:
        """Apply the policy once."""
        async with self.log.maintenance:
            self.stats.checks += 1
            if not self.policy.active:
                await self._note_oldest()
                return PurgePlan()
            found = plan(facts_of(self.log), self.log.readers.snapshot(), self.policy,
                         time.time())
            self.stats.held_back = found.held_back
            if found.names:
                await self._remove(found)
            elif not self.stats.oldest_gtid:
                await self._note_oldest()
            await self._compress()
            return found

    async def _compress(self) -> None:
        """Compress sealed segments older than the newest `compress_after`, one at a time
        in a reader thread (a dump reading one meanwhile keeps its plain file open)."""
        keep = self.policy.compress_after
        if keep is None:
            return
        segs = self.log.segments
        names = segs.names
        for name in names[: max(0, len(names) - keep)]:
            size = segs.sealed_size(name)
            number = segs.number_of(name)
            # Never the newest the index names nor the visible one: recovery and a
            # re-open after a full disk continue the last segment as a plain file.
            if size is None or segs.is_compressed(name) or number >= segs.indexed \
                    or number >= self.log.visible[0]:
                continue
            if free_bytes(self.log.directory) < size:  # a full disk is no time to add files
                log.warning("retention: not compressing %s: less free space than its %d "
                            "bytes", name, size)
                return
            stored = await self.log.read(functools.partial(
                segfile.compress, self.log.path_of(name), sync=self.log.policy.syncs))
            segs.compressed(name, stored)
            self.stats.compressed_segments += 1
            self.stats.compressed_in += size
            self.stats.compressed_out += stored
            log.info("compressed %s: %d -> %d bytes", name, size, stored)
            return  # one a check: purges and PURGE wait for the lock no longer than that

    async def purge(self, *, to: str | None = None, before: float | None = None) -> PurgePlan:
        """PURGE BINARY LOGS TO / BEFORE. Raises UnknownSegment for a name not held."""
        async with self.log.maintenance:
            found = plan_explicit(facts_of(self.log), self.log.readers.snapshot(), to=to,
                                  before=before)
            if found.names:
                await self._remove(found)
            return found

    async def _remove(self, found: PurgePlan) -> None:
        names = found.names
        first_kept = self.log.segments.number_of(self.log.segments.names[len(names)])
        await self.log.remove_oldest(names)
        # Readers before what is left lost it: the hard cap's victims, and holds further
        # behind than retain_max (they kept nothing). Live ones are told, holds dropped.
        why = (f"retention_max_size {self.policy.hard_cap} bytes crossed"
               if found.forced else found.reason)
        reason = f"{why}: {', '.join(names)} removed"
        lost = await self.log.read(lambda: self.log.readers.lose_below(first_kept, reason))
        now = time.time()
        for r in lost:
            log.warning("retention (%s) removed segment(s) %s that reader %r (%s, at segment "
                        "%d offset %d) still needed; it gets a purged-binlog error", why,
                        ", ".join(names), r.name, r.kind.value, r.position[0], r.position[1])
            self.stats.losses.append(Loss(r.name, r.kind.value, r.position[0],
                                          r.position[1], now))
            self.stats.losses_by_kind[r.kind.value] += 1
        del self.stats.losses[:-100]  # the last hundred are plenty for status
        self.stats.purged_segments += len(names)
        self.stats.purged_bytes += found.bytes
        self.stats.last_purge = time.time()
        self.stats.last_reason = found.reason
        log.info("retention: purged %s (%d bytes; %s)", ", ".join(names), found.bytes,
                 found.reason)
        await self._note_oldest()

    async def _note_oldest(self) -> None:
        names = self.log.segments.names
        if not names:
            return
        try:
            header = await self.log.read(lambda: segment_header(self.log, names[0]))
        except (PositionError, OSError):
            return
        self.stats.oldest_gtid = str(header.state)
