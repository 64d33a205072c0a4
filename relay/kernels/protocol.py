"""The one signature both implementations of the kernels keep: `pure.py` and the compiled
`compiled.pyx` (its `compiled.pyi` states it for mypy). `relay/kernels/__init__.py`
assigns each module to a `Kernels` variable, so a twin whose signature drifts fails the
type check, not a replica at run time."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any, Protocol

Buffer = bytes | bytearray | memoryview


class EventKind(IntEnum):
    """What an event type is to the ingest's scan (`kinds`: one byte per type code)."""

    OTHER = 0  # the caller's: the scan stops before it
    PLAIN = 1  # rows, table maps, annotations: inside a transaction only
    GTID = 2   # a MariaDB GTID, which may open a transaction
    XID = 3    # the commit of a transactional one


class CleanKind(IntEnum):
    """What an event type is to the rules' scan for untouched transactions (`kinds`)."""

    OTHER = 0      # the scan stops: the rules look at the transaction event by event
    GTID = 1       # a MariaDB GTID: a transaction opens
    TABLE_MAP = 2  # judged by the caller (`table_map`)
    ROWS = 3       # of a table mapped and judged in the same transaction
    ANNOTATION = 4
    XID = 5        # the transaction ends
    MYSQL_GTID = 6  # a MySQL GTID (or anonymous, or tagged): a QUERY "BEGIN" must follow
    QUERY = 7      # a statement: taken only as a MySQL transaction's BEGIN


class SpliceMode(IntEnum):
    """What splice_rows does with a column of a row image (`masked`: one byte per column)."""

    KEEP = 0    # its stored bytes as they are
    STORED = 1  # its replacer takes the stored bytes (length prefix included) and gives
    #             what takes their place, or None for NULL
    VALUE = 2   # (a column with a length prefix) its replacer takes the value's bytes
    #             and gives the new value, written behind a prefix of the same size


# A masked column's replacer in splice_rows (see SpliceMode).
Replacer = Callable[[bytes], "bytes | None"]


class PlanStep(IntEnum):
    """The first field of each step of a scan plan (see pure.scan_ingest)."""

    BEGIN = 0
    REWRITE = 1
    COMMIT = 2


class ColumnStep(IntEnum):
    """The first of the four ints of each column of a typed decode plan (see
    pure.decode_columns), with what the other three say."""

    INT = 1         # bytes stored (1-4, 8), signed (1/0), bytes out (1, 2, 4, 8; 16: decimal128),
    #                 wider than stored unless signed
    YEAR = 2        # one byte -> int16 (0, or 1900 + the byte)
    FLOAT = 3       # 4 bytes, as they are (NaN and infinities: not converted)
    DOUBLE = 4      # 8 bytes, as they are
    DECIMAL = 5     # precision (<= 38), scale, bytes stored -> decimal128
    DATE = 6        # 3 bytes -> int32 days since 1970-01-01
    DATETIME2 = 7   # fraction digits -> int64 microseconds since 1970-01-01 (wall clock)
    TIMESTAMP2 = 8  # fraction digits -> int64 microseconds since the epoch (UTC)
    TEXT = 9        # length bytes (1-4), then how: 0 bytes as they are (and zero-pad to
    #                 the third, BINARY(n)), 1 UTF-8 checked (0), 2 a single-byte
    #                 character set recoded to UTF-8 by charmaps[the third]
    # row_values only (the plan's other kernels refuse them):
    TIME2 = 10      # fraction digits -> a timedelta (negative values borrow, as servers write)
    ENUM = 11       # bytes stored (1, 2), then 1: the member members[the third] names by
    #                 its number ('' for 0), or 0 (no names in the table map): the number
    BIT = 12        # bytes stored (1-8) -> an int (big-endian, as servers store BIT(n))
    SET = 13        # bytes stored (1-8), then 1: a frozenset of the names of members[the
    #                 third] its bits pick (little-endian), or 0 (no names): the number
    CALL = 14       # length bytes (1-4), 0, then calls[the third](the value's bytes): JSON,
    #                 spatial, a hinted column (a call that raises or gives None gives the
    #                 event back)
    # json_images and change_lines only (BIT and TIME2 too):
    JSON = 15       # length bytes (1-4): MySQL's binary JSON document as its JSON text
    #                 (jsonvalue's form; a document with an opaque scalar other than a
    #                 DECIMAL, a NaN or infinity, or bad bytes gives the event back)
    GEOMETRY = 16   # length bytes (1-4): {"srid":N,"wkb":"base64"} of the SRID (4 bytes,
    #                 little-endian) and the WKB after it


