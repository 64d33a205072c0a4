"""Rows events (WRITE / UPDATE / DELETE, v1 and v2, MariaDB's compressed ones, MySQL's
PARTIAL_UPDATE_ROWS): the header, the column bitmaps, and the rows, decoded through
the table's `RowCodec`s and encoded back.

Layout after the post-header (table id, flags, v2 extra data): the column count, the
bitmap of columns in the image (UPDATE: a second one for the after-image), then rows
until the end of the body, each one or two images of (NULL bitmap, values). MariaDB's
compressed variants zlib-compress everything after the bitmaps (compression.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

from relay import kernels
from relay.binlog import compression
from relay.binlog.coltypes import ColumnType
from relay.binlog.constants import EventType, RowKind

__all__ = ["ROWS_TYPES", "CodecCache", "Images", "RowData", "RowKind", "RowsEvent", "side"]
from relay.binlog.rowcodec import RowCodec, RowImage
from relay.binlog.tablemap import TableMap, read_packed, write_packed
from relay.errors import MalformedEvent

E = EventType


_I, _U, _D = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE
_KIND: dict[int, RowKind] = {
    E.WRITE_ROWS_V1: _I, E.UPDATE_ROWS_V1: _U, E.DELETE_ROWS_V1: _D,
    E.WRITE_ROWS_V2: _I, E.UPDATE_ROWS_V2: _U, E.DELETE_ROWS_V2: _D,
    E.PARTIAL_UPDATE_ROWS: _U,
    E.WRITE_ROWS_COMPRESSED_V1: _I, E.UPDATE_ROWS_COMPRESSED_V1: _U,
    E.DELETE_ROWS_COMPRESSED_V1: _D, E.WRITE_ROWS_COMPRESSED: _I,
    E.UPDATE_ROWS_COMPRESSED: _U, E.DELETE_ROWS_COMPRESSED: _D,
}
_COMPRESSED = frozenset({E.WRITE_ROWS_COMPRESSED_V1, E.UPDATE_ROWS_COMPRESSED_V1,
                         E.DELETE_ROWS_COMPRESSED_V1, E.WRITE_ROWS_COMPRESSED,
                         E.UPDATE_ROWS_COMPRESSED, E.DELETE_ROWS_COMPRESSED})
_V2 = frozenset({E.WRITE_ROWS_V2, E.UPDATE_ROWS_V2, E.DELETE_ROWS_V2, E.PARTIAL_UPDATE_ROWS,
                 E.WRITE_ROWS_COMPRESSED, E.UPDATE_ROWS_COMPRESSED, E.DELETE_ROWS_COMPRESSED})
ROWS_TYPES = frozenset(_KIND)
PARTIAL_JSON_UPDATES = 1


def _bits(raw: bytes, n: int) -> tuple[int, ...]:
    return tuple(i for i in range(n) if raw[i // 8] >> (i % 8) & 1)


def _bitmap(indexes: Sequence[int], n: int) -> bytes:
    out = bytearray((n + 7) // 8)
    for i in indexes:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


class RowData(NamedTuple):
    """One row of a rows event: the before-image (UPDATE, DELETE), the after-image
    (INSERT, UPDATE) and, for a row of a partial update logged with
    PARTIAL_JSON_UPDATES, which JSON columns carry diffs (None otherwise)."""

    before: RowImage | None
    after: RowImage | None
    partial_json: frozenset[int] | None = None


# What decoding rows may raise besides MalformedEvent (a generated decoder or a kernel on
# bad bytes): rows() and planned_images() name the event and table and raise MalformedEvent
_DECODING_ERRORS = (MalformedEvent, IndexError, struct.error, ValueError, KeyError,
                    TypeError, OverflowError, UnicodeDecodeError, RecursionError)


class Images(NamedTuple):
    """A rows event's images by side, one a row: `before` (UPDATE, DELETE) and `after`
    (INSERT, UPDATE); None for the side its kind has not."""

    before: list[RowImage] | None
    after: list[RowImage] | None


def side(images: list[RowImage] | None) -> Iterable[RowImage | None]:
    """One side of `Images` to zip with the other: its images, or None for every row."""
    return repeat(None) if images is None else images


@dataclass(frozen=True)
class RowsEvent:
    type_code: int
    table_id: int
    flags: int
    extra: bytes | None          # v2 extra data (without its 2-byte length), None for v1
    ncols: int
    present: tuple[int, ...]
    present_after: tuple[int, ...] | None   # UPDATE only
    data: bytes                  # the (uncompressed) body, without a CRC
    rows_start: int
    id_size: int = 6
    bitmaps: bytes = b""         # the column bitmap(s) as written (servers differ in the
                                 # unused bits: MySQL sets them, MariaDB clears them)

    @property
    def kind(self) -> RowKind:
        return _KIND[self.type_code]

    @property
    def compressed(self) -> bool:
        return self.type_code in _COMPRESSED

    @property
    def stmt_end(self) -> bool:
        return bool(self.flags & 0x0001)

    @property
    def partial(self) -> bool:
        return self.type_code == E.PARTIAL_UPDATE_ROWS

    @classmethod
    def decode(cls, type_code: int, body: bytes | memoryview, *,
               post_header_len: int = 8) -> RowsEvent:
        body = bytes(body)
        if type_code not in _KIND:
            raise MalformedEvent(f"event type {type_code} is not a rows event")
        try:
            return cls._decode(type_code, body, post_header_len)
        except (IndexError, struct.error) as exc:
            raise MalformedEvent(f"{E(type_code).name}: {exc}") from exc

    @classmethod
    def _decode(cls, type_code: int, body: bytes, post_header_len: int) -> RowsEvent:
        id_size = 4 if post_header_len == 6 else 6
        if len(body) < id_size + 2:
            raise MalformedEvent(f"{E(type_code).name} body of {len(body)} bytes")
        table_id = int.from_bytes(body[:id_size], "little")
        flags = struct.unpack_from("<H", body, id_size)[0]
        pos = id_size + 2
        extra = None
        if type_code in _V2:
            elen = struct.unpack_from("<H", body, pos)[0]
            if elen < 2 or pos + elen > len(body):
                raise MalformedEvent(f"{E(type_code).name} extra data of {elen} bytes")
            extra = body[pos + 2 : pos + elen]
            pos += elen
        ncols, pos = read_packed(body, pos)
        nb = (ncols + 7) // 8
        if ncols > 8 * len(body) or pos + nb > len(body):
            raise MalformedEvent(f"{E(type_code).name} column bitmap runs past the event")
        bitmaps_start = pos
        present = _bits(body[pos : pos + nb], ncols)
        pos += nb
        present_after = None
        if _KIND[type_code] is RowKind.UPDATE:
            if pos + nb > len(body):
                raise MalformedEvent(f"{E(type_code).name} after-image bitmap runs past "
                                     "the event")
            present_after = _bits(body[pos : pos + nb], ncols)
            pos += nb
        bitmaps = body[bitmaps_start:pos]
        if type_code in _COMPRESSED:
            body = body[:pos] + compression.uncompress_block(body[pos:], E(type_code).name)
        return cls(type_code, table_id, flags, extra, ncols, present, present_after, body, pos,
                   id_size, bitmaps)

    # --- rows ----------------------------------------------------------------------------

    def rows(self, table: TableMap, codecs: CodecCache | None = None,
             wanted: frozenset[str] | None = None, *, planned: bool = True) -> list[RowData]:
        """Decode every row (an event holds a bounded number: the server cuts rows events
        at binlog_row_event_max_size). `wanted` limits the columns decoded (by name);
        `planned=False` skips the kernel (for a caller whose `planned_images` gave None)."""
        if table.table_id != self.table_id:
            raise MalformedEvent(f"rows event for table id {self.table_id} decoded with the "
                                 f"map of table id {table.table_id}")
        if self.ncols > len(table.columns):
            raise MalformedEvent(f"rows event has {self.ncols} columns, the table map of "
                                 f"{table.qualified} {len(table.columns)}")
        cache = codecs or CodecCache()
        try:
            return self._rows(table, cache, wanted, planned)
        except _DECODING_ERRORS as exc:
            raise self._bad_rows(table, exc) from exc

    def _bad_rows(self, table: TableMap, exc: Exception) -> MalformedEvent:
        """What decoding this event's rows raised, as the codec's error (its kind and table;
        the caller adds the file and offset)."""
        what = str(exc) if isinstance(exc, MalformedEvent) else f"{type(exc).__name__}: {exc}"
        return MalformedEvent(f"{E(self.type_code).name} of {table.qualified}: {what}")

    def planned_images(self, table: TableMap, codecs: CodecCache) -> Images | None:
        """Every row's images from the row_values kernel, by side, when `table`'s codec
        plans this event (full images of every column, no partial JSON update) and the
        kernel converts every value; None otherwise: `rows` decodes it. A value the kernel
        finds bad (text that is not UTF-8) raises as `rows` would."""
        if not self._plannable(table):
            return None
        try:
            return self._planned(codecs.get(table, self.present, None))
        except _DECODING_ERRORS as exc:
            raise self._bad_rows(table, exc) from exc

    def _plannable(self, table: TableMap) -> bool:
        return table.table_id == self.table_id and self.ncols <= len(table.columns) and \
            not self.partial and (self.present_after is None
                                  or self.present_after == self.present)

    def _planned(self, codec: RowCodec) -> Images | None:
        """The kernel's images of the rows, by `codec`'s plan (None: no plan, or a value
        it does not convert)."""
        if codec.values_plan is None:
            return None
        kind = self.kind
        out: list[Any] = []
        plan, charmaps, members, calls = codec.values_plan
        if kernels.row_values(self.data, self.rows_start, len(self.data), plan, charmaps,
                              members, 2 if kind is RowKind.UPDATE else 1, out, codec.image,
                              calls) < 0:
            return None
        if kind is RowKind.UPDATE:
            return Images(out[0::2], out[1::2])
        return Images(out, None) if kind is RowKind.DELETE else Images(None, out)

    def _rows(self, table: TableMap, cache: CodecCache,
              wanted: frozenset[str] | None, planned: bool) -> list[RowData]:
        data = self.data
        end = len(data)
        pos = self.rows_start
        kind = self.kind
        codec = cache.get(table, self.present, wanted)
        decode = codec.decoder
        out: list[RowData] = []
        append = out.append
        new = tuple.__new__
        images = self._planned(codec) if planned and wanted is None \
            and self._plannable(table) else None
        if images is not None:
            return list(map(new, repeat(RowData), zip(
                side(images.before), side(images.after), repeat(None))))
        if kind is not RowKind.UPDATE:
            # The common case, kept tight: one image per row.
            image_first = kind is RowKind.DELETE
            while pos < end:
                image, npos = decode(data, pos)
                if not pos < npos <= end:
                    raise self._bad_row(pos, npos, end)
                append(new(RowData, (image, None, None) if image_first
                           else (None, image, None)))
                pos = npos
            return out
        assert self.present_after is not None
        second = cache.get(table, self.present_after, wanted)
        json_cols = tuple(c.index for c in table.columns if c.type == ColumnType.JSON)
        while pos < end:
            before, npos = decode(data, pos)
            if not pos < npos <= end:
                raise self._bad_row(pos, npos, end)
            pos = npos
            after_codec = second
            partial = None
            if self.partial:
                options, pos = read_packed(data, pos)
                if options & PARTIAL_JSON_UPDATES:
                    nbits = (len(json_cols) + 7) // 8
                    mask = data[pos : pos + nbits]
                    pos += nbits
                    partial = frozenset(c for k, c in enumerate(json_cols)
                                        if mask[k // 8] >> (k % 8) & 1)
                    if partial:
                        after_codec = cache.get(table, self.present_after, wanted, partial)
            after, npos = after_codec.decoder(data, pos)
            if not pos < npos <= end:
                raise self._bad_row(pos, npos, end)
            append(new(RowData, (before, after, partial)))
            pos = npos
        return out

    def _bad_row(self, pos: int, npos: int, end: int) -> MalformedEvent:
        if npos <= pos:
            return MalformedEvent(f"rows of no columns cannot fill {end - pos} bytes")
        return MalformedEvent("a row image runs past the event")

    # --- encoding ------------------------------------------------------------------------

    def encode(self, table: TableMap, rows: Sequence[RowData],
               codecs: CodecCache | None = None, *, flags: int | None = None,
               table_id: int | None = None) -> bytes:
        """The event body (without header and CRC) with these rows; compressed again when
        this event was."""
        cache = codecs or CodecCache()
        first = cache.get(table, self.present, None)
        second = (cache.get(table, self.present_after, None)
                  if self.present_after is not None else None)
        json_cols = tuple(c.index for c in table.columns if c.type == ColumnType.JSON)
        out = bytearray()
        for row in rows:
            image = row.before if self.kind is not RowKind.INSERT else row.after
            if image is None:
                raise ValueError(f"{self.kind} row without its image")
            out += first.encode(image)
            if self.kind is not RowKind.UPDATE:
                continue
            assert second is not None and self.present_after is not None
            codec = second
            if self.partial:
                if row.partial_json is None:
                    out += b"\0"
                else:
                    out += write_packed(PARTIAL_JSON_UPDATES)
                    out += _bitmap([k for k, c in enumerate(json_cols) if c in row.partial_json],
                                   len(json_cols))
                    if row.partial_json:
                        codec = cache.get(table, self.present_after, None, row.partial_json)
            if row.after is None:
                raise ValueError("update row without its after-image")
            out += codec.encode(row.after)
        return self.header_bytes(flags=flags, table_id=table_id) + self._pack_rows(bytes(out))

    def header_bytes(self, *, flags: int | None = None, table_id: int | None = None) -> bytes:
        head = bytearray((self.table_id if table_id is None else table_id).to_bytes(
            self.id_size, "little"))
        head += struct.pack("<H", self.flags if flags is None else flags)
        if self.extra is not None:
            head += struct.pack("<H", len(self.extra) + 2) + self.extra
        head += write_packed(self.ncols)
        if self.bitmaps:
            head += self.bitmaps
        else:
            head += _bitmap(self.present, self.ncols)
            if self.present_after is not None:
                head += _bitmap(self.present_after, self.ncols)
        return bytes(head)

    def _pack_rows(self, rows: bytes) -> bytes:
        return compression.compress_block(rows) if self.compressed else rows

    def with_flags(self, flags: int) -> bytes:
        """The body with other flags (e.g. STMT_END_F moved), rows untouched."""
        return self.header_bytes(flags=flags) + self._pack_rows(self.data[self.rows_start:])


class CodecCache:
    """Row codecs by table map, column bitmap and wanted columns: built once, reused."""

    def __init__(self) -> None:
        self._codecs: dict[tuple[Any, ...], RowCodec] = {}

    def get(self, table: TableMap, present: tuple[int, ...],
            wanted: frozenset[str] | None = None,
            partial: frozenset[int] = frozenset()) -> RowCodec:
        key = (id(table), present, wanted, partial)
        codec = self._codecs.get(key)
        if codec is None or codec.table is not table:
            codec = RowCodec(table, present, wanted, partial)
            if len(self._codecs) > 4096:
                self._codecs.clear()
            self._codecs[key] = codec
        return codec


def full_images(rev: RowsEvent, table: TableMap) -> bool:
    """Whether a rows event of `table` holds every column of each image and nothing but
    images (no partial JSON update): what the row-image kernels take."""
    n = len(table.columns)
    return not rev.partial and rev.table_id == table.table_id and rev.ncols == n and \
        len(rev.present) == n and (rev.present_after is None or len(rev.present_after) == n)
