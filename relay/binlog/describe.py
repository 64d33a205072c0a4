"""A TABLE_MAP made from a table's description in information_schema: the map a primary
would write for the table with `binlog_row_metadata=FULL`, for a table the log holds no
row change of yet (a typed read needs the table's columns before its first change).

Sans-I/O: `describe_sql` and `primary_key_sql` are the statements to run on the primary,
`table_map` turns their rows into a `TableMap` whose `encode()` is the event body. The
columns it describes decode to what the server's own map gives (type, metadata,
nullability, signedness, collation, ENUM/SET members, geometry type, primary key; the
integration test compares them for every column type). Hand-written: no library maps
information_schema to binlog column metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.binlog import charsets
from relay.binlog.coltypes import CHARACTER_MARIADB, CHARACTER_MYSQL, NUMERIC, ColumnType
from relay.binlog.tablemap import (
    COLUMN_CHARSET,
    COLUMN_NAME,
    ENUM_AND_SET_COLUMN_CHARSET,
    ENUM_STR_VALUE,
    GEOMETRY_TYPE,
    SET_STR_VALUE,
    SIGNEDNESS,
    SIMPLE_PRIMARY_KEY,
    TableMap,
    write_packed,
)
from relay.errors import RelayError

T = ColumnType
BINARY_COLLATION = 63
_GEOMETRY_KINDS = {"geometry": 0, "point": 1, "linestring": 2, "polygon": 3,
                   "multipoint": 4, "multilinestring": 5, "multipolygon": 6,
                   "geometrycollection": 7}
_INTS = {"tinyint": T.TINY, "smallint": T.SHORT, "mediumint": T.INT24, "int": T.LONG,
         "integer": T.LONG, "bigint": T.LONGLONG}
_BLOBS = {"tinyblob": 1, "tinytext": 1, "blob": 2, "text": 2, "mediumblob": 3,
          "mediumtext": 3, "longblob": 4, "longtext": 4}
# MariaDB's own types, written as fixed-length binary strings.
_FIXED_BINARY = {"uuid": 16, "inet4": 4, "inet6": 16}
_OLD_TEMPORALS = {"datetime": T.DATETIME, "time": T.TIME, "timestamp": T.TIMESTAMP}


class DescribeError(RelayError):
    code = "describe"


@dataclass(frozen=True)
class ColumnDescription:
    """One row of `describe_sql`."""

    name: str
    data_type: str            # DATA_TYPE: "int", "varchar", "enum", ...
    column_type: str          # COLUMN_TYPE: "int(10) unsigned", "enum('a','b')", ...
    nullable: bool
    precision: int | None     # NUMERIC_PRECISION (BIT: its bits)
    scale: int | None         # NUMERIC_SCALE
    fsp: int | None           # DATETIME_PRECISION
    octets: int | None        # CHARACTER_OCTET_LENGTH
    collation: int | None     # the collation's id; None for binary and non-text types

    @classmethod
    def of_row(cls, row: Sequence[object]) -> ColumnDescription:
        """From a row as a client library gives it, or as raw bytes."""
        name, data_type, column_type, nullable, precision, scale, fsp, octets, coll = row[:9]

        def num(v: object) -> int | None:
            return None if v is None else int(text(v))
        collation = num(coll)
        if collation is None and len(row) > 10 and row[9] is not None:
            # A collation information_schema.COLLATIONS gives no id (MariaDB 10.10+ lists
            # its UCA 14.0.0 collations there without their character set): its id by its
            # full name, else one of the column's character set (what decoding needs).
            collation = charsets.uca1400_collation_id(text(row[10] or "")) or \
                charsets.collation_of_charset(text(row[9]))
        return cls(text(name), text(data_type).lower(), text(column_type),
                   text(nullable) == "YES", num(precision), num(scale), num(fsp), num(octets),
                   collation)


def text(value: object) -> str:
    """A value of information_schema (utf8) as str."""
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def describe_sql(schema: str, table: str, *, collation_ids: bool = True) -> str:
    """The query ColumnDescription.of_row reads. `collation_ids=False` leaves out each
    column's collation id (its join to information_schema.COLLATIONS is two thirds of the
    query's cost on MariaDB: 1.3 of 1.9 ms), for a look at names and types only; of_row
    then gives a text column its character set's collation."""
    ident, join = ("co.ID", "LEFT JOIN information_schema.COLLATIONS co "
                            "ON co.COLLATION_NAME = c.COLLATION_NAME ") \
        if collation_ids else ("NULL", "")
    return ("SELECT c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.IS_NULLABLE, "
            "c.NUMERIC_PRECISION, c.NUMERIC_SCALE, c.DATETIME_PRECISION, "
            f"c.CHARACTER_OCTET_LENGTH, {ident}, c.CHARACTER_SET_NAME, c.COLLATION_NAME "
            f"FROM information_schema.COLUMNS c {join}"
            f"WHERE c.TABLE_SCHEMA = {_literal(schema)} AND c.TABLE_NAME = {_literal(table)} "
            "ORDER BY c.ORDINAL_POSITION")