class TextStep(IntEnum):
    """How json_text_rows writes a column of a text result set (one int per column): the
    server's text of the value, as the tap's JSON writer writes the row codec's value."""

    INT = 1        # integers and YEAR: "-0042" -> -42
    TEXT = 2       # UTF-8 text (the connection's utf8mb4), JSON-escaped
    BASE64 = 3     # binary strings
    DECIMAL = 4    # the text quoted (given back below 1e-6: Python writes those as 1E-7)
    DATE = 5       # the text quoted (given back: zero parts, days past the 28th)
    DATETIME = 6   # "T" for the space (given back as DATE)
    TIMESTAMP = 7  # as DATETIME, and "+00:00" (the session's zone is UTC)


class Kernels(Protocol):
    def whole_events(self, buf: Buffer, start: int, end: int) -> int:
        ...

    def checked_events(self, buf: Buffer, start: int, end: int,
                       crc_len: int) -> tuple[int, int]:
        ...

    def frame_stored(self, out: bytearray, buf: Buffer, seq: int,
                     omit: int = -1) -> tuple[int, int, int]:
        ...

    def read_dump(self, buf: Buffer, pos: int, seq: int, last_pos: int, plain: bytes,
                  tally: list[int], out: bytearray,
                  marks: list[int]) -> tuple[int, int, int]:
        ...

    def scan_ingest(self, data: Buffer, pos: int, marks: list[int] | None, mi: int,
                    kinds: bytes, wend: int, in_group: bool, inline_gtid: bool,
                    segment_size: int,
                    plan: list[tuple[int, ...]]) -> tuple[int, int, int, bool]:
        ...

    def scan_clean(self, chunk: Buffer, pos: int, kinds: bytes, id_size: int, crc_len: int,
                   table_map: Callable[[int, int], int], known: dict[bytes, int],
                   drop_annotations: bool, cuts: list[int]) -> tuple[int, int]:
        ...

    def splice_rows(self, rows: Buffer, images: list[tuple[bytes, bytes]],
                    replace: list[tuple[Replacer | None, ...]]) -> tuple[bytes, bool]:
        ...

    def decode_columns(self, data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                       charmaps: tuple[bytes, ...], sinks: list[list[bytearray]],
                       rows: list[int]) -> int:
        ...

    def json_images(self, data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                    charmaps: tuple[bytes, ...], keys: tuple[bytes, ...],
                    sinks: list[list[bytearray]], rows: list[int]) -> int:
        ...

    def text_rows(self, data: Buffer, pos: int, end: int, ncols: int,
                  out: list[tuple[bytes | None, ...]], limit: int) -> int:
        ...

    def json_text_rows(self, data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                       keys: tuple[bytes, ...], sink: list[bytearray], row: int,
                       limit: int) -> tuple[int, int]:
        ...

    def change_lines(self, data: Buffer, pos: int, end: int, crc_len: int, state: list[Any],
                     table_map: Callable[[int, int], tuple[Any, ...] | None],
                     images: Callable[[int, int, tuple[Any, ...]],
                                      list[tuple[bytes | None, bytes | None]]],
                     out: bytearray, at: bytes, limit: int) -> int:
        ...

    def row_values(self, data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                   charmaps: tuple[bytes, ...], members: tuple[tuple[str, ...], ...],
                   images: int, out: list[tuple[Any, ...]],
                   image: type[tuple[Any, ...]] = tuple,
                   calls: tuple[Callable[[bytes], Any], ...] = ()) -> int:
        ...

    def json_document(self, data: Buffer, uint: Callable[[int], int],
                      opaque: Callable[[int, bytes], Any],
                      decimal: Callable[[str, int], Any]) -> Any:
        ...
