"""TapStore: the tap's view of the relay log. Blocking; the tap server calls it from its
worker threads (several at once: a lock guards the index).

It keeps a transaction index per segment, built by walking the events once (sealed
segments once and for all, the open one as it grows): where each transaction starts and
ends and how many row changes it holds (rows are counted by a decoder that keeps no
column, about 2M rows/s), and the latest TABLE_MAP of each table (for typed schemas).
From it the store answers what the tap protocol asks: first and last positions, the
boundary a batch of at most N rows ends at, partitions of a range, and the raw bytes of
a range of whole transactions, cut into frames at event boundaries. Segments are read
through relaylog's registered segment readers, like every other reader of the log.

For a reader whose rules change what it gets, `plan` and `checksum` take a stream of its
rules (relay/tap/rules.py) and count and hash what comes out of it, transaction by
transaction, as a fetch would send it: a transaction the rules leave as it is (or only
without its annotations, which every rule that hides data drops) keeps the index's
count; the others' rows are counted on what the rules let through. That costs a pass
over the range through the rules; without rules the index answers alone. A fetch counts
what it sends in its own pass the same way (`read_raw`'s tally), not in a pass of its own.

Memory: 24 bytes per transaction (three int64 arrays).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import threading
from array import array
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from relay.binlog import walk
from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.group import GroupTracker
from relay.binlog.gtid import GtidPosition, GtidState
from relay.binlog.rows import ROWS_TYPES
from relay.binlog.tablemap import TableMap
from relay.errors import MalformedEvent
from relay.relaylog import gtid_index
from relay.relaylog.cursor import SegmentReader
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import segment_header
from relay.rules.engine import RuleStream
from relay.tap.protocol import TapError, position, position_text, split_position

log = logging.getLogger("relay.tap")
E = EventType
# The index walk's type tests as plain ints (an enum member is a class attribute lookup,
# about 80 ns, on every event).
_GTIDS = frozenset(map(int, (E.GTID, E.MYSQL_GTID, E.ANONYMOUS_GTID, E.GTID_TAGGED)))
_TABLE_MAP = int(E.TABLE_MAP)
_FDE = int(E.FORMAT_DESCRIPTION)
_ANNOTATIONS = frozenset(map(int, (E.ANNOTATE_ROWS, E.ROWS_QUERY)))
_NO_COLUMNS: frozenset[str] = frozenset()
READ_BLOCK = 1 << 20


@dataclass
class SegmentIndex:
    name: str
    number: int
    starts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    rows: array[int] = field(default_factory=lambda: array("q"))  # cumulative
    scanned: int = 0                      # offset the walk reached (a group boundary)
    tables: dict[str, bytes] = field(default_factory=dict)  # latest TABLE_MAP by name
    # Each distinct map of a table in this segment, in order (ALTER TABLE makes another).
    versions: dict[str, list[tuple[TableMap, bytes]]] = field(default_factory=dict)
    decoder: StreamDecoder | None = None
    tracker: GroupTracker = field(default_factory=GroupTracker)
    open_start: int = -1                  # start of the group the walk is inside
    open_rows: int = 0
    complete: bool = False                # sealed and walked to its end
    state: GtidPosition = field(default_factory=GtidState)  # after the last walked one
    last_gtid: str | None = None

    @property
    def count(self) -> int:
        return len(self.ends)

    def rows_before(self, i: int) -> int:
        return self.rows[i - 1] if i > 0 else 0


@dataclass
class Tally:
    """What a read_raw sent, counted as it goes: the transactions of its range, and the
    rows of the rows events that went out (through the reader's rules when it has any;
    an event the codec cannot walk without type hints counts as one, as the index
    counts)."""

    transactions: int = 0
    rows: int = 0


@dataclass(frozen=True)
class Slice:
    """Transactions lo..hi-1 of one segment."""

    seg: SegmentIndex
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.seg.rows_before(self.hi) - self.seg.rows_before(self.lo)

    @property
    def start_offset(self) -> int:
        return self.seg.starts[self.lo]

    @property
    def end_offset(self) -> int:
        return self.seg.ends[self.hi - 1]


class TapStore:
    def __init__(self, log: RelayLog, frame_bytes: int = 1 << 20) -> None:
        self.log = log
        self.frame_bytes = frame_bytes
        self._segments: dict[str, SegmentIndex] = {}
        self._lock = threading.Lock()
        self.rows_counted = 0
        self.estimated = 0          # rows events whose rows could not be counted
        self._warned: set[str] = set()

    # --- the index ---------------------------------------------------------------------

    def refresh(self) -> list[SegmentIndex]:
        """Walk what the log made visible since the last call; the segments, in order."""
        with self._lock:
            segments = self.log.segments
            names = segments.names
            vis_seg = self.log.visible[0]
            for gone in set(self._segments) - set(names):
                del self._segments[gone]
            out = []
            for name in names:
                number = segments.number_of(name)
                if number > vis_seg:
                    break
                idx = self._segments.get(name)
                if idx is None:
                    idx = self._segments[name] = SegmentIndex(name, number)
                if not idx.complete:
                    self._walk(idx)
                out.append(idx)
            return out

    def _walk(self, idx: SegmentIndex) -> None:
        sealed = idx.number < self.log.visible[0]
        if idx.decoder is None:
            header = segment_header(self.log, idx.name)
            idx.decoder = StreamDecoder()
            idx.decoder.format_description(header.fde)
            idx.scanned = header.header_end
            idx.state = header.state.copy()
        decoder = idx.decoder
        with SegmentReader(self.log, idx.name, reader="tap index") as seg:
            limit = seg.size
            if idx.scanned >= limit:
                idx.complete = sealed
                return
            tracker = idx.tracker
            checksum = decoder.checksum
            pos = idx.scanned
            for pos, data in seg.events(idx.scanned, limit, READ_BLOCK):
                typ = data[4]
                if typ in _GTIDS:
                    idx.open_start = pos
                    idx.open_rows = 0
                elif typ == _TABLE_MAP:
                    table = decoder.table(decoder.remember_table_map(data))
                    idx.tables[table.qualified] = data
                    known = idx.versions.setdefault(table.qualified, [])
                    if not known or (known[-1][0] is not table
                                     and known[-1][0].columns != table.columns):
                        known.append((table, data))
                elif typ in ROWS_TYPES:
                    idx.open_rows += self._count_rows(decoder, data, seg.path, pos)
                elif typ == _FDE:
                    decoder.format_description(data)
                    checksum = decoder.checksum
                if tracker.feed(data, checksum) and idx.open_start >= 0:
                    if tracker.txn is not None:
                        idx.state.update(tracker.txn)
                        idx.last_gtid = str(tracker.txn)
                    idx.starts.append(idx.open_start)
                    idx.rows.append(idx.rows_before(idx.count) + idx.open_rows)
                    idx.ends.append(pos + len(data))
                    idx.open_start = -1
                idx.scanned = pos + len(data)
        idx.complete = sealed

    def _count_rows(self, decoder: StreamDecoder, data: bytes, path: str, pos: int) -> int:
        try:
            n = _rows_in(decoder, data)
        except MalformedEvent as exc:
            table = decoder.table(decoder.rows_event(data).table_id)
            # Rows the codec cannot walk without type hints (MariaDB's old temporal
            # formats): counted as one. Counts only plan batches; the readers decode
            # with their own hints.
            n = 1
            self.estimated += 1
            if table.qualified not in self._warned:
                self._warned.add(table.qualified)
                log.warning("tap: rows of %s counted as one per event (%s at %s offset %d); "
                            "batch sizes are estimates there", table.qualified, exc, path, pos)
        self.rows_counted += n
        return n

    # --- positions -----------------------------------------------------------------------

    def bounds(self) -> tuple[int, int, int]:
        """(first position, last position, transactions): the start of the first retained
        transaction and the end of the last one (both 0 when there are none)."""
        segs = self.refresh()
        first = next((position(s.number, s.starts[0]) for s in segs if s.count), 0)
        last = next((position(s.number, s.ends[-1]) for s in reversed(segs) if s.count), 0)
        return first, last, sum(s.count for s in segs)

    def visible_gtids(self) -> tuple[str, str | None]:
        """(GTID state, last GTID) at the last position the tap serves."""
        segs = self.refresh()
        if not segs:
            return "", None
        last = next((s.last_gtid for s in reversed(segs) if s.last_gtid), None)
        return str(segs[-1].state), last

    def gtid_at(self, pos: int) -> str:
        """The GTID state (a MariaDB GTID position or a MySQL GTID set, as the log's
        flavour writes it) of the transactions before boundary `pos`: its segment's
        starting state and the transactions of the segment's GTID index that end at or
        before `pos`. 0 (the "earliest" of an empty log) is the log's starting state."""
        self.check(pos, "position")
        segs = self.refresh()
        if not segs:
            return ""
        seg_no, off = split_position(pos)
        seg = next((s for s in segs if s.number == seg_no), segs[0] if pos == 0 else None)
        if seg is None:  # (purged since the check)
            raise TapError("not_in_log", f"position {pos} ({position_text(pos)}) is no "
                                         "longer in the log")
        with self._lock:  # the walk's own state at its last transaction's end
            if seg.count and seg.ends[-1] == off:
                return str(seg.state)
        state = segment_header(self.log, seg.name).state.copy()
        if pos == 0:
            return str(state)
        for entry in gtid_index.read_entries(self.log.path_of(seg.name)):
            if entry.end > off:
                break
            state.update(entry.txn)
        return str(state)

    def check(self, pos: int, what: str) -> None:
        """`pos` must be a transaction boundary this log holds: the start or end of one of
        its transactions (0 stands for "earliest")."""
        if pos == 0:
            return
        segs = self.refresh()
        seg_no, off = split_position(pos)
        first, last, _ = self.bounds()
        if first and pos < first:
            raise TapError("not_in_log", f"{what} {pos} ({position_text(pos)}) is before the "
                                         f"first position the log holds ({first}); it was "
                                         "purged or belongs to another log")
        if pos > last:
            raise TapError("not_in_log", f"{what} {pos} ({position_text(pos)}) is past the "
                                         f"end of the log ({last})")
        for s in segs:
            if s.number == seg_no:
                i = bisect.bisect_left(s.ends, off)
                if i < s.count and s.ends[i] == off:
                    return
                j = bisect.bisect_left(s.starts, off)
                if j < s.count and s.starts[j] == off:
                    return
        raise TapError("not_in_log", f"{what} {pos} ({position_text(pos)}) is not a "
                                     "transaction boundary of this log")

    def slices(self, start: int, end: int) -> list[Slice]:
        """The transactions that start at or after `start` and end at or before `end`."""
        out = []
        for s in self.refresh():
            if not s.count:
                continue
            base = position(s.number, 0)
            if position(s.number, s.ends[-1]) <= start or base + s.starts[0] >= end:
                continue
            lo = bisect.bisect_left(s.starts, max(start - base, 0))
            hi = bisect.bisect_right(s.ends, end - base) if end - base < 1 << 32 else s.count
            if lo < hi:
                out.append(Slice(s, lo, hi))
        return out

    def plan(self, start: int, end: int, max_rows: int | None, split_rows: int | None,
             stream: RuleStream | None = None) -> dict[str, Any]:
        """How far a batch from `start` goes: to `end`, or less so it holds at most
        `max_rows` rows (but always whole transactions, and at least one with rows); and
        its cut into parts of about `split_rows` rows, at transaction boundaries. Rows are
        counted as `stream` (a reader's rules) lets them through, when given."""
        if stream is not None:
            with contextlib.closing(self._through(start, end, stream)) as through:
                return _plan_of(start, ((pos, n) for pos, n, _, _ in through), max_rows,
                                split_rows)
        big = 1 << 62
        stop, rows, txs = start, 0, 0
        parts: list[list[int]] = []
        part_start, part_rows = start, 0
        for sl in self.slices(start, end):
            s = sl.seg
            base = position(s.number, 0)
            i = sl.lo
            while i < sl.hi:
                if max_rows is not None and rows >= max_rows:
                    break
                take = min(big if max_rows is None else max_rows - rows,
                           big if split_rows is None else split_rows - part_rows)
                j = bisect.bisect_right(s.rows, s.rows_before(i) + take, i, sl.hi)
                if j == i:  # the next transaction alone is over the limit
                    if max_rows is not None and rows and \
                            rows + s.rows_before(i + 1) - s.rows_before(i) > max_rows:
                        break
                    j = i + 1  # it goes whole (a limit is a target, not a cut)
                n = s.rows_before(j) - s.rows_before(i)
                rows += n
                part_rows += n
                txs += j - i
                stop = base + s.ends[j - 1]
                i = j
                if split_rows is not None and part_rows >= split_rows:
                    parts.append([part_start, stop, part_rows])
                    part_start, part_rows = stop, 0
            else:
                continue
            break
        if stop > part_start:
            parts.append([part_start, stop, part_rows])
        return {"start": start, "end": stop, "rows": rows, "transactions": txs,
                "parts": parts}

    def resolve_gtid(self, text: str) -> int:
        """The position to start at for a reader that has the transactions in GTID state
        `text`: the start of the first transaction it lacks (the end of the log when it
        has them all)."""
        try:
            state = self.log.flavour.parse(text)
        except ValueError as exc:
            raise TapError("bad_request", f"not a GTID position: {text!r} ({exc})") from None
        self._check_held(state, text)
        for s in self.refresh():
            path = self.log.path_of(s.name)
            for entry in gtid_index.read_entries(path):
                if not state.contains(entry.txn):
                    return position(s.number, entry.start)
        return self.bounds()[1]

    def watermark(self, target: GtidPosition) -> tuple[int, int] | None:
        """Where GTID state `target` (a snapshot's read view) lies in the log: (low,
        high), high the end of the last transaction `target` holds and low the start of
        the first one it lacks, lowered to high when that is later (the usual case: the
        log has target's transactions first, so the window (low, high] is empty). None
        while the log does not hold all of `target` yet. Scans from the newest segment
        whose starting state `target` covers."""
        segs = self.refresh()
        if not segs:
            return None
        end_state = segs[-1].state
        if type(end_state) is not type(target) or not end_state.covers(target):
            return None
        first = 0
        for i in range(len(segs) - 1, -1, -1):
            if target.covers(segment_header(self.log, segs[i].name).state):
                first = i
                break
        low: int | None = None
        # Until a transaction of `target` is found: the start of that segment (every
        # transaction before it is in `target`).
        high = position(segs[first].number, segment_header(self.log, segs[first].name)
                        .header_end)
        for s in segs[first:]:
            if not s.count:
                continue
            last_end = s.ends[-1]
            for entry in gtid_index.read_entries(self.log.path_of(s.name)):
                if entry.end > last_end:  # written, not yet visible to readers
                    break
                if target.contains(entry.txn):
                    high = position(s.number, entry.end)
                elif low is None:
                    low = position(s.number, entry.start)
        return (high if low is None else min(low, high)), high

    def _check_held(self, state: GtidPosition, text: str) -> None:
        """A GTID start must lie within the log: not past its end (transactions it has
        not received) and not before its start (ones it never had, or purged): either
        would silently skip transactions."""
        segs = [s for s in self.refresh() if s.count]
        if not segs:
            return
        end = segs[-1].state
        missing = end.first_missing(state)
        if missing is not None:
            raise TapError("not_in_log", f"start {text} is past the end of the relay log "
                                         f"(it lacks {missing}, which the log holds up to "
                                         f"{end}): a GTID start means after that "
                                         "transaction, and the relay has not received it")
        begin = segment_header(self.log, segs[0].name).state
        if state.covers(begin):
            return
        first = next(iter(gtid_index.read_entries(self.log.path_of(segs[0].name))), None)
        raise TapError("not_in_log", f"start {text} is older than the relay log, which "
                                     f"begins after {begin or 'nothing'} (its first "
                                     f"transaction is {first.txn if first else 'unknown'}): "
                                     "the transactions between were never in it or were "
                                     "purged. Start from \"earliest\" or take a snapshot "
                                     "(snapshot = \"when_needed\")")

    # --- reading -----------------------------------------------------------------------------

    def fde_of(self, seg: SegmentIndex) -> bytes:
        return segment_header(self.log, seg.name).fde

    def read_raw(self, start: int, end: int, stream: RuleStream | None = None,
                 reader: str = "tap", tally: Tally | None = None,
                 ) -> Iterator[dict[str, Any]]:
        """Frames of the raw events of the transactions in [start, end): for each segment
        {"k": "fde", ...} first, then {"k": "raw", "seg", "n", "data", "txs", "whole"}
        with whole events up to about frame_bytes (a larger event goes alone): "n" numbers
        the frames of the response, "txs" lists the end offsets of the transactions that
        start in the frame, and "whole" says the frame ends at a transaction's end (a
        huge transaction spans frames until one says so). With `stream` (the rules of
        this reader), the events go through the rules first; emptied transactions stay
        (as GTID + XID), so "txs" still matches.

        `tally` counts what goes out as it goes. Without rules the index has the rows.
        Through rules, frames end at a transaction's end where one ends within
        frame_bytes, so a frame the rules left as it was (or only without its
        annotations) takes the index's count; the rows of any other frame are counted on
        what goes out (a decoder that keeps no column), in the same pass."""
        frame_no = 0
        counting = tally is not None and stream is not None
        stripped = stream is not None and stream.chain.annotation_drop is not None
        for sl in self.slices(start, end):
            s = sl.seg
            fde = self.fde_of(s)
            yield {"k": "fde", "seg": s.number, "data": fde}
            decoder = StreamDecoder()  # counts the rows of what the rules let out
            if stream is not None:  # its decoder learns the format (the frame above has it)
                stream.feed_chunk(fde, s.name, 4)
                decoder.format_description(fde)
            lo_off = s.starts[sl.lo]
            hi_off = s.ends[sl.hi - 1]
            with SegmentReader(self.log, s.name, reader=reader) as seg:
                pos = lo_off
                aligned = True  # `pos` is where a transaction (or what precedes it) starts
                while pos < hi_off:
                    chunk = seg.pread(pos, min(self.frame_bytes, hi_off - pos))
                    used = walk.whole(chunk, where=seg.path, base=pos)
                    if counting:  # up to the last transaction that ends in it, if one does
                        k = bisect.bisect_right(s.ends, pos + used, sl.lo, sl.hi) - 1
                        if k >= sl.lo and s.ends[k] > pos:
                            used = s.ends[k] - pos
                    if used == 0:  # one event larger than a frame
                        size = walk.event_size(chunk, 0)
                        chunk = seg.pread(pos, size)
                        used = size
                    chunk = chunk[:used]
                    a = bisect.bisect_left(s.starts, pos, sl.lo, sl.hi)
                    b = bisect.bisect_left(s.starts, pos + used, sl.lo, sl.hi)
                    data = chunk
                    if stream is not None:
                        data = b"".join(stream.feed_chunk(chunk, s.name, pos))
                    j = bisect.bisect_left(s.ends, pos + used, sl.lo, sl.hi)
                    whole = j < sl.hi and s.ends[j] == pos + used
                    if tally is not None:
                        tally.transactions += b - a
                        if stream is None:
                            tally.rows += s.rows_before(b) - s.rows_before(a)
                        elif aligned and whole:
                            first = bisect.bisect_right(s.ends, pos, sl.lo, sl.hi)
                            tally.rows += _rows_of_whole(s, first, j + 1, pos, chunk, data,
                                                         decoder, stripped)
                        else:
                            tally.rows += _rows_out(decoder, data)
                    pos += used
                    aligned = whole
                    yield {"k": "raw", "seg": s.number, "n": frame_no, "data": data,
                           "txs": s.ends[a:b].tolist(), "whole": whole}
                    frame_no += 1
            if stream is not None:
                rest = b"".join(stream.flush())
                if rest:
                    if tally is not None:
                        tally.rows += _rows_out(decoder, rest)
                    yield {"k": "raw", "seg": s.number, "n": frame_no, "data": rest,
                           "txs": [], "whole": True}
                    frame_no += 1

    def checksum(self, start: int, end: int, stream: RuleStream | None = None
                 ) -> dict[str, Any]:
        """A SHA-256 over the range's transactions as the primary wrote them (or as
        `stream`, a reader's rules, lets them through): each event without its log_pos and
        CRC, so two relays of the same primary (whose segments are cut and numbered
        differently) agree on the same transactions."""
        if stream is not None:
            return self._checksum_through(start, end, stream)
        h = hashlib.sha256()
        txs = rows = nbytes = 0
        for sl in self.slices(start, end):
            s = sl.seg
            checksum = StreamDecoder()
            checksum.format_description(self.fde_of(s))
            crc = 4 if checksum.checksum else 0
            txs += sl.hi - sl.lo
            rows += sl.rows
            with SegmentReader(self.log, s.name, reader="tap checksum") as seg:
                for _pos, ev in seg.events(sl.start_offset, sl.end_offset, READ_BLOCK):
                    h.update(ev[:13])
                    h.update(ev[17 : len(ev) - crc])
                    nbytes += len(ev)
        return {"sha256": h.hexdigest(), "transactions": txs, "rows": rows, "bytes": nbytes}

    def _checksum_through(self, start: int, end: int, stream: RuleStream) -> dict[str, Any]:
        h = hashlib.sha256()
        txs = rows = nbytes = 0
        with contextlib.closing(self._through(start, end, stream)) as through:
            for _pos, n, out, crc in through:
                txs += 1
                rows += n
                nbytes += len(out)
                for at, size in walk.spans(out, where="tap checksum"):
                    h.update(out[at : at + 13])
                    h.update(out[at + 17 : at + size - crc])
        return {"sha256": h.hexdigest(), "transactions": txs, "rows": rows, "bytes": nbytes}

    def _through(self, start: int, end: int, stream: RuleStream
                 ) -> Generator[tuple[int, int, bytes, int], None, None]:
        """(end position, rows, the events out, their CRC size) of each transaction of
        [start, end) as `stream` lets it through (an emptied one too: its GTID and XID).
        The events between two transactions go with the second, as a fetch sends them."""
        stripped = stream.chain.annotation_drop is not None
        for sl in self.slices(start, end):
            s = sl.seg
            fde = self.fde_of(s)
            stream.feed_chunk(fde, s.name, 4)  # its decoder learns the format (not a change)
            decoder = StreamDecoder()          # counts the rows of what comes out
            decoder.format_description(fde)
            crc = 4 if decoder.checksum else 0
            base = position(s.number, 0)
            with SegmentReader(self.log, s.name, reader="tap rules") as seg:
                i, at = sl.lo, s.starts[sl.lo]
                while i < sl.hi:
                    # whole transactions, about READ_BLOCK bytes of them (at least one)
                    j = max(i + 1, bisect.bisect_right(s.ends, at + READ_BLOCK, i, sl.hi))
                    block = seg.pread(at, s.ends[j - 1] - at)
                    for k in range(i, j):
                        lo = (s.ends[k - 1] if k > i else at) - at
                        piece = block[lo : s.ends[k] - at]
                        out = b"".join(stream.feed_chunk(piece, s.name, at + lo))
                        if k == sl.hi - 1:
                            out += b"".join(stream.flush())
                        if _same_rows(piece, out, stripped):  # as it was: the index counted it
                            rows = s.rows_before(k + 1) - s.rows_before(k)
                        else:
                            rows = _rows_out(decoder, out)
                        yield base + s.ends[k], rows, out, crc
                    i, at = j, s.ends[j - 1]

    def table_versions(self, qualified: str) -> list[tuple[bytes, bytes]]:
        """(FDE, TABLE_MAP) of each distinct map of `qualified` the log holds, oldest
        first (what a reader that follows added and dropped columns takes the union of)."""
        out: list[tuple[bytes, bytes]] = []
        last: TableMap | None = None
        for s in self.refresh():
            for table, raw in s.versions.get(qualified, ()):
                if last is None or table.columns != last.columns:
                    out.append((self.fde_of(s), raw))
                    last = table
        return out

    def table_map(self, qualified: str) -> tuple[bytes, bytes] | None:
        """(FDE, TABLE_MAP event) of the latest map of `qualified` ("schema.table")."""
        for s in reversed(self.refresh()):
            raw = s.tables.get(qualified)
            if raw is not None:
                return self.fde_of(s), raw
        return None


