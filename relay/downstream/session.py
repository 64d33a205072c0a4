"""ClientSession: one downstream connection. Handshake and mysql_native_password auth,
then commands: queries answered from the relay's state, COM_REGISTER_SLAVE, and
COM_BINLOG_DUMP, which turns the connection into a DumpStream. Anything malformed ends
this connection only."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from relay.binlog.charsets import charset_name, codec_of
from relay.binlog.gtid import GtidState
from relay.downstream.answers import (
    Deferred,
    Err,
    Forward,
    Kill,
    Ok,
    Replica,
    Reply,
    Rows,
    SessionVars,
    split_statements,
)
from relay.downstream.dump import DumpRequest, DumpStream, RulesTimeout
from relay.errors import HookError, RemoteProtocolError
from relay.relaylog.positions import PositionError, check_file_position, resolve_gtid
from relay.wire import handshake
from relay.wire.auth import native_verify
from relay.wire.codec import MAX_PACKET
from relay.wire.handshake import CLIENT_DEPRECATE_EOF, SSL_REQUEST_LEN
from relay.wire.packets import frame
from relay.wire.replies import (
    OK_PACKET,
    SERVER_MORE_RESULTS_EXISTS,
    SERVER_STATUS_AUTOCOMMIT,
    ColumnDef,
    build_eof,
    build_err,
    build_ok,
    text_result_set,
)

if TYPE_CHECKING:
    from relay.downstream.server import DownstreamServer

log = logging.getLogger("relay.downstream")
T = TypeVar("T")

COM_QUIT = 0x01
COM_INIT_DB = 0x02
COM_QUERY = 0x03
COM_STATISTICS = 0x09
COM_PROCESS_KILL = 0x0C
COM_PING = 0x0E
COM_BINLOG_DUMP = 0x12
COM_REGISTER_SLAVE = 0x15
COM_SET_OPTION = 0x1B
COM_BINLOG_DUMP_GTID = 0x1E
COM_RESET_CONNECTION = 0x1F
CLIENT_MULTI_STATEMENTS = 1 << 16
BINLOG_DUMP_NON_BLOCK = 0x01
MAX_COMMAND = 1 << 20  # a replica's commands are tiny; anything larger is garbage


class ClientSession:
    def __init__(self, server: DownstreamServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, conn_id: int) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.conn_id = conn_id
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}"
        self.user = ""
        self.vars = SessionVars(connection_id=conn_id)
        self.capabilities = 0
        self.replica: Replica | None = None
        self.dump: DumpStream | None = None
        self.command_since = time.monotonic()  # SHOW PROCESSLIST's Time
        self.task: asyncio.Task[None] | None = None
        self._seq = 0

    def __str__(self) -> str:
        sid = f" server_id={self.replica.server_id}" if self.replica else ""
        return f"client {self.peer}{sid}"

    # --- packets ---------------------------------------------------------------------------

    async def _read(self) -> bytes:
        payload = b""
        while True:
            head = await self.reader.readexactly(4)
            length = int.from_bytes(head[:3], "little")
            if head[3] != self._seq:
                raise RemoteProtocolError(f"packets out of order: got {head[3]}, "
                                          f"expected {self._seq}")
            self._seq = (self._seq + 1) & 0xFF
            if len(payload) + length > MAX_COMMAND:
                raise RemoteProtocolError(f"command of over {MAX_COMMAND} bytes")
            payload += await self.reader.readexactly(length)
            if length < MAX_PACKET:
                return payload

    def _send(self, payloads: Sequence[bytes]) -> None:
        out = bytearray()
        for p in payloads:
            data, self._seq = frame(p, self._seq)
            out += data
        self.writer.write(out)

    def _reply(self, reply: Ok | Err | Rows, more: bool = False) -> None:
        status = SERVER_STATUS_AUTOCOMMIT | (SERVER_MORE_RESULTS_EXISTS if more else 0)
        if isinstance(reply, Ok):
            self._send([build_ok(status) if more else OK_PACKET])
        elif isinstance(reply, Err):
            self._send([build_err(reply.code, reply.message, reply.sqlstate)])
        else:
            self._send(text_result_set(*self._in_connection_charset(reply),
                                       bool(self.capabilities & CLIENT_DEPRECATE_EOF), status))

    def _in_connection_charset(self, reply: Rows) -> tuple[list[ColumnDef],
                                                           list[list[bytes | None]]]:
        """Text columns in the connection's collation and values encoded in its character
        set, as a server sends them (forwarded values arrive as bytes, already encoded)."""
        collation = self.vars.collation
        defs = [c if isinstance(c, ColumnDef) else ColumnDef(c) for c in
                (reply.defs or reply.columns)]
        defs = [dataclasses.replace(c, charset=collation) if c.charset == 33 else c
                for c in defs]
        codec = codec_of(collation) or ("utf-8", "strict")
        rows = [[v.encode(codec[0], "replace") if isinstance(v, str) else v for v in row]
                for row in reply.rows]
        return defs, rows

    async def _query(self, sql: str) -> None:
        """One COM_QUERY: its statements (several with CLIENT_MULTI_STATEMENTS), each
        answered in turn; the first error ends the run, as on a server."""
        statements = split_statements(sql) if self.capabilities & CLIENT_MULTI_STATEMENTS \
            else [sql]
        for i, statement in enumerate(statements):
            reply = await self._resolve(self.server.answers.answer(statement, self.vars))
            more = i < len(statements) - 1 and not isinstance(reply, Err)
            self._reply(reply, more)
            if not more:
                return

    async def _resolve(self, reply: Reply) -> Ok | Err | Rows:
        """What the session does for replies that are not answers yet."""
        if isinstance(reply, Forward):
            return await self.server.forward(reply.sql, self.vars.charset)
        if isinstance(reply, Kill):
            return self.server.kill(reply.connection_id, reply.query_only)
        if isinstance(reply, Deferred):
            done = await asyncio.to_thread(reply.run)
            return await self._resolve(done)
        return reply

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        clean = False
        try:
            async with asyncio.timeout(self.server.settings.handshake_timeout):
                if not await self._handshake():
                    return
            await self._commands()
            clean = True
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("%s disconnected", self)
        except TimeoutError:
            log.warning("%s dropped: handshake or write timed out", self)
        except RemoteProtocolError as exc:
            log.warning("%s dropped: %s", self, exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must cost this client only, never the relay
            log.exception("%s dropped after an unexpected error", self)
        finally:
            await self._close(clean)

    async def _close(self, clean: bool) -> None:
        """Flush what is buffered (an EOF, an error packet) and close; abort otherwise."""
        if clean:
            self.writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.server.settings.write_timeout):
                    await self.writer.wait_closed()
        self.writer.transport.abort()

    async def _handshake(self) -> bool:
        scramble = bytes(b % 94 + 33 for b in os.urandom(20))  # printable, no NUL
        self._send([handshake.build_greeting(self.server.greeting_version(), self.conn_id,
                                             scramble)])
        payload = await self._read()
        if len(payload) == SSL_REQUEST_LEN:
            self._send([build_err(1045, "relay does not offer TLS", "28000")])
            return False
        resp = handshake.parse_response(payload)
        self.capabilities = resp.capabilities
        auth = resp.auth_response
        if resp.plugin != handshake.NATIVE_PASSWORD:
            self._send([b"\xfe" + handshake.NATIVE_PASSWORD.encode() + b"\0" + scramble + b"\0"])
            auth = await self._read()
        stored = self.server.users.get(resp.user)
        if stored is None or not native_verify(stored, scramble, auth):
            log.warning("%s: access denied for user %r", self, resp.user)
            self._send([build_err(1045, f"Access denied for user '{resp.user}'@'"
                                        f"{self.peer.rsplit(':', 1)[0]}' (using password: "
                                        f"{'YES' if auth else 'NO'})", "28000")])
            await self._close(True)
            return False
        self.user = resp.user
        self.vars.user, self.vars.host = self.user, self.peer.rsplit(":", 1)[0]
        if charset_name(resp.charset) is not None:
            self.vars.collation = resp.charset
        self._send([OK_PACKET])
        return True

    async def _commands(self) -> None:
        while True:
            self._seq = 0
            payload = await self._read()
            if not payload:
                raise RemoteProtocolError("empty command packet")
            cmd = payload[0]
            if cmd == COM_QUERY:
                await self._query(payload[1:].decode("utf-8", "replace"))
            elif cmd == COM_PING:
                self._send([OK_PACKET])
            elif cmd == COM_INIT_DB:
                self.vars.database = payload[1:].decode("utf-8", "replace") or None
                self._send([OK_PACKET])
            elif cmd == COM_RESET_CONNECTION:
                self.vars = SessionVars(connection_id=self.conn_id, user=self.user,
                                        host=self.peer.rsplit(":", 1)[0],
                                        collation=self.vars.collation)
                self._send([OK_PACKET])
            elif cmd == COM_SET_OPTION:
                self._send([build_eof()])  # what servers answer (multi-statements on/off)
            elif cmd == COM_STATISTICS:
                self._send([self._statistics()])
            elif cmd == COM_PROCESS_KILL:
                if len(payload) < 5:
                    raise RemoteProtocolError("COM_PROCESS_KILL too short")
                self._reply(self.server.kill(struct.unpack_from("<I", payload, 1)[0], False))
            elif cmd == COM_QUIT:
                return
            elif cmd == COM_REGISTER_SLAVE:
                self._register(payload)
                self._send([OK_PACKET])
            elif cmd == COM_BINLOG_DUMP:
                await self._dump(payload)
                return
            elif cmd == COM_BINLOG_DUMP_GTID:
                self._send([build_err(1236, "relay serves MariaDB-style GTID replication "
                                            "(@slave_connect_state + COM_BINLOG_DUMP) and "
                                            "file/position; COM_BINLOG_DUMP_GTID (MySQL "
                                            "auto-positioning) is not supported yet")])
                return
            else:
                self._send([build_err(1047, f"Unknown command {cmd:#04x}", "08S01")])
            await self.writer.drain()

    def _statistics(self) -> bytes:
        """COM_STATISTICS: a plain string, as mariadb-admin status prints it."""
        uptime = int(time.time() - self.server.answers.started)
        return (f"Uptime: {uptime}  Threads: {len(self.server.sessions)}  Questions: 0  "
                f"Slow queries: 0  Opens: 0  Open tables: 0  Queries per second avg: 0.000"
                ).encode()

    def _register(self, payload: bytes) -> None:
        try:
            server_id = struct.unpack_from("<I", payload, 1)[0]
            pos = 5
            host_len = payload[pos]
            host = payload[pos + 1 : pos + 1 + host_len].decode("utf-8", "replace")
            pos += 1 + host_len
            pos += 1 + payload[pos]  # user
            pos += 1 + payload[pos]  # password
            port = struct.unpack_from("<H", payload, pos)[0]
        except (struct.error, IndexError) as exc:
            raise RemoteProtocolError(f"malformed COM_REGISTER_SLAVE: {exc}") from exc
        self.replica = Replica(server_id, host or self.peer.rsplit(":", 1)[0], port, self.user)

    async def _dump(self, payload: bytes) -> None:
        if len(payload) < 11:
            raise RemoteProtocolError("COM_BINLOG_DUMP too short")
        pos, flags, server_id = struct.unpack_from("<IHI", payload, 1)
        # C clients send the file name NUL-terminated; servers take both forms.
        name = payload[11:].split(b"\0", 1)[0].decode("utf-8", "replace")
        if self.replica is None:
            self.replica = Replica(server_id, self.peer.rsplit(":", 1)[0], 0, self.user)
        self.replica.server_id = server_id
        if server_id == self.server.relay_server_id:
            self._send([build_err(1236, f"the client's server_id {server_id} is the relay's "
                                        "own; give the replica another server_id")])
            return
        if server_id != 0:  # 0: a one-shot client such as mysqlbinlog; many may coexist
            await self.server.reap(server_id, self)
        checksum = self.vars.checksum
        heartbeat = self.vars.heartbeat_ns / 1e9 or None
        req = DumpRequest(str(self), server_id, checksum is not None,
                          (checksum or "").upper() == "CRC32", heartbeat,
                          self.server.settings.write_timeout,
                          non_blocking=bool(flags & BINLOG_DUMP_NON_BLOCK), user=self.user,
                          rules=self.server.rules, executor=self.server.rules_executor)
        stream = DumpStream(self.server.log, self.writer, req)
        self.dump = stream
        self.command_since = time.monotonic()
        connect_state = self.vars.user_vars.get("slave_connect_state")
        gtid_mode = connect_state is not None and self.vars.capability >= 4
        if stream.chain is not None:
            names = ", ".join(r.name for r in stream.chain.chain.rules)
            log.info("%s: send rules %s", self, names)
            if not gtid_mode and stream.chain.chain.can_grow_events():
                stream.close()
                self._send([build_err(
                    1236, f"the relay's send rules for this client ({names}) can make events "
                          "larger, which file/position coordinates cannot follow; replicate "
                          "by GTID: CHANGE MASTER TO MASTER_USE_GTID=slave_pos")])
                return
        watcher = asyncio.create_task(self._watch_client())
        try:
            if gtid_mode:
                request = GtidState.parse(connect_state or "")
                rl = self.server.log
                start = await self._when_available(lambda: asyncio.to_thread(
                    resolve_gtid, rl, request, rl.state.copy()), watcher)
                if start is None:
                    return
                log.info("%s: dump by GTID from %s (%s at %d)", self, request or "(empty)",
                         start.segment, start.resume_offset)
                await self._run_until_gone(stream.from_gtid(start, request), watcher)
            else:
                found = await self._when_available(lambda: asyncio.to_thread(
                    check_file_position, self.server.log, name, pos), watcher)
                if found is None:
                    return
                segment, offset = found
                log.info("%s: dump from %s:%d", self, segment, offset)
                await self._run_until_gone(stream.from_file(segment, offset), watcher)
        except (PositionError, ValueError) as exc:
            log.warning("%s: cannot start the dump: %s", self, exc)
            self._seq = 1
            self._send([build_err(1236, str(exc))])
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(5):
                    await self.writer.drain()
        except (HookError, RulesTimeout) as exc:
            # A rule failed on this stream: it stops, with the reason; others go on.
            log.error("%s: stream stopped: %s", self, exc)
            self._seq = stream.seq
            self._send([build_err(1236, f"relay: {exc}")])
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(5):
                    await self.writer.drain()
        finally:
            watcher.cancel()
            stream.close()

    async def _when_available(self, resolve: Callable[[], Awaitable[T]],
                              watcher: asyncio.Task[None]) -> T | None:
        """Resolve the start position; while the relay is only behind it (no log yet, or
        still catching up with its primary), wait up to catchup_wait rather than answer
        1236, which a MariaDB replica treats as fatal. None: the client went away."""
        deadline = time.monotonic() + self.server.settings.catchup_wait
        logged = False
        while True:
            try:
                return await resolve()  # in a thread: it reads the GTID index
            except PositionError as exc:
                remaining = deadline - time.monotonic()
                if not exc.behind or remaining <= 0:
                    raise
                if not logged:
                    log.info("%s: waiting up to %.0fs for the relay to catch up: %s", self,
                             remaining, exc)
                    logged = True
            grow = asyncio.ensure_future(self.server.log.wait_beyond(self.server.log.visible,
                                                                     min(remaining, 1.0)))
            done, _ = await asyncio.wait({grow, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                grow.cancel()
                return None

    async def _run_until_gone(self, stream: Coroutine[Any, Any, None],
                              watcher: asyncio.Task[None]) -> None:
        """Run the stream until it fails or the client goes away (EOF on its socket)."""
        task = asyncio.ensure_future(stream)
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            log.info("%s closed its dump connection", self)
            return
        task.result()

    async def _watch_client(self) -> None:
        # A replica sends nothing during the dump, and a primary reads nothing then: bytes
        # a client does send (python-mysql-replication's MariaDB dump packet carries one
        # byte beyond its stated length) are discarded, as the primary leaves them unread.
        # Only EOF ends the dump.
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(4096):
                pass
