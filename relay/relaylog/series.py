"""Binlog files on disk as a stream of events, for a reader in another process (`relay
changes`, `relay rules check --sample`): one file, a series named by an index file or a
directory (a server's binlogs), or a relay log directory, including ones being written.
This package is the one that reads binlog files; the relay's own readers use cursors.

A reader never hands out part of a transaction: in the newest file it reads only up to
the committed end (the end of the last complete transaction), found by a scan of event
headers (binlog/scan.py) that keeps its place between polls. With `follow` it waits for
the files to grow, like `tail -f`.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from relay.binlog.changes import SourceEvent
from relay.binlog.constants import (
    BINLOG_MAGIC,
    HEADER_LEN,
    LOG_EVENT_BINLOG_IN_USE_F,
    EventType,
)
from relay.binlog.events import decode_fde
from relay.binlog.file import TornTail, iter_file_events
from relay.binlog.scan import FileScan
from relay.errors import MalformedEvent, SourceError
from relay.relaylog.naming import NAME_RE, read_index, read_index_file
from relay.relaylog.segfile import open_segment, open_stream


class _CommittedEnd:
    """Where the complete transactions of a growing file end, found incrementally.

    A server marks the FORMAT_DESCRIPTION of the binlog file it has open (the in-use
    flag) and clears the mark when it closes the file: a closed file is complete and needs
    no scan. The relay's segments carry no mark, so they are always scanned
    (`always_scan`)."""

    def __init__(self, path: str, *, always_scan: bool = False) -> None:
        self.path = path
        self.scanned = 4
        self.always_scan = always_scan
        self.complete = False  # the server closed the file: its end is final
        self._scan = FileScan()

    def _closed(self) -> bool:
        with open(self.path, "rb") as f:
            head = f.read(4 + HEADER_LEN)
        return (len(head) == 4 + HEADER_LEN and head[4 + 4] == EventType.FORMAT_DESCRIPTION
                and not head[4 + 17] & LOG_EVENT_BINLOG_IN_USE_F)

    def refresh(self) -> int:
        if self.complete or (not self.always_scan and self.scanned == 4 and self._closed()):
            self.complete = True
            return os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            try:
                for raw in iter_file_events(f, start=self.scanned, verify_crc=False,
                                            where=self.path):
                    self._scan.feed(raw.offset, raw.data)
                    self.scanned = raw.offset + len(raw.data)
            except TornTail:
                pass  # the writer is in the middle of an event
        return self._scan.committed


class BinlogSeries:
    """Events of a list of binlog files in order. `list_files` is asked again while
    following, to see new files; every file but the last is read to its end."""

    def __init__(self, list_files: Callable[[], list[str]], *, follow: bool = False,
                 poll: float = 0.2, verify_crc: bool = True, always_scan: bool = False) -> None:
        self._list_files = list_files
        self.always_scan = always_scan
        self.follow = follow
        self.poll = poll
        self.verify_crc = verify_crc

    def events(self) -> Iterator[SourceEvent]:
        latest: bool | None = None  # the CRC mode of the file's last FORMAT_DESCRIPTION
        for region in self.regions():
            if region.start == 4:
                latest = None
            with open_stream(region.path) as f:
                try:
                    for raw in iter_file_events(
                            f, start=region.start, end=region.end, verify_crc=self.verify_crc,
                            checksum=region.checksum if latest is None else latest,
                            where=region.path):
                        if raw.data[4] == EventType.FORMAT_DESCRIPTION:
                            latest = decode_fde(raw.data).has_crc
                        yield SourceEvent(region.name, raw.offset, raw.data)
                except TornTail as exc:
                    if region.final:
                        raise SourceError(f"{region.path} ends inside an event at offset "
                                          f"{exc.offset}") from exc
                except MalformedEvent as exc:
                    raise SourceError(str(exc)) from exc

    def regions(self) -> Iterator[Region]:
        """The files' bytes to read, in order: each a run of whole events (of whole
        transactions, in the newest file) that the reader reads to its end before asking
        for the next."""
        index = 0
        current: str | None = None  # followed by name: retention removes files at the head
        tail: _CommittedEnd | None = None
        pos = 4
        while True:
            files = self._list_files()
            if current is not None:
                if current not in files:
                    raise SourceError(f"{current} was purged from the log while it was being "
                                      f"read (at offset {pos})")
                index = files.index(current)
            if index >= len(files):
                if not self.follow:
                    return
                time.sleep(self.poll)
                continue
            path = current = files[index]
            last = index == len(files) - 1
            if pos == 4:
                _check_magic(path)
            if last:
                if tail is None or tail.path != path:
                    tail = _CommittedEnd(path, always_scan=self.always_scan)
                end = tail.refresh()
            else:
                end = _size(path)
            if end > pos:
                final = not last or (tail is not None and tail.complete)
                yield Region(os.path.basename(path), path, pos, end, _has_crc(path), final)
                pos = end
            if not last or len(self._list_files()) > len(files):
                if last:
                    continue  # a newer file appeared: finish this one to its end first
                index += 1
                current = files[index]
                pos = 4
                tail = None
                continue
            if not self.follow:
                return
            time.sleep(self.poll)


class Region(NamedTuple):
    """A run of whole events of one file: [start, end). `checksum`: the file's events carry
    a CRC (its FORMAT_DESCRIPTION says so); `final`: the file will not grow past `end`, so
    bytes there that are not a whole event are an error, not a write in progress."""

    name: str
    path: str
    start: int
    end: int
    checksum: bool
    final: bool


def map_region(region: Region) -> bytes | mmap.mmap:
    """The file's bytes up to the region's end: mapped when the file is plain, read
    (decompressed) when it is a compressed segment. The caller closes a map."""
    try:
        fd = os.open(region.path, os.O_RDONLY)
    except FileNotFoundError:
        with open_stream(region.path) as f:
            return f.read(region.end)
    try:
        return mmap.mmap(fd, region.end, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def _has_crc(path: str) -> bool:
    """Whether the file's FORMAT_DESCRIPTION (its first event) announces CRC32 checksums."""
    with open_stream(path, buffering=4096) as f:
        head = f.read(4 + HEADER_LEN)
        if len(head) < 4 + HEADER_LEN or head[4 + 4] != EventType.FORMAT_DESCRIPTION:
            return False
        size = int.from_bytes(head[4 + 9 : 4 + 13], "little")
        fde = head[4:] + f.read(size - HEADER_LEN)
    try:
        return decode_fde(fde).has_crc
    except MalformedEvent:
        return False


