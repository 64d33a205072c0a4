"""Make and mend events: synthesized ROTATE / GTID_LIST / PREVIOUS_GTIDS / HEARTBEAT,
FDE copies, and `reframe`, the one rewrite of an event's frame (log_pos, body, type,
flags, with event_size and the CRC made right) that the ingest, the relay log, the rules
and the dump's checksum stripping all use."""

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
from relay.binlog.flavour import Flavour
from relay.binlog.gtid import Gtid, GtidPosition, GtidState
from relay.binlog.header import HEADER
from relay.binlog.tablemap import write_packed

_CRC = struct.Struct("<I")
_LOG_POS = struct.Struct("<I")


def _frame(timestamp: int, type_code: int, server_id: int, log_pos: int, flags: int,
           body: bytes | bytearray | memoryview, checksum: bool) -> bytes:
    size = HEADER_LEN + len(body) + (CRC_LEN if checksum else 0)
    raw = HEADER.pack(timestamp, type_code, server_id, size, log_pos, flags) + bytes(body)
    if checksum:
        raw += _CRC.pack(zlib.crc32(raw) & 0xFFFFFFFF)
    return raw


def build_event(type_code: int, body: bytes, *, server_id: int, log_pos: int, timestamp: int = 0,
                flags: int = 0, checksum: bool = True) -> bytes:
    return _frame(timestamp, type_code, server_id, log_pos, flags, body, checksum)


def reframe(event: bytes | bytearray | memoryview, checksum: bool, *,
            log_pos: int | None = None, body: bytes | bytearray | memoryview | None = None,
            type_code: int | None = None, flags: int | None = None,
            timestamp: int | None = None, strip_crc: bool = False) -> bytes:
    """`event` (ending in a CRC when `checksum`) with a new log_pos, body, type, header
    flags or timestamp, its event_size and CRC made right; the other header fields kept.
    `strip_crc` drops the CRC (a client that did not ask for checksums). A log_pos alone
    takes the fast way: one copy, the CRC recomputed in place."""
    if body is None and type_code is None and flags is None and timestamp is None \
            and not strip_crc:
        out = bytearray(event)
        if log_pos is not None:
            _LOG_POS.pack_into(out, 13, log_pos)
        if checksum:
            _CRC.pack_into(out, len(out) - CRC_LEN, zlib.crc32(memoryview(out)[:-CRC_LEN]))
        return bytes(out)
    ts, typ, server_id, _size, old_pos, old_flags = HEADER.unpack_from(event, 0)
    if body is None:
        body = memoryview(event)[HEADER_LEN : len(event) - (CRC_LEN if checksum else 0)]
    return _frame(ts if timestamp is None else timestamp,
                  typ if type_code is None else type_code, server_id,
                  old_pos if log_pos is None else log_pos,
                  old_flags if flags is None else flags, body, checksum and not strip_crc)


def rotate(next_file: str, *, position: int = 4, server_id: int, log_pos: int,
           timestamp: int = 0, artificial: bool = False, checksum: bool = True) -> bytes:
    body = struct.pack("<Q", position) + next_file.encode()
    return build_event(EventType.ROTATE, body, server_id=server_id, log_pos=log_pos,
                       timestamp=timestamp, flags=LOG_EVENT_ARTIFICIAL_F if artificial else 0,
                       checksum=checksum)


def gtid_list(gtids: Iterable[Gtid], *, server_id: int, log_pos: int, timestamp: int = 0,
              artificial: bool = False, checksum: bool = True, count_flags: int = 0) -> bytes:
    """`count_flags`: bits OR'd into the count field (MariaDB's FLAG_UNTIL_REACHED)."""
    body = bytearray(GtidState(gtids).header_body())
    body[0:4] = (int.from_bytes(body[0:4], "little") | count_flags).to_bytes(4, "little")
    return build_event(EventType.GTID_LIST, bytes(body),
                       server_id=server_id, log_pos=log_pos, timestamp=timestamp,
                       flags=LOG_EVENT_ARTIFICIAL_F if artificial else 0, checksum=checksum)


def position_event(position: GtidPosition, *, server_id: int, log_pos: int,
                   timestamp: int = 0, checksum: bool = True) -> bytes:
    """The event a binlog file of the position's flavour opens with: GTID_LIST (MariaDB)
    or PREVIOUS_GTIDS (MySQL)."""
    return build_event(Flavour.of_position(position).header_event, position.header_body(),
                       server_id=server_id, log_pos=log_pos, timestamp=timestamp,
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


def heartbeat_v2(file_name: str, *, server_id: int, log_pos: int,
                 checksum: bool = True) -> bytes:
    """MySQL 8.0.26+'s HEARTBEAT_LOG_EVENT_V2, for a dump that asked for it
    (USE_HEARTBEAT_EVENT_V2): fields as type, length, value (the file name, then the
    position as a length-encoded integer), then 0 (as MySQL 9.7 sends it)."""
    name = file_name.encode()
    position = write_packed(log_pos)
    body = (b"\x01" + write_packed(len(name)) + name
            + b"\x02" + write_packed(len(position)) + position + b"\x00")
    return build_event(EventType.HEARTBEAT_V2, body, server_id=server_id,
                       log_pos=min(log_pos, 0xFFFFFFFF), checksum=checksum)


def copy_fde(fde: bytes, *, log_pos: int, created: int | None = None,
             timestamp: int | None = None) -> bytes:
    """A FORMAT_DESCRIPTION copy with a new log_pos (and created/timestamp), the in-use flag
    cleared and its CRC recomputed. The FDE always carries a CRC slot on checksum-aware
    servers, even when the algorithm is OFF."""
    body = bytearray(fde[HEADER_LEN:-CRC_LEN])
    if created is not None:
        struct.pack_into("<I", body, 52, created)
    flags = struct.unpack_from("<H", fde, 17)[0] & ~LOG_EVENT_BINLOG_IN_USE_F
    return reframe(fde, True, log_pos=log_pos, body=body, flags=flags, timestamp=timestamp)


def fde_without_checksum(fde: bytes) -> bytes:
    """The FORMAT_DESCRIPTION for a client that takes no checksums: algorithm OFF. The FDE
    keeps its CRC slot (and a right CRC), as servers send it."""
    body = bytearray(fde[HEADER_LEN:-CRC_LEN])
    body[-1] = 0
    return reframe(fde, True, body=body)