def _same_rows(data: bytes, out: bytes, stripped: bool) -> bool:
    """Whether `out` (whole events the rules let out of `data`) is `data` as it was, or
    (`stripped`: the rules drop annotations, as every rule that hides data does) without
    its annotations: the same rows events, byte for byte, so the index's count holds."""
    if out == data:
        return True
    if not stripped or len(out) >= len(data):
        return False
    kept: list[bytes] = []
    last = 0
    for at, size in walk.spans(data, where="tap rules"):
        if data[at + 4] in _ANNOTATIONS:
            kept.append(data[last:at])
            last = at + size
    if not kept:
        return False
    kept.append(data[last:])
    return b"".join(kept) == out


def _rows_of_whole(s: SegmentIndex, first: int, stop: int, at: int, chunk: bytes,
                   out: bytes, decoder: StreamDecoder, stripped: bool) -> int:
    """The rows of `out`, what the rules let out of `chunk`:
    transactions first..stop-1 of `s` whole, read at offset `at`. Each transaction the
    rules left as it was (or only without its annotations) takes the index's count; the
    others' are counted on what went out. Every transaction goes out (an emptied one as
    its GTID and XID), so the n-th GTID event of `out` opens the n-th transaction's
    events."""
    if _same_rows(chunk, out, stripped):
        return s.rows_before(stop) - s.rows_before(first)
    opens = [at for at, _size in walk.spans(out, where="tap rules") if out[at + 4] in _GTIDS]
    if len(opens) != stop - first:  # (not one each: count all of it)
        return _rows_out(decoder, out)
    opens[0] = 0  # (what precedes the first transaction goes with it, as it came in)
    opens.append(len(out))
    rows = 0
    for n, k in enumerate(range(first, stop)):
        piece = chunk[(s.ends[k - 1] - at if k > first else 0) : s.ends[k] - at]
        went = out[opens[n] : opens[n + 1]]
        if _same_rows(piece, went, stripped):
            rows += s.rows_before(k + 1) - s.rows_before(k)
        else:
            rows += _rows_out(decoder, went)
    return rows


