"""TapServer: the tap protocol (relay/tap/protocol.py) over TCP, one task per connection.

Reading the log, indexing it and running tap rules are blocking work: they run in the
tap's worker threads, and frames go out as they are produced (a range is never held
whole). A bad request gets an error frame and the connection goes on; a wrong password
or bytes that are not frames close that connection only.

Subscribers: a reader names itself and acknowledges positions (Spark's commit). Each
acknowledgement is a named hold in the relay log's reader registry (persisted there,
atomically and synced, before the ack is answered); the lowest position of the holds
heard from within `subscriber_ttl` is the retention floor (`retain_from` in status).
Retention (relaylog/retention.py) purges below the registry's floor only, unless its hard
cap is crossed; a range the log no longer holds is answered with a not_in_log error,
never with an empty result.

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
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relay.binlog import build, describe
from relay.binlog.constants import EventType
from relay.binlog.events import decode_fde
from relay.binlog.gtid import parse_position
from relay.errors import HookError, RelayError, SegmentPurged, first_error
from relay.net import SocketListener, open_streams, peer_of
from relay.relaylog.log import RelayLog
from relay.rules.runtime import Rules
from relay.tap import protocol
from relay.tap.frames import RawFrames, change_messages
from relay.tap.protocol import TapError, TapForm
from relay.tap.rules import ReaderRules
from relay.tap.settings import TapSettings
from relay.tap.snapshots import MAX_PLAN_BYTES, STALE, SnapshotRegistry
from relay.tap.store import TapStore
from relay.tls import ServerTls, Throttle, tls_failure

T = TypeVar("T")

log = logging.getLogger("relay.tap")

_SENTINEL: dict[str, Any] = {}
PrimaryRows = Callable[[str], Coroutine[Any, Any, list[list[bytes | None]]]]


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


class TapServer:
    def __init__(self, relay_log: RelayLog, settings: TapSettings, rules: Rules | None = None,
                 source: Callable[[], str] | None = None,
                 primary_rows: PrimaryRows | None = None) -> None:
        self.log = relay_log
        # host:port of the primary the relay follows now (snapshot reads default to it)
        self.source = source if source is not None else (lambda: "")
        # A read-only statement's rows on that primary (a typed schema of a table the log
        # has no change of yet comes from its information_schema).
        self.primary_rows = primary_rows
        self.settings = settings
        self.rules = rules if rules is not None else Rules()
        self.store = TapStore(relay_log, settings.frame_bytes)
        self.snapshots = SnapshotRegistry(relay_log.directory)
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="relay-tap")
        self.stats = TapStats()
        self.clients: set[asyncio.Task[None]] = set()
        self._closing = False  # close() began: a connection accepted now is turned away
        self._listener = SocketListener(self._accept)
        self.tls = (ServerTls(settings.tls, "[tap.tls]") if settings.tls is not None
                    else None)
        self._tls_failures = Throttle()

    @property
    def port(self) -> int:
        return self._listener.port

    async def described_table(self, qualified: str) -> tuple[bytes, bytes]:
        """(FDE, TABLE_MAP) of a table the log has no row change of: the map the primary
        would write for it now, made from its information_schema."""
        fde = self.log.fde
        if self.primary_rows is None or fde is None:
            raise TapError("not_in_log", f"no row changes of {qualified} in the log (a typed "
                                         "schema comes from the table's TABLE_MAP)")
        schema, table = qualified.split(".")
        try:
            columns = await self.primary_rows(describe.describe_sql(schema, table))
            key = await self.primary_rows(describe.primary_key_sql(schema, table))
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

    async def start(self) -> None:
        await self.call(self._adopt_old_subscribers)
        await self.call(self.snapshots.load)
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
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _adopt_old_subscribers(self) -> None:
        """Subscribers a relay before the reader registry kept in tap-subscribers.json
        become holds (once; the file goes)."""
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
                    self.log.readers.hold(_HOLD_PREFIX + str(name),
                                          protocol.split_position(int(entry["pos"])))
        os.unlink(path)

    def subscribers(self) -> dict[str, int]:
        """Acknowledged positions of the subscribers heard from within subscriber_ttl."""
        cutoff = time.time() - self.settings.subscriber_ttl
        return {r.name.removeprefix(_HOLD_PREFIX): protocol.position(*r.position)
                for r in self.log.readers.snapshot()
                if r.kind.value == "hold" and r.name.startswith(_HOLD_PREFIX)
                and r.since >= cutoff}

    def snapshot_progress(self) -> dict[str, Any]:
        """Per snapshot: its subscriber and, per table, chunks planned and done, rows."""
        return {s.id: {"name": s.name, "tables": s.progress()}
                for s in self.snapshots.snapshot()}

    def retention_floor(self) -> int | None:
        """The lowest position an active subscriber has not acknowledged past."""
        subs = self.subscribers()
        return min(subs.values()) if subs else None

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
        conn = _Connection(self, reader, writer)
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

    # --- blocking work, in the tap's threads -----------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, _timed, self.stats, fn, *args)

    async def iterate(self, it: Iterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """Pull a blocking iterator of frames in the tap's threads, one frame at a time."""
        while True:
            frame = await self.call(next, it, _SENTINEL)
            if frame is _SENTINEL:
                return
            yield frame

    def reader_rules(self, user: str, tables: list[str] | None) -> ReaderRules:
        """The rules of one reader: the tap rules for its user (counted in the relay's
        rule metrics), then its own choice of tables (do_tables patterns)."""
        try:
            return ReaderRules(self.rules, user, tables)
        except ValueError as exc:
            raise TapError("bad_request", f"tables: {exc}") from None


