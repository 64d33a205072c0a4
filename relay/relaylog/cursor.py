"""Readers of segment files: a `Cursor` follows the log from a position (a dump, a test),
a `SegmentReader` reads ranges of one segment (the tap, SHOW BINLOG EVENTS). Both are
registered in the log's reader registry with the position they read at, and both read
only what is visible. Reads are blocking `pread`s; on the event loop, callers run them
through `RelayLog.read` (the log's reader threads) or the `*_async` methods.

`peek_chunk_async` first asks the kernel for what its page cache holds (`preadv` with
RWF_NOWAIT, which answers EAGAIN rather than wait for the disk): a reader that follows
the log's end finds its bytes there, and takes them without a round trip through a
thread (the hop cost dumps to many replicas a fifth of their throughput). Anything that
would touch the disk, or open the next segment, still goes to a reader thread.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from relay.binlog import walk
from relay.binlog.constants import HEADER_LEN
from relay.errors import CorruptLog, MalformedEvent, SegmentPurged
from relay.relaylog.log import RelayLog
from relay.relaylog.segfile import SegmentFile, open_segment

READ_CHUNK = 256 << 10
_NOWAIT: list[int] = [getattr(os, "RWF_NOWAIT", 0)]  # 0 once the kernel refuses the flag


@dataclass(frozen=True, slots=True)
class LogEvent:
    segment: str
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes read at `offset` of `segment` (empty: nothing new yet)."""

    segment: str
    offset: int
    data: bytes


class _OpenSegment:
    """A segment file open for reading, registered as a reader while open."""

    def __init__(self, log: RelayLog, segment: str, offset: int, reader: str) -> None:
        if segment not in log.segments:
            raise ValueError(f"unknown segment {segment!r}")
        self.log = log
        self.segment = segment
        self.offset = offset
        self._number = log.segments.number_of(segment)
        try:
            self._file: SegmentFile | None = open_segment(log.path_of(segment))
        except FileNotFoundError:  # purged between the caller's lookup and now
            raise SegmentPurged(f"binary log {segment} was purged; the required binlog "
                                "files have been purged") from None
        self.handle = log.readers.register(reader, (self._number, offset))

    @property
    def position(self) -> tuple[int, int]:
        return self._number, self.offset

    def check_kept(self) -> None:
        """Raise SegmentPurged once retention removed what this reader still needed."""
        lost = self.handle.lost
        if lost is not None:
            raise SegmentPurged(f"binary log {self.segment} was purged while this reader was "
                                f"at offset {self.offset} ({lost}); the required binlog "
                                "files have been purged")

    @property
    def file(self) -> SegmentFile:
        if self._file is None:
            raise ValueError(f"reader of {self.segment} is closed")
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self.handle.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Cursor(_OpenSegment):
    """One reader's position in the relay log. It never reads past `visible`, moves to the
    next segment after a sealed one's ROTATE, and sleeps until the log grows."""

    def __init__(self, log: RelayLog, segment: str, offset: int = 4, *,
                 reader: str = "cursor") -> None:
        super().__init__(log, segment, offset, reader)

    def _advance_segment(self) -> bool:
        nxt = self.log.segments.after(self.segment)
        if nxt is None:
            return False
        number = self.log.segments.number_of(nxt)
        if number > self.log.visible[0]:
            return False
        self.file.close()
        self._file = open_segment(self.log.path_of(nxt))
        self.segment, self._number, self.offset = nxt, number, 4
        self.handle.move(self.position)
        return True

    def _readable_limit(self) -> int | None:
        """The visible end in the cursor's segment, after moving past a finished segment;
        None when there is nothing new."""
        self.check_kept()
        while True:
            limit = self.log.visible_size(self.segment)
            if self.offset < limit:
                return limit
            if not self._advance_segment():
                return None

    def read_chunk(self, max_bytes: int = READ_CHUNK) -> Chunk:
        """Whole events from the cursor up to the visible end, as one byte string, and
        consumed. Empty: nothing new yet. At least one whole event when any is
        available, however large."""
        limit = self._readable_limit()
        if limit is None:
            return Chunk(self.segment, self.offset, b"")
        start = self.offset
        chunk = self.file.pread(min(limit - start, max(max_bytes, HEADER_LEN)), start)
        used = self._whole(chunk, start, limit)
        if used == 0:  # one event larger than the chunk
            size = walk.event_size(chunk, 0)
            chunk = self.file.pread(size, start)
            if len(chunk) < size:
                raise self.corrupt(start, "segment shorter than its visible end")
            used = size
        self.offset = start + used
        self.handle.move(self.position)
        return Chunk(self.segment, start, chunk[:used] if used < len(chunk) else chunk)

    def peek_chunk(self, max_bytes: int = READ_CHUNK) -> Chunk:
        """Up to `max_bytes` from the cursor, not cut at an event boundary and not consumed:
        the caller frames whole events and calls advance() with what it used."""
        limit = self._readable_limit()
        if limit is None:
            return Chunk(self.segment, self.offset, b"")
        return Chunk(self.segment, self.offset,
                     self.file.pread(min(limit - self.offset, max_bytes), self.offset))

    def peek_cached(self, max_bytes: int = READ_CHUNK) -> Chunk | None:
        """`peek_chunk` of what the page cache holds of the current segment, without
        blocking: None when the kernel would have to read the disk (or the cursor must
        move to the next segment first)."""
        flag = _NOWAIT[0]
        fd = self.file.fileno()
        if not flag or fd < 0 or self.handle.lost is not None:  # compressed: a thread's job
            return None
        limit = self.log.visible_size(self.segment)
        if self.offset >= limit:
            return None
        buf = bytearray(min(limit - self.offset, max_bytes))
        try:
            got = os.preadv(fd, [buf], self.offset, flag)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a kernel or file system
                _NOWAIT[0] = 0                                   # without it
            return None
        if got < HEADER_LEN:
            return None
        return Chunk(self.segment, self.offset, bytes(buf[:got]) if got < len(buf) else bytes(buf))

    def read_cached(self, max_bytes: int = READ_CHUNK) -> Chunk | None:
        """`read_chunk` of what the page cache holds, without blocking: None when the kernel
        would have to read the disk, the cursor must move to the next segment first, or
        the next event is larger than `max_bytes` (each a thread's job)."""
        peeked = self.peek_cached(max_bytes)
        if peeked is None:
            return None
        data = peeked.data
        used = self._whole(data, peeked.offset, self.log.visible_size(self.segment))
        if used == 0:
            return None
        self.advance(used)
        return Chunk(peeked.segment, peeked.offset, data[:used] if used < len(data) else data)

    def advance(self, nbytes: int) -> None:
        self.offset += nbytes
        self.handle.move(self.position)

    def _whole(self, chunk: bytes, start: int, limit: int) -> int:
        try:
            used = walk.whole(chunk, where=self.log.path_of(self.segment), base=start)
        except MalformedEvent as exc:
            raise self.corrupt(exc.offset or start, "impossible event size") from None
        if used == 0 and len(chunk) >= HEADER_LEN \
                and start + walk.event_size(chunk, 0) > limit:
            raise self.corrupt(start, f"an event of {walk.event_size(chunk, 0)} bytes runs "
                                      "past the visible end")
        return used

    def corrupt(self, offset: int, what: str) -> CorruptLog:
        return CorruptLog(self.log.path_of(self.segment), offset, what)

    def at_visible_end(self) -> bool:
        """Nothing past the cursor yet: it is at the visible end of the segment being
        written. (Learnt without a thread: a dump asks once more after each chunk it
        sent, so a follower asked a thread for nothing after every transaction. Moving
        on to a next segment opens a file: that stays a thread's job.)"""
        vis_seg, vis_off = self.log.visible
        return self._number == vis_seg and self.offset >= vis_off

    async def read_chunk_async(self, max_bytes: int = READ_CHUNK) -> Chunk:
        self.check_kept()
        if self.at_visible_end():
            return Chunk(self.segment, self.offset, b"")
        cached = self.read_cached(max_bytes)
        if cached is not None:
            return cached
        return await self.log.read(lambda: self.read_chunk(max_bytes))

    async def peek_chunk_async(self, max_bytes: int = READ_CHUNK) -> Chunk:
        self.check_kept()
        if self.at_visible_end():
            return Chunk(self.segment, self.offset, b"")
        cached = self.peek_cached(max_bytes)
        if cached is not None:
            return cached
        return await self.log.read(lambda: self.peek_chunk(max_bytes))

    def read_available(self, max_bytes: int = READ_CHUNK) -> list[LogEvent]:
        """Like read_chunk, split into events."""
        c = self.read_chunk(max_bytes)
        return [LogEvent(c.segment, c.offset + pos, c.data[pos : pos + size])
                for pos, size in walk.spans(c.data)]

    async def read(self, max_bytes: int = READ_CHUNK,
                   timeout: float | None = None) -> list[LogEvent]:
        """Wait for and return the next events; an empty list means the timeout passed."""
        while True:
            events = await self.log.read(lambda: self.read_available(max_bytes))
            if events:
                return events
            if not await self.log.wait_beyond(self.position, timeout):
                return []

    async def wait(self, timeout: float | None = None,
                   push: Callable[[], bool] | None = None) -> bool:
        """Wait until there is something past the cursor; False on timeout. `push`: sends
        what comes meanwhile (Visibility.wait_beyond)."""
        return await self.log.wait_beyond(self.position, timeout, push)


