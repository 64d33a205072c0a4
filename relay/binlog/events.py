"""Typed, lazy views over event bytes.

An `Event` parses its 19-byte header at once; bodies are decoded only when a caller asks
(`decode_*`). Pass-through code never calls them. Every decoder checks lengths and raises
MalformedEvent rather than IndexError or struct.error.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from relay.binlog.checksum import ALG_CRC32, ALG_OFF, ALG_UNDEF
from relay.binlog.constants import CRC_LEN, FL_STANDALONE, HEADER_LEN
from relay.binlog.gtid import Gtid, GtidSet
from relay.binlog.header import EventHeader, parse_header
from relay.errors import MalformedEvent


class Event:
    """One binlog event: raw bytes plus the parsed header. `checksum` says whether the last
    4 bytes are a CRC (decided by the governing FORMAT_DESCRIPTION)."""

    __slots__ = ("checksum", "data", "header")

    def __init__(self, data: bytes, checksum: bool) -> None:
        self.data = data
        self.header: EventHeader = parse_header(data)
        if self.header.event_size != len(data):
            raise MalformedEvent(f"{self.header.type_name} event_size {self.header.event_size} "
                                 f"but {len(data)} bytes")
        self.checksum = checksum

    @property
    def type_code(self) -> int:
        return self.header.type_code

    @property
    def body(self) -> bytes:
        end = len(self.data) - (CRC_LEN if self.checksum else 0)
        if end < HEADER_LEN:
            raise MalformedEvent(f"{self.header.type_name} event too short for its checksum")
        return self.data[HEADER_LEN:end]

    def __repr__(self) -> str:
        h = self.header
        return (f"<{h.type_name} server_id={h.server_id} size={h.event_size} "
                f"log_pos={h.log_pos} flags=0x{h.flags:04x}>")


def _need(body: bytes, n: int, what: str) -> None:
    if len(body) < n:
        raise MalformedEvent(f"{what} body needs {n} bytes, has {len(body)}")


# --- FORMAT_DESCRIPTION -----------------------------------------------------------------

@dataclass(frozen=True)
class FormatDescription:
    binlog_version: int
    server_version: str
    created: int
    header_len: int
    post_header_lens: bytes
    checksum_alg: int

    @property
    def has_crc(self) -> bool:
        return self.checksum_alg == ALG_CRC32

    @property
    def is_mariadb(self) -> bool:
        return "mariadb" in self.server_version.lower()


def decode_fde(data: bytes) -> FormatDescription:
    """Decode a FORMAT_DESCRIPTION event from its full bytes.

    The checksum algorithm byte sits just before the trailing 4 CRC bytes on any
    checksum-aware server (even when the algorithm is OFF), so the FDE is self-describing.
    """
    body = data[HEADER_LEN:]
    _need(body, 57, "FORMAT_DESCRIPTION")
    version, = struct.unpack_from("<H", body, 0)
    server_version = body[2:52].split(b"\0", 1)[0].decode("ascii", "replace")
    created, = struct.unpack_from("<I", body, 52)
    header_len = body[56]
    if header_len != HEADER_LEN:
        raise MalformedEvent(f"FORMAT_DESCRIPTION has header length {header_len}, expected 19")
    rest = body[57:]
    alg = ALG_UNDEF
    # Checksum-aware servers end with alg(1) + crc(4); older ones end with the table.
    if len(rest) >= 5 and rest[-5] in (ALG_OFF, ALG_CRC32) and _version_has_checksum(
            server_version):
        alg = rest[-5]
        post = rest[:-5]
    else:
        post = rest
    return FormatDescription(version, server_version, created, header_len, bytes(post), alg)


def _version_has_checksum(version: str) -> bool:
    digits = version.split("-", 1)[0].split(".")
    try:
        major, minor, patch = (int("".join(ch for ch in d if ch.isdigit()) or 0)
                               for d in ([*digits, "0", "0"])[:3])
    except ValueError:
        return True
    return (major, minor, patch) >= (5, 6, 1) or major >= 10


# --- small fixed events -------------------------------------------------------------------

@dataclass(frozen=True)
class Rotate:
    position: int
    next_file: str


def decode_rotate(ev: Event) -> Rotate:
    body = ev.body
    _need(body, 8, "ROTATE")
    return Rotate(struct.unpack_from("<Q", body, 0)[0], body[8:].decode("utf-8", "replace"))


@dataclass(frozen=True)
class GtidEvent:
    gtid: Gtid
    flags2: int

    @property
    def standalone(self) -> bool:
        return bool(self.flags2 & FL_STANDALONE)


def decode_gtid(ev: Event) -> GtidEvent:
    body = ev.body
    _need(body, 13, "GTID")
    seq, domain, flags2 = struct.unpack_from("<QIB", body, 0)
    return GtidEvent(Gtid(domain, ev.header.server_id, seq), flags2)


def decode_gtid_list(ev: Event) -> list[Gtid]:
    body = ev.body
    _need(body, 4, "GTID_LIST")
    count = struct.unpack_from("<I", body, 0)[0] & 0x0FFFFFFF
    _need(body, 4 + 16 * count, "GTID_LIST")
    out = []
    for i in range(count):
        d, s, q = struct.unpack_from("<IIQ", body, 4 + 16 * i)
        out.append(Gtid(d, s, q))
    return out


def decode_xid(ev: Event) -> int:
    body = ev.body
    _need(body, 8, "XID")
    return int(struct.unpack_from("<Q", body, 0)[0])


def decode_checkpoint(ev: Event) -> str:
    body = ev.body
    _need(body, 4, "BINLOG_CHECKPOINT")
    n = struct.unpack_from("<I", body, 0)[0]
    _need(body, 4 + n, "BINLOG_CHECKPOINT")
    return body[4 : 4 + n].decode("utf-8", "replace")


def decode_heartbeat(ev: Event) -> str:
    return ev.body.decode("utf-8", "replace")


# --- QUERY ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    thread_id: int
    exec_time: int
    error_code: int
    schema: str
    text: bytes


def decode_query(ev: Event) -> Query:
    body = ev.body
    _need(body, 13, "QUERY")
    thread_id, exec_time, db_len, err, sv_len = struct.unpack_from("<IIBHH", body, 0)
    start = 13 + sv_len
    _need(body, start + db_len + 1, "QUERY")
    schema = body[start : start + db_len].decode("utf-8", "replace")
    return Query(thread_id, exec_time, err, schema, body[start + db_len + 1 :])


def query_text(data: bytes | bytearray | memoryview, checksum: bool) -> bytes:
    """Just the statement text of a QUERY event, for transaction-boundary checks."""
    end = len(data) - (CRC_LEN if checksum else 0)
    if end < HEADER_LEN + 13:
        raise MalformedEvent("QUERY event too short")
    db_len = data[HEADER_LEN + 8]
    sv_len = data[HEADER_LEN + 11] | (data[HEADER_LEN + 12] << 8)
    return bytes(data[HEADER_LEN + 13 + sv_len + db_len + 1 : end])


# --- MySQL ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MysqlGtidEvent:
    flags: int
    sid: uuid.UUID
    gno: int
    last_committed: int | None
    sequence_number: int | None


def decode_mysql_gtid(ev: Event) -> MysqlGtidEvent:
    body = ev.body
    _need(body, 25, "MySQL GTID")
    flags = body[0]
    sid = uuid.UUID(bytes=bytes(body[1:17]))
    gno, = struct.unpack_from("<Q", body, 17)
    lc = sn = None
    if len(body) >= 42 and body[25] == 2:
        lc, sn = struct.unpack_from("<QQ", body, 26)
    return MysqlGtidEvent(flags, sid, gno, lc, sn)


def decode_previous_gtids(ev: Event) -> GtidSet:
    return GtidSet.decode(ev.body)

