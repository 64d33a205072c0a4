"""Binlog file framing over bytes: the magic, then events back to back. No file handles;
callers pass the bytes (or a memory map)."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from relay.binlog.checksum import verify
from relay.binlog.constants import BINLOG_MAGIC, HEADER_LEN, EventType
from relay.binlog.events import decode_fde
from relay.errors import MalformedEvent

MAX_EVENT_SIZE = 1 << 31


@dataclass(frozen=True)
class RawEvent:
    offset: int
    data: bytes

    @property
    def type_code(self) -> int:
        return self.data[4]

    @property
    def log_pos(self) -> int:
        return int(struct.unpack_from("<I", self.data, 13)[0])


class TornTail(MalformedEvent):
    """The bytes end inside an event: a write that was cut short."""


def check_magic(data: bytes | memoryview, where: str = "binlog") -> None:
    if bytes(data[:4]) != BINLOG_MAGIC:
        raise MalformedEvent("missing binlog magic \\xfebin", where=where, offset=0)


def iter_events(data: bytes | bytearray | memoryview | mmap.mmap, *, start: int = 4,
                verify_crc: bool = True, where: str = "binlog") -> Iterator[RawEvent]:
    """Yield the events of a binlog file image from `start` (a byte offset at an event start).

    Raises TornTail when the data ends inside an event, and MalformedEvent (with the
    offset) for a header or checksum that cannot be right. The checksum mode follows the
    file's own FORMAT_DESCRIPTION events.
    """
    pos = start
    n = len(data)
    has_crc = False
    while pos < n:
        if n - pos < HEADER_LEN:
            raise TornTail("file ends inside an event header", where=where, offset=pos)
        size = struct.unpack_from("<I", data, pos + 9)[0]
        if size < HEADER_LEN or size > MAX_EVENT_SIZE:
            raise MalformedEvent(f"impossible event size {size}", where=where, offset=pos)
        if pos + size > n:
            raise TornTail(f"file ends inside a {size}-byte event", where=where, offset=pos)
        ev = bytes(data[pos : pos + size])
        typ = ev[4]
        if typ == EventType.FORMAT_DESCRIPTION:
            fde = decode_fde(ev)
            has_crc = fde.has_crc
            if fde.checksum_alg != 255 and verify_crc and not verify(ev):
                raise MalformedEvent("FORMAT_DESCRIPTION checksum mismatch", where=where,
                                     offset=pos)
        elif has_crc and verify_crc and not verify(ev):
            raise MalformedEvent(f"checksum mismatch in event type {typ}", where=where,
                                 offset=pos)
        yield RawEvent(pos, ev)
        pos += size


def read_file_events(path: str, *, verify_crc: bool = True) -> list[RawEvent]:
    """Every event of a binlog file (for tools and tests; loads the file)."""
    with open(path, "rb") as f:
        data = f.read()
    check_magic(data, path)
    return list(iter_events(data, verify_crc=verify_crc, where=path))


def event_has_crc(fde_data: bytes) -> bool:
    return decode_fde(fde_data).has_crc
