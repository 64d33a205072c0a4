"""Receive rules: between the primary's stream and the relay log.

Without receive rules the ingest's hot loop copies packets straight into the log. With
them, this sink takes the place of the ingest on the connection: it cuts each received
batch into events, runs the chain over them in a worker thread (rules cost CPU and a hook
must not hold up the event loop) while the connection stops reading, and hands what comes
out to the ingest, which places and commits it as it does any event. One batch is in
flight at a time, so order is kept; the primary waits on TCP meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from relay.binlog.changes import Position
from relay.binlog.checksum import verify
from relay.binlog.constants import CRC_LEN, HEADER_LEN, EventType
from relay.errors import HookError, RemoteProtocolError
from relay.rules.engine import RuleStream
from relay.rules.runtime import ChainHandle, Rules
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import SinkFront, UpstreamProtocol
from relay.wire.codec import MAX_PACKET

log = logging.getLogger("relay.upstream")


class RulesSink(SinkFront[Ingest]):
    def __init__(self, ingest: Ingest, rules: Rules, executor: Executor) -> None:
        self.ingest = ingest
        self.rules = rules
        self.executor = executor
        self._handle: ChainHandle = rules.chain("receive")
        self._engine = RuleStream(self._handle.chain)
        self._batch: list[bytes] = []
        self._generation = 0
        self._proto: UpstreamProtocol | None = None
        self._file = ""

    # --- DumpSink --------------------------------------------------------------------------

    def attach(self, proto: UpstreamProtocol) -> None:
        self._proto = proto

    def feed_packets(self, buf: bytearray, mv: memoryview, pos: int, n: int,
                     seq: int) -> tuple[int, int]:
        while n - pos >= 5:
            plen = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
            end = pos + 4 + plen
            if end > n or plen == MAX_PACKET or buf[pos + 4] != 0 or plen < 20:
                break
            if buf[pos + 3] != seq:
                raise RemoteProtocolError(f"packets out of order: got seq {buf[pos + 3]}, "
                                          f"expected {seq}")
            seq = (seq + 1) & 0xFF
            self._batch.append(bytes(mv[pos + 5 : end]))
            pos = end
        return pos, seq

    def feed_one(self, ev: bytes) -> None:
        self._batch.append(ev)

    def end_batch(self) -> None:
        if not self._batch:
            self.ingest.end_batch()
            return
        batch, self._batch = self._batch, []
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.transport.pause_reading()
        loop = asyncio.get_running_loop()
        gen = self._generation
        fut = loop.run_in_executor(self.executor, self._apply, batch)
        fut.add_done_callback(lambda f: self._done(f, gen))

    def reset_connection(self) -> None:
        self._generation += 1  # a batch still in flight is for a connection now gone
        self._batch = []
        self.rules.release(self._handle.chain)
        self._handle = self.rules.chain("receive")
        self._engine = RuleStream(self._handle.chain)
        self.ingest.reset_connection()

    def close(self) -> None:
        self.rules.release(self._handle.chain)

    # --- the work ----------------------------------------------------------------------------

    def _apply(self, batch: list[bytes]) -> list[bytes]:
        engine = self._engine
        out: list[bytes] = []
        for data in batch:
            if data[4] == EventType.ROTATE:  # the file the positions below are in
                name = data[HEADER_LEN + 8 : len(data) - (CRC_LEN if verify(data) else 0)]
                self._file = name.decode("utf-8", "replace")
            if self.rules.version != self._handle.version and not engine.in_transaction:
                self.rules.release(self._handle.chain)
                self._handle = self.rules.chain("receive")
                engine.set_chain(self._handle.chain)
            log_pos = int.from_bytes(data[13:17], "little")
            out += engine.feed(data, Position(self._file, max(0, log_pos - len(data))))
        return out

    def _done(self, fut: asyncio.Future[list[bytes]], generation: int) -> None:
        if generation != self._generation:
            return
        proto = self._proto
        try:
            produced = fut.result()
        except HookError as exc:
            if proto is not None:
                proto.fail(exc)
            return
        except Exception as exc:  # a bug or bad bytes: this connection ends, reported
            if proto is not None:
                proto.fail(exc)
            return
        small: list[bytes] = []
        try:
            for ev in produced:
                if len(ev) + 1 >= MAX_PACKET:
                    if small:
                        self.ingest.feed(small)
                        small = []
                    self.ingest.feed_one(ev)
                else:
                    small.append(ev)
            if small:
                self.ingest.feed(small)
            self.ingest.end_batch()
        except Exception as exc:
            if proto is not None:
                proto.fail(exc)
            return
        if proto is not None and proto.transport is not None and not proto.closed.done():
            proto.transport.resume_reading()
