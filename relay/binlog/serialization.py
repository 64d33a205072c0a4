"""MySQL's event serialization format (8.3+), as far as the tagged GTID event uses it.

MySQL 8.3 writes GTID_TAGGED_LOG_EVENT (type 42) not as fixed offsets but as a message of
MySQL's own serialization library (`mysql::serialization`): a header of three
variable-length integers (format version, message size, last non-ignorable field id),
then fields, each its id as a variable-length integer and its value. An unsigned integer
takes 1 to 9 bytes: the trailing one-bits of the first byte count the bytes after it, and
the value is the little-endian number shifted right by the byte count (nine bytes: the
eight after the first). A signed integer is zig-zag encoded first. A fixed array (the
source UUID) is its elements one after another; a string is its length, then its bytes.

Hand-written because no Python library reads this format (python-mysql-replication
decodes the event with its own ad hoc reader), and it is small: the relay needs the
transaction's identity (source, tag, number) on the hot path and its timestamps for
`relay changes`. Sans-I/O: bytes in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.errors import MalformedEvent

# Field ids of the tagged GTID event (libs/mysql/binlog/event/control_events.h, Gtid_event
# ::define_fields); 7 (original commit timestamp) and 10 (original server version) are
# left out by the writer when they equal 6 and 9.
FLAGS, SOURCE, GNO, TAG, LAST_COMMITTED, SEQUENCE_NUMBER = range(6)
IMMEDIATE_COMMIT_TS, ORIGINAL_COMMIT_TS, TRANSACTION_LENGTH = 6, 7, 8
IMMEDIATE_SERVER_VERSION, ORIGINAL_SERVER_VERSION, COMMIT_GROUP_TICKET = 9, 10, 11
_SIGNED = frozenset({GNO, LAST_COMMITTED, SEQUENCE_NUMBER})
MAX_TAG = 32


def read_unsigned(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it) of the variable-length unsigned integer at `pos`."""
    if pos >= len(data):
        raise MalformedEvent(f"serialized integer at {pos} runs past the end")
    first = data[pos]
    extra = 0
    while extra < 8 and first & (1 << extra):
        extra += 1
    size = extra + 1
    if pos + size > len(data):
        raise MalformedEvent(f"serialized integer at {pos} runs past the end")
    if size == 9:
        return int.from_bytes(bytes(data[pos + 1 : pos + 9]), "little"), pos + 9
    return int.from_bytes(bytes(data[pos : pos + size]), "little") >> size, pos + size


def read_signed(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    raw, pos = read_unsigned(data, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def write_unsigned(value: int) -> bytes:
    """The variable-length form of `value` (0 <= value < 2**64)."""
    for size in range(1, 9):
        if value < 1 << (7 * size):
            return ((value << size) | ((1 << (size - 1)) - 1)).to_bytes(size, "little")
    return b"\xff" + value.to_bytes(8, "little")


def write_signed(value: int) -> bytes:
    return write_unsigned((value << 1) ^ (value >> 63) if value < 0 else value << 1)


@dataclass(frozen=True)
class TaggedGtid:
    """The fields of a GTID_TAGGED_LOG_EVENT body the relay reads."""

    flags: int
    source: bytes          # 16 bytes
    gno: int
    tag: str
    last_committed: int | None
    sequence_number: int | None
    immediate_commit_ts: int | None     # microseconds since the epoch
    original_commit_ts: int | None
    transaction_length: int | None


def decode_tagged_gtid(body: bytes | bytearray | memoryview, *,
                       identity_only: bool = False) -> TaggedGtid:
    """A tagged GTID event's body (after the common header, without the checksum).
    `identity_only` stops after the tag (the hot path needs only source, tag, number)."""
    _version, pos = read_unsigned(body, 0)
    size, pos = read_unsigned(body, pos)
    _last_needed, pos = read_unsigned(body, pos)
    end = min(size, len(body))
    values: dict[int, int] = {}
    source = b""
    tag = ""
    while pos < end:
        field, pos = read_unsigned(body, pos)
        if field == SOURCE:
            octets = bytearray(16)
            for i in range(16):
                octets[i], pos = read_unsigned(body, pos)
            source = bytes(octets)
        elif field == TAG:
            length, pos = read_unsigned(body, pos)
            if length > MAX_TAG or pos + length > len(body):
                raise MalformedEvent(f"tagged GTID event: a tag of {length} bytes")
            tag = bytes(body[pos : pos + length]).decode("ascii", "replace")
            pos += length
            if identity_only:
                break
        elif field in _SIGNED:
            values[field], pos = read_signed(body, pos)
        elif field <= COMMIT_GROUP_TICKET:
            values[field], pos = read_unsigned(body, pos)
        else:  # a field of a later version: its encoding is unknown, stop reading
            break
    if len(source) != 16 or GNO not in values:
        raise MalformedEvent("tagged GTID event without a source or a number")
    return TaggedGtid(
        flags=values.get(FLAGS, 0), source=source, gno=values[GNO], tag=tag,
        last_committed=values.get(LAST_COMMITTED),
        sequence_number=values.get(SEQUENCE_NUMBER),
        immediate_commit_ts=values.get(IMMEDIATE_COMMIT_TS),
        original_commit_ts=values.get(ORIGINAL_COMMIT_TS, values.get(IMMEDIATE_COMMIT_TS)),
        transaction_length=values.get(TRANSACTION_LENGTH))
