"""UpstreamProtocol: one TCP connection to the primary.

Two modes. In command mode (handshake, setup queries) replies are collected whole and
awaited one by one: slow and simple. In dump mode `data_received` hands the whole batch to
the ingest's packet loop (no await per event, no copy until the relay log buffer) and
deals itself only with what that loop leaves: split 16 MiB packets, errors, EOF.
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic, Protocol, TypeVar

from relay.errors import RemoteProtocolError, UpstreamError
from relay.wire.codec import MAX_PACKET
from relay.wire.packets import PacketReader, frame
from relay.wire.replies import parse_err


class DumpSink(Protocol):
    """Where the events of a dump go: the relay log's ingest, or a reader of the stream."""

    session_checksum: bool

    def feed_packets(self, buf: bytearray, mv: memoryview, pos: int, n: int,
                     seq: int) -> tuple[int, int]:
        """Consume whole one-event packets from buf[pos:n]; return where it stopped and
        the next sequence id. Packets it leaves (split, error, EOF) the protocol handles."""
        ...

    def feed_one(self, ev: bytes) -> None: ...

    def end_batch(self) -> None: ...

    def reset_connection(self) -> None: ...

    def attach(self, proto: UpstreamProtocol) -> None:
        """The connection the events come on (a sink may pause its reading)."""
        ...


_Inner = TypeVar("_Inner", bound=DumpSink)


class SinkFront(Generic[_Inner]):
    """A sink in front of another (`ingest`): the session's checksum setting is the
    inner sink's."""

    ingest: _Inner

    @property
    def session_checksum(self) -> bool:
        return self.ingest.session_checksum

    @session_checksum.setter
    def session_checksum(self, value: bool) -> None:
        self.ingest.session_checksum = value


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = PacketReader()
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        self._ingest: DumpSink | None = None
        self._buf = bytearray()
        self._big = bytearray()
        self._big_active = False
        self._seq = 0
        self.closed: asyncio.Future[Exception | None] = (
            asyncio.get_running_loop().create_future())
        self.last_rx = time.monotonic()
        self.bytes_received = 0
        self.ended = False  # EOF packet (non-blocking dump finished)
        # Semi-sync: the primary restarts its packet numbering after reading each
        # acknowledgement (at 1, after the ack's 0), so the dump's sequence ids jump.
        self.loose_seq = False

    # --- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        self._replies.put_nowait(b"")  # wake a waiting command

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()
        self.bytes_received += len(data)
        try:
            if self._ingest is not None:
                self._dump_data(data)
            else:
                self._reader.feed(data)
                while (payload := self._reader.next_payload()) is not None:
                    self._replies.put_nowait(payload)
        except Exception as exc:  # a bad packet or a failing sink ends this connection only
            self.fail(exc)
        # A sink may take its time (a reader applying backpressure): that is no silence.
        self.last_rx = time.monotonic()

    def fail(self, exc: Exception) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.transport is not None:
            self.transport.abort()

    # --- command mode ---------------------------------------------------------------------

    async def read_payload(self, timeout: float) -> bytes:
        try:
            payload = await asyncio.wait_for(self._replies.get(), timeout)
        except TimeoutError:
            raise UpstreamError(f"no answer from the primary within {timeout:g}s") from None
        if not payload and self.closed.done():
            exc = self.closed.result()
            raise UpstreamError(f"primary closed the connection ({exc or 'EOF'})")
        return payload

    def send(self, payload: bytes, *, new_command: bool = True) -> None:
        assert self.transport is not None
        if new_command:
            self._reader.next_seq = 0
        data, self._reader.next_seq = frame(payload, self._reader.next_seq)
        self.transport.write(data)

    # --- dump mode ------------------------------------------------------------------------

    def start_dump(self, ingest: DumpSink) -> None:
        """Switch to dump mode before the dump command goes out; replies become events."""
        self._ingest = ingest
        self._seq = 1  # the first packet of the dump reply

    def _dump_data(self, data: bytes) -> None:
        ingest = self._ingest
        assert ingest is not None
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        seq = self._seq
        mv = memoryview(buf)
        try:
            while True:
                if not self._big_active:
                    pos, seq = ingest.feed_packets(buf, mv, pos, n, seq)
                # What feed_packets left: an incomplete packet, or a special one.
                if n - pos < 4:
                    break
                plen = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
                end = pos + 4 + plen
                if end > n:
                    break
                if buf[pos + 3] != seq:
                    if not self.loose_seq:
                        raise RemoteProtocolError(
                            f"packets out of order: got seq {buf[pos + 3]}, expected {seq}")
                    seq = buf[pos + 3]
                seq = (seq + 1) & 0xFF
                if plen == MAX_PACKET or self._big_active:
                    event = self._reassemble(mv[pos + 4 : end], plen)
                    if event is not None:
                        ingest.feed_one(event)
                elif plen and buf[pos + 4] == 0:
                    ingest.feed_one(bytes(mv[pos + 5 : end]))
                else:
                    self._non_event(bytes(mv[pos + 4 : end]))
                pos = end
            self._seq = seq
            ingest.end_batch()
        finally:
            mv.release()
            del buf[:pos]

    def _reassemble(self, part: memoryview, plen: int) -> bytes | None:
        if not self._big_active:
            if part[0] != 0:
                raise RemoteProtocolError("oversized non-event packet in the dump stream")
            self._big_active = True
            self._big += part[1:]
        else:
            self._big += part
        if plen < MAX_PACKET:
            self._big_active = False
            event = bytes(self._big)
            self._big.clear()
            return event
        return None

    def _non_event(self, payload: bytes) -> None:
        if not payload:
            raise RemoteProtocolError("empty packet in the dump stream")
        if payload[0] == 0xFF:
            raise parse_err(payload)
        if payload[0] == 0xFE and len(payload) < 9:
            self.ended = True
            if self.transport is not None:
                self.transport.close()
            return
        raise RemoteProtocolError(f"unexpected packet 0x{payload[0]:02x} in the dump stream")