def primary_key_sql(schema: str, table: str) -> str:
    return ("SELECT COLUMN_NAME FROM information_schema.STATISTICS "
            f"WHERE TABLE_SCHEMA = {_literal(schema)} AND TABLE_NAME = {_literal(table)} "
            "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX")


def members(column_type: str) -> list[str]:
    """The values of "enum('a','b''c')" / "set(...)", as information_schema writes them."""
    start = column_type.index("(") + 1
    out: list[str] = []
    i = start
    n = len(column_type)
    while i < n and column_type[i] == "'":
        i += 1
        value: list[str] = []
        while i < n:
            ch = column_type[i]
            if ch == "'" and i + 1 < n and column_type[i + 1] == "'":
                value.append("'")
                i += 2
            elif ch == "\\" and i + 1 < n:
                value.append(column_type[i + 1])
                i += 2
            elif ch == "'":
                i += 1
                break
            else:
                value.append(ch)
                i += 1
        out.append("".join(value))
        if i < n and column_type[i] == ",":
            i += 1
    return out


@dataclass(frozen=True)
class _Typed:
    type: int      # the type byte of the map
    real: int      # the real type (ENUM and SET resolved from STRING)
    meta: bytes    # the metadata bytes as the map packs them


def _string_meta(real: int, length: int) -> bytes:
    """STRING metadata: the real type and a length, bits 8-9 of it in the type byte."""
    return bytes((real ^ ((length & 0x300) >> 4), length & 0xFF))


