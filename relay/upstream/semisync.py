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

End to end (`semi_sync_wait_for_replicas = N`): the ack also waits until N downstream
semi-sync replicas acknowledged the transaction to the relay (the relay log's
ReplicaAckBoard, where the downstream reports them). When they have not within
`semi_sync_timeout`, the relay acknowledges on durability alone, counted and logged, until
the replicas have caught up with what it acknowledged, as a primary falls back to
asynchronous replication and back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from relay.binlog import walk
from relay.binlog.constants import HEADER_LEN, EventType
from relay.binlog.position import LogPosition
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
    fallbacks: int = 0       # times semi_sync_timeout passed without the replicas' acks
    fallen_back: bool = False  # acknowledging on durability alone until replicas catch up


class SemiSyncSink:
    """An EventSink in front of the ingest: acknowledges each transaction the primary asks
    about once the relay log holds it durably."""

    def __init__(self, ingest: Ingest, relay_log: RelayLog, stats: SemiSyncStats, *,
                 wait_for_replicas: int = 0, timeout: float = 10.0) -> None:
        self.ingest = ingest
        self.log = relay_log
        self.stats = stats
        self.wait_for = wait_for_replicas  # downstream acks each transaction needs first
        self.timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._acked_upto: LogPosition = (0, 0)  # the last transaction acknowledged
        self._unlisten_replicas: Callable[[], None] | None = None
        self.binlog_file = b""          # the primary's current binlog (from ROTATE events)
        self._pending: collections.deque[tuple[LogPosition, int, bytes]] = collections.deque()
        self._link: StreamLink | None = None
        self._checksum = False
        self._unlisten: Callable[[], None] | None = None

    # --- EventSink ----------------------------------------------------------------------

    def on_stream(self, start: StreamStart) -> None:
        self._link = start.link
        self._checksum = start.checksum
        self._unlisten = self.log.visibility.add_listener(self._durable)
        if self.wait_for:
            self._unlisten_replicas = self.log.replica_acks.add_listener(self._replicas_moved)
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
            # where the transaction ended, even when the log rotated right after it
            self._pending.append((self.log.appender().last_commit, end_pos,
                                  self.binlog_file))
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
        if self._unlisten_replicas is not None:
            self._unlisten_replicas()
            self._unlisten_replicas = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.ingest.on_end()

    def _note_rotates(self, data: bytearray) -> None:
        for pos, size in walk.spans(data):
            if data[pos + 4] == EventType.ROTATE:
                tail = 4 if self._checksum else 0
                self.binlog_file = bytes(data[pos + HEADER_LEN + 8 : pos + size - tail])

    # --- acknowledgements ----------------------------------------------------------------

    def _durable(self, visible: LogPosition) -> None:
        del visible  # read again in _release, with the replicas' part
        self._release()

    def _release(self) -> None:
        """Acknowledge what is durable and, with semi_sync_wait_for_replicas, what enough
        downstream replicas acknowledged (or what waited past semi_sync_timeout)."""
        pending = self._pending
        link = self._link
        if link is None or not pending:
            return
        visible = self.log.visible
        gate = visible
        if self.wait_for and not self.stats.fallen_back:
            gate = min(visible, self.log.replica_acks.watermark(self.wait_for))
            if gate < pending[0][0] <= visible and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(
                    self.timeout, self._timed_out, pending[0][0])
        last: tuple[int, bytes] | None = None
        while pending and pending[0][0] <= gate:
            self._acked_upto, end_pos, name = pending.popleft()
            link.reply(bytes((SEMI_SYNC_MAGIC,)) + struct.pack("<Q", end_pos) + name)
            last = (end_pos, name)
            self.stats.acks_sent += 1
        if last is not None:
            self.stats.last_ack = f"{last[1].decode('utf-8', 'replace')}:{last[0]}"
            if self._timer is not None:  # what it waited for went out
                self._timer.cancel()
                self._timer = None
                self._release()  # the next one may start its own wait

    def _replicas_moved(self) -> None:
        """A downstream replica acknowledged more: after a fallback, once they have all
        the relay acknowledged, wait for them again."""
        stats = self.stats
        board = self.log.replica_acks
        if stats.fallen_back and board.replicas() >= self.wait_for and \
                board.watermark(self.wait_for) >= self._acked_upto:
            stats.fallen_back = False
            log.info("%d downstream semi-sync replica(s) caught up: acknowledging to the "
                     "primary after them again", self.wait_for)
        self._release()

    def _timed_out(self, waited_for: LogPosition) -> None:
        """semi_sync_timeout passed with a durable transaction still unacknowledged by the
        replicas: acknowledge on durability alone (as a primary falls back to async) until
        they catch up."""
        self._timer = None
        if not self._pending or self._pending[0][0] != waited_for:
            self._release()
            return
        self.stats.fallbacks += 1
        self.stats.fallen_back = True
        log.warning("no %d downstream semi-sync replica(s) acknowledged within %gs: "
                    "acknowledging to the primary once durable only, until they catch up",
                    self.wait_for, self.timeout)
        self._release()
