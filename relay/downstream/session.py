"""ClientSession: one downstream connection. After the connection phase (auth.py), its
commands: queries answered from the relay's state (answers.py), COM_REGISTER_SLAVE, and
COM_BINLOG_DUMP, which turns the connection into a DumpStream.

A dump runs as two tasks in the session's own TaskGroup: the stream, and a watcher of the
client's socket (a replica sends nothing during a dump; EOF means it went away). Whichever
ends first ends the other, and cancelling the session (KILL, a replacing dump, shutdown:
see registry.py) cancels and awaits both. A session logs one line when it ends, saying how;
anything malformed ends this connection only.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from relay.binlog.gtid import GtidSet, GtidState
from relay.downstream.connection import PacketConnection
from relay.downstream.context import SessionContext
from relay.downstream.dump import DumpRequest, DumpStream, RulesTimeout
from relay.downstream.registry import AckView, DumpView, EndReason, SessionInfo
from relay.downstream.replies import (
    Deferred,
    Err,
    FlushHosts,
    Kill,
    Lookup,
    Ok,
    Purge,
    Replica,
    Reply,
    Rows,
)
from relay.downstream.semisync import ReplicaAcks, parse_ack
from relay.downstream.sessionvars import SessionVars
from relay.errors import (
    CorruptLog,
    HookError,
    MalformedEvent,
    RemoteProtocolError,
    SegmentPurged,
    first_error,
)
from relay.relaylog.positions import (
    GtidSetStart,
    GtidStart,
    PositionError,
    check_file_position,
    exclusion_end,
    resolve_gtid,
    resolve_gtid_set,
)
from relay.relaylog.retention import UnknownSegment
from relay.wire.packets import PacketReader
from relay.wire.replies import OK_PACKET, build_eof, build_err

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
USE_HEARTBEAT_EVENT_V2 = 0x02   # COM_BINLOG_DUMP_GTID's flags (MySQL 8.0.26+)
BINLOG_SEND_ANNOTATE_ROWS_EVENT = 0x02  # COM_BINLOG_DUMP's, from a MariaDB client
CAPABILITY_TOLERATE_HOLES = 2   # @mariadb_slave_capability: events may be left out
ER_SLAVE_SAME_ID = 4052
ER_INCORRECT_GTID_STATE = 1941  # MariaDB: a GTID list that does not parse
SLAVE_SAME_ID_MESSAGE = ("A slave with the same server_uuid/server_id as this slave has "
                         "connected to the master")

Ending = tuple[EndReason, str]


@dataclass(frozen=True)
class DumpCommand:
    """COM_BINLOG_DUMP (file/position; a MariaDB replica's GTID start comes in
    @slave_connect_state) or COM_BINLOG_DUMP_GTID (a MySQL replica's GTID set)."""

    flags: int
    server_id: int
    name: str
    pos: int
    gtid_set: GtidSet | None = None


def wants_annotations(request: DumpCommand, capability: int) -> bool:
    """Whether ANNOTATE_ROWS go out, as a MariaDB primary decides: a client that did not
    ask gets a hole where each was when it takes holes (@mariadb_slave_capability 2 and
    up), the event otherwise (not the dummy QUERY a primary sends a client below
    capability 1 in its place: the relay sends such a client MariaDB's own events as
    they are, GTIDs included)."""
    if request.gtid_set is not None:  # (a MySQL client: its 0x02 means heartbeats)
        return True
    return bool(request.flags & BINLOG_SEND_ANNOTATE_ROWS_EVENT) \
        or capability < CAPABILITY_TOLERATE_HOLES


def parse_dump(payload: bytes) -> DumpCommand:
    if len(payload) < 11:
        raise RemoteProtocolError("COM_BINLOG_DUMP too short")
    pos, flags, server_id = struct.unpack_from("<IHI", payload, 1)
    # C clients send the file name NUL-terminated; servers take both forms.
    name = payload[11:].split(b"\0", 1)[0].decode("utf-8", "replace")
    return DumpCommand(flags, server_id, name, pos)


def parse_dump_gtid(payload: bytes) -> DumpCommand:
    """COM_BINLOG_DUMP_GTID: flags, server_id, file name (length-prefixed, empty for
    auto-positioning), position, the GTID set's size and its binary form. As on a MySQL
    primary, the set decides where the dump starts; the file and position are not used."""
    try:
        flags, server_id, name_len = struct.unpack_from("<HII", payload, 1)
        at = 11 + name_len
        # A C string in its field (python-mysql-replication sends three NULs for none).
        name = payload[11:at].split(b"\0", 1)[0].decode("utf-8", "replace")
        pos, size = struct.unpack_from("<QI", payload, at)
        at += 12
        if size > len(payload) - at:
            raise RemoteProtocolError(f"COM_BINLOG_DUMP_GTID: a GTID set of {size} bytes "
                                      f"in {len(payload) - at}")
        gtid_set = GtidSet.decode(payload[at : at + size]) if size else GtidSet()
    except (struct.error, MalformedEvent) as exc:
        raise RemoteProtocolError(f"malformed COM_BINLOG_DUMP_GTID: {exc}") from exc
    return DumpCommand(flags, server_id, name, pos, gtid_set)


class ClientSession:
    def __init__(self, ctx: SessionContext, conn: PacketConnection, conn_id: int) -> None:
        self.ctx = ctx
        self.conn = conn
        self._conn_id = conn_id
        self.user = ""
        self.until_us: int | None = None  # serve_until for this login's dumps
        self.admin = False
        self.vars = SessionVars(connection_id=conn_id)
        self.replica: Replica | None = None
        self.dump: DumpStream | None = None
        self.command_since = time.monotonic()  # SHOW PROCESSLIST's Time
        self._stop: Ending | None = None
        self._end: EndReason | None = None
        self._state = ""

    def __str__(self) -> str:
        sid = f" server_id={self.replica.server_id}" if self.replica else ""
        return f"client {self.conn.peer}{sid}"

    # --- what the registry sees --------------------------------------------------------------

    @property
    def conn_id(self) -> int:
        return self._conn_id

    @property
    def end_reason(self) -> EndReason | None:
        return self._end

    def stopping(self, reason: EndReason, detail: str) -> None:
        self._stop = (reason, detail)

    def info(self) -> SessionInfo:
        dump = self.dump
        acks = dump.acks if dump is not None else None
        return SessionInfo(
            self._conn_id, self.conn.peer, self.user, self.vars.database, self.replica,
            DumpView(dump.segment, dump.position, dump.bytes_sent, dump.last_ts)
            if dump is not None else None, self.command_since, self._state,
            AckView(acks.requested, acks.acks, acks.last_ack, acks.refused)
            if acks is not None else None,
            self.vars.tls_version)

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        ending: Ending = (EndReason.CLIENT_GONE, "")
        clean = False
        try:
            async with asyncio.timeout(self.ctx.settings.handshake_timeout):
                login = await self.ctx.auth.authenticate(
                    self.conn, greeting_version=self.ctx.answers.greeting_version(),
                    conn_id=self._conn_id, default_plugin=self.ctx.answers.default_plugin())
            if login is None:
                ending, clean = (EndReason.REFUSED, ""), True
                return
            self.user = login.user
            self.admin = login.account.admin
            self.until_us = login.account.serve_until_us
            if self.until_us is None:
                self.until_us = self.ctx.settings.serve_until_us
            self.vars.user, self.vars.host = login.user, self.conn.host
            self.vars.admin = self.admin
            self.vars.tls_cipher, self.vars.tls_version = self.conn.tls_info()
            if login.collation is not None:
                self.vars.collation = login.collation
            ending = await self._commands()
            clean = True
        except asyncio.CancelledError:
            ending = self._stop or (EndReason.SHUTDOWN, "")
            if ending[0] is EndReason.REPLACED and self.dump is not None:
                # What a primary tells the older of two dumps with one server_id.
                self.conn.seq = self.dump.seq
                self.conn.send([build_err(ER_SLAVE_SAME_ID, SLAVE_SAME_ID_MESSAGE)])
                clean = True  # flushed before the close
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            ending = (EndReason.CLIENT_GONE, str(exc) if isinstance(exc, ConnectionError)
                      else "")
        except TimeoutError:
            ending = (EndReason.TIMEOUT, "handshake or write timed out")
        except RemoteProtocolError as exc:
            ending = (EndReason.PROTOCOL, str(exc))
        except Exception as exc:  # a bug must cost this client only, never the relay
            log.exception("%s: unexpected error", self)
            ending = (EndReason.ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self._end = ending[0]
            self._log_end(*ending)
            await self.conn.close(clean=clean, timeout=self.ctx.settings.write_timeout)

    def _log_end(self, reason: EndReason, detail: str) -> None:
        dump = self.dump
        where = ""
        if dump is not None:
            where = (f" at {dump.segment or '(start)'}:{dump.position}, "
                     f"{dump.bytes_sent} bytes sent")
        what = "dump ended" if dump is not None else "connection ended"
        text = f"{self}: {what}: {reason.value}" + (f" ({detail})" if detail else "") + where
        if reason is EndReason.QUIT or (dump is None and reason is EndReason.CLIENT_GONE):
            log.debug("%s", text)
        elif reason in (EndReason.ERROR, EndReason.PROTOCOL, EndReason.TIMEOUT,
                        EndReason.STREAM_STOPPED, EndReason.REFUSED):
            log.warning("%s", text)
        else:
            log.info("%s", text)

    # --- commands ----------------------------------------------------------------------------

    async def _commands(self) -> Ending:
        conn = self.conn
        while True:
            conn.seq = 0
            payload = await conn.read()
            if not payload:
                raise RemoteProtocolError("empty command packet")
            cmd = payload[0]
            if cmd == COM_QUERY:
                await self._query(payload[1:].decode("utf-8", "replace"))
            elif cmd == COM_PING:
                conn.send([OK_PACKET])
            elif cmd == COM_INIT_DB:
                self.vars.database = payload[1:].decode("utf-8", "replace") or None
                conn.send([OK_PACKET])
            elif cmd == COM_RESET_CONNECTION:
                self.vars = SessionVars(connection_id=self._conn_id, user=self.user,
                                        host=conn.host, admin=self.admin,
                                        collation=self.vars.collation,
                                        tls_cipher=self.vars.tls_cipher,
                                        tls_version=self.vars.tls_version)
                conn.send([OK_PACKET])
            elif cmd == COM_SET_OPTION:
                conn.send([build_eof()])  # what servers answer (multi-statements on/off)
            elif cmd == COM_STATISTICS:
                conn.send([self._statistics()])
            elif cmd == COM_PROCESS_KILL:
                if len(payload) < 5:
                    raise RemoteProtocolError("COM_PROCESS_KILL too short")
                self._reply(self._kill(Kill(struct.unpack_from("<I", payload, 1)[0], False)))
            elif cmd == COM_QUIT:
                return EndReason.QUIT, ""
            elif cmd == COM_REGISTER_SLAVE:
                self._register(payload)
                conn.send([OK_PACKET])
            elif cmd == COM_BINLOG_DUMP:
                return await self._dump(parse_dump(payload))
            elif cmd == COM_BINLOG_DUMP_GTID:
                return await self._dump(parse_dump_gtid(payload))
            else:
                conn.send([build_err(1047, f"Unknown command {cmd:#04x}", "08S01")])
            await conn.drain(self.ctx.settings.write_timeout)

    def _reply(self, reply: Ok | Err | Rows, more: bool = False) -> None:
        self.conn.reply(reply, self.vars.collation, more)

    async def _query(self, sql: str) -> None:
        """One COM_QUERY: its statements (several with CLIENT_MULTI_STATEMENTS), each
        answered in turn; the first error ends the run, as on a server."""
        statements = self.ctx.answers.split_statements(sql) \
            if self.conn.capabilities & CLIENT_MULTI_STATEMENTS else [sql]
        for i, statement in enumerate(statements):
            reply = await self._resolve(self.ctx.answers.answer(statement, self.vars))
            more = i < len(statements) - 1 and not isinstance(reply, Err)
            self._reply(reply, more)
            if not more:
                return

    async def _resolve(self, reply: Reply) -> Ok | Err | Rows:
        """What the session does for replies that are not answers yet."""
        if isinstance(reply, Lookup):
            return await self._lookup(reply)
        if isinstance(reply, Kill):
            return self._kill(reply)
        if isinstance(reply, Deferred):
            done = await self.ctx.log.read(reply.run)
            return await self._resolve(done)
        if isinstance(reply, Purge):
            return await self._purge(reply)
        if isinstance(reply, FlushHosts):
            if not self.admin:
                return Err(1227, "Access denied; you need (at least one of) the RELOAD "
                                 "privilege(s) for this operation (relay: set admin = true on "
                                 f"[[downstream.users]] {self.user!r})", "42000")
            self.ctx.auth.guard.flush()
            return Ok()
        return reply

    def _kill(self, kill: Kill) -> Ok | Err:
        """KILL: an admin's of any connection, anyone else's of its own user's only (as a
        server without CONNECTION ADMIN)."""
        owner = None if self.admin else self.user
        return self.ctx.registry.kill(kill.connection_id, query_only=kill.query_only,
                                      by=str(self), owner=owner)

    async def _lookup(self, lookup: Lookup) -> Ok | Err | Rows:
        """A metadata look-up the relay composed, on the primary (context.MetadataQuery)."""
        charset = self.vars.charset
        if lookup.exists is not None:
            found = await self.ctx.lookup(lookup.exists, charset)
            if isinstance(found, Err):
                return found
            if not found.rows:
                return lookup.missing or Err(1146, "no such table", "42S02")
        result = await self.ctx.lookup(lookup.sql, charset)
        if isinstance(result, Err) or lookup.finish is None:
            return result
        return lookup.finish(result.defs or [], [list(r) for r in result.rows])

    async def _purge(self, request: Purge) -> Ok | Err:
        """PURGE BINARY LOGS: what no reader needs goes; a log in use stops it there, and
        the error names the reader (MariaDB purges up to the log in use, then refuses).
        Only users marked `admin` may (a server asks for BINLOG ADMIN)."""
        if not self.admin:
            return Err(1227, "Access denied; you need (at least one of) the BINLOG ADMIN "
                             "privilege(s) for this operation (relay: set admin = true on "
                             f"[[downstream.users]] {self.user!r})", "42000")
        try:
            done = await self.ctx.retention.purge(to=request.to, before=request.before)
        except UnknownSegment:
            return Err(1373, "Target log not found in binlog index")
        if done.blocked_by is not None:
            r = done.blocked_by
            purged = f"purged {', '.join(done.names)}; " if done.names else ""
            return Err(1378, f"A purgeable log is in use, will not purge: {purged}segment "
                             f"{r.position[0]} is read by {r.name!r} ({r.kind.value})")
        log.info("%s: PURGE BINARY LOGS removed %s", self,
                 ", ".join(done.names) or "nothing")
        return Ok()

    def _statistics(self) -> bytes:
        """COM_STATISTICS: a plain string, as mariadb-admin status prints it."""
        uptime = int(time.time() - self.ctx.answers.started)
        return (f"Uptime: {uptime}  Threads: {len(self.ctx.registry)}  Questions: 0  "
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
        uuid = self.vars.user_vars.get("replica_uuid") or \
            self.vars.user_vars.get("slave_uuid") or ""
        self.replica = Replica(server_id, host or self.conn.host, port, self.user, uuid)

    # --- the dump ----------------------------------------------------------------------------

    async def _dump(self, request: DumpCommand) -> Ending:
        flags, server_id, name, pos = request.flags, request.server_id, request.name, request.pos
        if self.replica is None:
            self.replica = Replica(server_id, self.conn.host, 0, self.user)
        self.replica.server_id = server_id
        ctx = self.ctx
        if server_id == ctx.settings.server_id:
            self.conn.send([build_err(1236, f"the client's server_id {server_id} is the "
                                            "relay's own; give the replica another server_id")])
            return EndReason.DUMP_REFUSED, "the relay's own server_id"
        if server_id != 0:  # 0: a one-shot client such as mysqlbinlog; many may coexist
            ctx.registry.reap(server_id, keep=self._conn_id)
        checksum = self.vars.checksum
        heartbeat = self.vars.heartbeat_ns / 1e9 or None
        req = DumpRequest(str(self), server_id, checksum is not None,
                          (checksum or "").upper() == "CRC32", heartbeat,
                          ctx.settings.write_timeout,
                          non_blocking=bool(flags & BINLOG_DUMP_NON_BLOCK), user=self.user,
                          rules=ctx.rules, executor=ctx.rules_executor,
                          heartbeat_v2=request.gtid_set is not None
                          and bool(flags & USE_HEARTBEAT_EVENT_V2),
                          until_time_us=self.until_us,
                          annotate=wants_annotations(request, self.vars.capability))
        stream = DumpStream(ctx.log, self.conn.writer, req)
        self.dump = stream
        self.command_since = time.monotonic()
        connect_state = self.vars.user_vars.get("slave_connect_state")
        gtid_mode = (connect_state is not None and self.vars.capability >= 4) \
            or request.gtid_set is not None
        start: GtidState | GtidSet | None = request.gtid_set
        if start is None and gtid_mode:
            start = GtidState.parse(connect_state or "")
        until = None
        until_text = self.vars.user_vars.get("slave_until_gtid")
        if isinstance(start, GtidState) and until_text is not None:
            # START SLAVE UNTIL master_gtid_pos (relay/downstream/until.py)
            try:
                until = GtidState.parse(until_text)
            except ValueError:
                stream.close()
                self.conn.send([build_err(ER_INCORRECT_GTID_STATE,
                                          "Could not parse GTID list")])
                return EndReason.DUMP_REFUSED, f"@slave_until_gtid {until_text!r}"
        if stream.chain is not None:
            names = ", ".join(r.name for r in stream.chain.chain.rules)
            log.info("%s: send rules %s", self, names)
            if not gtid_mode and stream.chain.chain.can_grow_events():
                stream.close()
                self.conn.send([build_err(
                    1236, f"the relay's send rules for this client ({names}) can make events "
                          "larger, which file/position coordinates cannot follow; replicate "
                          "by GTID: CHANGE MASTER TO MASTER_USE_GTID=slave_pos")])
                return EndReason.DUMP_REFUSED, "send rules that grow events need GTIDs"
        acks = ctx.semi_sync.open(self._conn_id) if self.vars.semi_sync_slave else None
        if acks is not None and stream.chain is not None:
            # Send rules may make the client's positions differ from the relay's: its acks
            # are counted, but never taken as acks of the relay's own transactions.
            acks.on_board = False
        stream.use_semi_sync(acks)
        try:
            async with asyncio.TaskGroup() as tasks:
                watcher = tasks.create_task(self._watch_client(acks), name=f"{self}: watcher")
                serving = tasks.create_task(self._serve(stream, start, name, pos, until),
                                            name=f"{self}: dump")
                await asyncio.wait({watcher, serving}, return_when=asyncio.FIRST_COMPLETED)
                watcher.cancel()  # whichever still runs
                serving.cancel()
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        finally:
            stream.close()
            if acks is not None:
                acks.close()
        if serving.cancelled():
            return EndReason.CLIENT_GONE, ""
        return serving.result()

    async def _serve(self, stream: DumpStream, request: GtidState | GtidSet | None,
                     name: str, pos: int, until: GtidState | None = None) -> Ending:
        """Find the start, then stream; what goes wrong with this stream ends it with an
        error packet the client can read."""
        try:
            if isinstance(request, GtidSet) and name:
                # A file named too (mysqlbinlog sends one): as a MySQL primary, the dump
                # starts there, and the set's transactions are skipped from there on.
                log_ = self.ctx.log
                asked = request
                segment, offset = await self._when_available(lambda: log_.read(
                    lambda: check_file_position(log_, name, pos)))
                known, visible = log_.visible_state.copy(), log_.visible
                checked_to = await log_.read(
                    lambda: exclusion_end(log_, asked, segment, offset, known, visible))
                log.info("%s: dump from %s:%d without GTID set %s", self, segment, offset,
                         request or "(empty)")
                await stream.from_file(segment, offset, exclude=request,
                                       exclude_until=checked_to)
            elif isinstance(request, GtidSet):
                log_ = self.ctx.log
                asked = request

                async def resolve_set() -> GtidSetStart:
                    # (on the loop: the state and where it holds, taken together)
                    known, visible = log_.visible_state.copy(), log_.visible
                    return await log_.read(
                        lambda: resolve_gtid_set(log_, asked, known, visible))

                set_start = await self._when_available(resolve_set)
                log.info("%s: dump by GTID set %s (%s at %d)", self, request or "(empty)",
                         set_start.segment, set_start.resume_offset)
                await stream.from_gtid_set(set_start)
            elif request is not None:
                log_ = self.ctx.log

                async def resolve() -> GtidStart:
                    known = log_.state.copy()  # on the loop, which owns the writer's state
                    return await log_.read(lambda: resolve_gtid(log_, request, known))

                start = await self._when_available(resolve)
                log.info("%s: dump by GTID from %s (%s at %d)", self, request or "(empty)",
                         start.segment, start.resume_offset)
                await stream.from_gtid(start, until)
            else:
                segment, offset = await self._when_available(lambda: self.ctx.log.read(
                    lambda: check_file_position(self.ctx.log, name, pos)))
                log.info("%s: dump from %s:%d", self, segment, offset)
                await stream.from_file(segment, offset)
            return EndReason.DUMP_FINISHED, ""
        except (PositionError, ValueError) as exc:
            self.conn.seq = 1
            self.conn.send([build_err(1236, str(exc))])
            await self.conn.flush_quietly()
            return EndReason.DUMP_REFUSED, str(exc)
        except (HookError, RulesTimeout, CorruptLog, SegmentPurged) as exc:
            # A rule (or the log under this stream) failed: it stops, with the reason;
            # the other clients go on.
            self.conn.seq = stream.seq
            self.conn.send([build_err(1236, f"relay: {exc}")])
            await self.conn.flush_quietly()
            return EndReason.STREAM_STOPPED, str(exc)

    async def _when_available(self, resolve: Callable[[], Awaitable[T]]) -> T:
        """Resolve the start position; while the relay is only behind it (no log yet, or
        still catching up with its primary), wait up to catchup_wait rather than answer
        1236, which a MariaDB replica treats as fatal."""
        deadline = time.monotonic() + self.ctx.settings.catchup_wait
        logged = False
        while True:
            try:
                found = await resolve()
                self._state = "streaming"
                return found
            except PositionError as exc:
                remaining = deadline - time.monotonic()
                if not exc.behind or remaining <= 0:
                    raise
                if not logged:
                    log.info("%s: waiting up to %.0fs for the relay to catch up: %s", self,
                             remaining, exc)
                    logged = True
                    self._state = "waiting for the relay to catch up"
            await self.ctx.log.wait_beyond(self.ctx.log.visible, min(remaining, 1.0))

    async def _watch_client(self, acks: ReplicaAcks | None) -> None:
        # A replica sends nothing during the dump but its semi-sync acknowledgements, and
        # a primary reads nothing else then: bytes a client does send (python-mysql-
        # replication's MariaDB dump packet carries one byte beyond its stated length) are
        # discarded, as the primary leaves them unread. Only EOF (or a reset) ends the dump.
        packets = PacketReader(max_payload=1 << 16) if acks is not None else None
        try:
            while data := await self.conn.reader.read(4096):
                if packets is None or acks is None:
                    continue
                packets.feed(data)
                while (payload := packets.next_payload()) is not None:
                    packets.next_seq = 0  # each acknowledgement is a packet of its own
                    acks.acknowledged(*parse_ack(payload))
        except ConnectionError:
            pass
