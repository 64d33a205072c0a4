"""Row images as JSON object text (jsonvalue.py's form, compact, UTF-8 as it is): what the
tap's JSON form and `relay changes` write. The generated writer here (`json_writer`) is the
definition; the json_images kernel (relay/kernels) writes the same bytes for the tables
its plans take (relay/binlog/plans.py), and tests hold the two equal."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import date, datetime
from json.encoder import encode_basestring
from typing import Any

from relay.binlog import charsets
from relay.binlog.coltypes import ColumnType as T
from relay.binlog.jsonvalue import datetime_text, jsonable, time_text
from relay.binlog.tablemap import TableMap

_JSON_INTS = {T.TINY, T.SHORT, T.INT24, T.LONG, T.LONGLONG, T.YEAR, T.BIT}
_JSON_DATES = {T.DATE, T.NEWDATE}
_JSON_DATETIMES = {T.DATETIME, T.DATETIME2, T.TIMESTAMP, T.TIMESTAMP2}
_JSON_TEXT = {T.VARCHAR, T.VAR_STRING, T.STRING, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB,
              T.BLOB, T.ENUM}


def json_value(value: Any) -> str:
    """A decoded value as JSON text (relay/binlog/jsonvalue.py's form)."""
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


def compile_json_writer(names: Sequence[str], exprs: Sequence[str], ns: dict[str, Any],
                        label: str) -> Callable[[Any], str]:
    """A generated function writing a row (a sequence, one value per name) as a JSON
    object: `exprs[i]` is the Python expression writing value `a{i}` when it is not None,
    with the names it uses in `ns`. One function per table, not one test per value."""
    if not names:
        return lambda row: "{}"
    parts = []
    for i, (name, expr) in enumerate(zip(names, exprs, strict=True)):
        key = ("{" if i == 0 else ",") + encode_basestring(name) + ":"
        parts.append(f"{key!r} + ('null' if a{i} is None else {expr})")
    src = (f"def write(row):\n    {', '.join(f'a{i}' for i in range(len(names)))}, = row\n"
           f"    return {' + '.join(parts)} + '}}'\n")
    exec(compile(src, f"<json writer {label}>", "exec"), ns)
    return ns["write"]  # type: ignore[no-any-return]


def json_writer(table: TableMap, names: tuple[str, ...]) -> Callable[[Any], str]:
    """A function writing a row image of these columns as a JSON object, generated for the
    table's column types (integers and text need no per-value type test): json.dumps of
    jsonvalue's image_jsonable, about 3x faster. Temporals have their column's fraction
    digits (a DATETIME(3) keeps ".000", which the value alone cannot tell)."""
    cols = {c.name: c for c in table.columns}
    ns: dict[str, Any] = {"enc": encode_basestring, "gen": json_value, "str": str,
                          "repr": float.__repr__, "iso": (datetime, date),
                          "dt": datetime_text, "tt": time_text}
    exprs = []
    for i, name in enumerate(names):
        col = cols.get(name)
        v = f"a{i}"
        if col is not None and col.type in _JSON_DATETIMES:  # a zero datetime: gen()
            fsp = col.fsp
            fmt = f"{v}.isoformat()" if not fsp else f"dt({v}, {fsp})"
            expr = f"('\"' + {fmt} + '\"' if type({v}) in iso else gen({v}))"
        elif col is not None and col.type in (T.TIME, T.TIME2):
            expr = f"'\"' + tt({v}, {col.fsp}) + '\"'"
        elif col is None or col.hint:
            expr = f"gen({v})"
        elif col.type in _JSON_INTS:
            expr = f"str({v})"
        elif col.type == T.ENUM:  # (its index when the map names no values)
            expr = f"(enc({v}) if type({v}) is str else gen({v}))"
        elif col.type in _JSON_TEXT and col.collation != charsets.BINARY:
            expr = f"enc({v})"
        elif col.type in (T.DECIMAL, T.NEWDECIMAL):
            expr = f"'\"' + str({v}) + '\"'"
        elif col.type in (T.FLOAT, T.DOUBLE):  # MySQL stores no NaN or infinity
            expr = f"repr({v})"
        elif col.type in _JSON_DATES:  # a zero date takes the general path
            expr = f"('\"' + {v}.isoformat() + '\"' if type({v}) in iso else gen({v}))"
        else:
            expr = f"gen({v})"
        exprs.append(expr)
    return compile_json_writer(names, exprs, ns, table.qualified)


class JsonWriters:
    """`json_writer`s by table map and image columns, each generated once (the map is
    kept, so a reused id() finds no stale writer; at most 1,024 kept)."""

    def __init__(self) -> None:
        self._writers: dict[tuple[int, tuple[str, ...]],
                            tuple[TableMap, Callable[[Any], str]]] = {}

    def get(self, table: TableMap, columns: tuple[str, ...]) -> Callable[[Any], str]:
        key = (id(table), columns)
        known = self._writers.get(key)
        if known is None or known[0] is not table:
            if len(self._writers) >= 1024:
                self._writers.clear()
            known = self._writers[key] = (table, json_writer(table, columns))
        return known[1]