def _rows_in(decoder: StreamDecoder, data: bytes) -> int:
    """The rows of a rows event (MalformedEvent where the codec cannot walk them)."""
    rev = decoder.rows_event(data)
    return len(rev.rows(decoder.table(rev.table_id), decoder.codecs, _NO_COLUMNS))


def _rows_out(decoder: StreamDecoder, events: bytes) -> int:
    """The rows of the rows events in `events` (whole events; their table maps before
    them), one for an event the codec cannot walk, as the index counts."""
    n = 0
    for at, size in walk.spans(events, where="tap rules"):
        typ = events[at + 4]
        if typ == _TABLE_MAP:
            decoder.remember_table_map(events[at : at + size])
        elif typ in ROWS_TYPES:
            try:
                n += _rows_in(decoder, events[at : at + size])
            except MalformedEvent:
                n += 1
    return n


def _plan_of(start: int, txs: Iterator[tuple[int, int]], max_rows: int | None,
             split_rows: int | None) -> dict[str, Any]:
    """TapStore.plan's cut over (end position, rows) of each transaction in turn: the same
    rules as its cut over the index (each run of transactions that fits what is left of
    the batch or the part goes at once; one alone over it goes whole), for rows counted
    as a reader's rules let them through."""
    big = 1 << 62
    stop, rows, count = start, 0, 0
    parts: list[list[int]] = []
    part_start, part_rows = start, 0
    nxt = next(txs, None)
    while nxt is not None:
        if max_rows is not None and rows >= max_rows:
            break
        take = min(big if max_rows is None else max_rows - rows,
                   big if split_rows is None else split_rows - part_rows)
        group = taken = 0
        while nxt is not None and group + nxt[1] <= take:
            group += nxt[1]
            taken += 1
            stop = nxt[0]
            nxt = next(txs, None)
        if not taken:  # the next transaction alone is over the limit
            assert nxt is not None
            if max_rows is not None and rows and rows + nxt[1] > max_rows:
                break
            group, taken, stop = nxt[1], 1, nxt[0]  # it goes whole
            nxt = next(txs, None)
        rows += group
        part_rows += group
        count += taken
        if split_rows is not None and part_rows >= split_rows:
            parts.append([part_start, stop, part_rows])
            part_start, part_rows = stop, 0
    if stop > part_start:
        parts.append([part_start, stop, part_rows])
    return {"start": start, "end": stop, "rows": rows, "transactions": count, "parts": parts}
