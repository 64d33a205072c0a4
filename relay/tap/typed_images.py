"""The typed form's before or after column, built column by column. Needs pyarrow only.

An image arrives as a tuple of decoded values (a change's RowImage, a snapshot's row) and
is kept as it is. At flush each of the table's columns becomes one Arrow array: in one
`pa.array(values, type)` call when its values already are what that Arrow type takes (int
for the integers, str for STRING, Decimal, naive datetime, date, ...; known from one
`set(map(type, values))` per column, not a test per value), and through
`sparktypes.typed_value` per value otherwise. An image of another version of the table (a
MINIMAL image, a column added or dropped, a column rescued as JSON) is first put in the
query's column order.

Faster still, a rows event of the query's own version of the table, with full images and
columns of the common types (integers, FLOAT, DOUBLE, DECIMAL up to 38 digits, DATE,
DATETIME, TIMESTAMP, YEAR, binary strings and text in UTF-8 or a single-byte character set
such as latin1), goes straight from its bytes into Arrow
buffers through the `decode_columns` kernel (`decode_event`), no Python object per
value; the kernel gives an event back to the row codec when a value is one it does not
convert (a zero date, say). A batch is then a run of segments (rows decoded by the codec,
columns by the kernel, images that are NULL) concatenated at flush.

Before, each image became a dict of converted values and Arrow read the list of dicts:
that was most of the typed tap's time (bench/tap_spark.py --images typed).
`BatchBuilder.typed_values`, one image at a time, stays the definition: tests require the
same batches from all three ways.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from relay import kernels
from relay.binlog.coltypes import ColumnType as T
from relay.binlog.constants import RowKind
from relay.binlog.jsonvalue import column_jsonable
from relay.binlog.plans import PlanCache, column_steps
from relay.binlog.rows import RowsEvent, full_images
from relay.binlog.tablemap import Column, TableMap
from relay.binlog.values import InvalidTemporal
from relay.tap.evolution import SchemaEvolution
from relay.tap.sparktypes import (
    INVALID_TEMPORALS,
    TEMPORAL_TYPES,
    has_temporals,
    image_struct,
    is_json,
    json_text,
    spark_type,
    typed_value,
)

_NONE = type(None)
# The Python types a column of each Spark type takes in one pa.array call, giving what
# typed_value would (it returns these values unchanged).
_TAKEN_AS_THEY_ARE: dict[str, frozenset[type]] = {
    "TINYINT": frozenset({int}), "SMALLINT": frozenset({int}), "INT": frozenset({int}),
    "BIGINT": frozenset({int}), "FLOAT": frozenset({float}), "DOUBLE": frozenset({float}),
    "STRING": frozenset({str}), "BINARY": frozenset({bytes}), "DATE": frozenset({date}),
    "TIMESTAMP": frozenset({datetime}), "TIMESTAMP_NTZ": frozenset({datetime}),
    "INTERVAL DAY TO SECOND": frozenset({timedelta}),
}
_DECIMAL = frozenset({Decimal})

Remap = Callable[[Sequence[Any]], tuple[Any, ...]]
Decode = Callable[[bytes, int, int, tuple[int, ...], tuple[bytes, ...], list[list[bytearray]],
                   list[int]], int]
class TypedImages:
    """The images of one batch column (before or after) of a typed query over `table`."""

    def __init__(self, table: TableMap, evolution: SchemaEvolution) -> None:
        cols = table.columns
        self.names = tuple(c.name for c in cols)
        self.type = image_struct(table, evolution)
        self._ddls = [spark_type(c) for c in cols]
        self._types = [self.type.field(i).type for i in range(len(cols))]
        self._json = [is_json(c) for c in cols]
        self._temporal = [c.type in TEMPORAL_TYPES for c in cols]
        self._taken = [_DECIMAL if ddl.startswith("DECIMAL(") else
                       _TAKEN_AS_THEY_ARE.get(ddl, frozenset()) for ddl in self._ddls]
        self._invalid_field = has_temporals(table)
        self._rescue_field = evolution is SchemaEvolution.JSON
        self._null_row = (None,) * len(cols)
        self._remaps: dict[tuple[tuple[str, ...], frozenset[str]], Remap] = {}
        self._text = [pa.types.is_string(t) or pa.types.is_binary(t) for t in self._types]
        self.plans = PlanCache(lambda table: column_steps(table, self._ddls)
                               if table.names == self.names else None)
        self._castable = all(_text_castable(c, ddl) for c, ddl in zip(cols, self._ddls,
                                                                       strict=True))
        # The batch so far: sealed segments, then the open one (at most one of the three).
        self._sealed: list[pa.Array] = []
        # rows decoded by the row codec
        self._rows: list[Sequence[Any]] = []
        self._null_at: list[int] = []           # rows with no image
        self._rescued: list[str | None] = []    # the __rescued text of each row (json mode)
        self._invalid_rescued: dict[int, list[tuple[str, str]]] = {}
        # images that are NULL (an insert's before), decoded by the kernel
        self._null_run = 0
        # columns decoded by the kernel: validity, values and text bytes per column
        self._columns: list[bytearray] | None = None
        self._column_rows = 0

    def __len__(self) -> int:
        return sum(map(len, self._sealed)) + len(self._rows) + self._null_run + \
            self._column_rows

    def clear(self) -> None:
        self._sealed.clear()
        self._clear_rows()
        self._null_run = 0
        self._columns = None
        self._column_rows = 0

    def _clear_rows(self) -> None:
        self._rows.clear()
        self._null_at.clear()
        self._rescued.clear()
        self._invalid_rescued.clear()

    def _seal(self) -> None:
        """Close the open segment."""
        if self._rows:
            self._sealed.append(self._rows_array())
            self._clear_rows()
        elif self._null_run:
            self._sealed.append(pa.nulls(self._null_run, self.type))
            self._null_run = 0
        elif self._column_rows:
            self._sealed.append(self._columns_array())
            self._columns = None
            self._column_rows = 0

    # --- the kernel's segments ---------------------------------------------------------------

    def kernel_sink(self) -> tuple[list[bytearray], int]:
        """The open kernel segment's buffers and its rows (decode_columns' sink)."""
        if self._rows or self._null_run:
            self._seal()
        if self._columns is None:
            self._columns = [b for text in self._text
                             for b in (bytearray(), bytearray(4 if text else 0), bytearray())]
        return self._columns, self._column_rows

    def kernel_took(self, rows: int) -> None:
        self._column_rows += rows

    def add_nulls(self, rows: int) -> None:
        """`rows` images that are NULL."""
        if self._rows or self._column_rows:
            self._seal()
        self._null_run += rows

    def _columns_array(self) -> pa.StructArray:
        n, bufs = self._column_rows, self._columns
        assert bufs is not None
        children = []
        for j, arrow_type in enumerate(self._types):
            validity, values, text = bufs[3 * j : 3 * j + 3]
            buffers = [pa.py_buffer(validity), pa.py_buffer(values)]
            if self._text[j]:
                buffers.append(pa.py_buffer(text))
            children.append(pa.Array.from_buffers(arrow_type, n, buffers))
        if self._invalid_field:
            children.append(pa.nulls(n, self.type.field(INVALID_TEMPORALS).type))
        if self._rescue_field:
            children.append(pa.nulls(n, pa.string()))
        return pa.StructArray.from_arrays(children, fields=list(self.type))

    # --- rows as the server's text (a snapshot's), cast by Arrow -------------------------------

    def add_text_rows(self, rows: Sequence[Sequence[bytes | None]]) -> bool:
        """Full images of these columns from the text protocol (a snapshot's rows: each
        value the server's text, None for NULL), cast into the column types by Arrow's
        own parsers (integers, DECIMAL, FLOAT, DOUBLE, DATE, DATETIME, TIMESTAMP, text,
        binary strings): False, nothing added, when a column is of another type or a value
        does not cast (a zero date, text that is not UTF-8): the row codec's values decide
        those (tests hold the two ways equal)."""
        if not self._castable or not rows:
            return not rows
        try:
            children = [_cast_text(values, arrow_type) for values, arrow_type in
                        zip(zip(*rows, strict=True), self._types, strict=True)]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        n = len(rows)
        if self._invalid_field:
            children.append(pa.nulls(n, self.type.field(INVALID_TEMPORALS).type))
        if self._rescue_field:
            children.append(pa.nulls(n, pa.string()))
        self._seal()
        self._sealed.append(pa.StructArray.from_arrays(children, fields=list(self.type)))
        return True

    # --- the row codec's segments --------------------------------------------------------------

    def add(self, values: Sequence[Any] | None, columns: tuple[str, ...],
            rescued: frozenset[str] = frozenset(), fsp: Mapping[str, int] | None = None,
            ) -> None:
        """One image: `values` of `columns` (None: no image, as an insert's before);
        `rescued` columns go to __rescued as JSON (temporals with their `fsp` digits)."""
        if self._null_run or self._column_rows:
            self._seal()
        if values is None:
            self._null_at.append(len(self._rows))
            self._rows.append(self._null_row)
            if self._rescue_field:
                self._rescued.append(None)
            return
        if rescued or columns != self.names:
            self._add_other(values, columns, rescued, fsp or {})
        else:
            self._rows.append(values)
            if self._rescue_field:
                self._rescued.append(None)

    def _add_other(self, values: Sequence[Any], columns: tuple[str, ...],
                   rescued: frozenset[str], fsp: Mapping[str, int]) -> None:
        key = (columns, rescued)
        remap = self._remaps.get(key)
        if remap is None:
            if len(self._remaps) > 256:
                self._remaps.clear()
            at = {n: i for i, n in enumerate(columns) if n not in rescued}
            index = [at.get(n, -1) for n in self.names]
            remap = self._remaps[key] = lambda row: tuple(
                None if i < 0 else row[i] for i in index)
        if self._rescue_field or rescued:
            kept = {n: values[i] for i, n in enumerate(columns) if n in rescued}
            bad = [(n, str(v)) for n, v in kept.items() if isinstance(v, InvalidTemporal)]
            if bad:
                self._invalid_rescued[len(self._rows)] = bad
            if self._rescue_field:
                self._rescued.append(json.dumps(
                    {n: column_jsonable(kept[n], fsp.get(n)) for n in sorted(kept)},
                    ensure_ascii=False, separators=(",", ":")) if rescued else None)
        self._rows.append(remap(values))

    def array(self) -> pa.Array:
        """The images added since the last clear, as one STRUCT array (and clear)."""
        self._seal()
        sealed = self._sealed
        out = self._rows_array() if not sealed else sealed[0] if len(sealed) == 1 else \
            pa.concat_arrays(sealed)
        self.clear()
        return out

    def _rows_array(self) -> pa.StructArray:
        n = len(self._rows)
        columns: list[Sequence[Any]] = list(zip(*self._rows, strict=True)) if n else \
            [()] * len(self.names)
        children = []
        invalid: list[list[tuple[str, str]] | None] = [None] * n
        for j, values in enumerate(columns):
            kinds = set(map(type, values))
            kinds.discard(_NONE)
            children.append(self._column(j, values, kinds))
            if self._temporal[j] and InvalidTemporal in kinds:
                name = self.names[j]
                for i, v in enumerate(values):
                    if type(v) is InvalidTemporal:
                        entries = invalid[i]
                        if entries is None:
                            entries = invalid[i] = []
                        entries.append((name, str(v)))
        if self._invalid_field:
            for i, bad in self._invalid_rescued.items():
                invalid[i] = (invalid[i] or []) + bad
            children.append(pa.array(invalid, self.type.field(INVALID_TEMPORALS).type))
        if self._rescue_field:
            children.append(pa.array(self._rescued, pa.string()))
        mask = None
        if self._null_at:
            flags = [False] * n
            for i in self._null_at:
                flags[i] = True
            mask = pa.array(flags, pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=mask)

    def _column(self, j: int, values: Sequence[Any], kinds: set[type]) -> pa.Array:
        ddl, arrow_type = self._ddls[j], self._types[j]
        if self._json[j]:
            return pa.array([json_text(v) for v in values], arrow_type)
        if kinds <= self._taken[j] and not (ddl == "TIMESTAMP_NTZ" and any(
                v.tzinfo is not None for v in values if v is not None)):
            return pa.array(values, arrow_type)
        return pa.array([typed_value(ddl, v) for v in values], arrow_type)


# What add_text_rows casts: Spark types whose Arrow parsers read the server's text exactly
# as the row codec's values come out (not BIT, SET, TIME, JSON, hinted columns, nor a
# DECIMAL past 38 digits, which is text in a form of Python's Decimal).
_CASTS = frozenset({"TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DATE",
                    "TIMESTAMP_NTZ", "TIMESTAMP", "STRING", "BINARY"})


def _text_castable(col: Column, ddl: str) -> bool:
    if col.hint or is_json(col) or col.type in (T.BIT, T.JSON, T.SET):
        return False
    if col.type in (T.DECIMAL, T.NEWDECIMAL):
        return ddl.startswith("DECIMAL(")
    return ddl in _CASTS or ddl.startswith("DECIMAL(")


def _cast_text(values: Sequence[bytes | None], arrow_type: pa.DataType) -> pa.Array:
    raw = pa.array(values, pa.binary())
    if pa.types.is_binary(arrow_type):
        return raw
    text = raw.cast(pa.string())  # (checks UTF-8)
    if pa.types.is_string(arrow_type):
        return text
    if (pa.types.is_date(arrow_type) or pa.types.is_timestamp(arrow_type)) and \
            pc.any(pc.starts_with(text, "0000")).as_py():
        # Arrow reads year 0; the codec's values hold no such date (InvalidTemporal)
        raise pa.ArrowInvalid("year 0")
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        # the session's zone is UTC: the text is the UTC wall clock
        return pc.cast(text, pa.timestamp(arrow_type.unit)).cast(arrow_type)
    if pa.types.is_float32(arrow_type):  # as float(text) rounded to float32, as the codec
        return pc.cast(pc.cast(text, pa.float64()), arrow_type, safe=False)
    return pc.cast(text, arrow_type)


class KernelImages(Protocol):
    """A batch column a kernel writes into (TypedImages, json_images.JsonImages)."""

    def kernel_sink(self) -> tuple[list[bytearray], int]: ...

    def kernel_took(self, rows: int) -> None: ...

    def add_nulls(self, rows: int) -> None: ...


def take_event(rev: RowsEvent, before: KernelImages, after: KernelImages,
               call: Callable[[list[list[bytearray]], list[int]], int]) -> int:
    """One rows event through a kernel (`call`, given the sinks of the images it writes
    and their rows): the rows taken, the other side's images NULL; -1, nothing added,
    when the kernel gives the event back."""
    kind = rev.kind
    targets = (before, after) if kind is RowKind.UPDATE else \
        (before,) if kind is RowKind.DELETE else (after,)
    sinks = [images.kernel_sink() for images in targets]
    rows = call([s for s, _ in sinks], [n for _, n in sinks])
    if rows < 0:
        return -1
    for images in targets:
        images.kernel_took(rows)
    if kind is RowKind.INSERT:
        before.add_nulls(rows)
    elif kind is RowKind.DELETE:
        after.add_nulls(rows)
    return rows


def decode_event(rev: RowsEvent, table: TableMap, before: TypedImages, after: TypedImages,
                 decode: Decode = kernels.decode_columns) -> int:
    """The images of one rows event of `table` into `before` and `after` by the kernel:
    the rows taken, or -1 (nothing added) for an event the row codec must decode: a
    MINIMAL image, another version's columns, a partial JSON update, a column type or a
    value the kernel does not convert."""
    plan = after.plans.get(table) if full_images(rev, table) else None
    if plan is None:
        return -1
    data = rev.data
    return take_event(rev, before, after, lambda sinks, rows: decode(
        data, rev.rows_start, len(data), *plan, sinks, rows))
