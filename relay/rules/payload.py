"""MySQL's compressed transactions (TRANSACTION_PAYLOAD) for the rules: the inner events
walked as they inflate, one at a time (never the whole transaction in memory), and the
events the rules keep packed into a payload again.

A payload's body is a few type-length-value header fields (compression type, uncompressed
size, payload size, an end mark) and then the transaction's events (QUERY BEGIN ... XID,
no CRCs, log_pos 0) as one zstd frame (or as they are, compression type NONE). See
`relay.binlog.compression`, whose header reader this uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from relay.binlog.compression import MAX_UNCOMPRESSED, NONE, ZSTD, decode_payload
from relay.binlog.constants import HEADER_LEN
from relay.errors import MalformedEvent
from relay.wire.codec import lenenc_int

_END_MARK, _PAYLOAD_SIZE, _COMPRESSION_TYPE, _UNCOMPRESSED_SIZE = 0, 1, 2, 3
# zstd's levels: MySQL's default (binlog_transaction_compression_level_zstd = 3), and the
# one tried when a re-packed transaction came out larger than the stored one.
LEVEL, TIGHT_LEVEL = 3, 19
_READ = 64 << 10  # bytes of the frame fed to the decompressor at a time


def _read_exact(reader: Any, n: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        part = reader.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def inner_events(body: bytes) -> Iterator[bytes]:
    """The inner events of a TRANSACTION_PAYLOAD body, each with its header and no CRC,
    inflated one at a time. MalformedEvent for a payload that does not hold whole events
    or inflates to another size than its header says."""
    payload = decode_payload(body)
    declared = payload.uncompressed_size
    if payload.compression_type == NONE:
        reader: Any = _Bytes(payload.payload)
    elif payload.compression_type == ZSTD:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(payload.payload, read_size=_READ)
    else:
        raise MalformedEvent(f"TRANSACTION_PAYLOAD compression type "
                             f"{payload.compression_type} is unknown")
    limit = declared or MAX_UNCOMPRESSED
    total = 0
    try:
        while True:
            head = _read_exact(reader, HEADER_LEN)
            if not head:
                break
            size = int.from_bytes(head[9:13], "little") if len(head) == HEADER_LEN else 0
            if size < HEADER_LEN or total + size > limit:
                raise MalformedEvent(f"TRANSACTION_PAYLOAD inner event at {total} runs past "
                                     "the payload")
            rest = _read_exact(reader, size - HEADER_LEN)
            if len(rest) != size - HEADER_LEN:
                raise MalformedEvent(f"TRANSACTION_PAYLOAD inner event at {total} runs past "
                                     "the payload")
            total += size
            yield head + rest
    except MalformedEvent:
        raise
    except Exception as exc:  # zstandard.ZstdError: a broken frame
        raise MalformedEvent(f"TRANSACTION_PAYLOAD: {exc}") from exc
    if declared and total != declared:
        raise MalformedEvent(f"TRANSACTION_PAYLOAD inflated to {total} bytes, header says "
                             f"{declared}")


class _Bytes:
    """An uncompressed payload read like the decompressor's stream."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def read(self, n: int) -> bytes:
        out = bytes(self._data[self._pos : self._pos + n])
        self._pos += len(out)
        return out


def _field(ftype: int, value: int) -> bytes:
    encoded = lenenc_int(value)
    return lenenc_int(ftype) + lenenc_int(len(encoded)) + encoded


# Up to this many bytes of events a packer keeps, to pack them again tighter when the
# first frame came out larger than the one it replaces.
_RETRY_LIMIT = 1 << 20


class Packer:
    """Events (with their headers, no CRCs) packed into a TRANSACTION_PAYLOAD body as they
    come: the compressed frame is kept, the events themselves only while they are small
    (for `body`'s tighter second try)."""

    def __init__(self, level: int = LEVEL) -> None:
        self._compressor = _compressor(level)
        self._frame: list[bytes] = []
        self._events: list[bytes] | None = []
        self.size = 0        # the events' bytes, uncompressed

    def add(self, event: bytes) -> None:
        self.size += len(event)
        if self._events is not None:
            self._events.append(event)
            if self.size > _RETRY_LIMIT:
                self._events = None
        if chunk := self._compressor.compress(event):
            self._frame.append(chunk)

    def body(self, within: int | None = None) -> bytes:
        """The payload event's body: the header fields, then the frame. `within`: a size
        it should not pass (the body it replaces): when it does, the events are packed
        again at a tighter level if they were kept."""
        out = self._body([*self._frame, _finish(self._compressor)])
        if within is not None and len(out) > within and self._events is not None:
            tight = _compressor(TIGHT_LEVEL)
            frame = [tight.compress(ev) for ev in self._events]
            out = min(out, self._body([*frame, _finish(tight)]), key=len)
        return out

    def _body(self, frame_parts: list[bytes]) -> bytes:
        frame = b"".join(frame_parts)
        return (_field(_COMPRESSION_TYPE, ZSTD) + _field(_UNCOMPRESSED_SIZE, self.size)
                + _field(_PAYLOAD_SIZE, len(frame)) + lenenc_int(_END_MARK) + frame)


def _compressor(level: int) -> Any:
    import zstandard

    return zstandard.ZstdCompressor(level=level).compressobj()


def _finish(compressor: Any) -> bytes:
    import zstandard

    return bytes(compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))


def pack(events: Iterable[bytes], level: int = LEVEL) -> bytes:
    """A TRANSACTION_PAYLOAD body holding `events` (headers, no CRCs)."""
    packer = Packer(level)
    for ev in events:
        packer.add(ev)
    return packer.body()
