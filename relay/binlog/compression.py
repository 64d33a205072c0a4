"""Compressed events.

MariaDB (`log_bin_compress=ON`): QUERY_COMPRESSED and the *_ROWS_COMPRESSED events keep
their headers and compress the rest (the query text; the rows after the bitmaps) into one
block: a byte `0x80 | n`, the uncompressed length in n big-endian bytes, then a zlib
stream (zlib's `compress()` at its default level, which Python's zlib reproduces).

MySQL (`binlog_transaction_compression=ON`): TRANSACTION_PAYLOAD holds a transaction's
events (QUERY BEGIN ... XID, no CRCs, log_pos 0) as one zstd frame after a few
type-length-value header fields.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from relay.binlog import walk
from relay.errors import MalformedEvent

MAX_UNCOMPRESSED = 1 << 32

# TRANSACTION_PAYLOAD header fields.
_END_MARK, _PAYLOAD_SIZE, _COMPRESSION_TYPE, _UNCOMPRESSED_SIZE = 0, 1, 2, 3
ZSTD, NONE = 0, 255


def uncompress_block(block: bytes, what: str = "compressed event") -> bytes:
    if len(block) < 2 or (block[0] & 0xE0) != 0x80:
        raise MalformedEvent(f"{what}: no compression header")
    if (block[0] >> 4) & 0x07 != 0:
        raise MalformedEvent(f"{what}: unknown compression algorithm {(block[0] >> 4) & 7}")
    lenlen = block[0] & 0x07
    if not 1 <= lenlen <= 4 or len(block) < 1 + lenlen:
        raise MalformedEvent(f"{what}: bad length size {lenlen}")
    size = int.from_bytes(block[1 : 1 + lenlen], "big")
    try:
        d = zlib.decompressobj()
        out = d.decompress(block[1 + lenlen :], size + 1)
    except zlib.error as exc:
        raise MalformedEvent(f"{what}: {exc}") from exc
    if len(out) != size or not d.eof:
        raise MalformedEvent(f"{what}: inflated to {len(out)} bytes, header says {size}")
    return out


def compress_block(data: bytes) -> bytes:
    n = len(data)
    lenlen = 4 if n >= 1 << 24 else 3 if n >= 1 << 16 else 2 if n >= 1 << 8 else 1
    return bytes((0x80 | lenlen,)) + n.to_bytes(lenlen, "big") + zlib.compress(data)


# --- MySQL TRANSACTION_PAYLOAD -----------------------------------------------------------

@dataclass(frozen=True)
class TransactionPayload:
    compression_type: int
    uncompressed_size: int
    payload: bytes           # the compressed frame
    header_fields: bytes     # the raw field block, for re-encoding

    def events(self) -> Iterator[bytes]:
        """The inner events, each with its header (and no CRC)."""
        data = self.uncompressed()
        end = 0
        for pos, size in walk.spans(data, where="TRANSACTION_PAYLOAD"):
            yield data[pos : pos + size]
            end = pos + size
        if end != len(data):
            raise MalformedEvent(f"TRANSACTION_PAYLOAD inner event at {end} runs past the "
                                 "payload")

    def uncompressed(self) -> bytes:
        if self.compression_type == NONE:
            return self.payload
        if self.compression_type != ZSTD:
            raise MalformedEvent(f"TRANSACTION_PAYLOAD compression type "
                                 f"{self.compression_type} is unknown")
        import zstandard

        try:
            out = zstandard.ZstdDecompressor().decompress(
                self.payload, max_output_size=self.uncompressed_size or MAX_UNCOMPRESSED)
        except zstandard.ZstdError as exc:
            raise MalformedEvent(f"TRANSACTION_PAYLOAD: {exc}") from exc
        if self.uncompressed_size and len(out) != self.uncompressed_size:
            raise MalformedEvent(f"TRANSACTION_PAYLOAD inflated to {len(out)} bytes, header "
                                 f"says {self.uncompressed_size}")
        return bytes(out)


def _packed(buf: bytes, pos: int) -> tuple[int, int]:
    from relay.binlog.tablemap import read_packed

    return read_packed(buf, pos)


def decode_payload(body: bytes) -> TransactionPayload:
    fields: dict[int, int] = {}
    pos = 0
    try:
        while True:
            ftype, pos = _packed(body, pos)
            if ftype == _END_MARK:
                break
            flen, pos = _packed(body, pos)
            value, _ = _packed(body, pos)
            fields[ftype] = value
            pos += flen
    except (IndexError, struct.error, MalformedEvent) as exc:  # a field cut short
        raise MalformedEvent(f"TRANSACTION_PAYLOAD header: {exc}") from exc
    size = fields.get(_PAYLOAD_SIZE, len(body) - pos)
    if pos + size > len(body):
        raise MalformedEvent(f"TRANSACTION_PAYLOAD says {size} bytes, has {len(body) - pos}")
    return TransactionPayload(fields.get(_COMPRESSION_TYPE, ZSTD),
                              fields.get(_UNCOMPRESSED_SIZE, 0), body[pos : pos + size],
                              body[:pos])
