"""TapServer: the tap protocol (relay/tap/protocol.py) over TCP, one task per connection.

Reading the log, indexing it and running tap rules are blocking work: they run in the
tap's worker threads, and frames go out as they are produced (a range is never held
whole). A bad request gets an error frame and the connection goes on; a wrong password
or bytes that are not frames close that connection only.

Logins: with [[tap.users]] a client proves its password (an HMAC of the connection's
nonce). Failed logins are counted per address as on the SQL port (relay/logins.py): from
the second in a row each answer waits longer, and after [tap] max_connect_errors the
address is refused ("blocked", before any password is looked at) for host_block_time; a
good login clears the count. Log lines about refused logins are throttled. A tap without
users lets everyone in as one anonymous user (tap rules may still be chosen by the name a
client gives).

Users own what they make. Each user is a namespace (a tap without users is one, ANONYMOUS)
holding its subscribers, their acknowledgements, their re-snapshot requests and its
snapshots: a user names only its own (another user's subscriber of the same name is
another subscriber; another's snapshot id is answered as one that does not exist), and
its `status` lists only its own. The operator's views (`subscribers()`,
`snapshot_progress()`, for /status and /metrics) show every user's, with the owner.
Snapshots are bounded per user ([tap] max_snapshots_per_user and
max_snapshot_bytes_per_user; relay/tap/snapshots.py), and so are its subscriber names
and re-snapshot requests ([tap] max_subscribers_per_user each): an ack, a snapshot_save
or a resnapshot under a name that would be one more is refused ("quota"; an
acknowledgement not renewed within subscriber_ttl no longer counts, and unsubscribe frees
a name). Names, tokens and re-snapshot patterns have at most MAX_NAME characters.

Rules: every command answers as the user's tap rules let it see the log. fetch and
subscribe stream through them (relay/tap/rules.py ReaderRules); plan and checksum count
and hash what those rules let through (a user without rules gets the log as stored, as
before); schema answers for a table the rules hide exactly as for a table that does not
exist, after the same look-ups (the primary is asked, the answer set aside: the time
taken does not tell them apart either); snapshot_save and snapshot_load refuse such a
table, and one whose values the rules change (a mask of its columns, or any hook):
Spark's executors read a snapshot's rows from the primary directly, where no tap rule
applies ("denied").

Subscribers: a reader names itself and acknowledges positions (Spark's commit). Each
acknowledgement is a named hold in the relay log's reader registry ("tap/<owner>/<name>",
persisted there, atomically and synced, before the ack is answered); the lowest position
of the holds heard from within `subscriber_ttl` is the retention floor (`retain_from` in
status). Retention (relaylog/retention.py) purges below the registry's floor only, unless
its hard cap is crossed; a range the log no longer holds is answered with a not_in_log
error, never with an empty result.

State from a relay before owners (holds named "tap:<name>", snapshots and re-snapshot
requests without an owner) is the tap's only namespace's when it has one (no users, or a
single user): it moves there at start. With several users nobody can tell whose it was,
and giving it to whichever user names it first would let one user take another's: it
stays ownerless, out of every user's reach. An ownerless hold still holds retention back
until subscriber_ttl after its last acknowledgement (then it no longer counts), shown to
the operator as "?/<name>"; an ownerless snapshot is shown to the operator and dropped at
a start once older than subscriber_ttl; ownerless re-snapshot requests are dropped at
start (a Spark reader asks again at its next start). A reader that used them acknowledges
and plans afresh under its user.

Tasks: each connection is a task the server owns (cancelled and awaited at close); a
subscription's listener and waits run in the connection's own TaskGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, unquote

from relay.binlog import build, describe
from relay.binlog.constants import EventType
from relay.binlog.decoder import DecodedTables
from relay.binlog.events import decode_fde
from relay.binlog.gtid import parse_position
from relay.errors import HookError, RelayError, SegmentPurged, first_error
from relay.logins import LoginGuard
from relay.net import SocketListener, open_streams, peer_of
from relay.relaylog.log import RelayLog
from relay.relaylog.readers import ReaderKind, ReaderRegistry
from relay.rules.runtime import Rules
from relay.tap import protocol
from relay.tap.frames import RawFrames, change_messages
from relay.tap.protocol import TapError, TapForm
from relay.tap.rules import ReaderRules, UserRules
from relay.tap.settings import TapSettings
from relay.tap.snapshots import (
    ANONYMOUS,
    MAX_PLAN_BYTES,
    STALE,
    Snapshot,
    SnapshotRegistry,
    check_plan,
)
from relay.tap.store import Tally, TapStore
from relay.tls import ServerTls, Throttle, tls_failure

T = TypeVar("T")

log = logging.getLogger("relay.tap")

PrimaryRows = Callable[[str], Coroutine[Any, Any, list[list[bytes | None]]]]
MAX_REQUEST = 1 << 20
# Encoded frames a thread hands the loop at once (Threads.encoded).
ENCODED_BUDGET = 1 << 20
# Characters of a subscriber name, a re-snapshot token and a table pattern of a re-snapshot
# request: they are kept (the holds file, requests.msgpack), rewritten at every change.
MAX_NAME = 256


@dataclass
class TapStats:
    connections: int = 0
    rejected: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    frames: int = 0
    bytes_sent: int = 0
    transactions_sent: int = 0
    busy_seconds: float = 0.0     # thread time spent reading, indexing, running rules
    login_failures: int = 0       # wrong user or password
    logins_blocked: int = 0       # connections and logins refused: their address is blocked


class Threads:
    """The tap's worker threads: blocking work (reading, indexing, rules) off the loop,
    its thread time counted."""

    def __init__(self, stats: TapStats) -> None:
        self.stats = stats
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="relay-tap")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, _timed, self.stats, fn, *args)

    async def encoded(self, it: Iterator[dict[str, Any]], budget: int = ENCODED_BUDGET,
                      ) -> AsyncIterator[tuple[list[dict[str, Any]], list[bytes]]]:
        """Pull a blocking iterator of frames in the threads and encode them there, as
        many a hop as come to `budget` bytes: the frames and their encodings. (A hop per
        frame cost a subscriber following a busy primary more than its frames did.)"""
        while True:
            frames, blobs, ended = await self.call(_pull_encoded, it, budget)
            if frames:
                yield frames, blobs
            if isinstance(ended, BaseException):
                raise ended  # (after the frames before it, as a frame at a time had it)
            if ended:
                return

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _pull_encoded(it: Iterator[dict[str, Any]], budget: int,
                  ) -> tuple[list[dict[str, Any]], list[bytes], bool | Exception]:
    """Frames of `it` and their encodings up to `budget` bytes; then True once it ended,
    or the error it raised after the frames pulled (they still go out first)."""
    frames: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    size = 0
    try:
        for frame in it:
            blob = protocol.encode(frame)
            frames.append(frame)
            blobs.append(blob)
            size += len(blob)
            if size >= budget:
                return frames, blobs, False
    except Exception as exc:
        if not frames:
            raise
        return frames, blobs, exc
    return frames, blobs, True


def _timed(stats: TapStats, fn: Callable[..., T], *args: Any) -> T:
    t0 = time.thread_time()
    try:
        return fn(*args)
    finally:
        stats.busy_seconds += time.thread_time() - t0


# --- subscribers: holds in the reader registry, one namespace per user ------------------------

HOLD_PREFIX = "tap/"
LEGACY_PREFIX = "tap:"   # a relay before owners: "tap:<name>"


def hold_name(owner: str, name: str) -> str:
    """The hold of `owner`'s subscriber `name`: the owner escaped, so no owner's names
    run into another's (and none into the older relays' "tap:" holds)."""
    return f"{HOLD_PREFIX}{quote(owner, safe='')}/{name}"


@dataclass(frozen=True)
class Subscriber:
    owner: str | None     # None: acknowledged on a relay before owners
    name: str
    position: int

    @property
    def label(self) -> str:
        """The operator's name for it: owner/name (the owner escaped, empty for a tap
        without users, "?" for one from before owners)."""
        return f"{'?' if self.owner is None else quote(self.owner, safe='')}/{self.name}"


def _subscriber(hold: str, position: int) -> Subscriber | None:
    """The subscriber a hold of the reader registry is (None: not the tap's)."""
    if hold.startswith(HOLD_PREFIX):
        owner, sep, name = hold.removeprefix(HOLD_PREFIX).partition("/")
        return Subscriber(unquote(owner), name, position) if sep else None
    if hold.startswith(LEGACY_PREFIX):
        return Subscriber(None, hold.removeprefix(LEGACY_PREFIX), position)
    return None


class Subscribers:
    """The tap's subscribers as holds of the relay log's reader registry. Writers block
    (the registry persists before it returns): the server calls them in its threads."""

    def __init__(self, readers: Callable[[], ReaderRegistry], ttl: float,
                 max_per_owner: int | None = None) -> None:
        """`readers`: the log's registry as it is now (opening the log makes a new one,
        with its epoch, after the tap server is built). `max_per_owner`: the active
        subscribers one owner may have ([tap] max_subscribers_per_user)."""
        self._readers = readers
        self.ttl = ttl
        self.max_per_owner = max_per_owner
        self._lock = threading.Lock()  # a quota's check and the hold it allows: at once

    @property
    def readers(self) -> ReaderRegistry:
        return self._readers()

    def hold(self, owner: str, name: str, pos: int, *, bounded: bool = False) -> None:
        """Hold `pos` for `owner`'s subscriber `name`. `bounded` (a user's command):
        TapError("quota") when `name` would be one active subscriber more than the owner
        may have."""
        with self._lock:
            if bounded:
                self.check_room(owner, name)
            self.readers.hold(hold_name(owner, name), protocol.split_position(pos))

    def check_room(self, owner: str, name: str) -> None:
        """TapError("quota") when `name` is not one of `owner`'s active subscribers and it
        has as many as it may."""
        limit = self.max_per_owner
        if limit is None:
            return
        mine = self.of(owner)
        if name not in mine and len(mine) >= limit:
            raise TapError("quota", f"{owner or 'the tap'} has {len(mine)} subscribers, the "
                                    "most a user may ([tap] max_subscribers_per_user = "
                                    f"{limit}): unsubscribe one before using a new name "
                                    f"({name!r})")

    def held(self, owner: str, name: str) -> int | None:
        held = self.readers.held(hold_name(owner, name))
        return protocol.position(*held) if held is not None else None

    def release(self, owner: str, name: str) -> bool:
        return self.readers.release(hold_name(owner, name))

    def active(self) -> list[Subscriber]:
        """Every subscriber heard from within subscriber_ttl, ownerless ones too."""
        cutoff = time.time() - self.ttl
        out = []
        for r in self.readers.snapshot():
            if r.kind is ReaderKind.HOLD and r.since >= cutoff:
                sub = _subscriber(r.name, protocol.position(*r.position))
                if sub is not None:
                    out.append(sub)
        return out

    def of(self, owner: str) -> dict[str, int]:
        return {s.name: s.position for s in self.active() if s.owner == owner}

    def floor(self) -> int | None:
        """The lowest position an active subscriber (of any user) has not acknowledged
        past: where retention stops for the tap."""
        return min((s.position for s in self.active()), default=None)

    def adopt(self, owner: str) -> None:
        """Ownerless holds (from before owners) become `owner`'s."""
        for sub in self.active():
            if sub.owner is None:
                self.hold(owner, sub.name, sub.position)
                self.readers.release(LEGACY_PREFIX + sub.name)
                log.info("tap: subscriber %s, acknowledged before subscribers had owners, is "
                         "%s's", sub.name, owner or "the tap's (no users)")


# --- what every connection shares -------------------------------------------------------------

@dataclass(frozen=True)
class TapContext:
    """Everything a tap connection uses, made once by the server and handed to each."""

    log: RelayLog
    settings: TapSettings
    store: TapStore
    snapshots: SnapshotRegistry
    subscribers: Subscribers
    rules: Rules
    threads: Threads
    stats: TapStats
    logins: LoginGuard
    login_log: Throttle                     # refused logins: at most a line a second
    source: Callable[[], str]               # host:port of the primary the relay follows now
    # whether the relay's link to it is TLS (snapshot reads then require TLS by default)
    source_tls: Callable[[], bool]
    # A read-only statement's rows on that primary (a typed schema of a table the log
    # has no change of yet comes from its information_schema).
    primary_rows: PrimaryRows | None

    def reader_rules(self, user: str, tables: list[str] | None) -> ReaderRules:
        """The rules of one reader: the tap rules for its user (counted in the relay's
        rule metrics), then its own choice of tables (do_tables patterns)."""
        try:
            return ReaderRules(self.rules, user, tables)
        except ValueError as exc:
            raise TapError("bad_request", f"tables: {exc}") from None

    async def described_table(self, qualified: str, *, visible: bool = True
                              ) -> tuple[bytes, bytes]:
        """(FDE, TABLE_MAP) of a table the log has no row change of: the map the primary
        would write for it now, made from its information_schema. A table the asking
        user may not see (`visible` False) is described as one the primary does not
        have: the same error, word for word, after the same look-ups on the primary
        (their answers set aside), so that the time it takes does not tell it apart."""
        fde = self.log.fde
        if self.primary_rows is None or fde is None:
            raise TapError("not_in_log", f"no row changes of {qualified} in the log (a typed "
                                         "schema comes from the table's TABLE_MAP)")
        schema, table = qualified.split(".")
        try:
            columns = await self.primary_rows(describe.describe_sql(schema, table))
            key = await self.primary_rows(describe.primary_key_sql(schema, table))
            if not visible:
                columns, key = [], []
            tm = describe.table_map(schema, table,
                                    [describe.ColumnDescription.of_row(r) for r in columns],
                                    [describe.text(r[0]) for r in key],
                                    mariadb=decode_fde(fde).is_mariadb)
        except (RelayError, OSError) as exc:
            raise TapError("not_in_log", f"no row changes of {qualified} in the log, and its "
                                         f"columns could not be read from the primary: "
                                         f"{exc}") from None
        checksum = decode_fde(fde).has_crc
        event = build.build_event(EventType.TABLE_MAP, tm.encode(), server_id=0, log_pos=0,
                                  checksum=checksum)
        return fde, event


class TapServer:
    def __init__(self, relay_log: RelayLog, settings: TapSettings, rules: Rules | None = None,
                 source: Callable[[], str] | None = None,
                 primary_rows: PrimaryRows | None = None,
                 source_tls: Callable[[], bool] | None = None) -> None:
        self.log = relay_log
        self.settings = settings
        self.rules = rules if rules is not None else Rules()
        self.store = TapStore(relay_log, settings.frame_bytes)
        self.snapshots = SnapshotRegistry(
            relay_log.directory, max_per_user=settings.max_snapshots_per_user,
            max_bytes_per_user=settings.max_snapshot_bytes_per_user,
            max_requests_per_user=settings.max_subscribers_per_user)
        self.stats = TapStats()
        self.logins = LoginGuard(settings.max_connect_errors, settings.host_block_time)
        self.threads = Threads(self.stats)
        self._subscribers = Subscribers(lambda: relay_log.readers, settings.subscriber_ttl,
                                        settings.max_subscribers_per_user)
        self.context = TapContext(
            relay_log, settings, self.store, self.snapshots, self._subscribers, self.rules,
            self.threads, self.stats, self.logins, Throttle(),
            source if source is not None else (lambda: ""),
            source_tls if source_tls is not None else (lambda: False), primary_rows)
        self.clients: set[asyncio.Task[None]] = set()
        self._closing = False  # close() began: a connection accepted now is turned away
        self._listener = SocketListener(self._accept)
        self.tls = (ServerTls(settings.tls, "[tap.tls]") if settings.tls is not None
                    else None)
        self._tls_failures = Throttle()

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def sole_namespace(self) -> str | None:
        """The one namespace this tap has (ANONYMOUS without users, or its only user);
        None with several users."""
        users = list(self.settings.users)
        if not users:
            return ANONYMOUS
        return users[0] if len(users) == 1 else None

    async def start(self) -> None:
        call = self.threads.call
        await call(self._adopt_old_subscribers)
        owner = self.sole_namespace
        if owner is not None:
            await call(self._subscribers.adopt, owner)
        await call(self.snapshots.load, owner, self.settings.subscriber_ttl)
        await self._listener.open(self.settings.host, self.settings.port)
        log.info("tap listening on %s:%d%s", self.settings.host, self.port,
                 "" if self.settings.users else " (no users configured: no login needed)")

    async def close(self) -> None:
        self._closing = True
        self._listener.stop()
        for task in list(self.clients):
            task.cancel()
        for task in list(self.clients):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._listener.closed()
        self.threads.shutdown()

    def _adopt_old_subscribers(self) -> None:
        """Subscribers a relay before the reader registry kept in tap-subscribers.json
        become holds (once; the file goes): ownerless ones, as an older registry's."""
        path = os.path.join(self.log.directory, "tap-subscribers.json")
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s): its subscribers are dropped", path, exc)
            saved = {}
        if isinstance(saved, dict) and saved.get("epoch") == self.log.epoch:
            for name, entry in dict(saved.get("subscribers", {})).items():
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    self.log.readers.hold(LEGACY_PREFIX + str(name),
                                          protocol.split_position(int(entry["pos"])))
        os.unlink(path)

    # --- the operator's views (/status, /metrics, relay status): every user's ----------------

    def subscribers(self) -> dict[str, int]:
        """Acknowledged positions of the subscribers heard from within subscriber_ttl, of
        every user, by owner/name (Subscriber.label)."""
        return {s.label: s.position for s in self._subscribers.active()}

    def snapshot_progress(self) -> dict[str, Any]:
        """Per snapshot: its subscriber, its owner (None: from before owners) and, per
        table, chunks planned and done, rows."""
        return {s.id: {"name": s.name, "user": s.owner, "tables": s.progress()}
                for s in self.snapshots.snapshot()}

    def retention_floor(self) -> int | None:
        return self._subscribers.floor()

    # --- connections ---------------------------------------------------------------------------

    async def _accept(self, sock: socket.socket) -> None:
        if self._closing:
            sock.close()
            return
        try:
            reader, writer = await open_streams(
                sock, self.tls.context if self.tls is not None else None,
                self.settings.handshake_timeout)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            if (suppressed := self._tls_failures.allow()) is not None:
                log.warning("tap client %s: TLS handshake failed: %s%s", peer_of(sock),
                            tls_failure(exc), suppressed)
            sock.close()
            return
        await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._closing:  # accepted just before the listener stopped
            writer.close()
            return
        if len(self.clients) >= self.settings.max_clients:
            self.stats.rejected += 1
            with contextlib.suppress(Exception):
                writer.write(protocol.encode(TapError(
                    "busy", f"the tap serves {self.settings.max_clients} clients at most "
                            "([tap] max_clients)").frame()))
                await writer.drain()
            writer.close()
            return
        self.clients.add(task)
        self.stats.connections += 1
        conn = _Connection(self.context, reader, writer)
        try:
            await conn.run()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError,
                asyncio.CancelledError):  # cancelled: the server is closing
            pass
        except Exception:  # a fault of ours: this connection only
            log.exception("tap client %s failed", conn.peer)
        finally:
            self.clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# --- one connection -------------------------------------------------------------------------

