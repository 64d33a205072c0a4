"""Ingest: the upstream's event stream -> the relay log. The only writer of the log.

Per event it reads the header bytes it needs and nothing else. Transaction events are
appended as they come; a transaction becomes visible only when its last event is in.
Non-transaction events (FORMAT_DESCRIPTION, ROTATE, GTID_LIST, BINLOG_CHECKPOINT,
heartbeats) describe the upstream's files and are not copied: the log writes its own
segment headers, mirroring the upstream's when a new upstream file starts cleanly (so
the segment stays byte-aligned and no event needs rewriting).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from relay.binlog import build
from relay.binlog.constants import (
    FL_STANDALONE,
    LOG_EVENT_ARTIFICIAL_F,
    ROWS_EVENT_TYPES,
    EventType,
)
from relay.binlog.events import Event, decode_fde, decode_rotate
from relay.binlog.group import GroupTracker
from relay.binlog.gtid import Gtid
from relay.errors import RemoteProtocolError
from relay.relaylog.log import RelayLog

log = logging.getLogger("relay.upstream")

_GROUP_START = frozenset({EventType.GTID, EventType.MYSQL_GTID, EventType.ANONYMOUS_GTID,
                          EventType.GTID_TAGGED})
_HEADER_KEEP = frozenset({EventType.GTID_LIST, EventType.BINLOG_CHECKPOINT,
                          EventType.PREVIOUS_GTIDS})
_IGNORED = frozenset({EventType.HEARTBEAT, EventType.HEARTBEAT_V2, EventType.START_ENCRYPTION})
_NON_GROUP = frozenset({EventType.FORMAT_DESCRIPTION, EventType.ROTATE, EventType.STOP,
                        EventType.GTID_LIST, EventType.BINLOG_CHECKPOINT,
                        EventType.PREVIOUS_GTIDS}) | _IGNORED
_POS = struct.Struct("<II")
_HDR = struct.Struct("<IBIIIH")
# A dump packet from its first byte: length+seq, OK byte, then the event header's
# timestamp, type, server_id, event_size, log_pos.
_PKT = struct.Struct("<IBIBIII")
_GTID_BODY = struct.Struct("<QIB")  # seq_no, domain_id, flags2
_SLOW = _NON_GROUP | _GROUP_START
# Events inside a transaction that can neither open nor close one.
_PLAIN = ROWS_EVENT_TYPES | {EventType.TABLE_MAP, EventType.ANNOTATE_ROWS, EventType.ROWS_QUERY,
                             EventType.INTVAR, EventType.RAND, EventType.USER_VAR}
# Types that may close a transaction (GTID opens one and goes the slow way).
_BOUNDARY = frozenset({EventType.XID, EventType.QUERY, EventType.QUERY_COMPRESSED,
                       EventType.XA_PREPARE, EventType.INCIDENT,
                       EventType.TRANSACTION_PAYLOAD})


@dataclass
class IngestStats:
    events_by_type: list[int] = field(default_factory=lambda: [0] * 256)
    bytes_by_type: list[int] = field(default_factory=lambda: [0] * 256)
    heartbeats: int = 0
    last_event_ts: int = 0       # header timestamp of the newest transaction
    last_event_at: float = 0.0   # wall time when it arrived
    last_heartbeat_at: float = 0.0

    @property
    def events(self) -> int:
        return sum(self.events_by_type)

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_type)


class Ingest:
    def __init__(self, relay_log: RelayLog) -> None:
        self.log = relay_log
        self.tracker = GroupTracker()
        self.stats = IngestStats()
        self._fde: bytes | None = relay_log.fde
        self._checksum = relay_log.checksum
        self._headers: list[bytes] | None = None
        self._skipped = False
        self._rotate_pending = False
        self.session_checksum = False  # what @master_binlog_checksum agreed for this session

    def attach(self, proto: object) -> None:
        """The ingest needs nothing of the connection."""

    def reset_connection(self) -> None:
        """The upstream connection ended: drop a half transaction and header state."""
        self.log.abort_group()
        self.tracker = GroupTracker()
        self._headers = None
        self._skipped = False

    def feed(self, events: Sequence[bytes | memoryview]) -> None:
        """Feed whole events (tests and tools); the network path uses feed_packets."""
        buf = bytearray()
        seq = 0
        for ev in events:
            buf += (len(ev) + 1).to_bytes(3, "little") + bytes((seq,)) + b"\0" + ev
            seq = (seq + 1) & 0xFF
        with memoryview(buf) as mv:
            pos, _ = self.feed_packets(buf, mv, 0, len(buf), 0)
        if pos != len(buf):
            raise RemoteProtocolError("feed() takes event payloads below 16 MiB only")
        self.end_batch()

    def feed_packets(self, buf: bytearray, mv: memoryview, pos: int, n: int,
                     seq: int) -> tuple[int, int]:
        """Consume the dump packets in buf[pos:n] that each hold one whole event.

        Stops at an incomplete packet, or at one that is not a plain event packet (error,
        EOF, a 16 MiB split), and returns (pos, seq) there for the protocol to handle.
        This is the hot loop: one struct call per packet yields its length, sequence id,
        OK byte, event type, size and log_pos; only types that can open or close a
        transaction take a slower branch; aligned events are copied as they are.
        """
        log_ = self.log
        tracker = self.tracker
        wbuf = log_._wbuf  # the hot loop appends to the log's write buffer directly
        wend = log_.end
        unpack = _PKT.unpack_from
        gtid_body = _GTID_BODY.unpack_from
        ecount = self.stats.events_by_type
        ebytes = self.stats.bytes_by_type
        last_ts = 0
        try:
            while n - pos >= 22:
                lenseq, ok, ts, typ, server_id, size, log_pos = unpack(buf, pos)
                plen = lenseq & 0xFFFFFF
                end = pos + 4 + plen
                if end > n or ok != 0 or plen == 0xFFFFFF or plen != size + 1:
                    break
                if lenseq >> 24 != seq:
                    raise RemoteProtocolError(
                        f"packets out of order: got seq {lenseq >> 24}, expected {seq}")
                seq = (seq + 1) & 0xFF
                ecount[typ] += 1
                ebytes[typ] += size
                if typ in _PLAIN:
                    # Table maps, rows, annotations: the bulk of a stream. Append, next.
                    # (The append below is repeated on purpose: no boundary check here.)
                    if not tracker.in_group:
                        raise RemoteProtocolError(
                            f"event type {typ} outside a transaction: the stream did not "
                            "start at a transaction boundary")
                    wend += size
                    if log_pos == wend:
                        wbuf += mv[pos + 5 : end]
                    else:
                        wbuf += build.with_log_pos(mv[pos + 5 : end], wend, log_.checksum)
                        log_.stats.events_rewritten += 1
                    pos = end
                    continue
                closes = False
                if typ == EventType.GTID and not tracker.in_group and self._headers is None \
                        and not log_.needs_segment and size >= 32:
                    # The start of a MariaDB transaction, inline: the common case.
                    gseq, domain, flags2 = gtid_body(buf, pos + 24)
                    tracker.gtid = Gtid(domain, server_id, gseq)
                    tracker.in_group = True
                    tracker.standalone = bool(flags2 & FL_STANDALONE)
                    log_._group_start = wend
                    last_ts = ts
                elif typ == EventType.XID and tracker.in_group:
                    # The end of a transactional one, inline: committed once appended.
                    tracker.in_group = False
                    tracker.standalone = False
                    closes = True
                elif typ in _SLOW:
                    log_.end = wend
                    if not self._slow_event(mv[pos + 5 : end], typ, size, log_pos):
                        pos = end
                        wbuf = log_._wbuf
                        wend = log_.end
                        continue
                    wbuf = log_._wbuf
                    wend = log_.end
                    last_ts = ts
                elif not tracker.in_group:
                    raise RemoteProtocolError(
                        f"event type {typ} outside a transaction: the stream did not start at "
                        "a transaction boundary")
                wend += size
                if log_pos == wend:
                    wbuf += mv[pos + 5 : end]
                else:
                    wbuf += build.with_log_pos(mv[pos + 5 : end], wend, log_.checksum)
                    log_.stats.events_rewritten += 1
                if closes or (typ in _BOUNDARY and typ != EventType.XID
                              and tracker.feed(mv[pos + 5 : end], self._checksum)):
                    log_.end = wend
                    log_.commit(tracker.gtid)
                    if wend >= log_.segment_size:
                        log_.rotate_if_full()
                        wbuf = log_._wbuf
                        wend = log_.end
                pos = end
        finally:
            log_.end = wend
            if last_ts:
                self.stats.last_event_ts = last_ts
                self.stats.last_event_at = time.time()
        return pos, seq

    def _slow_event(self, ev: memoryview, typ: int, size: int, log_pos: int) -> bool:
        """Events that describe files, or that start a transaction. True: append it."""
        tracker = self.tracker
        if typ in _IGNORED:
            self._non_group(ev, typ)
            return False
        if typ in _GROUP_START:
            if tracker.in_group:
                raise RemoteProtocolError("a transaction started before the previous ended")
            if self._headers is not None or self.log.needs_segment:
                self._place_segment()
            self.log.begin_group()
            tracker.feed(ev, self._checksum)
            self.stats.last_event_ts = _HDR.unpack_from(ev, 0)[0]
            self.stats.last_event_at = time.time()
            return True
        if tracker.in_group:
            raise RemoteProtocolError(f"event type {typ} inside a transaction")
        self._non_group(ev, typ)
        return False

    def feed_one(self, ev: bytes) -> None:
        """One event that arrived outside feed_packets (split over 16 MiB packets)."""
        typ = ev[4]
        size, log_pos = _POS.unpack_from(ev, 9)
        if size != len(ev):
            raise RemoteProtocolError(f"event_size {size} but the packet holds {len(ev)} bytes")
        if typ in _SLOW:
            if not self._slow_event(memoryview(ev), typ, size, log_pos):
                return
        elif not self.tracker.in_group:
            raise RemoteProtocolError(f"event type {typ} outside a transaction")
        self.log.append(ev, log_pos, size)
        self.stats.events_by_type[typ] += 1
        self.stats.bytes_by_type[typ] += size
        if typ in _BOUNDARY and self.tracker.feed(ev, self._checksum):
            self.log.commit(self.tracker.gtid)
            self.log.rotate_if_full()

    def end_batch(self) -> None:
        """After each received batch: open a pending segment, hand bytes to the OS."""
        if self._headers is not None and self.log.needs_segment and self._fde is not None:
            # An idle primary: open the segment now so the log exists and shows where it
            # starts, rather than at the first transaction.
            self._place_segment()
        self.log.flush()

    # --- the slow path: events that describe files, not transactions ------------------------

    def _non_group(self, ev: memoryview, typ: int) -> None:
        if typ in _IGNORED:
            if typ != EventType.START_ENCRYPTION:
                self.stats.heartbeats += 1
                self.stats.last_heartbeat_at = time.time()
            return
        data = bytes(ev)
        flags = _HDR.unpack_from(data, 0)[5]
        log_pos = _HDR.unpack_from(data, 0)[4]
        if typ == EventType.ROTATE:
            rot = decode_rotate(Event(data, self._checksum_for(data)))
            if flags & LOG_EVENT_ARTIFICIAL_F or log_pos == 0:
                # The upstream (re)starts describing a file: its header events follow.
                self._headers = []
                self._skipped = rot.position > 4
                log.info("upstream streaming %s from position %d", rot.next_file, rot.position)
            else:
                # The upstream closed its file: so do we, and the next file's header comes.
                self._rotate_pending = True
                self.log.seal(_HDR.unpack_from(data, 0)[0])
            return
        if typ == EventType.STOP:
            self._rotate_pending = True
            return
        if typ == EventType.FORMAT_DESCRIPTION:
            self._fde = data
            self._checksum = decode_fde(data).has_crc
            if self._headers is None:
                self._headers = []
            self._headers.append(data)
            return
        if flags & LOG_EVENT_ARTIFICIAL_F:
            # The artificial GTID_LIST: the upstream skipped to our GTID position.
            self._skipped = True
            return
        if self._headers is not None and typ in _HEADER_KEEP:
            self._headers.append(data)

    def _checksum_for(self, data: bytes) -> bool:
        # The artificial ROTATE precedes the FDE and carries a CRC iff the session agreed one.
        if data[13:17] == b"\0\0\0\0":
            return self.session_checksum
        return self._checksum

    def _place_segment(self) -> None:
        """First transaction after a header block: continue the open segment, or open one."""
        headers = self._headers or []
        self._headers = None
        fde = self._fde
        if fde is None:
            raise RemoteProtocolError("transaction before any FORMAT_DESCRIPTION event")
        log_ = self.log
        if not log_.needs_segment and not self._rotate_pending and _same_format(fde, log_.fde):
            return  # a reconnect into the file we are already mirroring: keep appending
        if not log_.needs_segment:
            log_.seal(int(time.time()))
        self._rotate_pending = False
        clean = (not self._skipped and headers and headers[0][4] == EventType.FORMAT_DESCRIPTION
                 and _POS.unpack_from(headers[0], 9)[1] == 4 + len(headers[0]))
        log_.new_segment(fde, headers[1:] if clean else None)


def _same_format(a: bytes, b: bytes | None) -> bool:
    if b is None:
        return False
    fa, fb = decode_fde(a), decode_fde(b)
    return (fa.checksum_alg == fb.checksum_alg and fa.post_header_lens == fb.post_header_lens
            and fa.server_version == fb.server_version)
