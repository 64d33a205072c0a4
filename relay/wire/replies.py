"""Generic reply packets: OK, ERR, EOF, and text result sets (both directions)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from relay.errors import RemoteProtocolError, ServerError
from relay.wire.codec import lenenc_int, lenenc_str, read_lenenc_int, read_lenenc_str

SERVER_STATUS_AUTOCOMMIT = 0x0002
OK_PACKET = b"\x00\x00\x00\x02\x00\x00\x00"


@dataclass(frozen=True)
class Ok:
    affected_rows: int
    last_insert_id: int
    status: int
    warnings: int


def is_ok(payload: bytes) -> bool:
    return bool(payload) and payload[0] == 0x00


def is_err(payload: bytes) -> bool:
    return bool(payload) and payload[0] == 0xFF


def is_eof(payload: bytes) -> bool:
    return bool(payload) and payload[0] == 0xFE and len(payload) < 9


def parse_ok(payload: bytes) -> Ok:
    if not is_ok(payload):
        raise RemoteProtocolError(f"expected OK packet, got 0x{payload[:1].hex()}")
    affected, pos = read_lenenc_int(payload, 1)
    last_id, pos = read_lenenc_int(payload, pos)
    status, warnings = (0, 0)
    if len(payload) >= pos + 4:
        status, warnings = struct.unpack_from("<HH", payload, pos)
    return Ok(affected or 0, last_id or 0, status, warnings)


def parse_err(payload: bytes) -> ServerError:
    if len(payload) < 3 or payload[0] != 0xFF:
        return ServerError(0, "HY000", "malformed error packet")
    code = struct.unpack_from("<H", payload, 1)[0]
    if len(payload) >= 9 and payload[3:4] == b"#":
        state = payload[4:9].decode("ascii", "replace")
        message = payload[9:].decode("utf-8", "replace")
    else:
        state, message = "HY000", payload[3:].decode("utf-8", "replace")
    return ServerError(code, state, message)


def raise_if_err(payload: bytes) -> None:
    if is_err(payload):
        raise parse_err(payload)


def build_err(code: int, message: str, sqlstate: str = "HY000") -> bytes:
    return b"\xff" + struct.pack("<H", code) + b"#" + sqlstate.encode()[:5] + message.encode()


def build_eof(status: int = SERVER_STATUS_AUTOCOMMIT, warnings: int = 0) -> bytes:
    return b"\xfe" + struct.pack("<HH", warnings, status)


SERVER_MORE_RESULTS_EXISTS = 0x0008


@dataclass(frozen=True)
class ColumnDef:
    """A result set column (Protocol::ColumnDefinition41)."""

    name: str
    type_code: int = 0xFD        # VAR_STRING
    charset: int = 33            # utf8_general_ci; 63 (binary) for numbers
    length: int = 1024
    flags: int = 0
    decimals: int = 0
    table: str = ""
    org_table: str = ""
    schema: str = ""
    org_name: str = ""


def column_definition(col: ColumnDef | str) -> bytes:
    c = ColumnDef(col) if isinstance(col, str) else col
    return (lenenc_str(b"def") + lenenc_str(c.schema) + lenenc_str(c.table)
            + lenenc_str(c.org_table) + lenenc_str(c.name) + lenenc_str(c.org_name or c.name)
            + b"\x0c" + struct.pack("<HIBHB", c.charset, c.length, c.type_code, c.flags,
                                    c.decimals) + b"\x00\x00")


def build_ok(status: int = SERVER_STATUS_AUTOCOMMIT, affected: int = 0, info: bytes = b""
             ) -> bytes:
    """An OK packet; `info` (a length-encoded string, as MariaDB sends it) when given."""
    return (b"\x00" + lenenc_int(affected) + lenenc_int(0) + struct.pack("<HH", status, 0)
            + (lenenc_str(info) if info else b""))


def text_result_set(columns: Sequence[str | ColumnDef],
                    rows: Sequence[Sequence[str | bytes | None]],
                    deprecate_eof: bool = False,
                    status: int = SERVER_STATUS_AUTOCOMMIT) -> list[bytes]:
    """Payloads of a text result set; frame them with consecutive sequence ids. `status`
    goes in the closing packet (SERVER_MORE_RESULTS_EXISTS when more results follow)."""
    out = [lenenc_int(len(columns))]
    out += [column_definition(c) for c in columns]
    if not deprecate_eof:
        out.append(build_eof())
    for row in rows:
        out.append(b"".join(b"\xfb" if v is None else lenenc_str(v) for v in row))
    if deprecate_eof:
        out.append(b"\xfe\x00\x00" + struct.pack("<HH", status, 0))
    else:
        out.append(build_eof(status))
    return out


def parse_text_row(payload: bytes, ncols: int) -> list[bytes | None]:
    values: list[bytes | None] = []
    pos = 0
    for _ in range(ncols):
        value, pos = read_lenenc_str(payload, pos)
        values.append(value)
    return values
