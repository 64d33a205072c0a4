"""Cursor: one reader's position in the relay log. It never reads past `visible`, moves
to the next segment after a sealed one's ROTATE, and sleeps until the log grows."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from relay.binlog.constants import HEADER_LEN
from relay.errors import CorruptLog
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import segment_number

READ_CHUNK = 256 << 10


@dataclass(frozen=True, slots=True)
class LogEvent:
    segment: str
    offset: int
    data: bytes


class Cursor:
    def __init__(self, log: RelayLog, segment: str, offset: int = 4) -> None:
        if segment not in log.segments:
            raise ValueError(f"unknown segment {segment!r}")
        self.log = log
        self.segment = segment
        self.offset = offset
        self._fd = os.open(log.path_of(segment), os.O_RDONLY)

    @property
    def position(self) -> tuple[int, int]:
        return segment_number(self.segment), self.offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _limit(self) -> int:
        vis_seg, vis_off = self.log.visible
        number = segment_number(self.segment)
        if number < vis_seg:
            return os.fstat(self._fd).st_size
        if number == vis_seg:
            return vis_off
        return 4

    def _advance_segment(self) -> bool:
        idx = self.log.segments.index(self.segment)
        if idx + 1 >= len(self.log.segments):
            return False
        nxt = self.log.segments[idx + 1]
        if segment_number(nxt) > self.log.visible[0]:
            return False
        os.close(self._fd)
        self.segment = nxt
        self.offset = 4
        self._fd = os.open(self.log.path_of(nxt), os.O_RDONLY)
        return True

    def _readable_limit(self) -> int | None:
        """The visible end in the cursor's segment, after moving past a finished segment;
        None when there is nothing new."""
        while True:
            limit = self._limit()
            if self.offset < limit:
                return limit
            if not self._advance_segment():
                return None

    def read_chunk(self, max_bytes: int = READ_CHUNK) -> tuple[str, int, bytes]:
        """Whole events from the cursor up to the visible end, as one byte string:
        (segment, offset of its first byte, bytes). Empty bytes: nothing new yet. At
        least one whole event when any is available, however large."""
        while True:
            limit = self._readable_limit()
            if limit is None:
                return self.segment, self.offset, b""
            want = min(limit - self.offset, max(max_bytes, HEADER_LEN))
            chunk = os.pread(self._fd, want, self.offset)
            pos = 0
            n = len(chunk)
            while n - pos >= HEADER_LEN:
                size = struct.unpack_from("<I", chunk, pos + 9)[0]
                if size < HEADER_LEN or self.offset + pos + size > limit:
                    raise CorruptLog(self.log.path_of(self.segment), self.offset + pos,
                                     f"impossible event size {size}")
                if pos + size > n:
                    break
                pos += size
            if pos == 0:  # one event larger than the chunk
                size = struct.unpack_from("<I", chunk, 9)[0]
                chunk = os.pread(self._fd, size, self.offset)
                if len(chunk) < size:
                    raise CorruptLog(self.log.path_of(self.segment), self.offset,
                                     "segment shorter than its visible end")
                pos = size
            start = self.offset
            self.offset += pos
            return self.segment, start, chunk[:pos] if pos < n else chunk

    def peek_chunk(self, max_bytes: int = READ_CHUNK) -> tuple[str, int, bytes]:
        """Up to `max_bytes` from the cursor, not cut at an event boundary and not consumed:
        the caller frames whole events and calls advance() with what it used. Empty bytes:
        nothing new yet."""
        limit = self._readable_limit()
        if limit is None:
            return self.segment, self.offset, b""
        return self.segment, self.offset, os.pread(
            self._fd, min(limit - self.offset, max_bytes), self.offset)

    def advance(self, nbytes: int) -> None:
        self.offset += nbytes

    def corrupt(self, offset: int, what: str) -> CorruptLog:
        return CorruptLog(self.log.path_of(self.segment), offset, what)

    def read_available(self, max_bytes: int = READ_CHUNK) -> list[LogEvent]:
        """Like read_chunk, split into events."""
        segment, offset, chunk = self.read_chunk(max_bytes)
        out = []
        pos = 0
        while pos < len(chunk):
            size = struct.unpack_from("<I", chunk, pos + 9)[0]
            out.append(LogEvent(segment, offset + pos, chunk[pos : pos + size]))
            pos += size
        return out

    async def read(self, max_bytes: int = READ_CHUNK,
                   timeout: float | None = None) -> list[LogEvent]:
        """Wait for and return the next events; an empty list means the timeout passed."""
        while True:
            events = self.read_available(max_bytes)
            if events:
                return events
            if not await self.log.wait_beyond(self.position, timeout):
                return []

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until there is something past the cursor; False on timeout."""
        return await self.log.wait_beyond(self.position, timeout)