@dataclass(frozen=True)
class Caller:
    """Who a connection's requests come from, from its login on."""

    owner: str    # the namespace its subscribers and snapshots are kept in
    user: str     # the name its tap rules are chosen by
    peer: str


@dataclass(frozen=True)
class Request:
    """One request as its command gets it: what the command declared it needs, checked."""

    args: dict[str, Any]
    caller: Caller
    name: str = ""                    # the subscriber it names (Command.name)
    snapshot: Snapshot | None = None  # the caller's snapshot its "id" names
    rules: UserRules | None = None    # the caller's tap rules (Command.rules)

    @property
    def user_rules(self) -> UserRules:
        assert self.rules is not None, "a command that reads rules declares rules=True"
        return self.rules

    @property
    def own_snapshot(self) -> Snapshot:
        assert self.snapshot is not None, "a command on a snapshot declares snapshot=True"
        return self.snapshot


Handler = Callable[["_Connection", Request], Awaitable[None]]


@dataclass(frozen=True)
class Command:
    """A tap command (every one but login needs a login) and what it needs."""

    run: Handler
    name: bool = False       # "name": a subscriber of the caller's (a non-empty string)
    snapshot: bool = False   # "id": a snapshot of the caller's (another's is not found)
    rules: bool = False      # the caller's tap rules apply to what it answers


