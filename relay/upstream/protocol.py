"""UpstreamProtocol: one TCP connection to the primary, and the sink interface of its dump.

Two modes. In command mode (handshake, setup queries) replies are collected whole and
awaited one by one: slow and simple. In dump mode `data_received` hands the bytes to the
stream's one framing object (relay.wire.dumpstream.DumpReader) and the batch of whole
events it returns to the sink, with no await per event. Sinks (the ingest, the receive
rules, semi-sync, a live source's queue) see events only; the connection is theirs only
through the `StreamLink` they are given: pause and resume reading, fail it, reply.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import Protocol

from relay.errors import UpstreamError
from relay.wire.dumpstream import DumpReader, EventBatch
from relay.wire.packets import PacketReader, frame


class StreamLink(Protocol):
    """What a sink may do with the connection its events come on."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def fail(self, exc: Exception) -> None:
        """End the connection with this error (a sink's failure ends this stream only)."""
        ...

    def reply(self, payload: bytes) -> None:
        """Send one packet to the primary (a semi-sync acknowledgement: sequence 0)."""
        ...


class NoLink:
    """The link of events that come on no connection (binlog files): nothing to pause,
    answer or end; a sink's failure is raised to the reader of the files."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def fail(self, exc: Exception) -> None:
        raise exc

    def reply(self, payload: bytes) -> None: ...


@dataclass(frozen=True)
class StreamStart:
    """What the session agreed with the primary before the dump: whether events carry a
    CRC (@master_binlog_checksum), and the link to the connection."""

    checksum: bool
    link: StreamLink
    source: str = ""


class EventSink(Protocol):
    """Where the events of a dump go: the relay log's ingest, or a sink in front of it."""

    def on_stream(self, start: StreamStart) -> None:
        """A dump begins on a new connection."""
        ...

    def on_events(self, batch: EventBatch) -> None:
        """Whole events, in stream order (called once per received batch)."""
        ...

    async def on_end(self) -> None:
        """The connection ended: drop what a new one must not continue (a half
        transaction)."""
        ...


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = PacketReader()
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        self._dump: DumpReader | None = None
        self._sink: EventSink | None = None
        self.closed: asyncio.Future[Exception | None] = (
            asyncio.get_running_loop().create_future())
        self.last_rx = time.monotonic()
        self.bytes_received = 0

    @property
    def ended(self) -> bool:
        """An EOF packet ended a non-blocking dump."""
        return self._dump is not None and self._dump.ended

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
            if self._dump is not None and self._sink is not None:
                batch = self._dump.feed(data)
                if batch.data:
                    self._sink.on_events(batch)
                if self._dump.ended and self.transport is not None:
                    self.transport.close()
            else:
                self._reader.feed(data)
                while (payload := self._reader.next_payload()) is not None:
                    self._replies.put_nowait(payload)
        except Exception as exc:  # a bad packet or a failing sink ends this connection only
            self.fail(exc)
        # A sink may take its time (a reader applying backpressure): that is no silence.
        self.last_rx = time.monotonic()

    # --- StreamLink -------------------------------------------------------------------------

    def fail(self, exc: Exception) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.resume_reading()

    def reply(self, payload: bytes) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.write(frame(payload, 0)[0])

    # --- command mode ---------------------------------------------------------------------

    async def read_payload(self, timeout: float) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                payload = await self._replies.get()
        except TimeoutError:
            raise UpstreamError(f"no answer from the primary within {timeout:g}s") from None
        if not payload and self.closed.done():
            exc = self.closed.result()
            raise UpstreamError(f"primary closed the connection ({exc or 'EOF'})")
        return payload

    async def start_tls(self, context: ssl.SSLContext, host: str, timeout: float) -> None:
        """Encrypt the connection from here on (after an SSLRequest went out)."""
        assert self.transport is not None
        tls = await asyncio.get_running_loop().start_tls(
            self.transport, self, context, server_hostname=host,
            ssl_handshake_timeout=timeout)
        assert tls is not None
        self.transport = tls

    def send(self, payload: bytes, *, new_command: bool = True) -> None:
        assert self.transport is not None
        if new_command:
            self._reader.next_seq = 0
        data, self._reader.next_seq = frame(payload, self._reader.next_seq)
        self.transport.write(data)

    # --- dump mode ------------------------------------------------------------------------

    def start_dump(self, sink: EventSink, reader: DumpReader, *, checksum: bool,
                   source: str) -> None:
        """Switch to dump mode before the dump command goes out; replies become events,
        read by `reader`."""
        self._dump = reader
        self._sink = sink
        sink.on_stream(StreamStart(checksum, self, source))
