"""Binlog file framing: the magic, then events back to back, each checked (size and, when
the file's FORMAT_DESCRIPTION says so, CRC). Over bytes in memory (`iter_events`) or over
a file object the caller opened and hands in (`iter_file_events`, read in blocks); this
module opens no file itself."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from relay.binlog import walk
from relay.binlog.checksum import verify
from relay.binlog.constants import BINLOG_MAGIC, HEADER_LEN, EventType
from relay.binlog.events import decode_fde
from relay.binlog.walk import Buffer
from relay.errors import MalformedEvent


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


def iter_events(data: Buffer, *, start: int = 4, verify_crc: bool = True,
                checksum: bool = False, where: str = "binlog") -> Iterator[RawEvent]:
    """Yield the events of a binlog file image from `start` (a byte offset at an event start;
    `checksum`: the CRC mode when starting past the file's FORMAT_DESCRIPTION).

    Raises TornTail when the data ends inside an event, and MalformedEvent (with the
    offset) for a header or checksum that cannot be right.
    """
    check = _Checker(verify_crc, where)
    check.has_crc = checksum
    pos = start
    for pos, size in walk.spans(data, start, where=where):
        yield check.event(bytes(data[pos : pos + size]), pos)
        pos += size
    _torn(data, pos, len(data), where, pos)


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
    buf = b""
    base = start  # file offset of buf[0]
    while True:
        used = 0
        for pos, size in walk.spans(buf, where=where, base=base):
            yield check.event(buf[pos : pos + size], base + pos)
            used = pos + size
        rest = buf[used:]
        base += used
        need = walk.event_size(rest, 0) if len(rest) >= HEADER_LEN else HEADER_LEN
        want = max(block, need - len(rest))
        if end is not None:
            want = min(want, end - (base + len(rest)))
        chunk = f.read(want) if want > 0 else b""
        if not chunk:
            _torn(rest, 0, len(rest), where, base)
            return
        buf = rest + chunk


def _torn(data: bytes | bytearray | memoryview, pos: int, n: int, where: str,
          offset: int) -> None:
    """Raise TornTail when bytes are left at `pos` that do not make a whole event."""
    have = n - pos
    if have == 0:
        return
    if have < HEADER_LEN:
        raise TornTail("file ends inside an event header", where=where, offset=offset)
    raise TornTail(f"file ends inside a {walk.event_size(data, pos)}-byte event",
                   where=where, offset=offset)