class _Connection:
    """One tap client: login, then requests in order."""

    def __init__(self, ctx: TapContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.ctx = ctx
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        # A client's requests are small maps: before a login a frame over 1 MiB is
        # garbage, refused before it is buffered; after it, a snapshot's plan may take up
        # to MAX_PLAN_BYTES. (The tap's own frames to clients may be larger.)
        self.decoder = protocol.FrameDecoder(max_frame=MAX_REQUEST)
        self.pending: list[Any] = []
        self.caller: Caller | None = None
        if not ctx.settings.users:
            self._logged_in(Caller(ANONYMOUS, "", self.peer))

    def _logged_in(self, caller: Caller) -> None:
        self.caller = caller
        self.decoder.max_frame = MAX_PLAN_BYTES

    async def send(self, frame: dict[str, Any]) -> None:
        await self.send_encoded([protocol.encode(frame)])

    async def send_encoded(self, blobs: list[bytes]) -> None:
        """Frames encoded already (protocol.encode), in one write."""
        if self.writer.is_closing():  # the client reset it: uvloop raises on a write
            raise ConnectionResetError("the client closed the connection")
        self.writer.writelines(blobs)
        stats = self.ctx.stats
        stats.frames += len(blobs)
        stats.bytes_sent += sum(map(len, blobs))
        await self.writer.drain()

    async def next_request(self) -> Any:
        while not self.pending:
            data = await self.reader.read(1 << 16)
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def run(self) -> None:
        ctx = self.ctx
        if ctx.settings.users and ctx.logins.blocked(self.host):
            # Refused before anything else: not even a nonce to answer.
            error = self._blocked()
            self._count_error(error.code)
            await self.send(error.frame())
            return
        nonce = protocol.new_nonce()
        await self.send({"hello": "relay-tap", "v": protocol.VERSION, "nonce": nonce,
                         "epoch": ctx.log.epoch, "login": bool(ctx.settings.users)})
        while True:
            try:
                if self.caller is not None:
                    req = await self.next_request()
                else:  # a client that does not log in in time goes
                    async with asyncio.timeout(ctx.settings.handshake_timeout):
                        req = await self.next_request()
            except TimeoutError:
                self._count_error("auth")
                await self.send(TapError("auth", "no login within [tap] handshake_timeout "
                                         f"({ctx.settings.handshake_timeout:g}s)").frame())
                return
            except TapError as exc:  # malformed: nothing more from this client makes sense
                self._count_error(exc.code)
                await self.send(exc.frame())
                return
            if req is None:
                return
            cmd = req.get("cmd") if isinstance(req, dict) else None
            stats = ctx.stats
            stats.requests[str(cmd)] = stats.requests.get(str(cmd), 0) + 1
            try:
                if not isinstance(cmd, str):
                    raise TapError("bad_request", "a request is a map with a \"cmd\"")
                if cmd == "login":
                    await self._login(req, nonce)
                    await self.send({"ok": True})
                    continue
                await self._dispatch(cmd, req)
            except TapError as exc:
                self._count_error(exc.code)
                await self.send(exc.frame())
                if exc.code in ("auth", "blocked", "malformed"):
                    return
            except HookError as exc:
                self._count_error("rules")
                await self.send(TapError("rules", str(exc)).frame())
            except SegmentPurged as exc:  # retention's hard cap removed it mid-request
                self._count_error("not_in_log")
                await self.send(TapError("not_in_log", str(exc)).frame())
            except RelayError as exc:  # a malformed or corrupt log under this request
                self._count_error("internal")
                log.error("tap: %s", exc)
                await self.send(TapError("internal", str(exc)).frame())

    async def _dispatch(self, cmd: str, req: dict[str, Any]) -> None:
        """Run `cmd` with what its Command says it needs, checked first."""
        if self.caller is None:
            raise TapError("auth", "log in first ({\"cmd\": \"login\", ...})")
        command = COMMANDS.get(cmd)
        if command is None:
            raise TapError("unknown_command", f"unknown command {cmd!r}; the tap knows "
                                              + ", ".join(sorted([*COMMANDS, "login"])))
        caller = self.caller
        name = _subscriber_name(req.get("name"), cmd) if command.name else ""
        snapshot = None
        if command.snapshot:
            snap_id = req.get("id")
            snapshot = self.ctx.snapshots.owned(caller.owner, snap_id) \
                if isinstance(snap_id, str) else None
            if snapshot is None:  # another user's is not there for this one either
                raise TapError("not_in_log", f"no snapshot {snap_id!r} on this relay "
                                             "(dropped, or planned on another relay log)")
        rules = UserRules(self.ctx.rules, caller.user) if command.rules else None
        await command.run(self, Request(req, caller, str(name), snapshot, rules))

    def _count_error(self, code: str) -> None:
        errors = self.ctx.stats.errors
        errors[code] = errors.get(code, 0) + 1

    # --- login -----------------------------------------------------------------------------------

    async def _login(self, req: dict[str, Any], nonce: bytes) -> None:
        ctx = self.ctx
        users = ctx.settings.users
        user = req.get("user")
        if not users:  # one anonymous namespace; the name given chooses tap rules only
            self._logged_in(Caller(ANONYMOUS, str(user or ""), self.peer))
            return
        if ctx.logins.blocked(self.host):  # blocked since this connection opened
            raise self._blocked()
        password = users.get(user) if isinstance(user, str) else None
        if password is None or not protocol.check_proof(password, nonce, req.get("proof")):
            ctx.stats.login_failures += 1
            delay = ctx.logins.failure(self.host)
            if (suppressed := ctx.login_log.allow()) is not None:
                log.warning("tap: login of %r from %s refused%s", user, self.peer, suppressed)
            if delay:
                await asyncio.sleep(delay)  # back-off: a guessing client slows down
            raise TapError("auth", f"access denied for user {user!r}")
        ctx.logins.success(self.host)
        self._logged_in(Caller(str(user), str(user), self.peer))

    def _blocked(self) -> TapError:
        ctx = self.ctx
        ctx.stats.logins_blocked += 1
        if (suppressed := ctx.login_log.allow()) is not None:
            log.warning("tap: %s refused, its address is blocked for failed logins%s",
                        self.peer, suppressed)
        return TapError("blocked", f"address {self.host} is blocked after "
                                   f"{ctx.settings.max_connect_errors} failed logins in a row "
                                   "([tap] max_connect_errors); it may log in again "
                                   f"{ctx.settings.host_block_time:g}s after the block "
                                   "([tap] host_block_time)")

    # --- arguments ----------------------------------------------------------------------------

    def _epoch(self, req: dict[str, Any]) -> None:
        epoch = req.get("epoch")
        if epoch is not None and epoch != self.ctx.log.epoch:
            raise TapError("epoch", f"positions of relay log {epoch} asked of relay log "
                                    f"{self.ctx.log.epoch}: the log was rebuilt or this "
                                    "is another relay; start the reader afresh")

    async def _position(self, req: dict[str, Any], key: str, default: Any = None) -> int:
        value = req.get(key, default)
        if value is None:
            raise TapError("bad_request", f"{key} is missing")
        store = self.ctx.store
        call = self.ctx.threads.call
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TapError("bad_request", f"{key}: a position, \"earliest\", \"latest\" or "
                                          f"a GTID, not {value!r}")
        if value == "earliest":
            first, _, _ = await call(store.bounds)
            return int(first)
        if value == "latest":
            _, last, _ = await call(store.bounds)
            return int(last)
        if isinstance(value, str):
            if value.isdigit():
                value = int(value)
            elif ":" in value and value.replace(":", "").isdigit():
                seg, off = value.split(":")
                value = protocol.position(int(seg), int(off))
            else:
                return int(await call(store.resolve_gtid, value))
        if value < 0:
            raise TapError("bad_request", f"{key}: {value} is negative")
        await call(store.check, value, key)
        return int(value)

    async def _range(self, req: dict[str, Any]) -> tuple[int, int]:
        self._epoch(req)
        start = await self._position(req, "start", "earliest")
        end = await self._position(req, "end", "latest")
        if end < start:
            raise TapError("bad_request", f"end {end} is before start {start}")
        return start, end

    @staticmethod
    def _int(req: dict[str, Any], key: str) -> int | None:
        v = req.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TapError("bad_request", f"{key}: a positive integer, not {v!r}")
        return v

    @staticmethod
    def _tables(req: dict[str, Any]) -> list[str] | None:
        tables = req.get("tables")
        if tables is None:
            return None
        if isinstance(tables, str):
            tables = [t.strip() for t in tables.split(",") if t.strip()]
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise TapError("bad_request", "tables: a list of schema.table patterns")
        return tables

    @staticmethod
    def _snapshottable(rules: UserRules, tables: list[tuple[str, str]], what: str) -> None:
        """TapError("denied") for a snapshot of tables (schema, table) the rules hide, or
        whose values they change (a mask of their columns; any hook, which may rewrite
        any row): a snapshot's rows are read from the primary directly (Spark's
        executors), where no tap rule applies. Tables are refused by name: nothing is
        said of whether they exist."""
        hidden = [f"{s}.{t}" for s, t in tables if not rules.keeps(s, t)]
        if hidden:
            raise TapError("denied", f"{what}: the tap rules of user {rules.user!r} do not "
                                     f"let {', '.join(hidden)} through")
        changed = [(f"{s}.{t}", rule) for s, t in tables
                   if (rule := rules.changes_values(s, t)) is not None]
        if changed:
            named = ", ".join(f"{t} (tap rule {rule!r})" for t, rule in changed)
            raise TapError("denied", f"{what}: the columns of {named} are masked or "
                                     f"rewritten for user {rules.user!r}, and snapshots "
                                     "read the primary directly, where no tap rule "
                                     "applies: no snapshot of them for this user (read "
                                     "their changes without a snapshot)")

    # --- commands ------------------------------------------------------------------------------

    async def cmd_ping(self, r: Request) -> None:
        await self.send({"ok": True, "time": time.time()})

    async def cmd_status(self, r: Request) -> None:
        """The log's state, and the caller's own subscribers and snapshots."""
        ctx = self.ctx
        call = ctx.threads.call
        first, last, count = await call(ctx.store.bounds)
        state, last_gtid = await call(ctx.store.visible_gtids)
        owner = r.caller.owner
        await self.send({
            "ok": True, "epoch": ctx.log.epoch, "first": first, "last": last,
            "transactions": count, "gtid_state": state, "last_gtid": last_gtid,
            "segments": len(ctx.log.segments),
            "retain_from": ctx.subscribers.floor(),  # (the log's, not only the caller's)
            "retain_max": ctx.settings.retain_max,
            "subscribers": ctx.subscribers.of(owner),
            "snapshots": {s.id: {"name": s.name, "tables": s.progress()}
                          for s in ctx.snapshots.of(owner)},
            "source": ctx.source(), "source_tls": ctx.source_tls()})

    async def cmd_resolve(self, r: Request) -> None:
        """{"at"} -> {"pos"}; with "gtid": true also {"gtid"}, the GTID state of the
        transactions before that position (what a reader there has read)."""
        self._epoch(r.args)
        pos = await self._position(r.args, "at")
        answer: dict[str, Any] = {"ok": True, "pos": pos}
        if r.args.get("gtid") is True:
            answer["gtid"] = await self.ctx.threads.call(self.ctx.store.gtid_at, pos)
        await self.send(answer)

    async def cmd_plan(self, r: Request) -> None:
        """Rows counted as the caller's rules let them through."""
        start, end = await self._range(r.args)
        max_rows, split_rows = self._int(r.args, "max_rows"), self._int(r.args, "split_rows")
        plan = await self.ctx.threads.call(self.ctx.store.plan, start, end, max_rows,
                                           split_rows, r.user_rules.counting())
        await self.send({"ok": True, "epoch": self.ctx.log.epoch, **plan})

    async def cmd_checksum(self, r: Request) -> None:
        """The hash of the range as the caller's rules let it through."""
        start, end = await self._range(r.args)
        result = await self.ctx.threads.call(self.ctx.store.checksum, start, end,
                                             r.user_rules.hashing())
        await self.send({"ok": True, "start": start, "end": end, **result})

    async def cmd_ack(self, r: Request) -> None:
        self._epoch(r.args)
        await self._ack(r.caller, r.name, r.args)
        await self.send({"ok": True})

    async def _ack(self, caller: Caller, name: str, req: dict[str, Any]) -> None:
        """A subscriber's acknowledged position, held (and persisted) in the relay log's
        reader registry before it is answered."""
        pos = await self._position(req, "pos")
        subscribers = self.ctx.subscribers
        await self.ctx.threads.call(
            lambda: subscribers.hold(caller.owner, name, pos, bounded=True))

    async def cmd_acked(self, r: Request) -> None:
        await self.send({"ok": True, "pos": self.ctx.subscribers.held(r.caller.owner, r.name)})

    async def cmd_unsubscribe(self, r: Request) -> None:
        """Forget a subscriber (its acknowledged position no longer holds retention back)
        and the snapshots it started."""
        ctx, owner, name = self.ctx, r.caller.owner, r.name
        call = ctx.threads.call
        dropped = await call(ctx.subscribers.release, owner, name)
        for snap in ctx.snapshots.of(owner):
            if snap.name == name:
                await call(ctx.snapshots.drop, snap.id)
        await call(lambda: ctx.snapshots.forget(name, owner=owner))
        if not dropped:
            yours = ", ".join(sorted(ctx.subscribers.of(owner))) or "none"
            raise TapError("not_in_log", f"no subscriber {name!r} (your subscribers: {yours})")
        log.info("tap: subscriber %s of %r dropped by %s", name, owner, r.caller.peer)
        await self.send({"ok": True})

    async def cmd_schema(self, r: Request) -> None:
        """A table the caller's rules hide is answered as one that does not exist, after
        the same work (the log's look-up and the primary's, their answers set aside):
        neither the answer nor the time it takes tells the two apart."""
        table = r.args.get("table")
        if not isinstance(table, str) or table.count(".") != 1:
            raise TapError("bad_request", "schema needs table = \"schema.table\"")
        ctx = self.ctx
        visible = r.user_rules.keeps(*table.split("."))
        if r.args.get("versions"):
            # Every distinct map the log holds, oldest first, then the table as the primary
            # has it now (an ALTER with no row change since has no map in the log yet).
            versions = await ctx.threads.call(ctx.store.table_versions, table)
            if not visible:
                versions = []
            try:
                versions.append(await ctx.described_table(table, visible=visible))
            except TapError:
                if not versions:
                    raise
            await self.send({"ok": True, "versions": [list(v) for v in versions]})
            return
        found = await ctx.threads.call(ctx.store.table_map, table)
        source = "log"
        if found is None or not visible:  # no change of it yet: as the primary has it now
            found = await ctx.described_table(table, visible=visible)
            source = "primary"
        fde, event = found
        await self.send({"ok": True, "fde": fde, "event": event, "from": source})

    # --- snapshots (relay/tap/snapshot.py plans and reads them; the relay keeps them) ---

    async def cmd_watermark(self, r: Request) -> None:
        """{"gtid": the GTID state of a snapshot read, "timeout": s}: its positions in
        this log, {"low", "high"}, once the log holds all of it."""
        req = r.args
        self._epoch(req)
        text = req.get("gtid")
        if not isinstance(text, str):
            raise TapError("bad_request", "watermark needs gtid = a GTID state")
        try:
            target = parse_position(text)
        except ValueError as exc:
            raise TapError("bad_request", f"gtid: {exc}") from None
        timeout = req.get("timeout", 60)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not 0 <= timeout <= 3600:
            raise TapError("bad_request", "timeout: seconds, 0 to 3600")
        deadline = time.monotonic() + timeout
        log_, store, call = self.ctx.log, self.ctx.store, self.ctx.threads.call
        while True:
            seen = log_.visible
            found = await call(store.watermark, target)
            if found is not None:
                await self.send({"ok": True, "low": found[0], "high": found[1]})
                return
            left = deadline - time.monotonic()
            if left <= 0:
                _, held = await call(store.visible_gtids)
                raise TapError("not_in_log", f"the relay log does not hold GTID state "
                                             f"{text} after {timeout:g}s (it holds "
                                             f"{held or 'nothing'}): the relay is behind "
                                             "its primary, or the snapshot source is not "
                                             "the primary the relay follows")
            await log_.wait_beyond(seen, min(left, 1.0))

    async def cmd_snapshot_save(self, r: Request) -> None:
        """A snapshot's plan: {"name", "start", "tables", "chunks", "requested"} -> {"id"}
        (None: no chunks). The subscriber `name` holds `start` (the stream part) from now
        on; the re-snapshot requests it takes are taken at its first delivered chunk.
        Refused ("denied") for a table the caller's rules hide or whose values they
        change, and ("quota") beyond the caller's bounds. Without chunks nothing is kept
        (a batch read's driver asks so whether it may snapshot these tables)."""
        req, ctx, owner, name = r.args, self.ctx, r.caller.owner, r.name
        self._epoch(req)
        call = ctx.threads.call
        try:  # (in the threads: a plan may hold a million chunks)
            tables, chunks = await call(check_plan, req.get("tables"), req.get("chunks"))
        except ValueError as exc:
            raise TapError("bad_request", f"snapshot_save: {exc}") from None
        pairs = [(t["schema"], t["table"]) for t in tables]
        names = [f"{s}.{t}" for s, t in pairs]
        self._snapshottable(r.user_rules, pairs, "snapshot_save")
        start = await self._position(req, "start")
        requested = req.get("requested")
        taken = [str(t) for t in requested] if isinstance(requested, list) else []
        if not chunks:  # nothing to copy (empty tables, or none matched): asked and done;
            # a batch read's driver asks so too (its plan is not kept): may it copy these?
            if taken:
                await call(lambda: ctx.snapshots.taken(name, taken, owner=owner))
            await self.send({"ok": True, "id": None})
            return
        await call(ctx.subscribers.check_room, owner, name)  # (before a plan is kept)
        snap = await call(lambda: ctx.snapshots.create(name, start, tables, chunks, taken,
                                                       owner=owner))
        try:
            await call(lambda: ctx.subscribers.hold(owner, name, start, bounded=True))
        except TapError:  # another connection of the user's took the room meanwhile
            await call(ctx.snapshots.drop, snap.id)
            raise
        log.info("tap: snapshot %s of %s for %s of %r: %d chunks, the stream from %s", snap.id,
                 ", ".join(names), name, owner, len(chunks), protocol.position_text(start))
        await self.send({"ok": True, "id": snap.id})

    async def cmd_resnapshot(self, r: Request) -> None:
        """{"name", "tables"}: copy these tables again for subscriber `name` while its
        stream goes on (its reader plans the snapshot at its next batch)."""
        tables = self._tables(r.args)
        if not tables:
            raise TapError("bad_request", "resnapshot needs a subscriber name and tables")
        token = r.args.get("token")
        if token is not None and not isinstance(token, str):
            raise TapError("bad_request", "resnapshot's token is a string")
        if any(len(t) > MAX_NAME for t in [*tables, token or ""]):
            raise TapError("bad_request", f"resnapshot: a table pattern or token has at most "
                                          f"{MAX_NAME} characters")
        snapshots, owner, name = self.ctx.snapshots, r.caller.owner, r.name
        new = await self.ctx.threads.call(
            lambda: snapshots.request(name, tables, token, owner=owner))
        if new:
            log.info("tap: re-snapshot of %s asked for %s of %r by %s", ", ".join(tables),
                     name, owner, r.caller.peer)
        await self.send({"ok": True, "new": new})

    async def cmd_snapshot_requested(self, r: Request) -> None:
        await self.send({"ok": True, "tables": self.ctx.snapshots.requested(
            r.name, owner=r.caller.owner)})

    async def cmd_snapshot_load(self, r: Request) -> None:
        snap = r.own_snapshot
        # (saved under rules that let its tables through; these may have changed since)
        self._snapshottable(r.user_rules, snap.table_pairs, f"snapshot {snap.id}")
        await self.send({"ok": True, **snap.to_wire(), "stale": snap.stale_tables()})

    async def cmd_snapshot_done(self, r: Request) -> None:
        snap = r.own_snapshot
        chunk, rows = r.args.get("chunk"), r.args.get("rows")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or \
                isinstance(rows, bool) or not isinstance(rows, int) or rows < STALE:
            raise TapError("bad_request", "snapshot_done needs chunk and rows (integers; "
                                          f"{STALE}: the table changed, copied again)")
        if not snap.has_chunk(chunk):
            raise TapError("bad_request", f"snapshot {snap.id} has no chunk {chunk}")
        await self.ctx.threads.call(self.ctx.snapshots.chunk_done, snap.id, chunk, rows)
        await self.send({"ok": True})

    async def cmd_snapshot_drop(self, r: Request) -> None:
        await self.ctx.threads.call(self.ctx.snapshots.drop, r.own_snapshot.id)
        await self.send({"ok": True})

    async def cmd_fetch(self, r: Request) -> None:
        """The end frame counts the range's transactions and the rows sent (through the
        caller's rules and its choice of tables), counted while they are sent."""
        req, ctx = r.args, self.ctx
        start, end = await self._range(req)
        form = _form(req, TapForm.RAW)
        max_changes = self._int(req, "max_changes")
        tally = Tally()
        with ctx.reader_rules(r.caller.user, self._tables(req)) as rules:
            await self._stream_range(start, end, form, rules, max_changes, tally)
        await self.send({"k": "end", "pos": end, "transactions": tally.transactions,
                         "rows": tally.rows})

    async def _stream_range(self, start: int, end: int, form: TapForm, rules: ReaderRules,
                            max_changes: int | None, tally: Tally | None = None,
                            tables: DecodedTables | None = None) -> int:
        """Send the frames of [start, end); returns the transactions sent. `tables`: the
        decoded maps and codecs of the reader's earlier ranges (a subscription's)."""
        store = self.ctx.store
        raw = store.read_raw(start, end, rules.stream(), reader=f"tap {self.peer}",
                             tally=tally)
        frames: Iterator[dict[str, Any]]
        if form is TapForm.RAW:
            frames = raw
        else:
            frames = change_messages(RawFrames(_raw_then_end(raw), tables=tables),
                                     max_changes or 5000)
        sent = 0
        async for batch, blobs in self.ctx.threads.encoded(frames):
            for frame in batch:
                if frame.get("last") or frame.get("k") == "raw":
                    sent += len(frame.get("txs", ())) if form is TapForm.RAW else 1
            await self.send_encoded(blobs)
        self.ctx.stats.transactions_sent += sent
        return sent

    async def cmd_subscribe(self, r: Request) -> None:
        """Frames from `start` on as the log grows; {"k": "idle", "pos"} when there is
        nothing new for a while. The client may send {"cmd": "ack", ...} meanwhile and
        ends the subscription with {"cmd": "stop"} (answered by the end frame)."""
        req = r.args
        self._epoch(req)
        start = await self._position(req, "start", "latest")
        form = _form(req, TapForm.ROWS)
        name = req.get("name")
        with self.ctx.reader_rules(r.caller.user, self._tables(req)) as rules:
            try:
                pos = await self._subscription(r.caller, start, form, rules, name)
            except BaseExceptionGroup as group:  # the error itself reaches the handlers
                raise first_error(group) from None
        await self.send({"k": "end", "pos": pos})

    async def _subscription(self, caller: Caller, pos: int, form: TapForm, rules: ReaderRules,
                            name: Any) -> int:
        """Send what the log holds past `pos` as it grows, while a listener takes the
        client's acks, until it asks to stop; returns where the subscription ended."""
        stop = asyncio.Event()
        ctx = self.ctx
        tables = DecodedTables()  # one subscription's ranges decode each map once
        async with asyncio.TaskGroup() as tasks:
            listener = tasks.create_task(self._listen_during_subscribe(stop, caller, name),
                                         name=f"tap {self.peer}: listener")
            try:
                while not stop.is_set():
                    _, last, _ = await ctx.threads.call(ctx.store.bounds)
                    if last > pos:
                        await self._stream_range(pos, last, form, rules, None,
                                                 tables=tables)
                        pos = last
                        continue
                    log_ = ctx.log
                    grew = await _first_of(
                        log_.wait_beyond(log_.visible, ctx.settings.idle_interval),
                        stop.wait())
                    if grew is False:
                        await self.send({"k": "idle", "pos": pos})
            finally:
                listener.cancel()
        return pos

    async def _listen_during_subscribe(self, stop: asyncio.Event, caller: Caller,
                                       name: Any) -> None:
        while True:
            req = await self.next_request()
            if req is None:
                stop.set()
                return
            cmd = req.get("cmd") if isinstance(req, dict) else None
            if cmd == "stop":
                stop.set()
                return
            if cmd == "ack":  # answered only when wrong
                try:
                    acked = _subscriber_name(req.get("name", name), "ack")
                    self._epoch(req)
                    await self._ack(caller, acked, req)
                except TapError as exc:
                    await self.send(exc.frame())
            else:
                await self.send(TapError("bad_request", "during a subscription only ack and "
                                                        "stop are taken").frame())


# The commands, and what each needs checked before it runs (login: all of them).
COMMANDS: dict[str, Command] = {
    "ping": Command(_Connection.cmd_ping),
    "status": Command(_Connection.cmd_status),
    "resolve": Command(_Connection.cmd_resolve),
    "plan": Command(_Connection.cmd_plan, rules=True),
    "checksum": Command(_Connection.cmd_checksum, rules=True),
    "fetch": Command(_Connection.cmd_fetch),            # (its rules: ReaderRules)
    "subscribe": Command(_Connection.cmd_subscribe),   # (its rules: ReaderRules)
    "ack": Command(_Connection.cmd_ack, name=True),
    "acked": Command(_Connection.cmd_acked, name=True),
    "unsubscribe": Command(_Connection.cmd_unsubscribe, name=True),
    "schema": Command(_Connection.cmd_schema, rules=True),
    "watermark": Command(_Connection.cmd_watermark),
    "snapshot_save": Command(_Connection.cmd_snapshot_save, name=True, rules=True),
    "resnapshot": Command(_Connection.cmd_resnapshot, name=True),
    "snapshot_requested": Command(_Connection.cmd_snapshot_requested, name=True),
    "snapshot_load": Command(_Connection.cmd_snapshot_load, snapshot=True, rules=True),
    "snapshot_done": Command(_Connection.cmd_snapshot_done, snapshot=True),
    "snapshot_drop": Command(_Connection.cmd_snapshot_drop, snapshot=True),
}


async def _first_of(*waits: Coroutine[Any, Any, T]) -> T:
    """The result of whichever of `waits` finishes first; the others are cancelled (and
    awaited: every task here has an owner)."""
    async with asyncio.TaskGroup() as tasks:
        running = [tasks.create_task(w) for w in waits]
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for t in running:
            t.cancel()
    return next(iter(done)).result()


def _subscriber_name(value: Any, cmd: str) -> str:
    if not isinstance(value, str) or not value:
        raise TapError("bad_request", f"{cmd} needs a subscriber name")
    if len(value) > MAX_NAME:
        raise TapError("bad_request", f"{cmd}: a subscriber name has at most {MAX_NAME} "
                                      f"characters, not {len(value)}")
    return value


def _form(req: dict[str, Any], default: TapForm) -> TapForm:
    form = req.get("form", default.value)
    try:
        return TapForm(form)
    except ValueError:
        raise TapError("bad_request", f"form: \"raw\" or \"rows\", not {form!r}") from None


def _raw_then_end(raw: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from raw
    yield {"k": "end"}
