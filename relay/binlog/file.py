"""Binlog file framing over bytes: the magic, then events back to back. No file handles;
callers pass the bytes (or a memory map)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from relay.binlog.checksum import verify
from relay.binlog.constants import BINLOG_MAGIC, HEADER_LEN, EventType
from relay.binlog.events import decode_fde
from relay.errors import MalformedEvent

MAX_EVENT_SIZE = 1 << 31


class RawEvent(NamedTuple):  # a tuple: millions are made while verifying a log
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


class _Checker:
    """Header and checksum checks shared by the in-memory and the streaming walkers; the
    checksum mode follows the file's own FORMAT_DESCRIPTION events."""

    def __init__(self, verify_crc: bool, where: str) -> None:
        self.verify_crc = verify_crc
        self.where = where
        self.has_crc = False

    def size(self, head: bytes | bytearray | memoryview, at: int, pos: int) -> int:
        size: int = struct.unpack_from("<I", head, at + 9)[0]
        if size < HEADER_LEN or size > MAX_EVENT_SIZE:
            raise MalformedEvent(f"impossible event size {size}", where=self.where, offset=pos)
        return size

    def event(self, ev: bytes, pos: int) -> RawEvent:
        typ = ev[4]
        if typ == EventType.FORMAT_DESCRIPTION:
            fde = decode_fde(ev)
            self.has_crc = fde.has_crc
            if fde.checksum_alg != 255 and self.verify_crc and not verify(ev):
                raise MalformedEvent("FORMAT_DESCRIPTION checksum mismatch", where=self.where,
                                     offset=pos)
        elif self.has_crc and self.verify_crc and not verify(ev):
            raise MalformedEvent(f"checksum mismatch in event type {typ}", where=self.where,
                                 offset=pos)
        return RawEvent(pos, ev)


def iter_events(data: bytes | bytearray | memoryview, *, start: int = 4,
                verify_crc: bool = True, where: str = "binlog") -> Iterator[RawEvent]:
    """Yield the events of a binlog file image from `start` (a byte offset at an event start).

    Raises TornTail when the data ends inside an event, and MalformedEvent (with the
    offset) for a header or checksum that cannot be right.
    """
    check = _Checker(verify_crc, where)
    pos = start
    n = len(data)
    while pos < n:
        if n - pos < HEADER_LEN:
            raise TornTail("file ends inside an event header", where=where, offset=pos)
        size = check.size(data, pos, pos)
        if pos + size > n:
            raise TornTail(f"file ends inside a {size}-byte event", where=where, offset=pos)
        yield check.event(bytes(data[pos : pos + size]), pos)
        pos += size


def iter_file_events(f: BinaryIO, *, start: int = 4, end: int | None = None,
                     verify_crc: bool = True, checksum: bool = False, where: str = "binlog",
                     block: int = 4 << 20) -> Iterator[RawEvent]:
    """The same walk over an open file, reading it in blocks: bounded memory, and safe
    while another process appends to or truncates the file (a short read is a torn tail).
    With `end`, the walk stops there as if the file ended; `checksum` is the CRC mode
    when starting past the file's FORMAT_DESCRIPTION."""
    check = _Checker(verify_crc, where)
    check.has_crc = checksum
    f.seek(start)
    buf = bytearray()
    base = start  # file offset of buf[0]
    i = 0
    eof = False
    while True:
        have = len(buf) - i
        need = HEADER_LEN if have < HEADER_LEN else check.size(buf, i, base + i)
        if have < need:
            if eof:
                if have == 0:
                    return
                what = "an event header" if have < HEADER_LEN else f"a {need}-byte event"
                raise TornTail(f"file ends inside {what}", where=where, offset=base + i)
            del buf[:i]
            base += i
            i = 0
            want = max(block, need - have)
            if end is not None:
                want = min(want, end - (base + len(buf)))
            chunk = f.read(want) if want > 0 else b""
            eof = not chunk
            buf += chunk
            continue
        yield check.event(bytes(buf[i : i + need]), base + i)
        i += need


def read_file_events(path: str, *, verify_crc: bool = True) -> list[RawEvent]:
    """Every event of a binlog file (for tools and tests; loads the file)."""
    with open(path, "rb") as f:
        data = f.read()
    check_magic(data, path)
    return list(iter_events(data, verify_crc=verify_crc, where=path))

