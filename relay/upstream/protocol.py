"""UpstreamProtocol: one TCP connection to the primary.

Two modes. In command mode (handshake, setup queries) replies are collected whole and
awaited one by one: slow and simple. In dump mode `data_received` parses every complete
packet of the batch in one loop and hands the event payloads to the sink as memoryviews,
once per batch: no await per event, no copy until the relay log buffer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from relay.errors import RemoteProtocolError, UpstreamError
from relay.wire.codec import MAX_PACKET
from relay.wire.packets import PacketReader, frame
from relay.wire.replies import parse_err

EventSink = Callable[[list[memoryview]], None]


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = PacketReader()
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        self._sink: EventSink | None = None
        self._buf = bytearray()
        self._big = bytearray()
        self._big_active = False
        self._seq = 0
        self.closed: asyncio.Future[Exception | None] = (
            asyncio.get_running_loop().create_future())
        self.last_rx = time.monotonic()
        self.bytes_received = 0
        self.ended = False  # EOF packet (non-blocking dump finished)

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
            if self._sink is not None:
                self._dump_data(data)
            else:
                self._reader.feed(data)
                while (payload := self._reader.next_payload()) is not None:
                    self._replies.put_nowait(payload)
        except Exception as exc:  # a bad packet or a failing sink ends this connection only
            self.fail(exc)

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

    def start_dump(self, sink: EventSink) -> None:
        """Switch to dump mode before the dump command goes out; replies become events."""
        self._sink = sink
        self._seq = 1  # the first packet of the dump reply

    def _dump_data(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        seq = self._seq
        events: list[memoryview] = []
        mv = memoryview(buf)
        try:
            while n - pos >= 4:
                plen = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
                end = pos + 4 + plen
                if end > n:
                    break
                if buf[pos + 3] != seq:
                    raise RemoteProtocolError(
                        f"packets out of order: got seq {buf[pos + 3]}, expected {seq}")
                seq = (seq + 1) & 0xFF
                if plen == MAX_PACKET or self._big_active:
                    self._reassemble(mv[pos + 4 : end], plen, events)
                else:
                    first = buf[pos + 4]
                    if first == 0:
                        events.append(mv[pos + 5 : end])
                    else:
                        self._non_event(bytes(mv[pos + 4 : end]))
                pos = end
            self._seq = seq
            if events:
                assert self._sink is not None
                self._sink(events)
        finally:
            events.clear()
            mv.release()
            del buf[:pos]

    def _reassemble(self, part: memoryview, plen: int, events: list[memoryview]) -> None:
        if not self._big_active:
            if part[0] != 0:
                raise RemoteProtocolError("oversized non-event packet in the dump stream")
            self._big_active = True
            self._big += part[1:]
        else:
            self._big += part
        if plen < MAX_PACKET:
            self._big_active = False
            events.append(memoryview(bytes(self._big)))
            self._big.clear()

    def _non_event(self, payload: bytes) -> None:
        if payload[0] == 0xFF:
            raise parse_err(payload)
        if payload[0] == 0xFE and len(payload) < 9:
            self.ended = True
            if self.transport is not None:
                self.transport.close()
            return
        raise RemoteProtocolError(f"unexpected packet 0x{payload[0]:02x} in the dump stream")
