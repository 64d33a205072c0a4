"""Start-up recovery: find the segments, verify them, truncate a torn tail of the last
one, and rebuild the committed GTID state and the last segment's GTID index."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from relay.binlog.constants import BINLOG_MAGIC, HEADER_LEN
from relay.binlog.file import TornTail, iter_file_events
from relay.binlog.gtid import GtidPosition, GtidState
from relay.binlog.scan import FileScan
from relay.errors import CorruptLog, MalformedEvent
from relay.relaylog import gtid_index, segfile
from relay.relaylog.naming import list_segment_files, read_index, segment_number, write_index
from relay.relaylog.segfile import open_stream

log = logging.getLogger("relay.relaylog")


@dataclass
class Recovered:
    segments: list[str] = field(default_factory=list)
    end: int = 0
    fde: bytes | None = None
    state: GtidPosition = field(default_factory=GtidState)
    sealed: bool = False
    truncated: int = 0


@dataclass
class SegmentScan:
    committed: int
    fde: bytes | None
    state: GtidPosition
    sealed: bool
    entries: list[gtid_index.IndexEntry]
    error: MalformedEvent | None


def scan_segment(path: str) -> SegmentScan:
    """Walk a segment, verifying headers and checksums; stop at the first bad byte."""
    # A buffered walk, not mmap: another process (a live relay) may truncate the file
    # under a reader, and touching a truncated mapping kills the reader with SIGBUS.
    f = open_stream(path)
    if f.seek(0, os.SEEK_END) < 4:
        f.close()
        return SegmentScan(0, None, GtidState(), False, [], TornTail(
            "segment shorter than the binlog magic", where=path, offset=0))
    f.seek(0)
    scan = FileScan(keep_transactions=True)
    error: MalformedEvent | None = None
    with f:
        if f.read(4) != BINLOG_MAGIC:
            raise CorruptLog(path, 0, "missing binlog magic")
        try:
            for raw in iter_file_events(f, where=path):
                scan.feed(raw.offset, raw.data)
        except MalformedEvent as exc:
            error = exc
    assert scan.transactions is not None
    entries = [gtid_index.IndexEntry(t.txn, t.start, t.end) for t in scan.transactions
               if t.txn is not None]
    return SegmentScan(scan.committed, scan.fde, scan.state, scan.sealed, entries, error)


def verify_segment(path: str) -> None:
    """Headers and checksums of a sealed segment; raises CorruptLog at the first bad one."""
    with open_stream(path) as f:
        if f.read(4) != BINLOG_MAGIC:
            raise CorruptLog(path, 0, "missing binlog magic")
        try:
            for _ in iter_file_events(f, where=path):
                pass
        except MalformedEvent as exc:
            raise CorruptLog(path, exc.offset or 0, str(exc)) from None


def _is_torn(path: str, exc: MalformedEvent, committed: int) -> bool:
    """A cut-short write leaves an incomplete event or zero-filled pages at the very end."""
    if isinstance(exc, TornTail):
        return True
    offset = exc.offset or 0
    if offset < committed:
        return False
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(HEADER_LEN)
        rest_size = os.fstat(f.fileno()).st_size - offset
        # A bad checksum on the very last event of the file: a torn final page.
        if len(head) == HEADER_LEN and int.from_bytes(head[9:13], "little") == rest_size:
            return True
        # Zero-filled pages to the end (a file system that extended before the write).
        f.seek(offset)
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                return False
        return True


def recover(directory: str, basename: str, *, verify_all: bool, sync: bool) -> Recovered:
    names = read_index(directory, basename)
    for leftover in os.listdir(directory):  # an interrupted compression's output
        if leftover.endswith(segfile.SUFFIX + ".tmp"):
            os.unlink(os.path.join(directory, leftover))
    on_disk = list_segment_files(directory, basename)
    if not names and on_disk:
        log.warning("index file missing: rebuilding it from %d segment files", len(on_disk))
        names = on_disk
        write_index(directory, basename, names, sync=sync)
    for stray in set(on_disk) - set(names):
        if names and segment_number(stray) > segment_number(names[-1]):
            # Created but never indexed: no committed transaction can be in it.
            log.warning("removing unindexed segment %s left by an interrupted rotation", stray)
        elif names and segment_number(stray) < segment_number(names[0]):
            # Retention took it out of the index and stopped before unlinking it.
            log.warning("removing segment %s left by an interrupted purge", stray)
        else:
            continue
        path = os.path.join(directory, stray)
        segfile.remove(path)
    missing = [n for n in names if not segfile.exists(os.path.join(directory, n))]
    if missing:
        raise CorruptLog(os.path.join(directory, missing[0]), 0,
                         "listed in the index but missing on disk")
    out = Recovered(segments=names)
    if not names:
        return out
    if verify_all:
        for name in names[:-1]:
            verify_segment(os.path.join(directory, name))
    last = os.path.join(directory, names[-1])
    scan = scan_segment(last)
    size = os.path.getsize(last)
    if scan.error is not None and not _is_torn(last, scan.error, scan.committed):
        raise CorruptLog(last, scan.error.offset or 0, str(scan.error))
    if scan.fde is None:
        raise CorruptLog(last, 4, "segment has no FORMAT_DESCRIPTION event")
    if scan.committed < size:
        out.truncated = size - scan.committed
        log.warning("truncating %d bytes of incomplete transaction at the end of %s "
                    "(offset %d)", out.truncated, names[-1], scan.committed)
        with open(last, "r+b") as f:
            f.truncate(scan.committed)
            if sync:
                os.fsync(f.fileno())
    gtid_index.rewrite(last, scan.entries, sync=sync)
    out.end = scan.committed
    out.fde = scan.fde
    out.state = scan.state
    out.sealed = scan.sealed
    return out


def event_type_counts(path: str, end: int) -> dict[int, int]:
    """How many events of each type a segment holds up to `end` (for `relay inspect-log`)."""
    counts: dict[int, int] = {}
    with open_stream(path) as f:
        for raw in iter_file_events(f, end=end, verify_crc=False, where=path):
            counts[raw.type_code] = counts.get(raw.type_code, 0) + 1
    return counts
