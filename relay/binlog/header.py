"""The 19-byte common event header."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from relay.binlog.constants import HEADER_LEN, type_name
from relay.errors import MalformedEvent

HEADER = struct.Struct("<IBIIIH")


@dataclass(frozen=True, slots=True)
class EventHeader:
    timestamp: int
    type_code: int
    server_id: int
    event_size: int
    log_pos: int
    flags: int

    @property
    def type_name(self) -> str:
        return type_name(self.type_code)


def parse_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> EventHeader:
    if len(buf) - offset < HEADER_LEN:
        raise MalformedEvent(f"event header needs {HEADER_LEN} bytes, have {len(buf) - offset}")
    h = EventHeader(*HEADER.unpack_from(buf, offset))
    if h.event_size < HEADER_LEN:
        raise MalformedEvent(f"event size {h.event_size} smaller than its header")
    return h