def _typed(col: ColumnDescription) -> _Typed:
    d = col.data_type
    if d in _INTS:
        return _Typed(_INTS[d], _INTS[d], b"")
    if d in ("decimal", "numeric"):
        return _Typed(T.NEWDECIMAL, T.NEWDECIMAL, bytes((col.precision or 10, col.scale or 0)))
    if d == "float":
        return _Typed(T.FLOAT, T.FLOAT, b"\x04")
    if d in ("double", "real", "double precision"):
        return _Typed(T.DOUBLE, T.DOUBLE, b"\x08")
    if d == "bit":
        bits = col.precision or 1
        return _Typed(T.BIT, T.BIT, bytes((bits % 8, bits // 8)))
    if d == "year":
        return _Typed(T.YEAR, T.YEAR, b"")
    if d == "date":
        return _Typed(T.DATE, T.DATE, b"")
    if d in _OLD_TEMPORALS and "mariadb-5.3" in col.column_type:
        return _Typed(_OLD_TEMPORALS[d], _OLD_TEMPORALS[d], b"")
    if d == "datetime":
        return _Typed(T.DATETIME2, T.DATETIME2, bytes((col.fsp or 0,)))
    if d == "timestamp":
        return _Typed(T.TIMESTAMP2, T.TIMESTAMP2, bytes((col.fsp or 0,)))
    if d == "time":
        return _Typed(T.TIME2, T.TIME2, bytes((col.fsp or 0,)))
    if d in ("char", "binary"):
        return _Typed(T.STRING, T.STRING, _string_meta(T.STRING, col.octets or 0))
    if d in _FIXED_BINARY:
        return _Typed(T.STRING, T.STRING, _string_meta(T.STRING, _FIXED_BINARY[d]))
    if d in ("varchar", "varbinary"):
        return _Typed(T.VARCHAR, T.VARCHAR, (col.octets or 0).to_bytes(2, "little"))
    if d in _BLOBS:
        return _Typed(T.BLOB, T.BLOB, bytes((_BLOBS[d],)))
    if d == "json":  # MySQL's (MariaDB's JSON is a LONGTEXT)
        return _Typed(T.JSON, T.JSON, b"\x04")
    if d in _GEOMETRY_KINDS:
        return _Typed(T.GEOMETRY, T.GEOMETRY, b"\x04")
    if d == "enum":
        pack = 1 if len(members(col.column_type)) < 256 else 2
        return _Typed(T.STRING, T.ENUM, bytes((T.ENUM, pack)))
    if d == "set":
        n = len(members(col.column_type))
        pack = (n + 7) // 8
        return _Typed(T.STRING, T.SET, bytes((T.SET, 8 if pack > 4 else pack)))
    raise DescribeError(f"column {col.name!r}: type {col.column_type!r} has no binlog form "
                        "the relay knows")


def _str_list(values: list[str], collation: int | None) -> bytes:
    cs = charsets.codec_of(collation or 0)
    codec = cs[0] if cs else "utf-8"
    out = bytearray(write_packed(len(values)))
    for v in values:
        raw = v.encode(codec, "replace")
        out += write_packed(len(raw)) + raw
    return bytes(out)


def _field(kind: int, data: bytes) -> bytes:
    return bytes((kind,)) + write_packed(len(data)) + data


def table_map(schema: str, table: str, columns: Sequence[ColumnDescription],
              primary_key: Sequence[str] = (), *, mariadb: bool = True,
              table_id: int = 0) -> TableMap:
    """The map of `schema.table` with `columns` (describe_sql's rows, in order) and the
    primary key's columns (primary_key_sql's, in key order)."""
    if not columns:
        raise DescribeError(f"{schema}.{table}: no such table, or no privilege to see its "
                            "columns")
    typed = [_typed(c) for c in columns]
    character = CHARACTER_MARIADB if mariadb else CHARACTER_MYSQL
    signedness = bytearray()
    numeric = 0
    charset_list = bytearray()
    enum_set_charsets = bytearray()
    names = bytearray()
    sets = bytearray()
    enums = bytearray()
    geometry = bytearray()
    null_bits = bytearray((len(columns) + 7) // 8)
    for i, (col, t) in enumerate(zip(columns, typed, strict=True)):
        if col.nullable:
            null_bits[i // 8] |= 1 << (i % 8)
        if t.real in NUMERIC:
            if numeric % 8 == 0:
                signedness.append(0)
            # MariaDB marks YEAR unsigned, MySQL does not
            if "unsigned" in col.column_type.lower() or (t.real == T.YEAR and mariadb):
                signedness[-1] |= 0x80 >> (numeric % 8)
            numeric += 1
        collation = col.collation if col.collation is not None else BINARY_COLLATION
        if t.real in character:
            charset_list += write_packed(collation)
        elif t.real in (T.ENUM, T.SET):
            enum_set_charsets += write_packed(collation)
            target = enums if t.real == T.ENUM else sets
            target += _str_list(members(col.column_type), collation)
        if t.real == T.GEOMETRY:
            geometry += write_packed(_GEOMETRY_KINDS[col.data_type])
        raw = col.name.encode("utf-8")
        names += write_packed(len(raw)) + raw
    index = {c.name.lower(): i for i, c in enumerate(columns)}
    try:
        key = b"".join(write_packed(index[k.lower()]) for k in primary_key)
    except KeyError as exc:
        raise DescribeError(f"{schema}.{table}: primary key column {exc} is not among its "
                            "columns") from None
    optional = b"".join(_field(kind, data) for kind, data in (
        (SIGNEDNESS, bytes(signedness)), (COLUMN_CHARSET, bytes(charset_list)),
        (COLUMN_NAME, bytes(names)), (SET_STR_VALUE, bytes(sets)),
        (ENUM_STR_VALUE, bytes(enums)), (GEOMETRY_TYPE, bytes(geometry)),
        (SIMPLE_PRIMARY_KEY, key), (ENUM_AND_SET_COLUMN_CHARSET, bytes(enum_set_charsets)),
    ) if data)
    body = TableMap(table_id, 1, schema, table, (), bytes(t.type for t in typed),
                    b"".join(t.meta for t in typed), bytes(null_bits), optional,
                    mariadb=mariadb).encode()
    return TableMap.decode(body, mariadb=mariadb)
