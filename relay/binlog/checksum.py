"""CRC32 event checksums (zlib's CRC-32 over the event minus its last 4 bytes)."""

from __future__ import annotations

import struct
import zlib

from relay.binlog.constants import CRC_LEN, HEADER_LEN

ALG_OFF = 0
ALG_CRC32 = 1
ALG_UNDEF = 255


def crc_of(event: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(memoryview(event)[: len(event) - CRC_LEN]) & 0xFFFFFFFF


def verify(event: bytes | bytearray | memoryview) -> bool:
    if len(event) < HEADER_LEN + CRC_LEN:
        return False
    stored: int = struct.unpack_from("<I", event, len(event) - CRC_LEN)[0]
    if crc_of(event) == stored:
        return True
    if event[4] == 15 and event[17] & 0x01:
        # A FORMAT_DESCRIPTION of an open file: its CRC was taken with BINLOG_IN_USE clear.
        copy = bytearray(event)
        copy[17] &= 0xFE
        return crc_of(copy) == stored
    return False
