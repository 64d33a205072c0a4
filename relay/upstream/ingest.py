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
from dataclasses import dataclass, field

from relay.binlog.constants import LOG_EVENT_ARTIFICIAL_F, EventType
from relay.binlog.events import Event, decode_fde, decode_rotate
from relay.binlog.group import GroupTracker
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


@dataclass
class IngestStats:
    events: int = 0
    bytes: int = 0
    by_type: dict[int, int] = field(default_factory=dict)
    heartbeats: int = 0
    last_event_ts: int = 0      # header timestamp of the newest transaction event
    last_seen_at: float = 0.0   # monotonic time of the newest event or heartbeat


class Ingest:
    def __init__(self, relay_log: RelayLog) -> None:
        self.log = relay_log
        self.tracker = GroupTracker()
        self.stats = IngestStats()
        self.upstream_file = ""
        self._fde: bytes | None = relay_log.fde
        self._checksum = relay_log.checksum
        self._headers: list[bytes] | None = None
        self._skipped = False
        self._rotate_pending = False
        self.session_checksum = False  # what @master_binlog_checksum agreed for this session

    def reset_connection(self) -> None:
        """The upstream connection ended: drop a half transaction and header state."""
        self.log.abort_group()
        self.tracker = GroupTracker()
        self._headers = None
        self._skipped = False

    def feed(self, events: list[memoryview]) -> None:
        """One batch of event payloads from the upstream; hot path."""
        log_ = self.log
        tracker = self.tracker
        stats = self.stats
        nbytes = 0
        for ev in events:
            typ = ev[4]
            if typ in _NON_GROUP and not tracker.in_group:
                self._non_group(ev, typ)
                continue
            size, log_pos = _POS.unpack_from(ev, 9)
            nbytes += size
            if typ in _GROUP_START:
                if tracker.in_group:
                    raise RemoteProtocolError("a transaction started before the previous ended")
                if self._headers is not None or log_.needs_segment:
                    self._place_segment()
                log_.begin_group()
            elif not tracker.in_group:
                raise RemoteProtocolError(
                    f"event type {typ} outside a transaction: the stream did not start at a "
                    "transaction boundary")
            log_.append(ev, log_pos, size)
            if tracker.feed(ev, self._checksum):
                log_.commit(tracker.gtid)
                stats.last_event_ts = _HDR.unpack_from(ev, 0)[0]
                if log_.end >= log_.segment_size:
                    log_.rotate_if_full()
        stats.events += len(events)
        stats.bytes += nbytes
        stats.last_seen_at = time.monotonic()
        if self._headers is not None and log_.needs_segment and self._fde is not None:
            # An idle primary: open the segment now so the log exists and shows where it
            # starts, rather than at the first transaction.
            self._place_segment()
        log_.flush()

    # --- the slow path: events that describe files, not transactions ------------------------

    def _non_group(self, ev: memoryview, typ: int) -> None:
        if typ in _IGNORED:
            if typ != EventType.START_ENCRYPTION:
                self.stats.heartbeats += 1
            return
        data = bytes(ev)
        flags = _HDR.unpack_from(data, 0)[5]
        log_pos = _HDR.unpack_from(data, 0)[4]
        if typ == EventType.ROTATE:
            rot = decode_rotate(Event(data, self._checksum_for(data)))
            if flags & LOG_EVENT_ARTIFICIAL_F or log_pos == 0:
                # The upstream (re)starts describing a file: its header events follow.
                self.upstream_file = rot.next_file
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
