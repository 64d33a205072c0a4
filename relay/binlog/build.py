"""Make and mend events: synthesized ROTATE / GTID_LIST / HEARTBEAT, FDE copies, and
log_pos rewrites with checksum recomputation."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

from relay.binlog.constants import (
    CRC_LEN,
    HEADER_LEN,
    LOG_EVENT_ARTIFICIAL_F,
    LOG_EVENT_BINLOG_IN_USE_F,
    EventType,
)
from relay.binlog.gtid import Gtid
from relay.binlog.header import HEADER


def build_event(type_code: int, body: bytes, *, server_id: int, log_pos: int, timestamp: int = 0,
                flags: int = 0, checksum: bool = True) -> bytes:
    size = HEADER_LEN + len(body) + (CRC_LEN if checksum else 0)
    raw = HEADER.pack(timestamp, type_code, server_id, size, log_pos, flags) + body
    if checksum:
        raw += struct.pack("<I", zlib.crc32(raw) & 0xFFFFFFFF)
    return raw


def rotate(next_file: str, *, position: int = 4, server_id: int, log_pos: int,
           timestamp: int = 0, artificial: bool = False, checksum: bool = True) -> bytes:
    body = struct.pack("<Q", position) + next_file.encode()
    return build_event(EventType.ROTATE, body, server_id=server_id, log_pos=log_pos,
                       timestamp=timestamp, flags=LOG_EVENT_ARTIFICIAL_F if artificial else 0,
                       checksum=checksum)


def gtid_list(gtids: Iterable[Gtid], *, server_id: int, log_pos: int, timestamp: int = 0,
              artificial: bool = False, checksum: bool = True) -> bytes:
    items = sorted(gtids)
    body = struct.pack("<I", len(items)) + b"".join(
        struct.pack("<IIQ", g.domain, g.server_id, g.seq) for g in items)
    return build_event(EventType.GTID_LIST, body, server_id=server_id, log_pos=log_pos,
                       timestamp=timestamp, flags=LOG_EVENT_ARTIFICIAL_F if artificial else 0,
                       checksum=checksum)


def binlog_checkpoint(file_name: str, *, server_id: int, log_pos: int, timestamp: int = 0,
                      checksum: bool = True) -> bytes:
    raw = file_name.encode()
    return build_event(EventType.BINLOG_CHECKPOINT, struct.pack("<I", len(raw)) + raw,
                       server_id=server_id, log_pos=log_pos, timestamp=timestamp,
                       checksum=checksum)


def heartbeat(file_name: str, *, server_id: int, log_pos: int, checksum: bool = True) -> bytes:
    return build_event(EventType.HEARTBEAT, file_name.encode(), server_id=server_id,
                       log_pos=log_pos, checksum=checksum)


def copy_fde(fde: bytes, *, log_pos: int, created: int | None = None,
             timestamp: int | None = None) -> bytes:
    """A FORMAT_DESCRIPTION copy with a new log_pos (and created/timestamp), the in-use flag
    cleared and its CRC recomputed. The FDE always carries a CRC slot on checksum-aware
    servers, even when the algorithm is OFF."""
    out = bytearray(fde)
    struct.pack_into("<I", out, 13, log_pos)
    flags = struct.unpack_from("<H", out, 17)[0] & ~LOG_EVENT_BINLOG_IN_USE_F
    struct.pack_into("<H", out, 17, flags)
    if created is not None:
        struct.pack_into("<I", out, HEADER_LEN + 52, created)
    if timestamp is not None:
        struct.pack_into("<I", out, 0, timestamp)
    struct.pack_into("<I", out, len(out) - CRC_LEN, zlib.crc32(out[:-CRC_LEN]) & 0xFFFFFFFF)
    return bytes(out)


def with_log_pos(event: bytes | bytearray | memoryview, log_pos: int,
                 checksum: bool) -> bytearray:
    """The event with a new log_pos, CRC recomputed when the stream carries checksums."""
    out = bytearray(event)
    struct.pack_into("<I", out, 13, log_pos)
    if checksum:
        struct.pack_into("<I", out, len(out) - CRC_LEN, zlib.crc32(out[:-CRC_LEN]) & 0xFFFFFFFF)
    return out
