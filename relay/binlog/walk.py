"""Walking binlog events laid back to back in a buffer, by the size field of each header.

Every reader of stored events (the relay log's cursors, a dump, the tap, the rules, the
segment header reader, the file framing) takes its events from here, so an impossible
size is caught the same way everywhere and no one hand-writes the loop again.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from relay import kernels
from relay.binlog.constants import HEADER_LEN
from relay.errors import MalformedEvent

Buffer = bytes | bytearray | memoryview

MAX_EVENT_SIZE = 1 << 31
_SIZE = struct.Struct("<I").unpack_from  # one C call: half the time of four byte reads


def event_size(buf: Buffer, pos: int) -> int:
    """The size field of the event header at `pos`; the caller checked 19 bytes are there."""
    return int(_SIZE(buf, pos + 9)[0])


def spans(buf: Buffer, start: int = 0, end: int | None = None, *, where: str = "",
          base: int = 0) -> Iterator[tuple[int, int]]:
    """(offset in `buf`, size) of each whole event from `start` up to `end` (the buffer's
    end by default). Stops before an event that does not fit: the caller reads on from
    `offset` of the last one + its size (see `whole`). An event size smaller than its
    header or past MAX_EVENT_SIZE raises MalformedEvent at `base` + its offset (`base`: the
    buffer's own offset in its file)."""
    n = len(buf) if end is None else end
    pos = start
    size_at = _SIZE
    while n - pos >= HEADER_LEN:
        size = size_at(buf, pos + 9)[0]
        if size < HEADER_LEN or size > MAX_EVENT_SIZE:
            raise MalformedEvent(f"impossible event size {size}", where=where or None,
                                 offset=base + pos)
        if pos + size > n:
            return
        yield pos, size
        pos += size


def whole(buf: Buffer, start: int = 0, end: int | None = None, *, where: str = "",
          base: int = 0) -> int:
    """Where the whole events of buf[start:end] end (`start` when not even one fits): the
    walk of `spans` in one kernel call (relay/kernels `whole_events`)."""
    try:
        return kernels.whole_events(buf, start, len(buf) if end is None else end)
    except MalformedEvent as exc:
        at = exc.offset or 0
        raise MalformedEvent(f"impossible event size {event_size(buf, at)}",
                             where=where or None, offset=base + at) from None
