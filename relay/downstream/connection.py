"""PacketConnection: a downstream client's socket in packets: read one command (16 MiB
pieces joined, sequence ids checked), send payloads with the next sequence ids, and the
relay's replies as a server writes them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl
from collections.abc import Sequence

from relay.binlog.charsets import codec_of
from relay.downstream.replies import Err, Ok, Rows
from relay.errors import RemoteProtocolError
from relay.net import open_streams, peer_of
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
    """A client's connection in packets. Made from a freshly accepted socket (`accepted`),
    it starts without streams: the greeting goes out and the client's first packet is read
    with exact-length reads, so a TLS ClientHello sent right behind an SSLRequest stays in
    the socket for the TLS layer (a stream reader would take it into its buffer, where
    asyncio's start_tls never sees it). `open_streams` then wraps the socket, encrypted or
    not; everything after goes through the streams."""

    def __init__(self, reader: asyncio.StreamReader | None = None,
                 writer: asyncio.StreamWriter | None = None, *,
                 sock: socket.socket | None = None) -> None:
        """Streams (`reader`, `writer`), or an accepted socket whose streams
        `open_streams` makes after the first packet."""
        assert (sock is None) == (writer is not None), "streams or a socket"
        self._reader = reader
        self._writer = writer
        self._sock = sock
        self._unsent = bytearray()      # before the streams: what goes out with the next read
        self._closed = False
        if sock is not None:
            self.peer = peer_of(sock)
        else:
            assert writer is not None
            peer = writer.get_extra_info("peername")
            self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = self.peer.rsplit(":", 1)[0]
        self.seq = 0
        self.capabilities = 0

    @property
    def reader(self) -> asyncio.StreamReader:
        assert self._reader is not None, "the connection's streams are not open yet"
        return self._reader

    @property
    def writer(self) -> asyncio.StreamWriter:
        assert self._writer is not None, "the connection's streams are not open yet"
        return self._writer

    async def open_streams(self, tls: ssl.SSLContext | None = None,
                           handshake_timeout: float | None = None) -> None:
        """Wrap the socket in streams, after a TLS handshake when `tls` is given."""
        if self._sock is None:
            return
        await self._flush_unsent()
        self._reader, self._writer = await open_streams(self._sock, tls, handshake_timeout)
        self._sock = None  # the transport owns it now

    async def _flush_unsent(self) -> None:
        if self._unsent and self._sock is not None:
            data, self._unsent = bytes(self._unsent), bytearray()
            await asyncio.get_running_loop().sock_sendall(self._sock, data)

    async def _recv_exactly(self, n: int) -> bytes:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        out = bytearray()
        while len(out) < n:
            chunk = await loop.sock_recv(self._sock, n - len(out))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(out), n)
            out += chunk
        return bytes(out)

    def has_client_certificate(self) -> bool:
        """The client presented a certificate and the TLS layer verified it (a server
        context with a CA verifies one when it is presented)."""
        return bool(self._writer is not None and self._writer.get_extra_info("peercert"))

    def tls_info(self) -> tuple[str, str]:
        """(cipher, protocol version) of a TLS connection; empty strings on a plain one."""
        cipher = self._writer.get_extra_info("cipher") if self._writer is not None else None
        return (cipher[0], cipher[1]) if cipher else ("", "")

    async def read(self) -> bytes:
        if self._sock is not None:   # before the streams: exact reads on the socket
            await self._flush_unsent()
            readexactly = self._recv_exactly
        else:
            readexactly = self.reader.readexactly
        payload = b""
        while True:
            head = await readexactly(4)
            length = int.from_bytes(head[:3], "little")
            if head[3] != self.seq:
                raise RemoteProtocolError(f"packets out of order: got {head[3]}, "
                                          f"expected {self.seq}")
            self.seq = (self.seq + 1) & 0xFF
            if len(payload) + length > MAX_COMMAND:
                raise RemoteProtocolError(f"command of over {MAX_COMMAND} bytes")
            payload += await readexactly(length)
            if length < MAX_PACKET:
                return payload

    def send(self, payloads: Sequence[bytes]) -> None:
        out = bytearray()
        for p in payloads:
            data, self.seq = frame(p, self.seq)
            out += data
        if self._writer is None:
            self._unsent += out
            return
        if self._writer.is_closing():  # the client reset it: uvloop raises on a write
            raise ConnectionResetError("the client closed the connection")
        self._writer.write(out)

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
            if self._writer is None:
                await self._flush_unsent()
            else:
                await self._writer.drain()

    async def flush_quietly(self, timeout: float = 5.0) -> None:
        """Let an error packet reach a client that may be gone already."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            await self.drain(timeout)

    async def close(self, *, clean: bool, timeout: float) -> None:
        """Flush what is buffered (an EOF, an error packet) and close; abort otherwise."""
        if self._sock is not None:
            if clean:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(timeout):
                        await self._flush_unsent()
            _discard_unread(self._sock)
            self._sock.close()
            self._sock = None
            return
        writer = self._writer
        if writer is None or self._closed:
            return
        self._closed = True
        if clean:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout):
                    await writer.wait_closed()
        writer.transport.abort()
        # Retrieves how the connection ended (a reset by the client included), which
        # asyncio otherwise reports as "Future exception was never retrieved".
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()


def _discard_unread(sock: socket.socket, limit: int = 1 << 20) -> None:
    """Drop what the client sent that was not read (exact reads leave it in the socket):
    closing over unread bytes would reset the connection instead of ending it."""
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more has arrived
        while limit > 0 and (chunk := sock.recv(min(limit, 65536))):
            limit -= len(chunk)


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
