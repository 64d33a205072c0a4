"""Archived binlog files (a primary's own, `mysqlbinlog --raw` copies, another relay's
segments) as a primary would send them: the files of one server in order, and each
file's events from an offset the way a dump from that file and offset sends them (an
artificial ROTATE naming the file, its FORMAT_DESCRIPTION, then its events), each checked
(size, CRC32) and named by file and offset when it is not right.

This is what a writer of the relay log from archives feeds to the log's ingest, so the
relay log places and names segments from archived files exactly as it does from a live
primary's dump. Blocking file reads: callers on an event loop run it in a thread.
"""

from __future__ import annotations

import glob
import itertools
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from relay.binlog import build
from relay.binlog.checksum import verify
from relay.binlog.constants import (
    BINLOG_MAGIC,
    CRC_LEN,
    HEADER_LEN,
    LOG_EVENT_BINLOG_IN_USE_F,
    EventType,
)
from relay.binlog.events import decode_fde
from relay.binlog.file import TornTail, iter_file_events
from relay.binlog.group import GROUP_START, GroupTracker
from relay.binlog.gtid import GtidPosition
from relay.errors import MalformedEvent, RelayError
from relay.kernels import checked_events
from relay.relaylog.segfile import open_segment

_NUMBERED = struct.Struct("<I")
BATCH_BYTES = 4 << 20  # events handed over at a time: bounded memory, few wake-ups


class ArchiveError(RelayError):
    """A set of binlog files that cannot be one server's history in order, or a file
    that is not a binlog file; the message names the file and what to do."""

    code = "archive"


@dataclass(frozen=True)
class ArchiveFile:
    path: str
    name: str      # the file name, as the server named it (mysql-bin.000042)
    base: str      # mysql-bin
    number: int    # 42

    @property
    def size(self) -> int:
        return os.path.getsize(self.path)


def _numbered(path: str) -> ArchiveFile:
    name = os.path.basename(path)
    base, dot, digits = name.rpartition(".")
    if not dot or not base or not digits.isdigit() or len(digits) < 6:
        raise ArchiveError(f"{path}: not a binlog file name (base.NNNNNN): name the "
                           "server's binlog files, not its .index or other files")
    return ArchiveFile(path, name, base, int(digits))


