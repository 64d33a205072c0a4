"""TapServer: the tap protocol (relay/tap/protocol.py) over TCP, one task per connection.

Reading the log, indexing it and running tap rules are blocking work: they run in the
tap's worker threads, and frames go out as they are produced (a range is never held
whole). A bad request gets an error frame and the connection goes on; a wrong password
or bytes that are not frames close that connection only.

Subscribers: a reader names itself and acknowledges positions (Spark's commit). The
lowest acknowledged position of the subscribers heard from within `subscriber_ttl` is the
retention floor (`retain_from` in status): what log retention must keep, up to
`retain_max` bytes behind the end of the log. The relay purges nothing yet; when it does,
it purges below that floor only, and a range it no longer holds is answered with a
not_in_log error, never with an empty result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from relay.errors import HookError, MalformedEvent
from relay.relaylog.log import RelayLog
from relay.rules.chain import Chain, Rule, RuleSpec
from relay.rules.engine import RuleStream
from relay.rules.runtime import NO_RULES, Rules
from relay.rules.tables import TablePattern
from relay.tap import protocol
from relay.tap.frames import RawFrames, change_messages
from relay.tap.protocol import TapError
from relay.tap.store import TapStore

log = logging.getLogger("relay.tap")

_SENTINEL: dict[str, Any] = {}


@dataclass(frozen=True)
class TapSettings:
    host: str
    port: int
    users: dict[str, str] = field(default_factory=dict)   # name -> password
    frame_bytes: int = 1 << 20
    max_clients: int = 64
    subscriber_ttl: float = 7 * 86400.0
    retain_max: int = 50 << 30
    idle_interval: float = 5.0


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


class Subscribers:
    """Acknowledged positions by subscriber name, kept in <data_dir>/tap-subscribers.json
    (written atomically on every change)."""

    def __init__(self, path: str, epoch: str) -> None:
        self.path = path
        self.epoch = epoch
        self.acks: dict[str, dict[str, Any]] = {}
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            if saved.get("epoch") == epoch:
                self.acks = dict(saved.get("subscribers", {}))
            else:
                log.warning("%s belongs to another relay log (epoch %s): subscribers reset",
                            path, saved.get("epoch"))
        except FileNotFoundError:
            pass
        except (ValueError, AttributeError) as exc:
            log.warning("%s is unreadable (%s): subscribers reset", path, exc)

    def ack(self, name: str, pos: int) -> None:
        prev = self.acks.get(name, {}).get("pos", 0)
        self.acks[name] = {"pos": max(pos, prev), "at": time.time()}
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"epoch": self.epoch, "subscribers": self.acks}, f)
        os.replace(tmp, self.path)

    def floor(self, ttl: float) -> int | None:
        now = time.time()
        live = [a["pos"] for a in self.acks.values() if now - a["at"] <= ttl]
        return min(live) if live else None


class TapServer:
    def __init__(self, relay_log: RelayLog, settings: TapSettings, rules: Rules = NO_RULES,
                 ) -> None:
        self.log = relay_log
        self.settings = settings
        self.rules = rules
        self.store = TapStore(relay_log, settings.frame_bytes)
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="relay-tap")
        self.stats = TapStats()
        self.clients: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.subscribers: Subscribers | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self.subscribers = Subscribers(os.path.join(self.log.directory, "tap-subscribers.json"),
                                       self.log.epoch)
        self._server = await asyncio.start_server(self._accept, self.settings.host,
                                                  self.settings.port, limit=1 << 20)
        log.info("tap listening on %s:%d%s", self.settings.host, self.port,
                 "" if self.settings.users else " (no users configured: no login needed)")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self.clients):
            task.cancel()
        for task in list(self.clients):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def retention_floor(self) -> int | None:
        """The lowest position an active subscriber has not acknowledged past."""
        return self.subscribers.floor(self.settings.subscriber_ttl) if self.subscribers else None

    # --- connections ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
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

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, _timed, self.stats, fn, *args)

    async def iterate(self, it: Iterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """Pull a blocking iterator of frames in the tap's threads, one frame at a time."""
        while True:
            frame = await self.call(next, it, _SENTINEL)
            if frame is _SENTINEL:
                return
            yield frame

    def rule_stream(self, user: str, tables: list[str] | None) -> Callable[[], RuleStream] | None:
        """The rule stream factory of a reader: the tap rules for its user, then its own
        choice of tables (do_tables patterns); None when neither applies."""
        rules: list[Rule] = []
        if self.rules.has("tap"):
            handle = self.rules.chain("tap", user)
            self.rules.release(handle.chain)
            rules += handle.chain.rules
        if tables:
            for p in tables:
                try:
                    TablePattern.parse(p)
                except ValueError as exc:
                    raise TapError("bad_request", f"tables: {exc}") from None
            spec = RuleSpec("tables", "tap", do_tables=tuple(tables))
            rules += Rules([spec]).chain("tap", user).chain.rules
        if not rules:
            return None
        return lambda: RuleStream(Chain(list(rules)))


