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

    def read_available(self, max_bytes: int = READ_CHUNK) -> list[LogEvent]:
        """Events from the cursor up to the visible end (at least one whole event if any is
        available, otherwise about `max_bytes`)."""
        out: list[LogEvent] = []
        while True:
            limit = self._limit()
            if self.offset >= limit:
                if out or not self._advance_segment():
                    return out
                continue
            want = min(limit - self.offset, max(max_bytes, HEADER_LEN))
            chunk = os.pread(self._fd, want, self.offset)
            pos = 0
            while len(chunk) - pos >= HEADER_LEN:
                size = struct.unpack_from("<I", chunk, pos + 9)[0]
                if size < HEADER_LEN or self.offset + size > limit:
                    raise CorruptLog(self.log.path_of(self.segment), self.offset,
                                     f"impossible event size {size}")
                if pos + size > len(chunk):
                    if pos == 0:  # one event larger than the chunk
                        chunk = os.pread(self._fd, size, self.offset)
                        if len(chunk) < size:
                            raise CorruptLog(self.log.path_of(self.segment), self.offset,
                                             "segment shorter than its visible end")
                        continue
                    break
                out.append(LogEvent(self.segment, self.offset, chunk[pos : pos + size]))
                pos += size
                self.offset += size
            if out:
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