_HOLD_PREFIX = "tap:"
MAX_REQUEST = 1 << 20


def _timed(stats: TapStats, fn: Callable[..., T], *args: Any) -> T:
    t0 = time.thread_time()
    try:
        return fn(*args)
    finally:
        stats.busy_seconds += time.thread_time() - t0


class _Connection:
    """One tap client: login, then requests in order."""

    def __init__(self, server: TapServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # A client's requests are small maps: before a login a frame over 1 MiB is
        # garbage, refused before it is buffered; after it, a snapshot's plan may take up
        # to MAX_PLAN_BYTES. (The tap's own frames to clients may be larger.)
        self.decoder = protocol.FrameDecoder(max_frame=MAX_REQUEST)
        self.pending: list[Any] = []
        self.user = ""
        self.logged_in = False
        if not server.settings.users:
            self._logged_in()

    def _logged_in(self) -> None:
        self.logged_in = True
        self.decoder.max_frame = MAX_PLAN_BYTES

    async def send(self, frame: dict[str, Any]) -> None:
        data = protocol.encode(frame)
        if self.writer.is_closing():  # the client reset it: uvloop raises on a write
            raise ConnectionResetError("the client closed the connection")
        self.writer.write(data)
        stats = self.server.stats
        stats.frames += 1
        stats.bytes_sent += len(data)
        await self.writer.drain()

    async def next_request(self) -> Any:
        while not self.pending:
            data = await self.reader.read(1 << 16)
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def run(self) -> None:
        nonce = protocol.new_nonce()
        await self.send({"hello": "relay-tap", "v": protocol.VERSION, "nonce": nonce,
                         "epoch": self.server.log.epoch,
                         "login": bool(self.server.settings.users)})
        while True:
            try:
                if self.logged_in:
                    req = await self.next_request()
                else:  # a client that does not log in in time goes
                    async with asyncio.timeout(self.server.settings.handshake_timeout):
                        req = await self.next_request()
            except TimeoutError:
                self._count_error("auth")
                await self.send(TapError("auth", "no login within [tap] handshake_timeout "
                                         f"({self.server.settings.handshake_timeout:g}s)")
                                .frame())
                return
            except TapError as exc:  # malformed: nothing more from this client makes sense
                self._count_error(exc.code)
                await self.send(exc.frame())
                return
            if req is None:
                return
            cmd = req.get("cmd") if isinstance(req, dict) else None
            stats = self.server.stats
            stats.requests[str(cmd)] = stats.requests.get(str(cmd), 0) + 1
            try:
                if not isinstance(cmd, str):
                    raise TapError("bad_request", "a request is a map with a \"cmd\"")
                if cmd == "login":
                    await self.send(self._login(req, nonce))
                    continue
                if not self.logged_in:
                    raise TapError("auth", "log in first ({\"cmd\": \"login\", ...})")
                handler = getattr(self, f"cmd_{cmd}", None)
                if handler is None:
                    raise TapError("unknown_command", f"unknown command {cmd!r}; the tap "
                                   "knows " + ", ".join(sorted(_COMMANDS)))
                await handler(req)
            except TapError as exc:
                self._count_error(exc.code)
                await self.send(exc.frame())
                if exc.code in ("auth", "malformed"):
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

    def _count_error(self, code: str) -> None:
        errors = self.server.stats.errors
        errors[code] = errors.get(code, 0) + 1

    def _login(self, req: dict[str, Any], nonce: bytes) -> dict[str, Any]:
        users = self.server.settings.users
        user = req.get("user")
        if not users:
            self._logged_in()
            self.user = str(user or "")
            return {"ok": True}
        password = users.get(user) if isinstance(user, str) else None
        if password is None or not protocol.check_proof(password, nonce, req.get("proof")):
            log.warning("tap: login of %r from %s refused", user, self.peer)
            raise TapError("auth", f"access denied for user {user!r}")
        self._logged_in()
        self.user = str(user)
        return {"ok": True}

    # --- arguments ----------------------------------------------------------------------------

    def _epoch(self, req: dict[str, Any]) -> None:
        epoch = req.get("epoch")
        if epoch is not None and epoch != self.server.log.epoch:
            raise TapError("epoch", f"positions of relay log {epoch} asked of relay log "
                                    f"{self.server.log.epoch}: the log was rebuilt or this "
                                    "is another relay; start the reader afresh")

    async def _position(self, req: dict[str, Any], key: str, default: Any = None) -> int:
        value = req.get(key, default)
        if value is None:
            raise TapError("bad_request", f"{key} is missing")
        store = self.server.store
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TapError("bad_request", f"{key}: a position, \"earliest\", \"latest\" or "
                                          f"a GTID, not {value!r}")
        if value == "earliest":
            first, _, _ = await self.server.call(store.bounds)
            return int(first)
        if value == "latest":
            _, last, _ = await self.server.call(store.bounds)
            return int(last)
        if isinstance(value, str):
            if value.isdigit():
                value = int(value)
            elif ":" in value and value.replace(":", "").isdigit():
                seg, off = value.split(":")
                value = protocol.position(int(seg), int(off))
            else:
                return int(await self.server.call(store.resolve_gtid, value))
        if value < 0:
            raise TapError("bad_request", f"{key}: {value} is negative")
        await self.server.call(store.check, value, key)
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

    def _tables(self, req: dict[str, Any]) -> list[str] | None:
        tables = req.get("tables")
        if tables is None:
            return None
        if isinstance(tables, str):
            tables = [t.strip() for t in tables.split(",") if t.strip()]
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise TapError("bad_request", "tables: a list of schema.table patterns")
        return tables

    # --- commands ------------------------------------------------------------------------------

    async def cmd_ping(self, req: dict[str, Any]) -> None:
        await self.send({"ok": True, "time": time.time()})

    async def cmd_status(self, req: dict[str, Any]) -> None:
        server = self.server
        first, last, count = await server.call(server.store.bounds)
        state, last_gtid = await server.call(server.store.visible_gtids)
        await self.send({
            "ok": True, "epoch": server.log.epoch, "first": first, "last": last,
            "transactions": count, "gtid_state": state, "last_gtid": last_gtid,
            "segments": len(server.log.segments),
            "retain_from": server.retention_floor(), "retain_max": server.settings.retain_max,
            "subscribers": server.subscribers(), "snapshots": server.snapshot_progress(),
            "source": server.source()})

    async def cmd_resolve(self, req: dict[str, Any]) -> None:
        self._epoch(req)
        await self.send({"ok": True, "pos": await self._position(req, "at")})

    async def cmd_plan(self, req: dict[str, Any]) -> None:
        start, end = await self._range(req)
        plan = await self.server.call(self.server.store.plan, start, end,
                                      self._int(req, "max_rows"), self._int(req, "split_rows"))
        await self.send({"ok": True, "epoch": self.server.log.epoch, **plan})

    async def cmd_checksum(self, req: dict[str, Any]) -> None:
        start, end = await self._range(req)
        result = await self.server.call(self.server.store.checksum, start, end)
        await self.send({"ok": True, "start": start, "end": end, **result})

    async def cmd_ack(self, req: dict[str, Any]) -> None:
        self._epoch(req)
        await self._ack(req)
        await self.send({"ok": True})

    async def _ack(self, req: dict[str, Any]) -> None:
        """A subscriber's acknowledged position, held (and persisted) in the relay log's
        reader registry before it is answered."""
        name = req.get("name")
        if not isinstance(name, str) or not name:
            raise TapError("bad_request", "ack needs a subscriber name")
        pos = await self._position(req, "pos")
        readers = self.server.log.readers
        await self.server.call(readers.hold, _HOLD_PREFIX + name, protocol.split_position(pos))

    async def cmd_acked(self, req: dict[str, Any]) -> None:
        name = req.get("name")
        held = self.server.log.readers.held(_HOLD_PREFIX + name) \
            if isinstance(name, str) else None
        await self.send({"ok": True, "pos": protocol.position(*held) if held else None})

    async def cmd_unsubscribe(self, req: dict[str, Any]) -> None:
        """Forget a subscriber (its acknowledged position no longer holds retention back)
        and the snapshots it started."""
        name = req.get("name")
        if not isinstance(name, str) or not name:
            raise TapError("bad_request", "unsubscribe needs a subscriber name")
        server = self.server
        dropped = await server.call(server.log.readers.release, _HOLD_PREFIX + name)
        for snap in server.snapshots.snapshot():
            if snap.name == name:
                await server.call(server.snapshots.drop, snap.id)
        await server.call(server.snapshots.forget, name)
        if not dropped:
            raise TapError("not_in_log", f"no subscriber {name!r} (the tap's subscribers: "
                                         f"{', '.join(sorted(server.subscribers())) or 'none'})")
        log.info("tap: subscriber %s dropped by %s", name, self.peer)
        await self.send({"ok": True})

    async def cmd_schema(self, req: dict[str, Any]) -> None:
        table = req.get("table")
        if not isinstance(table, str) or table.count(".") != 1:
            raise TapError("bad_request", "schema needs table = \"schema.table\"")
        if req.get("versions"):
            # Every distinct map the log holds, oldest first, then the table as the primary
            # has it now (an ALTER with no row change since has no map in the log yet).
            versions = await self.server.call(self.server.store.table_versions, table)
            try:
                versions.append(await self.server.described_table(table))
            except TapError:
                if not versions:
                    raise
            await self.send({"ok": True, "versions": [list(v) for v in versions]})
            return
        found = await self.server.call(self.server.store.table_map, table)
        source = "log"
        if found is None:  # no change of it yet: as the primary describes it now
            found = await self.server.described_table(table)
            source = "primary"
        fde, event = found
        await self.send({"ok": True, "fde": fde, "event": event, "from": source})

    # --- snapshots (relay/tap/snapshot.py plans and reads them; the relay keeps them) ---

    async def cmd_watermark(self, req: dict[str, Any]) -> None:
        """{"gtid": the GTID state of a snapshot read, "timeout": s}: its positions in
        this log, {"low", "high"}, once the log holds all of it."""
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
        log_ = self.server.log
        while True:
            seen = log_.visible
            found = await self.server.call(self.server.store.watermark, target)
            if found is not None:
                await self.send({"ok": True, "low": found[0], "high": found[1]})
                return
            left = deadline - time.monotonic()
            if left <= 0:
                _, held = await self.server.call(self.server.store.visible_gtids)
                raise TapError("not_in_log", f"the relay log does not hold GTID state "
                                             f"{text} after {timeout:g}s (it holds "
                                             f"{held or 'nothing'}): the relay is behind "
                                             "its primary, or the snapshot source is not "
                                             "the primary the relay follows")
            await log_.wait_beyond(seen, min(left, 1.0))

    async def cmd_snapshot_save(self, req: dict[str, Any]) -> None:
        """A snapshot's plan: {"name", "start", "tables", "chunks", "requested"} -> {"id"}
        (None: no chunks). The subscriber `name` holds `start` (the stream part) from now
        on; the re-snapshot requests it takes are taken at its first delivered chunk."""
        self._epoch(req)
        name, tables, chunks = req.get("name"), req.get("tables"), req.get("chunks")
        if not isinstance(name, str) or not name:
            raise TapError("bad_request", "snapshot_save needs a subscriber name")
        if not isinstance(tables, list) or not isinstance(chunks, list):
            raise TapError("bad_request", "snapshot_save needs tables and chunks lists")
        start = await self._position(req, "start")
        requested = req.get("requested")
        taken = [str(t) for t in requested] if isinstance(requested, list) else []
        if not chunks:  # nothing to copy (empty tables, or none matched): asked and done
            await self.server.call(self.server.snapshots.taken, name, taken)
            await self.send({"ok": True, "id": None})
            return
        await self.server.call(self.server.log.readers.hold, _HOLD_PREFIX + name,
                               protocol.split_position(start))
        snap = await self.server.call(self.server.snapshots.create, name, start, tables,
                                      chunks, taken)
        log.info("tap: snapshot %s of %s for %s: %d chunks, the stream from %s", snap.id,
                 ", ".join(f"{t.get('schema')}.{t.get('table')}" for t in tables), name,
                 len(chunks), protocol.position_text(start))
        await self.send({"ok": True, "id": snap.id})

    async def cmd_resnapshot(self, req: dict[str, Any]) -> None:
        """{"name", "tables"}: copy these tables again for subscriber `name` while its
        stream goes on (its reader plans the snapshot at its next batch)."""
        name, tables = req.get("name"), self._tables(req)
        if not isinstance(name, str) or not name or not tables:
            raise TapError("bad_request", "resnapshot needs a subscriber name and tables")
        token = req.get("token")
        if token is not None and not isinstance(token, str):
            raise TapError("bad_request", "resnapshot's token is a string")
        new = await self.server.call(self.server.snapshots.request, name, tables, token)
        if new:
            log.info("tap: re-snapshot of %s asked for %s by %s", ", ".join(tables), name,
                     self.peer)
        await self.send({"ok": True, "new": new})

    async def cmd_snapshot_requested(self, req: dict[str, Any]) -> None:
        name = req.get("name")
        if not isinstance(name, str):
            raise TapError("bad_request", "snapshot_requested needs a subscriber name")
        await self.send({"ok": True, "tables": self.server.snapshots.requested(name)})

    def _snapshot(self, req: dict[str, Any]) -> Any:
        snap_id = req.get("id")
        snap = self.server.snapshots.get(snap_id) if isinstance(snap_id, str) else None
        if snap is None:
            raise TapError("not_in_log", f"no snapshot {snap_id!r} on this relay (dropped, "
                                         "or planned on another relay log)")
        return snap

    async def cmd_snapshot_load(self, req: dict[str, Any]) -> None:
        snap = self._snapshot(req)
        await self.send({"ok": True, **snap.to_wire(), "stale": snap.stale_tables()})

    async def cmd_snapshot_done(self, req: dict[str, Any]) -> None:
        snap = self._snapshot(req)
        chunk, rows = req.get("chunk"), req.get("rows")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or \
                isinstance(rows, bool) or not isinstance(rows, int) or rows < STALE:
            raise TapError("bad_request", "snapshot_done needs chunk and rows (integers; "
                                          f"{STALE}: the table changed, copied again)")
        await self.server.call(self.server.snapshots.chunk_done, snap.id, chunk, rows)
        await self.send({"ok": True})

    async def cmd_snapshot_drop(self, req: dict[str, Any]) -> None:
        snap = self._snapshot(req)
        await self.server.call(self.server.snapshots.drop, snap.id)
        await self.send({"ok": True})

    async def cmd_fetch(self, req: dict[str, Any]) -> None:
        start, end = await self._range(req)
        form = _form(req, TapForm.RAW)
        with self.server.reader_rules(self.user, self._tables(req)) as rules:
            plan = await self.server.call(self.server.store.plan, start, end, None, None)
            await self._stream_range(start, end, form, rules, self._int(req, "max_changes"))
        await self.send({"k": "end", "pos": end, "transactions": plan["transactions"],
                         "rows": plan["rows"]})

    async def _stream_range(self, start: int, end: int, form: TapForm, rules: ReaderRules,
                            max_changes: int | None) -> int:
        """Send the frames of [start, end); returns the transactions sent."""
        store = self.server.store
        raw = store.read_raw(start, end, rules.stream(), reader=f"tap {self.peer}")
        frames: Iterator[dict[str, Any]]
        if form is TapForm.RAW:
            frames = raw
        else:
            frames = change_messages(RawFrames(_raw_then_end(raw)), max_changes or 5000)
        sent = 0
        async for frame in self.server.iterate(frames):
            if frame.get("last") or frame.get("k") == "raw":
                sent += len(frame.get("txs", ())) if form is TapForm.RAW else 1
            await self.send(frame)
        self.server.stats.transactions_sent += sent
        return sent

    async def cmd_subscribe(self, req: dict[str, Any]) -> None:
        """Frames from `start` on as the log grows; {"k": "idle", "pos"} when there is
        nothing new for a while. The client may send {"cmd": "ack", ...} meanwhile and
        ends the subscription with {"cmd": "stop"} (answered by the end frame)."""
        self._epoch(req)
        start = await self._position(req, "start", "latest")
        form = _form(req, TapForm.ROWS)
        name = req.get("name")
        with self.server.reader_rules(self.user, self._tables(req)) as rules:
            try:
                pos = await self._subscription(start, form, rules, name)
            except BaseExceptionGroup as group:  # the error itself reaches the handlers
                raise first_error(group) from None
        await self.send({"k": "end", "pos": pos})

    async def _subscription(self, pos: int, form: TapForm, rules: ReaderRules,
                            name: Any) -> int:
        """Send what the log holds past `pos` as it grows, while a listener takes the
        client's acks, until it asks to stop; returns where the subscription ended."""
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            listener = tasks.create_task(self._listen_during_subscribe(stop, name),
                                         name=f"tap {self.peer}: listener")
            try:
                while not stop.is_set():
                    _, last, _ = await self.server.call(self.server.store.bounds)
                    if last > pos:
                        await self._stream_range(pos, last, form, rules, None)
                        pos = last
                        continue
                    log_ = self.server.log
                    grew = await _first_of(
                        log_.wait_beyond(log_.visible, self.server.settings.idle_interval),
                        stop.wait())
                    if grew is False:
                        await self.send({"k": "idle", "pos": pos})
            finally:
                listener.cancel()
        return pos

    async def _listen_during_subscribe(self, stop: asyncio.Event, name: Any) -> None:
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
                if "name" not in req and isinstance(name, str):
                    req["name"] = name
                try:
                    self._epoch(req)
                    await self._ack(req)
                except TapError as exc:
                    await self.send(exc.frame())
            else:
                await self.send(TapError("bad_request", "during a subscription only ack and "
                                                        "stop are taken").frame())


async def _first_of(*waits: Coroutine[Any, Any, T]) -> T:
    """The result of whichever of `waits` finishes first; the others are cancelled (and
    awaited: every task here has an owner)."""
    async with asyncio.TaskGroup() as tasks:
        running = [tasks.create_task(w) for w in waits]
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for t in running:
            t.cancel()
    return next(iter(done)).result()


def _form(req: dict[str, Any], default: TapForm) -> TapForm:
    form = req.get("form", default.value)
    try:
        return TapForm(form)
    except ValueError:
        raise TapError("bad_request", f"form: \"raw\" or \"rows\", not {form!r}") from None


def _raw_then_end(raw: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from raw
    yield {"k": "end"}


_COMMANDS = {n.removeprefix("cmd_") for n in dir(_Connection) if n.startswith("cmd_")} | {
    "login"}