def _timed(stats: TapStats, fn: Callable[..., Any], *args: Any) -> Any:
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
        self.decoder = protocol.FrameDecoder()
        self.pending: list[Any] = []
        self.user = ""
        self.logged_in = not server.settings.users

    async def send(self, frame: dict[str, Any]) -> None:
        data = protocol.encode(frame)
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
                req = await self.next_request()
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
            except MalformedEvent as exc:
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
            self.logged_in = True
            self.user = str(user or "")
            return {"ok": True}
        password = users.get(user) if isinstance(user, str) else None
        if password is None or not protocol.check_proof(password, nonce, req.get("proof")):
            log.warning("tap: login of %r from %s refused", user, self.peer)
            raise TapError("auth", f"access denied for user {user!r}")
        self.logged_in = True
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
        subs = server.subscribers.acks if server.subscribers else {}
        await self.send({
            "ok": True, "epoch": server.log.epoch, "first": first, "last": last,
            "transactions": count, "gtid_state": state, "last_gtid": last_gtid,
            "segments": len(server.log.segments),
            "retain_from": server.retention_floor(), "retain_max": server.settings.retain_max,
            "subscribers": {k: v["pos"] for k, v in subs.items()}})

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
        name = req.get("name")
        if not isinstance(name, str) or not name:
            raise TapError("bad_request", "ack needs a subscriber name")
        pos = await self._position(req, "pos")
        assert self.server.subscribers is not None
        self.server.subscribers.ack(name, pos)

    async def cmd_acked(self, req: dict[str, Any]) -> None:
        name = req.get("name")
        subs = self.server.subscribers.acks if self.server.subscribers else {}
        entry = subs.get(name) if isinstance(name, str) else None
        await self.send({"ok": True, "pos": entry["pos"] if entry else None})

    async def cmd_schema(self, req: dict[str, Any]) -> None:
        table = req.get("table")
        if not isinstance(table, str) or table.count(".") != 1:
            raise TapError("bad_request", "schema needs table = \"schema.table\"")
        found = await self.server.call(self.server.store.table_map, table)
        if found is None:
            raise TapError("not_in_log", f"no row changes of {table} in the log (a typed "
                                         "schema comes from the table's TABLE_MAP)")
        fde, event = found
        await self.send({"ok": True, "fde": fde, "event": event})

    async def cmd_fetch(self, req: dict[str, Any]) -> None:
        start, end = await self._range(req)
        form = req.get("form", "raw")
        if form not in ("raw", "rows"):
            raise TapError("bad_request", f"form: \"raw\" or \"rows\", not {form!r}")
        factory = self.server.rule_stream(self.user, self._tables(req))
        plan = await self.server.call(self.server.store.plan, start, end, None, None)
        await self._stream_range(start, end, form, factory, self._int(req, "max_changes"))
        await self.send({"k": "end", "pos": end, "transactions": plan["transactions"],
                         "rows": plan["rows"]})

    async def _stream_range(self, start: int, end: int, form: str,
                            factory: Callable[[], RuleStream] | None,
                            max_changes: int | None) -> int:
        """Send the frames of [start, end); returns the transactions sent."""
        store = self.server.store
        raw = store.read_raw(start, end, factory)
        frames: Iterator[dict[str, Any]]
        if form == "raw":
            frames = raw
        else:
            frames = change_messages(RawFrames(_raw_then_end(raw)), max_changes or 5000)
        sent = 0
        async for frame in self.server.iterate(frames):
            if frame.get("last") or frame.get("k") == "raw":
                sent += len(frame.get("txs", ())) if form == "raw" else 1
            await self.send(frame)
        self.server.stats.transactions_sent += sent
        return sent

    async def cmd_subscribe(self, req: dict[str, Any]) -> None:
        """Frames from `start` on as the log grows; {"k": "idle", "pos"} when there is
        nothing new for a while. The client may send {"cmd": "ack", ...} meanwhile and
        ends the subscription with {"cmd": "stop"} (answered by the end frame)."""
        self._epoch(req)
        start = await self._position(req, "start", "latest")
        form = req.get("form", "rows")
        if form not in ("raw", "rows"):
            raise TapError("bad_request", f"form: \"raw\" or \"rows\", not {form!r}")
        name = req.get("name")
        factory = self.server.rule_stream(self.user, self._tables(req))
        stop = asyncio.Event()
        listener = asyncio.create_task(self._listen_during_subscribe(stop, name))
        pos = start
        try:
            while not stop.is_set():
                _, last, _ = await self.server.call(self.server.store.bounds)
                if last > pos:
                    await self._stream_range(pos, last, form, factory, None)
                    pos = last
                    continue
                waiter = asyncio.create_task(
                    self.server.log.wait_beyond(self.server.log.visible,
                                                self.server.settings.idle_interval))
                stopper = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait({waiter, stopper},
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in (waiter, stopper):
                    t.cancel()
                if waiter in done and not waiter.result():
                    await self.send({"k": "idle", "pos": pos})
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
        await self.send({"k": "end", "pos": pos})

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


def _raw_then_end(raw: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from raw
    yield {"k": "end"}


_COMMANDS = {n.removeprefix("cmd_") for n in dir(_Connection) if n.startswith("cmd_")} | {
    "login"}
