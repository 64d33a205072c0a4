"""The typed form's types: which Spark (and Arrow) type holds each MySQL column, and the
Python value a decoded column value becomes in it. Needs pyarrow only.

Arrow types match Spark's exactly (timestamps in UTC, `string` not `large_string`):
Spark refuses a batch whose schema differs in any detail. Zero dates ('0000-00-00') and
other temporals Python cannot hold become NULL, their server text kept in the image's
`__invalid_temporals` map.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from relay.binlog.coltypes import ColumnType as T
from relay.binlog.jsonvalue import jsonable, time_text
from relay.binlog.tablemap import Column, TableMap
from relay.binlog.values import Geometry, InvalidTemporal
from relay.tap.evolution import RESCUED, SchemaEvolution

UTC_TS = pa.timestamp("us", tz="UTC")

_INT_TYPES = {T.TINY: (1, "TINYINT", "SMALLINT"), T.SHORT: (2, "SMALLINT", "INT"),
              T.INT24: (3, "INT", "INT"), T.LONG: (4, "INT", "BIGINT"),
              T.LONGLONG: (8, "BIGINT", "DECIMAL(20,0)")}
_TEXT_TYPES = {T.VARCHAR, T.VAR_STRING, T.STRING, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB,
               T.BLOB}
BINARY_COLLATION = 63


def spark_type(col: Column) -> str:
    """The Spark SQL type of a column in the typed form."""
    t = col.type
    hint = (col.hint or "").split("(")[0]
    if hint in ("uuid", "inet4", "inet6", "json"):
        return "STRING"
    if t in _INT_TYPES:
        _, signed, unsigned = _INT_TYPES[T(t)]
        return unsigned if col.unsigned else signed
    if t == T.YEAR:
        return "SMALLINT"
    if t == T.BIT:
        return "BIGINT" if (col.meta >> 8) * 8 + (col.meta & 0xFF) < 64 else "DECIMAL(20,0)"
    if t in (T.DECIMAL, T.NEWDECIMAL):
        precision, scale = col.meta >> 8, col.meta & 0xFF
        return f"DECIMAL({precision},{scale})" if 0 < precision <= 38 else "STRING"
    if t == T.FLOAT:
        return "FLOAT"
    if t == T.DOUBLE:
        return "DOUBLE"
    if t in (T.DATE, T.NEWDATE):
        return "DATE"
    if t in (T.DATETIME, T.DATETIME2):
        return "TIMESTAMP_NTZ"
    if t in (T.TIMESTAMP, T.TIMESTAMP2):
        return "TIMESTAMP"
    if t in (T.TIME, T.TIME2):  # -838:59:59.999999 .. 838:59:59.999999 fits an interval
        return "INTERVAL DAY TO SECOND"
    if t == T.SET:
        return "ARRAY<STRING>"
    if t == T.ENUM or t == T.JSON:
        return "STRING"
    if t == T.GEOMETRY:
        return "BINARY"
    if t in _TEXT_TYPES:
        return "BINARY" if col.collation == BINARY_COLLATION else "STRING"
    return "BINARY"


def arrow_type(ddl: str) -> pa.DataType:
    if ddl.startswith("DECIMAL("):
        p, s = ddl[8:-1].split(",")
        return pa.decimal128(int(p), int(s))
    return {
        "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(), "BIGINT": pa.int64(),
        "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "DATE": pa.date32(),
        "TIMESTAMP_NTZ": pa.timestamp("us"), "TIMESTAMP": UTC_TS, "STRING": pa.string(),
        "BINARY": pa.binary(), "ARRAY<STRING>": pa.list_(pa.string()),
        "INTERVAL DAY TO SECOND": pa.duration("us"),
    }[ddl]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# A typed image's extra field: the server's text of DATE/DATETIME/TIMESTAMP values Spark
# cannot hold (zero dates, zero months or days), by column; the column itself is NULL.
INVALID_TEMPORALS = "__invalid_temporals"
TEMPORAL_TYPES = {T.DATE, T.NEWDATE, T.DATETIME, T.DATETIME2, T.TIMESTAMP, T.TIMESTAMP2}


def has_temporals(table: TableMap) -> bool:
    return any(c.type in TEMPORAL_TYPES for c in table.columns)


def exactness_note(col: Column) -> str | None:
    """Where a column's Spark type does not hold the MySQL type as it is: how it is kept
    (the column's comment in the schema)."""
    t = col.type
    ddl = spark_type(col)
    if t in (T.DECIMAL, T.NEWDECIMAL) and ddl == "STRING":
        return (f"DECIMAL({col.meta >> 8},{col.meta & 0xFF}) as exact text (Spark's "
                "DECIMAL holds 38 digits)")
    if t == T.LONGLONG and col.unsigned:
        return "BIGINT UNSIGNED as DECIMAL(20,0)"
    if t == T.BIT and ddl.startswith("DECIMAL"):
        return "BIT(64) as DECIMAL(20,0)"
    if t in TEMPORAL_TYPES:
        return f"zero or invalid dates are NULL here, their text in {INVALID_TEMPORALS}"
    if t in (T.TIME, T.TIME2):
        return "TIME as a day-time interval"
    return None


def _comment(col: Column) -> str:
    note = exactness_note(col)
    return "" if note is None else " COMMENT '" + note.replace("'", "\\'") + "'"


def image_ddl(table: TableMap, evolution: SchemaEvolution = SchemaEvolution.FAIL) -> str:
    fields = [f"{_quote(c.name)}: {spark_type(c)}{_comment(c)}" for c in table.columns]
    if has_temporals(table):
        fields.append(f"{INVALID_TEMPORALS}: MAP<STRING, STRING>")
    if evolution is SchemaEvolution.JSON:
        fields.append(f"{RESCUED}: STRING")
    return "STRUCT<" + ", ".join(fields) + ">"



def image_struct(table: TableMap, evolution: SchemaEvolution = SchemaEvolution.FAIL,
                 ) -> pa.StructType:
    """The Arrow type of a typed image of `table` (image_ddl's struct)."""
    fields = [pa.field(c.name, arrow_type(spark_type(c))) for c in table.columns]
    if has_temporals(table):
        fields.append(pa.field(INVALID_TEMPORALS, pa.map_(pa.string(), pa.string())))
    if evolution is SchemaEvolution.JSON:
        fields.append(pa.field(RESCUED, pa.string()))
    return pa.struct(fields)


def typed_value(ddl: str, value: Any) -> Any:
    """A decoded value as the typed form's Arrow column takes it."""
    if value is None or isinstance(value, InvalidTemporal):
        return None
    if ddl == "STRING":
        if isinstance(value, str):
            return value
        if isinstance(value, timedelta):
            return time_text(value)
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8", "replace")
        j = jsonable(value)
        return j if isinstance(j, str) else json.dumps(j, ensure_ascii=False)
    if ddl == "BINARY":
        if isinstance(value, Geometry):
            return value.srid.to_bytes(4, "little") + bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        return bytes(value)
    if ddl == "ARRAY<STRING>":
        return sorted(value)
    if ddl.startswith("DECIMAL("):
        return value if isinstance(value, Decimal) else Decimal(int(value))
    if ddl == "TIMESTAMP_NTZ" and isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if ddl == "DATE" and isinstance(value, datetime):
        return value.date()
    if ddl == "DATE" and not isinstance(value, date):
        return None
    return value


def is_json(col: Column) -> bool:
    return col.type == T.JSON or (col.hint or "").startswith("json")


def json_text(value: Any) -> str | None:
    """A JSON column's document as JSON text (a top-level string stays quoted)."""
    if value is None:
        return None
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))