def _size(path: str) -> int:
    segment = open_segment(path)  # a compressed segment's size is its footer's
    try:
        return segment.size
    finally:
        segment.close()


def _check_magic(path: str) -> None:
    try:
        with open_stream(path) as f:
            head = f.read(4)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror}") from exc
    if head != BINLOG_MAGIC:
        raise SourceError(f"{path} is not a binlog file (no \\xfebin magic at offset 0)")


def index_files(path: str) -> list[str]:
    """The files an index file lists (one per line, relative to the index's directory)."""
    base = os.path.dirname(os.path.abspath(path))
    return [n if os.path.isabs(n) else os.path.join(base, n) for n in read_index_file(path)]


def relay_log_files(directory: str, basename: str) -> Callable[[], list[str]]:
    """The segments of a relay log directory, as its index lists them."""
    if not os.path.isdir(directory):
        raise SourceError(f"{directory} is not a directory")
    if not read_index(directory, basename):
        raise SourceError(f"no relay log in {directory} (looked for {basename}.index)")
    return lambda: [os.path.join(directory, n) for n in read_index(directory, basename)]


def files_of(path: str) -> Callable[[], list[str]]:
    """What `file://PATH` names: one binlog file, an index file, or a directory (its one
    index file, or else its numbered binlog files)."""
    if os.path.isdir(path):
        indexes = sorted(n for n in os.listdir(path) if n.endswith(".index"))
        if len(indexes) == 1:
            index = os.path.join(path, indexes[0])
            return lambda: index_files(index)
        if len(indexes) > 1:
            raise SourceError(f"{path} holds several index files ({', '.join(indexes)}); "
                              "name the one to read")

        def numbered() -> list[str]:
            found = sorted((m.group("base"), int(m.group("num")), n) for n in os.listdir(path)
                           if (m := NAME_RE.match(n)))
            return [os.path.join(path, n) for _b, _k, n in found]
        if not numbered():
            raise SourceError(f"{path} holds no binlog files (name.000001, ...) or index")
        return numbered
    if not os.path.exists(path):
        raise SourceError(f"{path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == BINLOG_MAGIC:
        return lambda: [path]
    return lambda: index_files(path)