class SegmentReader(_OpenSegment):
    """Reads of one segment up to its visible end, registered as a reader at the offset it
    last read. For the tap's index walks and ranges, and SHOW BINLOG EVENTS."""

    def __init__(self, log: RelayLog, segment: str, *, reader: str) -> None:
        super().__init__(log, segment, 4, reader)
        self.path = log.path_of(segment)

    @property
    def size(self) -> int:
        """The bytes readers may see."""
        return self.log.visible_size(self.segment)

    def pread(self, offset: int, n: int) -> bytes:
        self.offset = offset
        self.handle.move(self.position)
        return self.file.pread(n, offset)

    def events(self, start: int = 4, end: int | None = None,
               block: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of each whole event in [start, end) (end: the visible end);
        CorruptLog where the events do not fit."""
        self.check_kept()
        stop = self.size if end is None else end
        pos = start
        while pos < stop:
            buf = self.pread(pos, min(block, stop - pos))
            try:
                spans = list(walk.spans(buf, where=self.path, base=pos))
            except MalformedEvent as exc:
                raise CorruptLog(self.path, exc.offset or pos, "impossible event size") from None
            if not spans:
                if len(buf) < HEADER_LEN:
                    raise CorruptLog(self.path, pos, "the visible end cuts an event header")
                size = walk.event_size(buf, 0)
                if pos + size > stop:
                    raise CorruptLog(self.path, pos, "the visible end cuts an event")
                yield pos, self.pread(pos, size)
                pos += size
                continue
            for p, size in spans:
                yield pos + p, buf[p : p + size]
            last, size = spans[-1]
            pos += last + size
