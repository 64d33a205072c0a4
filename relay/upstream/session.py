"""One replica session with the primary: handshake, the setup a replica of its flavour
performs, COM_REGISTER_SLAVE, then the dump by GTID (MariaDB: @slave_connect_state and
COM_BINLOG_DUMP; MySQL: COM_BINLOG_DUMP_GTID with the relay's GTID set, asking for the
v2 heartbeats) and the stream until it ends."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from relay.binlog.flavour import Flavour, relay_server_uuid
from relay.binlog.group import PLAIN
from relay.binlog.gtid import GtidPosition, GtidSet
from relay.config import Source
from relay.errors import (
    AuthError,
    ConfigError,
    FatalUpstreamError,
    HookError,
    LogWriteError,
    ServerError,
    UpstreamError,
)
from relay.mysql.errors import LOGIN_REFUSED
from relay.tls import client_context, tls_failure
from relay.upstream.protocol import EventSink, UpstreamProtocol
from relay.wire.auth import ClientAuth
from relay.wire.codec import read_lenenc_int
from relay.wire.dumpstream import DumpReader, EventTally
from relay.wire.handshake import (
    CLIENT_SSL,
    build_response,
    build_ssl_request,
    parse_greeting,
)
from relay.wire.login_policy import LoginPolicy
from relay.wire.replies import is_eof, is_err, parse_err, parse_text_row, raise_if_err

log = logging.getLogger("relay.upstream")

COM_QUERY = 0x03
COM_BINLOG_DUMP = 0x12
COM_REGISTER_SLAVE = 0x15
COM_BINLOG_DUMP_GTID = 0x1E
BINLOG_DUMP_NON_BLOCK = 0x01
BINLOG_SEND_ANNOTATE_ROWS_EVENT = 0x02   # MariaDB's meaning of bit 1
USE_HEARTBEAT_EVENT_V2 = 0x02           # MySQL's (8.0.26+): type-41 heartbeats
BINLOG_THROUGH_GTID = 0x04              # MySQL's COM_BINLOG_DUMP_GTID: the set is there


@dataclass(frozen=True)
class SessionSettings:
    server_id: int
    heartbeat_period: float
    connect_timeout: float
    read_timeout: float


class Session:
    def __init__(self, source: Source, settings: SessionSettings, sink: EventSink, *,
                 non_blocking: bool = False,
                 semi_sync: Callable[[EventSink], EventSink] | None = None,
                 on_streaming: Callable[[], None] | None = None,
                 tally: EventTally | None = None) -> None:
        """`semi_sync`: ask to be the primary's semi-sync replica; when the primary has it
        enabled, the sink this makes from `sink` takes the stream (and acknowledges).
        `tally`: where the events received are counted by type."""
        self.source = source
        self.settings = settings
        self.sink = sink
        self.tally = tally
        self.semi_sync = semi_sync
        self._on_streaming = on_streaming
        self.semi_sync_active = False
        self.non_blocking = non_blocking
        self.proto: UpstreamProtocol | None = None
        self.server_version = ""
        self.checksum = ""

    async def run(self, state: GtidPosition) -> None:
        """Stream until the connection ends; raises UpstreamError saying why (with the
        primary's own error as `server_error` when it sent one)."""
        s = self.settings
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can drop a cancel (client.py)
            async with asyncio.timeout(s.connect_timeout):
                transport, proto = await self.open_connection()
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"{self.source}: cannot connect ({exc or 'timeout'})") from exc
        self.proto = proto
        sink: EventSink | None = None
        try:
            await self._handshake(proto)
            flavour = Flavour.of_position(state)
            if Flavour.of_version(self.server_version) is not flavour:
                theirs = Flavour.of_version(self.server_version)
                raise FatalUpstreamError(f"{self.source}: " + flavour.mismatch(
                    theirs, f"this source ({self.server_version})"))
            await self._setup(proto, state)
            self._register(proto)
            raise_if_err(await proto.read_payload(s.connect_timeout))
            sink = self.sink
            if self.semi_sync is not None and self.semi_sync_active:
                sink = self.semi_sync(self.sink)
            reader = DumpReader(semi_sync=self.semi_sync_active, plain=PLAIN,
                                tally=self.tally)
            proto.start_dump(sink, reader, checksum=self.checksum.upper() == "CRC32",
                             source=str(self.source))
            proto.send(self._dump_request(state))
            log.info("streaming from %s (%s, checksum %s) at GTID %s", self.source,
                     self.server_version, self.checksum, state or "(empty)")
            if self._on_streaming is not None:
                self._on_streaming()
            await self._watch(proto)
        except ServerError as exc:
            if exc.errno in LOGIN_REFUSED:
                raise FatalUpstreamError(f"{self.source}: login refused: {exc.message}",
                                         server_error=exc) from exc
            raise UpstreamError(f"{self.source}: error {exc.errno}: {exc.message}",
                                server_error=exc) from exc
        finally:
            (proto.transport or transport).abort()  # the TLS transport when it started
            if sink is not None:
                await sink.on_end()

    async def open_connection(self) -> tuple[asyncio.Transport, UpstreamProtocol]:
        """The TCP connection to the source."""
        transport, proto = await asyncio.get_running_loop().create_connection(
            UpstreamProtocol, self.source.host, self.source.port)
        return transport, proto

    async def _watch(self, proto: UpstreamProtocol) -> None:
        timeout = self.settings.read_timeout
        while True:
            remaining = proto.last_rx + timeout - time.monotonic()
            done, _ = await asyncio.wait([proto.closed], timeout=max(remaining, 0.05))
            if done:
                exc = proto.closed.result()
                if isinstance(exc, ServerError | HookError | LogWriteError):
                    raise exc
                if proto.ended:
                    return
                raise UpstreamError(f"{self.source}: connection lost ({exc or 'EOF'})")
            if time.monotonic() - proto.last_rx > timeout:
                raise UpstreamError(f"{self.source}: no event or heartbeat for {timeout:g}s "
                                    "(read_timeout); reconnecting")

    async def _handshake(self, proto: UpstreamProtocol) -> None:
        t = self.settings.connect_timeout
        greeting = parse_greeting(await proto.read_payload(t))
        self.server_version = greeting.server_version.removeprefix("5.5.5-")
        tls = await self._start_tls(proto, greeting.capabilities, t)
        auth = ClientAuth(self.source.password.encode(), tls=tls,
                          policy=LoginPolicy.of_source(self.source))
        first = auth.first_response(greeting.auth_plugin, greeting.scramble)
        proto.send(build_response(self.source.user, first, auth.plugin, tls=tls),
                   new_command=False)
        while True:
            reply = await proto.read_payload(t)
            raise_if_err(reply)
            if reply[:1] == b"\x00":
                return
            try:
                answer = auth.answer(reply)
            except AuthError as exc:
                raise FatalUpstreamError(f"{self.source}: {exc}") from exc
            if answer is not None:
                proto.send(answer, new_command=False)

    async def _start_tls(self, proto: UpstreamProtocol, capabilities: int,
                         timeout: float) -> bool:
        """Switch to TLS after the greeting as ssl-mode says; never fall back to plain text
        when TLS is required. True: the connection is encrypted."""
        tls = self.source.tls
        try:
            ctx = client_context(tls)
        except ConfigError as exc:
            raise FatalUpstreamError(f"{self.source}: {exc}") from exc
        if ctx is None:
            return False
        if not capabilities & CLIENT_SSL:
            if tls.mode.required:
                raise UpstreamError(f"{self.source}: the primary does not offer TLS "
                                    f"(ssl-mode={tls.mode.value}); not connecting in plain "
                                    "text (configure ssl_cert/ssl_key on the primary)")
            return False
        proto.send(build_ssl_request(), new_command=False)
        try:
            await proto.start_tls(ctx, self.source.host, timeout)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            raise UpstreamError(f"{self.source}: TLS handshake failed "
                                f"(ssl-mode={tls.mode.value}): {tls_failure(exc)}") from exc
        return True

    async def query(self, proto: UpstreamProtocol, sql: str) -> list[list[bytes | None]]:
        t = self.settings.connect_timeout
        proto.send(bytes((COM_QUERY,)) + sql.encode())
        first = await proto.read_payload(t)
        if is_err(first):
            raise parse_err(first)
        if first[0] == 0:
            return []
        ncols, _ = read_lenenc_int(first, 0)
        for _ in range(ncols or 0):
            await proto.read_payload(t)
        rows: list[list[bytes | None]] = []
        pkt = await proto.read_payload(t)
        if is_eof(pkt):
            pkt = await proto.read_payload(t)
        while not is_eof(pkt):
            raise_if_err(pkt)
            rows.append(parse_text_row(pkt, ncols or 0))
            pkt = await proto.read_payload(t)
        return rows

    def _dump_request(self, state: GtidPosition) -> bytes:
        s = self.settings
        non_block = BINLOG_DUMP_NON_BLOCK if self.non_blocking else 0
        if isinstance(state, GtidSet):  # MySQL: the set travels in the request itself
            data = state.encode()
            return (struct.pack("<BHIIQ", COM_BINLOG_DUMP_GTID,
                                BINLOG_THROUGH_GTID | USE_HEARTBEAT_EVENT_V2 | non_block,
                                s.server_id, 0, 4)
                    + struct.pack("<I", len(data)) + data)
        return struct.pack("<BIHI", COM_BINLOG_DUMP, 4,
                           BINLOG_SEND_ANNOTATE_ROWS_EVENT | non_block, s.server_id)

    async def _setup(self, proto: UpstreamProtocol, state: GtidPosition) -> None:
        period_ns = int(self.settings.heartbeat_period * 1e9)
        mysql = isinstance(state, GtidSet)
        if mysql:  # both spellings, as a MySQL 8.4/9.x replica sends them
            await self.query(proto, f"SET @master_heartbeat_period = {period_ns}, "
                                    f"@source_heartbeat_period = {period_ns}")
            await self.query(proto, "SET @master_binlog_checksum = @@global.binlog_checksum, "
                                    "@source_binlog_checksum = @@global.binlog_checksum")
            uuid = self.replica_uuid()
            await self.query(proto, f"SET @slave_uuid = '{uuid}', @replica_uuid = '{uuid}'")
        else:
            await self.query(proto, f"SET @master_heartbeat_period = {period_ns}")
            await self.query(proto, "SET @master_binlog_checksum = @@global.binlog_checksum")
        rows = await self.query(proto, "SELECT @master_binlog_checksum")
        self.checksum = (rows[0][0] or b"NONE").decode() if rows else "NONE"
        if not mysql:
            await self.query(proto, "SET @mariadb_slave_capability = 4")
            await self.query(proto, f"SET @slave_connect_state = '{state}'")
            await self.query(proto, "SET @slave_gtid_strict_mode = 0")
            await self.query(proto, "SET @slave_gtid_ignore_duplicates = 0")
        if self.semi_sync is not None:
            name = "rpl_semi_sync_source_enabled" if mysql else "rpl_semi_sync_master_enabled"
            rows = await self.query(proto, f"SHOW VARIABLES LIKE '{name}'")
            self.semi_sync_active = bool(rows) and (rows[0][1] or b"").upper() == b"ON"
            if self.semi_sync_active:
                await self.query(proto, "SET @rpl_semi_sync_replica = 1, "
                                        "@rpl_semi_sync_slave = 1" if mysql
                                 else "SET @rpl_semi_sync_slave = 1")

    def replica_uuid(self) -> str:
        """The relay's UUID towards a MySQL primary (which ends an older dump with the same
        one): stable per server_id, so a reconnect replaces its own dump."""
        return relay_server_uuid(self.settings.server_id)

    def _register(self, proto: UpstreamProtocol) -> None:
        payload = struct.pack("<BIBBBHII", COM_REGISTER_SLAVE, self.settings.server_id,
                              0, 0, 0, 0, 0, 0)
        proto.send(payload)
