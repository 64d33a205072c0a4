"""Ingest: the upstream's events -> the relay log. The log's writer while it follows a
primary.

Per event it reads the header fields it needs and nothing else. Transaction events are
appended as they come; a transaction becomes visible only when its last event is in.
Non-transaction events (FORMAT_DESCRIPTION, ROTATE, GTID_LIST, heartbeats) describe the
upstream's files and are not copied: they go to the log's segment placement
(relay/relaylog/placement.py), which decides where segments start and end and writes
their headers, mirroring the upstream's when a new upstream file starts cleanly (so the
segment stays byte-aligned and no event needs rewriting).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from relay.binlog.constants import HEADER_LEN, EventType
from relay.binlog.group import CAN_CLOSE, GROUP_START, PLAIN, GroupTracker
from relay.errors import RemoteProtocolError
from relay.kernels import scan_ingest
from relay.kernels.protocol import EventKind, PlanStep
from relay.relaylog.appender import Appender
from relay.relaylog.log import RelayLog
from relay.relaylog.placement import SegmentNaming, SegmentPlacement
from relay.upstream.protocol import StreamStart
from relay.wire.dumpstream import EventBatch, EventTally

log = logging.getLogger("relay.upstream")

_IGNORED = frozenset({EventType.HEARTBEAT, EventType.HEARTBEAT_V2, EventType.START_ENCRYPTION})
_NON_GROUP = frozenset({EventType.FORMAT_DESCRIPTION, EventType.ROTATE, EventType.STOP,
                        EventType.GTID_LIST, EventType.BINLOG_CHECKPOINT,
                        EventType.PREVIOUS_GTIDS}) | _IGNORED
_SLOW = frozenset(map(int, _NON_GROUP | GROUP_START))
# The hot loop's type tests as plain ints: an enum member is a class attribute lookup
# (about 85 ns against 15 for a global int), and set lookups of ints skip the subclass.
_GTID = int(EventType.GTID)
_XID = int(EventType.XID)
_PLAIN = frozenset(map(int, PLAIN))
_CAN_CLOSE = frozenset(map(int, CAN_CLOSE))
_HDR = struct.Struct("<IBIIIH")
# An event header from its first byte: timestamp, type, server_id, event_size, log_pos.
_EVENT = struct.Struct("<IBIII")
# What each type is to the scan kernel: the inline cases, and OTHER (the caller's).
_KINDS = bytes(EventKind.PLAIN if t in _PLAIN else EventKind.GTID if t == _GTID
               else EventKind.XID if t == _XID else EventKind.OTHER for t in range(256))
_COMMIT = int(PlanStep.COMMIT)


@dataclass(slots=True)
class IngestStats(EventTally):
    """What the upstream received (the dump reader tallies events by type into it)."""

    heartbeats: int = 0
    last_event_ts: int = 0       # header timestamp of the newest transaction
    last_event_at: float = 0.0   # wall time when it arrived
    last_heartbeat_at: float = 0.0


class Ingest:
    def __init__(self, relay_log: RelayLog, naming: SegmentNaming = SegmentNaming.OWN) -> None:
        self.log = relay_log
        self.tracker = GroupTracker()
        self.stats = IngestStats()
        # Where segments start and end (the log's policy, fed the upstream's file events)
        self.placement = SegmentPlacement(relay_log.fde, relay_log.checksum, naming)
        if naming is SegmentNaming.SOURCE and relay_log.segments \
                and not relay_log.appender().needs_segment:
            # The open segment holds the source's file of its name (a later file the
            # source names starts a segment of its own).
            self.placement.source_file = relay_log.segments.last
        self._session_checksum = False  # what @master_binlog_checksum agreed for the session

    # --- EventSink ------------------------------------------------------------------------

    def on_stream(self, start: StreamStart) -> None:
        self._session_checksum = start.checksum

    async def on_end(self) -> None:
        """The upstream connection ended: drop a half transaction and header state."""
        self.tracker = GroupTracker()
        self.placement.reset()
        await self.log.appender().abort_group()

    def feed(self, events: Sequence[bytes | memoryview]) -> None:
        """Whole events in (rules that made new events, tests and tools)."""
        self.on_events(EventBatch.of(list(events)))

    def on_events(self, batch: EventBatch) -> None:
        """The hot loop. The scan kernel (relay/kernels: compiled, or its pure twin) walks
        the batch and plans what the appender does for the events that need no Python of
        their own: a MariaDB GTID that opens a transaction, the plain events in it, the XID
        that commits it; with the reader's marks the plain events of a run placed as they
        came are not visited at all (the reader saw them follow each other in the
        primary's file, so they follow the visited one here too). The plan is applied
        here, and the event the scan stopped at (one that describes a file, opens a
        transaction another way, may close one, or breaks the stream) is taken one at a
        time as before, then the scan goes on."""
        w = self.log.appender()
        placement = self.placement
        data = batch.data
        n = len(data)
        mv = memoryview(data)
        marks = None if batch.marks is None else [*batch.marks, n]  # sentinel: the end
        mi = 0
        tracker = self.tracker
        begin, end_group = tracker.begin, tracker.end
        # A GTID is taken by the scan while no segment header is pending (checked again
        # after each slow event and rotation, the only places that change it).
        inline_gtid = not placement.pending and not w.needs_segment
        in_group = tracker.in_group  # kept in step with the tracker at each boundary
        wend = w.end
        unpack = _EVENT.unpack_from
        plan: list[tuple[int, ...]] = []
        last_ts = 0
        pos = run = 0  # data[run:pos] is appended but not yet copied to buf
        try:
            while pos < n:
                pos, mi, wend, in_group = scan_ingest(data, pos, marks, mi, _KINDS, wend,
                                                      in_group, inline_gtid, w.segment_size,
                                                      plan)
                filled = False
                if plan:
                    filled = plan[-1][0] == _COMMIT and wend >= w.segment_size
                    applied = w.apply(mv, run, plan, tracker.txn if tracker.in_group else None,
                                      wend)
                    plan.clear()
                    run = applied.run
                    if applied.ended:
                        end_group()
                    if applied.opened is not None:
                        begin(*applied.opened)
                    last_ts = applied.last_ts or last_ts
                if filled:
                    w.take(mv[run:pos])
                    run = pos
                    w.end = wend
                    w.rotate_if_full()
                    inline_gtid = not placement.pending and not w.needs_segment
                    wend = w.end
                    continue
                if pos >= n:
                    break
                # The event the scan stopped at, the Python way.
                if n - pos < HEADER_LEN:
                    raise RemoteProtocolError(f"an event header cut short at {pos} of a "
                                              f"{n}-byte batch")
                ts, typ, _server_id, size, log_pos = unpack(data, pos)
                end = pos + size
                if size < HEADER_LEN or end > n:
                    raise RemoteProtocolError(f"an event of {size} bytes at {pos} of a "
                                              f"{n}-byte batch")
                closes = False
                if typ in _PLAIN:
                    if not in_group:
                        raise RemoteProtocolError(
                            f"event type {typ} outside a transaction: the stream did not "
                            "start at a transaction boundary")
                elif typ in _SLOW:
                    w.take(mv[run:pos])
                    run = pos
                    w.end = wend
                    keep = self._slow_event(w, mv[pos:end], typ)
                    in_group = tracker.in_group
                    inline_gtid = not placement.pending and not w.needs_segment
                    wend = w.end
                    if not keep:
                        run = pos = end
                        continue
                    last_ts = ts
                elif not in_group:
                    raise RemoteProtocolError(
                        f"event type {typ} outside a transaction: the stream did not start at "
                        "a transaction boundary")
                elif typ in _CAN_CLOSE:
                    closes = tracker.feed(mv[pos:end], placement.checksum)
                    in_group = tracker.in_group
                wend += size
                if log_pos != wend:
                    w.take(mv[run:pos])
                    w.take_rewritten(mv[pos:end], wend)
                    run = end
                pos = end
                if closes:
                    w.end = wend
                    w.commit(tracker.txn)
                    if wend >= w.segment_size:
                        w.take(mv[run:pos])
                        run = pos
                        w.rotate_if_full()
                        inline_gtid = not placement.pending and not w.needs_segment
                        wend = w.end
            if pos > run:  # the batch's last run, written from the batch itself
                w.write_through(mv[run:pos])
                run = pos
        finally:
            w.take(mv[run:pos])  # what an error left unwritten (the group is aborted)
            mv.release()
            w.end = wend
            if last_ts:
                self.stats.last_event_ts = last_ts
                self.stats.last_event_at = time.time()
        self._end_batch(w)

    def _end_batch(self, w: Appender) -> None:
        """After each batch: open a pending segment, hand bytes to the OS."""
        self.placement.end_of_batch(w)
        w.finish()

    def _slow_event(self, w: Appender, ev: memoryview, typ: int) -> bool:
        """Events that describe files, or that start a transaction. True: append it."""
        tracker = self.tracker
        if typ in _IGNORED:
            self._non_group(w, ev, typ)
            return False
        if typ in GROUP_START:
            if tracker.in_group:
                raise RemoteProtocolError("a transaction started before the previous ended")
            self.placement.before_transaction(w)
            w.begin_group()
            tracker.feed(ev, self.placement.checksum)
            self.stats.last_event_ts = _HDR.unpack_from(ev, 0)[0]
            self.stats.last_event_at = time.time()
            return True
        if tracker.in_group:
            raise RemoteProtocolError(f"event type {typ} inside a transaction")
        self._non_group(w, ev, typ)
        return False

    # --- the slow path: events that describe files, not transactions ------------------------

    def _non_group(self, w: Appender, ev: memoryview, typ: int) -> None:
        if typ in _IGNORED:
            if typ != EventType.START_ENCRYPTION:
                self.stats.heartbeats += 1
                self.stats.last_heartbeat_at = time.time()
            return
        data = bytes(ev)
        self.placement.file_event(w, data, typ, self._checksum_for(data))

    def _checksum_for(self, data: bytes) -> bool:
        # The artificial ROTATE precedes the FDE and carries a CRC iff the session agreed one.
        if data[13:17] == b"\0\0\0\0":
            return self._session_checksum
        return self.placement.checksum
