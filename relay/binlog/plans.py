"""The row-image kernels' per-table plans (relay/kernels: decode_columns, json_images), made
from a table map as plain data: four ints per column (ColumnStep) and the charmaps of the
single-byte character sets its text columns need. A plan is made once per table map, by
whoever drives the kernels (the tap's executors, `relay changes`, the row codec); None for
a table with a column only the row codec decodes (a hint, spatial, ...; MySQL's JSON too
but for the JSON writers, json_images and change_lines, which write its text; TIME, ENUM,
SET and BIT but for row_values, and JSON, spatial, VECTOR and the uuid, inet and json
hints there by a call per value to the row codec's own converter).

The typed form's plan follows the Spark type each column is stored as (its DDL, as
relay/tap/sparktypes.py names it); the JSON form's writes each value as JSON text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any, Generic, TypeVar

from relay.binlog import charsets, jsonb
from relay.binlog import values as V
from relay.binlog.coltypes import ColumnType as T
from relay.binlog.coltypes import string_real_type
from relay.binlog.tablemap import Column, TableMap
from relay.kernels.protocol import ColumnStep

Plan = tuple[tuple[int, ...], tuple[bytes, ...]]   # decode_columns' plan and charmaps
# row_values' plan, charmaps, ENUM and SET names, and converters
ValuesPlan = tuple[tuple[int, ...], tuple[bytes, ...], tuple[tuple[str, ...], ...],
                   tuple[Callable[[bytes], Any], ...]]
JsonPlan = tuple[tuple[int, ...], tuple[bytes, ...], tuple[bytes, ...]]  # plan, charmaps, keys

P = TypeVar("P")


class PlanCache(Generic[P]):
    """A kernel's plans by table map, made once per map (`make`: None for a map whose
    events the row codec decodes); the map is kept, so a reused id() finds no stale plan."""

    def __init__(self, make: Callable[[TableMap], P | None]) -> None:
        self._make = make
        self._plans: dict[int, tuple[TableMap, P | None]] = {}

    def get(self, table: TableMap) -> P | None:
        known = self._plans.get(id(table))
        if known is not None and known[0] is table:
            return known[1]
        if len(self._plans) > 256:
            self._plans.clear()
        plan = self._make(table)
        self._plans[id(table)] = (table, plan)
        return plan


_INT_BYTES = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}
_INT_DDL_BYTES = {"TINYINT": 1, "SMALLINT": 2, "INT": 4, "BIGINT": 8}
_BLOBS = {T.TINY_BLOB, T.BLOB, T.MEDIUM_BLOB, T.LONG_BLOB}


def _charmap(table: str) -> bytes:
    """decode_columns' charmap of a single-byte character set's decoding table."""
    out = bytearray()
    for ch in table:
        raw = ch.encode("utf-8")
        out += bytes((len(raw),)) + raw.ljust(3, b"\0")
    return bytes(out)


def _step(col: Column, ddl: str | None, charmaps: list[bytes],
          ) -> tuple[int, int, int, int] | None:
    """How decode_columns converts this column into the typed form's `ddl` (None:
    json_images writes it as JSON text), or None for a column only the row codec decodes;
    a charmap it needs is added to `charmaps`."""
    t = col.type
    if col.hint:
        return None
    decimal_out = ddl is not None and ddl.startswith("DECIMAL(")
    if t in _INT_BYTES:
        if ddl is None:  # (the width of a value the JSON form does not store)
            width = 16 if col.unsigned and t == T.LONGLONG else 8
        elif decimal_out:
            width = 16
        elif ddl in _INT_DDL_BYTES:
            width = _INT_DDL_BYTES[ddl]
        else:
            return None
        return ColumnStep.INT, _INT_BYTES[T(t)], 0 if col.unsigned else 1, width
    if t == T.YEAR:
        return ColumnStep.YEAR, 0, 0, 0
    if t == T.FLOAT:
        return ColumnStep.FLOAT, 0, 0, 0
    if t == T.DOUBLE:
        return ColumnStep.DOUBLE, 0, 0, 0
    if t == T.NEWDECIMAL and (ddl is None or decimal_out):
        precision, scale = col.meta >> 8, col.meta & 0xFF
        if 0 < precision <= (65 if ddl is None else 38) and scale <= precision:
            return ColumnStep.DECIMAL, precision, scale, V.decimal_size(precision, scale)
        return None
    if t in (T.DATE, T.NEWDATE):
        return ColumnStep.DATE, 0, 0, 0
    if t == T.DATETIME2 and col.meta <= 6:
        return ColumnStep.DATETIME2, col.meta, 0, 0
    if t == T.TIMESTAMP2 and col.meta <= 6:
        return ColumnStep.TIMESTAMP2, col.meta, 0, 0
    pad = 0
    if t in (T.VARCHAR, T.VAR_STRING):
        prefix = 1 if col.meta < 256 else 2
    elif t == T.STRING:
        real, maxlen = string_real_type(col.meta)
        if real != T.STRING:
            return None
        prefix = 1 if maxlen < 256 else 2
        if col.collation == charsets.BINARY:
            pad = maxlen  # BINARY(n): the image drops trailing zero bytes, SELECT shows them
    elif t in _BLOBS and 1 <= col.meta <= 4:
        prefix = col.meta
    elif t == T.JSON and ddl is None and 1 <= col.meta <= 4:
        return ColumnStep.JSON, col.meta, 0, 0   # (the JSON writers: the document's text)
    elif t == T.GEOMETRY and ddl is None and 0 <= col.meta <= 4:
        return ColumnStep.GEOMETRY, col.meta or 4, 0, 0
    elif t == T.BIT and ddl is None and 1 <= _bit_bytes(col.meta) <= 8:
        return ColumnStep.BIT, _bit_bytes(col.meta), 0, 0
    elif t == T.TIME2 and ddl is None and col.meta <= 6:
        return ColumnStep.TIME2, col.meta, 0, 0
    else:
        return None
    if col.collation == charsets.BINARY and ddl in (None, "BINARY"):
        return (ColumnStep.TEXT, prefix, 0, pad) if pad <= 255 else None
    codec = charsets.codec_of(col.collation) if col.collation is not None else None
    if codec is None or ddl not in (None, "STRING"):
        return None
    if codec == ("utf-8", "strict"):
        return ColumnStep.TEXT, prefix, 1, 0
    table = charsets.decoding_table(*codec)
    if table is None or any(ord(ch) > 0xFFFF for ch in table):
        return None
    charmap = _charmap(table)
    if charmap not in charmaps:
        charmaps.append(charmap)
    return ColumnStep.TEXT, prefix, 2, charmaps.index(charmap)


def column_steps(table: TableMap, ddls: Sequence[str] | None) -> Plan | None:
    """The kernels' plan and charmaps for full images of `table`: into the typed form,
    column i stored as `ddls[i]` (decode_columns), or as JSON text (None: json_images);
    None when a column is one only the row codec decodes."""
    plan: list[int] = []
    charmaps: list[bytes] = []
    for i, col in enumerate(table.columns):
        step = _step(col, None if ddls is None else ddls[i], charmaps)
        if step is None:
            return None
        plan += step
    return (tuple(plan), tuple(charmaps)) if plan else None  # (no columns: the codec's to refuse)


def values_steps(table: TableMap) -> ValuesPlan | None:
    """row_values' plan, charmaps, ENUM and SET names and converters for full images of
    `table`: the JSON form's steps, and TIME, ENUM, SET and BIT columns and the converted
    ones (CALL), which only row_values takes; None when a column is one only the row codec
    decodes."""
    plan: list[int] = []
    charmaps: list[bytes] = []
    members: list[tuple[str, ...]] = []
    calls: list[Callable[[bytes], Any]] = []
    for col in table.columns:
        step: tuple[int, int, int, int] | None
        converted = _converted(col)
        if converted is not None:
            prefix, call = converted
            if call not in calls:
                calls.append(call)
            step = ColumnStep.CALL, prefix, 0, calls.index(call)
        elif col.hint:
            return None
        elif col.type == T.TIME2 and col.meta <= 6:
            step = ColumnStep.TIME2, col.meta, 0, 0
        elif (col.type == T.ENUM and col.meta & 0xFF in (1, 2)) or \
                (col.type == T.SET and 1 <= col.meta & 0xFF <= 8):
            kind = ColumnStep.ENUM if col.type == T.ENUM else ColumnStep.SET
            if col.members is None:  # (no names in the table map: the number, as the codec)
                step = kind, col.meta & 0xFF, 0, 0
            else:
                if col.members not in members:
                    members.append(col.members)
                step = kind, col.meta & 0xFF, 1, members.index(col.members)
        elif col.type == T.BIT and 1 <= _bit_bytes(col.meta) <= 8:
            step = ColumnStep.BIT, _bit_bytes(col.meta), 0, 0
        else:
            step = _step(col, None, charmaps)
            if step is None:
                return None
        plan += step
    return (tuple(plan), tuple(charmaps), tuple(members), tuple(calls)) if plan else None


def _converted(col: Column) -> tuple[int, Callable[[bytes], Any]] | None:
    """(length bytes, the row codec's converter of the value's bytes) for a column whose
    value row_values hands to that converter, as the codec's generated decoder does."""
    t, meta = col.type, col.meta
    if col.hint in ("uuid", "inet4", "inet6") and t in (T.VARCHAR, T.VAR_STRING, T.STRING):
        maxlen = string_real_type(meta)[1] if t == T.STRING else meta
        if t == T.STRING and string_real_type(meta)[0] != T.STRING:
            return None
        return (1 if maxlen < 256 else 2), _HINTED[col.hint]
    if col.hint:
        return None
    if t == T.JSON and 1 <= meta <= 4:
        return meta, jsonb.decode
    if t == T.GEOMETRY and 0 <= meta <= 4:
        return meta or 4, V.geometry_value
    if t == T.VECTOR and 0 <= meta <= 4:
        return meta or 4, V.vector_value
    return None


_HINTED: dict[str, Callable[[bytes], Any]] = {
    "uuid": V.uuid_value, "inet4": V.inet4_value, "inet6": V.inet6_value}


def _bit_bytes(meta: int) -> int:
    """The bytes a BIT(n) value takes: its table map meta is (whole bytes << 8) | bits."""
    return ((meta >> 8) * 8 + (meta & 0xFF) + 7) // 8


def json_keys(names: Sequence[str]) -> tuple[bytes, ...]:
    """What the JSON kernels write before each column's value: '{"id":', ',"v":'."""
    return tuple((("{" if i == 0 else ",") + encode_basestring(name) + ":").encode()
                 for i, name in enumerate(names))


def json_plan(table: TableMap) -> JsonPlan | None:
    """json_images' plan, charmaps and keys for full images of `table`, or None when a
    column is one only the row codec and the generated writer handle."""
    steps = column_steps(table, None)
    if steps is None:
        return None
    plan, charmaps = steps
    return plan, charmaps, json_keys([c.name for c in table.columns])