def archive_files(patterns: Sequence[str]) -> list[ArchiveFile]:
    """The files that `patterns` name (paths or glob patterns; an index file's own name is
    refused), in the order the server wrote them. Refused: names of two series, the same
    name twice, a number missing between two (a file left out of the archive would be a
    hole in its history), and a file without the binlog magic."""
    paths: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            raise ArchiveError(f"{pattern}: no file matches")
        paths += [p for p in found if not p.endswith(".index")]
    files = sorted({_numbered(p).name: _numbered(p) for p in paths}.values(),
                   key=lambda f: f.number)
    if len(files) < len(paths):
        names = [os.path.basename(p) for p in paths]
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ArchiveError(f"{', '.join(twice)} named more than once (from two folders?)")
    if not files:
        raise ArchiveError("no binlog files named")
    bases = sorted({f.base for f in files})
    if len(bases) > 1:
        raise ArchiveError(f"files of {len(bases)} series ({', '.join(bases)}): import one "
                           "server's files at a time")
    for before, after in itertools.pairwise(files):
        if after.number != before.number + 1:
            raise ArchiveError(f"{before.base}.{before.number + 1:06d} is missing between "
                               f"{before.name} and {after.name}")
    for f in files:
        try:
            with open(f.path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise ArchiveError(f"{f.path}: {exc.strerror}") from None
        if magic != BINLOG_MAGIC:
            raise ArchiveError(f"{f.path}: not a binlog file (no \\xfebin magic at offset 0)")
    return files


_POSITION_EVENTS = frozenset({EventType.GTID_LIST, EventType.PREVIOUS_GTIDS})


def header(f: ArchiveFile) -> tuple[bytes, bytes | None]:
    """The file's FORMAT_DESCRIPTION and its GTID position event (GTID_LIST or
    PREVIOUS_GTIDS: the transactions before the file), None for a file without one."""
    with open(f.path, "rb") as fh:
        fde = None
        try:
            for raw in iter_file_events(fh, where=f.path):
                if fde is None:
                    if raw.type_code != EventType.FORMAT_DESCRIPTION:
                        raise ArchiveError(f"{f.path} at offset {raw.offset}: the first event "
                                           f"is type {raw.type_code}, not a "
                                           "FORMAT_DESCRIPTION")
                    fde = raw.data
                elif raw.type_code in _POSITION_EVENTS:
                    return fde, raw.data
                elif raw.type_code != EventType.START_ENCRYPTION:
                    return fde, None
        except TornTail:
            pass
        except MalformedEvent as exc:
            raise ArchiveError(str(exc)) from None
    if fde is None:
        raise ArchiveError(f"{f.path}: no whole FORMAT_DESCRIPTION event")
    return fde, None


@dataclass
class FileDump:
    """A file's events from `start` as a dump from there sends them. `events()` yields
    runs of whole events (about BATCH_BYTES each, the first one behind the artificial
    ROTATE, and past the file's start its FORMAT_DESCRIPTION, that a dump begins with);
    `end` is where the file's events handed out so far end (set before each run is
    handed out), and at the last `complete` says whether the file ended whole (a torn
    last event, as in a file a server still writes, is no error: it is left for a later
    read). Each event's size and CRC32 are checked; what comes before a bad event is
    handed out, then ArchiveError names the file and offset."""

    file: ArchiveFile
    start: int = 4
    end: int = 4
    complete: bool = False

    def events(self) -> Iterator[bytearray]:
        f = self.file
        fde_raw = header(f)[0]
        fde = decode_fde(fde_raw)
        head = build.rotate(f.name, position=self.start, server_id=_server_id(fde_raw),
                            log_pos=0, artificial=True, checksum=fde.has_crc)
        if self.start > 4:  # as a primary resuming a file past its start: its header
            head += build.copy_fde(fde_raw, log_pos=0, created=0)
        self.end = self.start
        rest = b""
        with open(f.path, "rb") as fh:
            fh.seek(self.start)
            while True:
                chunk = fh.read(max(BATCH_BYTES, _needed(rest)))
                if not chunk:
                    self.complete = not rest
                    break
                buf = rest + chunk if rest else chunk
                used, bad = _checked(buf, self.end, fde.has_crc, f.path)
                rest = buf[used:]
                if used:
                    self.end += used
                    run = bytearray(head)  # (one copy of the block: an EventBatch's own)
                    run += memoryview(buf)[:used]
                    yield run
                    head = b""
                if bad is not None:
                    raise bad
        if head:
            yield bytearray(head)


def _needed(rest: bytes) -> int:
    """Bytes to read for the event `rest` begins (when it is larger than a batch)."""
    return int.from_bytes(rest[9:13], "little") - len(rest) if len(rest) >= HEADER_LEN else 0


def _checked(buf: bytes, base: int, crc: bool, path: str) -> tuple[int, ArchiveError | None]:
    """(bytes of whole events at the start of `buf`, file offset `base`, whose size and
    CRC32 hold; the error of the event that stops them, or None at a torn end), by the
    `checked_events` kernel."""
    pos = 0
    while True:
        try:
            pos, bad = checked_events(buf, pos, len(buf), CRC_LEN if crc else 0)
        except MalformedEvent as exc:
            at = exc.offset or 0
            return at, ArchiveError(f"{path} at offset {base + at}: an event of "
                                    f"{int.from_bytes(buf[at + 9 : at + 13], 'little')} "
                                    "bytes (impossible event size)")
        if bad < 0:
            return pos, None
        end = bad + int.from_bytes(buf[bad + 9 : bad + 13], "little")
        if buf[bad + 4] == EventType.FORMAT_DESCRIPTION and verify(buf[bad:end]):
            pos = end  # (its CRC taken with the in-use flag clear, as servers write it)
            continue
        return bad, ArchiveError(f"{path} at offset {base + bad}: checksum mismatch in "
                                 f"event type {buf[bad + 4]}")


def _server_id(ev: bytes) -> int:
    return int(_NUMBERED.unpack_from(ev, 5)[0])


def same_header(segment_path: str, f: ArchiveFile) -> bool:
    """Whether a relay log segment begins with the file's FORMAT_DESCRIPTION (but for the
    in-use mark, which the log does not keep) and its GTID position event, as a segment
    an import made of that file does."""
    fde, position = header(f)
    want = len(fde) + (len(position) if position is not None else 0)
    seg = open_segment(segment_path)
    try:
        head = seg.pread(want, 4)
    finally:
        seg.close()
    theirs = bytearray(fde + (position or b""))
    mine = bytearray(head)
    if len(mine) != len(theirs):
        return False
    mine[17] &= ~LOG_EVENT_BINLOG_IN_USE_F  # (the FORMAT_DESCRIPTION's flags, low byte)
    theirs[17] &= ~LOG_EVENT_BINLOG_IN_USE_F
    return mine == theirs


def first_lacking(f: ArchiveFile, state: GtidPosition) -> int:
    """Where the file's first transaction that `state` lacks starts (or where its whole
    events end): a stream by GTID starts there, as a primary's dump does."""
    tracker = GroupTracker()
    end = 4
    with open(f.path, "rb") as fh:
        checksum = False
        try:
            for raw in iter_file_events(fh, where=f.path):
                if raw.type_code == EventType.FORMAT_DESCRIPTION:
                    checksum = decode_fde(raw.data).has_crc
                tracker.feed(raw.data, checksum)
                if raw.type_code in GROUP_START and tracker.txn is not None \
                        and not state.contains(tracker.txn):
                    return raw.offset
                end = raw.offset + len(raw.data)
        except TornTail:
            pass
        except MalformedEvent as exc:
            raise ArchiveError(str(exc)) from None
    return end
