"""Column type codes of TABLE_MAP events and the per-type metadata they carry."""

from __future__ import annotations

from enum import IntEnum


class ColumnType(IntEnum):
    DECIMAL = 0
    TINY = 1
    SHORT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    LONGLONG = 8
    INT24 = 9
    DATE = 10
    TIME = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    TIMESTAMP2 = 17
    DATETIME2 = 18
    TIME2 = 19
    TYPED_ARRAY = 20
    VECTOR = 242
    INVALID = 243
    BOOL = 244
    JSON = 245
    NEWDECIMAL = 246
    ENUM = 247
    SET = 248
    TINY_BLOB = 249
    MEDIUM_BLOB = 250
    LONG_BLOB = 251
    BLOB = 252
    VAR_STRING = 253
    STRING = 254
    GEOMETRY = 255


# Bytes of per-column metadata in a TABLE_MAP, by the type byte of the column.
META_LEN: dict[int, int] = {
    ColumnType.FLOAT: 1, ColumnType.DOUBLE: 1, ColumnType.BLOB: 1, ColumnType.TINY_BLOB: 1,
    ColumnType.MEDIUM_BLOB: 1, ColumnType.LONG_BLOB: 1, ColumnType.GEOMETRY: 1,
    ColumnType.JSON: 1, ColumnType.VECTOR: 1, ColumnType.TIMESTAMP2: 1,
    ColumnType.DATETIME2: 1, ColumnType.TIME2: 1, ColumnType.VARCHAR: 2,
    ColumnType.VAR_STRING: 2, ColumnType.STRING: 2, ColumnType.ENUM: 2, ColumnType.SET: 2,
    ColumnType.NEWDECIMAL: 2, ColumnType.BIT: 2,
}

# Numeric columns: the ones the SIGNEDNESS optional metadata has a bit for. YEAR and the
# old DECIMAL have one too (MySQL's has_signedness_information_type; MariaDB's Field_year
# is a Field_tiny and sets it): a reader that skips them reads every later numeric
# column's bit off by one, and a signed TINYINT -1 after a YEAR becomes 255.
NUMERIC = frozenset({ColumnType.TINY, ColumnType.SHORT, ColumnType.INT24, ColumnType.LONG,
                     ColumnType.LONGLONG, ColumnType.NEWDECIMAL, ColumnType.FLOAT,
                     ColumnType.DOUBLE, ColumnType.YEAR, ColumnType.DECIMAL})

# Columns counted by DEFAULT_CHARSET / COLUMN_CHARSET (by real type). MariaDB counts its
# geometry columns too (their base class is a blob); MySQL 9 counts VECTOR.
CHARACTER_MYSQL = frozenset({ColumnType.STRING, ColumnType.VAR_STRING, ColumnType.VARCHAR,
                             ColumnType.BLOB, ColumnType.VECTOR})
CHARACTER_MARIADB = frozenset({ColumnType.STRING, ColumnType.VAR_STRING, ColumnType.VARCHAR,
                               ColumnType.BLOB, ColumnType.GEOMETRY})
ENUM_OR_SET = frozenset({ColumnType.ENUM, ColumnType.SET})


def read_meta(type_code: int, meta: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The metadata value of one column and the position after it, in the packing the
    servers use: STRING/ENUM/SET big-endian (real type, length), NEWDECIMAL (precision,
    scale) big-endian, VARCHAR and BIT little-endian, the rest one byte."""
    n = META_LEN.get(type_code, 0)
    if n == 0:
        return 0, pos
    if n == 1:
        return meta[pos], pos + 1
    if type_code in (ColumnType.STRING, ColumnType.ENUM, ColumnType.SET,
                     ColumnType.NEWDECIMAL):
        return (meta[pos] << 8) | meta[pos + 1], pos + 2
    return meta[pos] | (meta[pos + 1] << 8), pos + 2


def string_real_type(meta: int) -> tuple[int, int]:
    """(real type, max length in bytes) of a STRING column from its metadata: CHAR and
    BINARY keep bits 8-9 of a length above 255 in the type byte (MySQL bug #37426)."""
    byte0, byte1 = meta >> 8, meta & 0xFF
    if byte0 and (byte0 & 0x30) != 0x30:
        return byte0 | 0x30, byte1 | (((byte0 & 0x30) ^ 0x30) << 4)
    return (byte0 or ColumnType.STRING), byte1
