"""The typed form's before or after column, built column by column. Needs pyarrow only.

An image arrives as a tuple of decoded values (a change's RowImage, a snapshot's row) and
is kept as it is. At flush each of the table's columns becomes one Arrow array: in one
`pa.array(values, type)` call when its values already are what that Arrow type takes (int
for the integers, str for STRING, Decimal, naive datetime, date, ...; known from one
`set(map(type, values))` per column, not a test per value), and through
`sparktypes.typed_value` per value otherwise. An image of another version of the table (a
MINIMAL image, a column added or dropped, a column rescued as JSON) is first put in the
query's column order.

Before, each image became a dict of converted values and Arrow read the list of dicts:
that was most of the typed tap's time (bench/tap_spark.py --images typed).
`BatchBuilder.typed_values`, one image at a time, stays the definition: tests require the
same batches from both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from relay.binlog.jsonvalue import column_jsonable
from relay.binlog.tablemap import TableMap
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
        self._rows: list[Sequence[Any]] = []
        self._null_at: list[int] = []           # rows with no image
        self._rescued: list[str | None] = []    # the __rescued text of each row (json mode)
        self._invalid_rescued: dict[int, list[tuple[str, str]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows.clear()
        self._null_at.clear()
        self._rescued.clear()
        self._invalid_rescued.clear()

    def add(self, values: Sequence[Any] | None, columns: tuple[str, ...],
            rescued: frozenset[str] = frozenset(), fsp: Mapping[str, int] | None = None,
            ) -> None:
        """One image: `values` of `columns` (None: no image, as an insert's before);
        `rescued` columns go to __rescued as JSON (temporals with their `fsp` digits)."""
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

    def array(self) -> pa.StructArray:
        """The images added since the last clear, as one STRUCT array."""
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
