"""A live primary as a stream of events, through the relay's own replica session.

The session runs on an event loop in a helper thread and hands batches of events to the
reading thread through a small queue; when the reader falls behind, the queue fills, the
loop waits, and TCP tells the primary to slow down. Without `follow` the dump is
non-blocking: the primary ends it at the end of its binlog.
"""

from __future__ import annotations

import asyncio
import queue
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from relay.binlog import walk
from relay.binlog.changes import SourceEvent
from relay.binlog.gtid import GtidState
from relay.config import Source, StartMode
from relay.errors import UpstreamError
from relay.upstream.control import fetch_type_hints, inspect_primary, start_position
from relay.upstream.protocol import StreamStart
from relay.upstream.session import Session, SessionSettings
from relay.wire.dumpstream import EventBatch

_END = object()


class _QueueSink:
    """An EventSink that queues each received batch's events for the reading thread."""

    def __init__(self, out: queue.Queue[object]) -> None:
        self.out = out

    def on_stream(self, start: StreamStart) -> None:
        pass

    def on_events(self, batch: EventBatch) -> None:
        data = bytes(batch.data)
        # blocks this loop while the reader is behind (TCP then slows the primary)
        self.out.put([data[p : p + n] for p, n in walk.spans(data)])

    async def on_end(self) -> None:
        pass


@dataclass
class LiveSource:
    source: Source
    start: str = "earliest"      # "earliest", "current", or a GTID position
    follow: bool = False
    server_id: int = 0           # 0: picked from the primary's own id
    heartbeat_period: float = 5.0
    read_timeout: float = 30.0
    connect_timeout: float = 10.0
    fetch_hints: bool = True

    def type_hints(self) -> dict[tuple[str, str, str], str]:
        if not self.fetch_hints:
            return {}
        return asyncio.run(fetch_type_hints(self.source, timeout=self.connect_timeout))

    def events(self) -> Iterator[SourceEvent]:
        out: queue.Queue[object] = queue.Queue(maxsize=8)
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(out, stop), daemon=True,
                                  name="relay-live-source")
        thread.start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, list)
                for data in item:
                    size, log_pos = struct.unpack_from("<II", data, 9)
                    yield SourceEvent("", max(log_pos - size, 0), data)
        finally:
            stop.set()
            while thread.is_alive():
                try:  # unblock a loop waiting to hand over a batch
                    out.get_nowait()
                except queue.Empty:
                    thread.join(0.05)

    def _run(self, out: queue.Queue[object], stop: threading.Event) -> None:
        try:
            asyncio.run(self._stream(out, stop))
            out.put(_END)
        except BaseException as exc:  # handed to the reading thread, which raises it
            if not stop.is_set():
                out.put(exc)

    async def _stream(self, out: queue.Queue[object], stop: threading.Event) -> None:
        info = await inspect_primary(self.source, timeout=self.connect_timeout)
        position = None
        mode = StartMode(self.start) if self.start in ("earliest", "current") \
            else StartMode.POSITION
        if mode is StartMode.POSITION:
            try:
                position = GtidState.parse(self.start)
            except ValueError as exc:
                raise UpstreamError(f"start={self.start!r}: {exc}") from exc
        state = start_position(info, mode, position)
        # A server id of our own: unique towards the primary, above the usual range.
        server_id = self.server_id or (0xFFFF0000 | (threading.get_ident() & 0xFFFF))
        if server_id == info.server_id:
            server_id ^= 1
        session = Session(self.source, SessionSettings(
            server_id, self.heartbeat_period, self.connect_timeout, self.read_timeout),
            _QueueSink(out), non_blocking=not self.follow)
        task = asyncio.create_task(session.run(state))
        while not task.done():
            await asyncio.wait([task], timeout=0.2)
            if stop.is_set():
                task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.result()
