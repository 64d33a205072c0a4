"""PacketConnection: a downstream client's socket in packets: read one command (16 MiB
pieces joined, sequence ids checked), send payloads with the next sequence ids, and the
relay's replies as a server writes them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence

from relay.binlog.charsets import codec_of
from relay.downstream.replies import Err, Ok, Rows
from relay.errors import RemoteProtocolError
from relay.wire.codec import MAX_PACKET
from relay.wire.handshake import CLIENT_DEPRECATE_EOF
from relay.wire.packets import frame
from relay.wire.replies import (
    OK_PACKET,
    SERVER_MORE_RESULTS_EXISTS,
    SERVER_STATUS_AUTOCOMMIT,
    ColumnDef,
    build_err,
    build_ok,
    text_result_set,
)

MAX_COMMAND = 1 << 20  # a replica's commands are tiny; anything larger is garbage


class PacketConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = self.peer.rsplit(":", 1)[0]
        self.seq = 0
        self.capabilities = 0

    async def read(self) -> bytes:
        payload = b""
        while True:
            head = await self.reader.readexactly(4)
            length = int.from_bytes(head[:3], "little")
            if head[3] != self.seq:
                raise RemoteProtocolError(f"packets out of order: got {head[3]}, "
                                          f"expected {self.seq}")
            self.seq = (self.seq + 1) & 0xFF
            if len(payload) + length > MAX_COMMAND:
                raise RemoteProtocolError(f"command of over {MAX_COMMAND} bytes")
            payload += await self.reader.readexactly(length)
            if length < MAX_PACKET:
                return payload

    def send(self, payloads: Sequence[bytes]) -> None:
        out = bytearray()
        for p in payloads:
            data, self.seq = frame(p, self.seq)
            out += data
        if self.writer.is_closing():  # the client reset it: uvloop raises on a write
            raise ConnectionResetError("the client closed the connection")
        self.writer.write(out)

    def reply(self, reply: Ok | Err | Rows, collation: int, more: bool = False) -> None:
        status = SERVER_STATUS_AUTOCOMMIT | (SERVER_MORE_RESULTS_EXISTS if more else 0)
        if isinstance(reply, Ok):
            self.send([build_ok(status) if more else OK_PACKET])
        elif isinstance(reply, Err):
            self.send([build_err(reply.code, reply.message, reply.sqlstate)])
        else:
            self.send(text_result_set(*_in_charset(reply, collation),
                                      bool(self.capabilities & CLIENT_DEPRECATE_EOF), status))

    async def drain(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            await self.writer.drain()

    async def flush_quietly(self, timeout: float = 5.0) -> None:
        """Let an error packet reach a client that may be gone already."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            await self.drain(timeout)

    async def close(self, *, clean: bool, timeout: float) -> None:
        """Flush what is buffered (an EOF, an error packet) and close; abort otherwise."""
        if clean:
            self.writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout):
                    await self.writer.wait_closed()
        self.writer.transport.abort()


def _in_charset(reply: Rows, collation: int) -> tuple[list[ColumnDef],
                                                      list[list[bytes | None]]]:
    """Text columns in the connection's collation and values encoded in its character set,
    as a server sends them (forwarded values arrive as bytes, already encoded)."""
    defs = [c if isinstance(c, ColumnDef) else ColumnDef(c) for c in
            (reply.defs or reply.columns)]
    defs = [dataclasses.replace(c, charset=collation) if c.charset == 33 else c for c in defs]
    codec = codec_of(collation) or ("utf-8", "strict")
    rows = [[v.encode(codec[0], "replace") if isinstance(v, str) else v for v in row]
            for row in reply.rows]
    return defs, rows
