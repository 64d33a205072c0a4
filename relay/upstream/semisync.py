"""Semi-synchronous acknowledgement: the relay as a primary's semi-sync replica.

With `SET @rpl_semi_sync_slave = 1` before the dump, a MariaDB primary running
`rpl_semi_sync_master_enabled` puts two bytes before every event: 0xEF and a flag whose bit
0 asks for an acknowledgement (set on the event that ends a transaction). The replica
answers, on the same connection, with a packet of sequence id 0: 0xEF, the event's 8-byte
end position in the primary's binlog and that binlog's name.

The relay answers only once the transaction is durable in its relay log under the
configured `sync` policy: the ack waits for the log's visible end (which the fsync thread
moves) to pass the transaction's end. A primary that waits for the ack
(rpl_semi_sync_master_wait_point = AFTER_SYNC) therefore never tells a client "committed"
about a transaction the relay could still lose. Events take the protocol's per-packet path
here (the hot batch loop knows no semi-sync header); a semi-sync primary is bound by the
round trip, not by parsing.
"""

from __future__ import annotations

import collections
import logging
import struct
from dataclasses import dataclass

from relay.binlog.constants import HEADER_LEN, EventType
from relay.errors import RemoteProtocolError
from relay.relaylog.durability import Position
from relay.relaylog.log import RelayLog
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import SinkFront, UpstreamProtocol
from relay.wire.packets import frame

log = logging.getLogger("relay.upstream")

MAGIC = 0xEF
ACK_REQUESTED = 0x01


@dataclass
class SemiSyncStats:
    acks_requested: int = 0
    acks_sent: int = 0
    last_ack: str = ""       # "file:pos" of the last acknowledged transaction


class SemiSyncSink(SinkFront[Ingest]):
    """A DumpSink in front of the ingest: strips the semi-sync header, and acknowledges
    each transaction the primary asks about once the relay log holds it durably."""

    def __init__(self, ingest: Ingest, relay_log: RelayLog, stats: SemiSyncStats) -> None:
        self.ingest = ingest
        self.log = relay_log
        self.stats = stats
        self.binlog_file = b""          # the primary's current binlog (from ROTATE events)
        self._pending: collections.deque[tuple[Position, int, bytes]] = collections.deque()
        self._proto: UpstreamProtocol | None = None
        relay_log.on_durable.append(self._durable)

    # --- DumpSink ----------------------------------------------------------------------

    def feed_packets(self, buf: bytearray, mv: memoryview, pos: int, n: int,
                     seq: int) -> tuple[int, int]:
        return pos, seq  # every packet takes the protocol's per-packet path (feed_one)

    def feed_one(self, payload: bytes) -> None:
        if len(payload) >= 2 + HEADER_LEN and payload[0] == MAGIC:
            flag, event = payload[1], payload[2:]
        elif len(payload) >= HEADER_LEN and payload[4] == EventType.HEARTBEAT:
            flag, event = 0, payload
        else:
            raise RemoteProtocolError("semi-sync: an event packet without the 0xEF header")
        if event[4] == EventType.ROTATE:
            tail = 4 if self.ingest.session_checksum else 0
            self.binlog_file = bytes(event[HEADER_LEN + 8 : len(event) - tail])
        self.ingest.feed_one(event)
        if flag & ACK_REQUESTED:
            self.stats.acks_requested += 1
            end_pos = struct.unpack_from("<I", event, 13)[0]
            self._pending.append(((self.log.current_number, self.log.committed), end_pos,
                                  self.binlog_file))

    def end_batch(self) -> None:
        self.ingest.end_batch()
        self._durable(self.log.visible)  # sync = off: already durable when flushed

    def reset_connection(self) -> None:
        self.ingest.reset_connection()
        self._pending.clear()
        self._proto = None
        if self._durable in self.log.on_durable:
            self.log.on_durable.remove(self._durable)

    def attach(self, proto: UpstreamProtocol) -> None:
        self._proto = proto
        proto.loose_seq = True
        self.ingest.attach(proto)

    # --- acknowledgements ----------------------------------------------------------------

    def _durable(self, visible: Position) -> None:
        pending = self._pending
        proto = self._proto
        if not pending or proto is None or proto.transport is None:
            return
        out = bytearray()
        last: tuple[int, bytes] | None = None
        while pending and pending[0][0] <= visible:
            _, end_pos, name = pending.popleft()
            payload = bytes((MAGIC,)) + struct.pack("<Q", end_pos) + name
            data, _ = frame(payload, 0)  # a reply starts its own sequence
            out += data
            last = (end_pos, name)
            self.stats.acks_sent += 1
        if out:
            proto.transport.write(bytes(out))
            assert last is not None
            self.stats.last_ack = f"{last[1].decode('utf-8', 'replace')}:{last[0]}"
