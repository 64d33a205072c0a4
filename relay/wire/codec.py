"""Primitive encodings of the MySQL protocol: length-encoded integers and strings."""

from __future__ import annotations

import struct

from relay.errors import RemoteProtocolError

MAX_PACKET = 0xFFFFFF


def lenenc_int(value: int) -> bytes:
    if value < 251:
        return bytes((value,))
    if value < 1 << 16:
        return b"\xfc" + struct.pack("<H", value)
    if value < 1 << 24:
        return b"\xfd" + struct.pack("<I", value)[:3]
    return b"\xfe" + struct.pack("<Q", value)


def lenenc_str(value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return lenenc_int(len(raw)) + raw


def read_lenenc_int(buf: bytes | memoryview, pos: int) -> tuple[int | None, int]:
    """Return (value, next_pos); value is None for the NULL marker 0xFB."""
    if pos >= len(buf):
        raise RemoteProtocolError("length-encoded integer past end of packet")
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFB:
        return None, pos + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
    if width is None or pos + 1 + width > len(buf):
        raise RemoteProtocolError(f"bad length-encoded integer prefix 0x{first:02x}")
    return int.from_bytes(buf[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


def read_lenenc_str(buf: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_lenenc_int(buf, pos)
    if length is None:
        return None, pos
    if pos + length > len(buf):
        raise RemoteProtocolError("length-encoded string past end of packet")
    return bytes(buf[pos : pos + length]), pos + length


def read_nul_str(buf: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    raw = bytes(buf[pos:])
    end = raw.find(b"\0")
    if end < 0:
        raise RemoteProtocolError("missing NUL terminator")
    return raw[:end], pos + end + 1
