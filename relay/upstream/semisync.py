"""Semi-sync: the relay as a primary's semi-sync replica.

With `SET @rpl_semi_sync_slave = 1` before the dump, a MariaDB primary running
`rpl_semi_sync_master_enabled` puts two bytes before every event: 0xEF and a flag whose bit
0 asks for an acknowledgement (set on the event that ends a transaction). The stream's
reader strips them and marks the events to acknowledge (relay.wire.dumpstream). The
replica answers, on the same connection, with a packet of sequence id 0: 0xEF, the
event's 8-byte end position in the primary's binlog and that binlog's name.

The relay answers only once the transaction is durable in its relay log under the
configured `sync` policy: the ack waits for the log's visible end (which the fsync worker
moves) to pass the transaction's end. A primary that waits for the ack
(rpl_semi_sync_master_wait_point = AFTER_SYNC) therefore never tells a client "committed"
about a transaction the relay could still lose; a failed fsync stops the visible end, so
no ack goes out for bytes that are not durable.
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from relay.binlog import walk
from relay.binlog.constants import HEADER_LEN, EventType
from relay.relaylog.durability import Position
from relay.relaylog.log import RelayLog
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import StreamLink, StreamStart
from relay.wire.dumpstream import SEMI_SYNC_MAGIC, EventBatch

log = logging.getLogger("relay.upstream")


@dataclass
class SemiSyncStats:
    acks_requested: int = 0
    acks_sent: int = 0
    last_ack: str = ""       # "file:pos" of the last acknowledged transaction


class SemiSyncSink:
    """An EventSink in front of the ingest: acknowledges each transaction the primary asks
    about once the relay log holds it durably."""

    def __init__(self, ingest: Ingest, relay_log: RelayLog, stats: SemiSyncStats) -> None:
        self.ingest = ingest
        self.log = relay_log
        self.stats = stats
        self.binlog_file = b""          # the primary's current binlog (from ROTATE events)
        self._pending: collections.deque[tuple[Position, int, bytes]] = collections.deque()
        self._link: StreamLink | None = None
        self._checksum = False
        self._unlisten: Callable[[], None] | None = None

    # --- EventSink ----------------------------------------------------------------------

    def on_stream(self, start: StreamStart) -> None:
        self._link = start.link
        self._checksum = start.checksum
        self._unlisten = self.log.visibility.add_listener(self._durable)
        self.ingest.on_stream(start)

    def on_events(self, batch: EventBatch) -> None:
        data = batch.data
        self._note_rotates(data)
        if not batch.acks:
            self.ingest.on_events(batch)
            return
        start = 0
        for offset in batch.acks:  # cut after each event the primary wants acknowledged
            end = offset + walk.event_size(data, offset)
            self.ingest.on_events(EventBatch(data[start:end]))
            self.stats.acks_requested += 1
            end_pos = struct.unpack_from("<I", data, offset + 13)[0]
            w = self.log.appender()
            self._pending.append(((w.number, w.committed), end_pos, self.binlog_file))
            start = end
        if start < len(data):
            self.ingest.on_events(EventBatch(data[start:]))
        self._durable(self.log.visible)  # sync = off: already durable when flushed

    async def on_end(self) -> None:
        self._pending.clear()
        self._link = None
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        await self.ingest.on_end()

    def _note_rotates(self, data: bytearray) -> None:
        for pos, size in walk.spans(data):
            if data[pos + 4] == EventType.ROTATE:
                tail = 4 if self._checksum else 0
                self.binlog_file = bytes(data[pos + HEADER_LEN + 8 : pos + size - tail])

    # --- acknowledgements ----------------------------------------------------------------

    def _durable(self, visible: Position) -> None:
        pending = self._pending
        link = self._link
        if not pending or link is None:
            return
        last: tuple[int, bytes] | None = None
        while pending and pending[0][0] <= visible:
            _, end_pos, name = pending.popleft()
            link.reply(bytes((SEMI_SYNC_MAGIC,)) + struct.pack("<Q", end_pos) + name)
            last = (end_pos, name)
            self.stats.acks_sent += 1
        if last is not None:
            self.stats.last_ack = f"{last[1].decode('utf-8', 'replace')}:{last[0]}"
