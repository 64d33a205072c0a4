"""Receive rules: between the primary's stream and the relay log.

Without receive rules the stream's batches go straight to the ingest. With them, this sink
takes the batches, runs the chain over their events in a worker thread (rules cost CPU
and a hook must not hold up the event loop) while the connection stops reading, and hands
what comes out to the ingest, which places and commits it as it does any event. One batch
is in flight at a time, so order is kept; the primary waits on TCP meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from relay.binlog import walk
from relay.binlog.checksum import verify
from relay.binlog.constants import CRC_LEN, HEADER_LEN, EventType
from relay.binlog.position import Position
from relay.config import RulePoint
from relay.rules.engine import RuleStream
from relay.rules.runtime import ChainHandle, Rules
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import StreamLink, StreamStart
from relay.wire.dumpstream import EventBatch

log = logging.getLogger("relay.upstream")


class RulesSink:
    def __init__(self, ingest: Ingest, rules: Rules, executor: Executor) -> None:
        self.ingest = ingest
        self.rules = rules
        self.executor = executor
        self._handle: ChainHandle = rules.chain(RulePoint.RECEIVE)
        self._engine = RuleStream(self._handle.chain)
        self._generation = 0
        self._link: StreamLink | None = None
        self._file = ""

    # --- EventSink --------------------------------------------------------------------------

    def on_stream(self, start: StreamStart) -> None:
        self._link = start.link
        self.ingest.on_stream(start)

    def on_events(self, batch: EventBatch) -> None:
        link = self._link
        if link is not None:
            link.pause()
        loop = asyncio.get_running_loop()
        gen = self._generation
        fut = loop.run_in_executor(self.executor, self._apply, batch.data)
        fut.add_done_callback(lambda f: self._done(f, gen))

    async def on_end(self) -> None:
        self._generation += 1  # a batch still in flight is for a connection now gone
        self._link = None
        self.rules.release(self._handle.chain)
        self._handle = self.rules.chain(RulePoint.RECEIVE)
        self._engine = RuleStream(self._handle.chain)
        await self.ingest.on_end()

    def close(self) -> None:
        self.rules.release(self._handle.chain)

    # --- the work ----------------------------------------------------------------------------

    def _apply(self, data: bytearray) -> list[bytes]:
        engine = self._engine
        out: list[bytes] = []
        for pos, size in walk.spans(data):
            ev = bytes(data[pos : pos + size])
            if ev[4] == EventType.ROTATE:  # the file the positions below are in
                name = ev[HEADER_LEN + 8 : len(ev) - (CRC_LEN if verify(ev) else 0)]
                self._file = name.decode("utf-8", "replace")
            if self.rules.version != self._handle.version and not engine.in_transaction:
                self.rules.release(self._handle.chain)
                self._handle = self.rules.chain(RulePoint.RECEIVE)
                engine.set_chain(self._handle.chain)
            log_pos = int.from_bytes(ev[13:17], "little")
            out += engine.feed(ev, Position(self._file, max(0, log_pos - len(ev))))
        return out

    def _done(self, fut: asyncio.Future[list[bytes]], generation: int) -> None:
        if generation != self._generation:
            return
        link = self._link
        try:
            produced = fut.result()
            if produced:
                self.ingest.feed(produced)
            else:
                self.ingest.on_events(EventBatch())
        except Exception as exc:  # a failing rule, a bug or bad bytes: this stream ends
            if link is not None:
                link.fail(exc)
            return
        if link is not None:
            link.resume()
