"""Tables of every column type family, filled with edge values on a real primary, and how
to compare what the row codec decodes with what SELECT returns for the same rows."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pymysql

from relay.binlog.jsonb import JsonPartial
from relay.binlog.values import Geometry, InvalidTemporal
from relay.testing.mariadb import MariaDB

BIG_BLOB = 20 << 20


@dataclass(frozen=True)
class Table:
    name: str
    ddl: str                       # column definitions after "id INT PRIMARY KEY"
    rows: list[str]                # VALUES tuples without the id
    kinds: dict[str, str]          # column -> how SELECT's value compares (see normalize)


INTS = Table(
    "ints",
    "ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, "
    "miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED, "
    "b1 BIT(1), b7 BIT(7), b8 BIT(8), b9 BIT(9), b64 BIT(64), y YEAR, bo BOOLEAN",
    # bo after y: YEAR has a signedness bit of its own (a reader that skips it decoded
    # bo's -2 as 254)
    [
        "-128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, b'0', "
        "b'0', b'0', b'0', b'0', 1901, FALSE",
        "127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
        "9223372036854775807, 18446744073709551615, b'1', b'1111111', b'11111111', "
        "b'111111111', b'1111111111111111111111111111111111111111111111111111111111111111', "
        "2155, TRUE",
        "-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, b'1', b'1010101', b'10000000', b'100000001', "
        "b'1000000000000000000000000000000000000000000000000000000000000001', 0, -2",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL",
        "0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'0', b'0', b'0', b'0', b'0', 2024, 0",
    ],
    {"b1": "bit", "b7": "bit", "b8": "bit", "b9": "bit", "b64": "bit"},
)

NUMS = Table(
    "nums",
    "d1 DECIMAL(1,0), d5 DECIMAL(5,2), d10 DECIMAL(10,0), d18 DECIMAL(18,9), "
    "d30 DECIMAL(30,10), d65 DECIMAL(65,30), d650 DECIMAL(65,0), du DECIMAL(10,4) UNSIGNED, "
    "f FLOAT, db DOUBLE",
    [
        "9, 999.99, 9999999999, 999999999.999999999, 99999999999999999999.9999999999, "
        "99999999999999999999999999999999999.999999999999999999999999999999, "
        "99999999999999999999999999999999999999999999999999999999999999999, 999999.9999, "
        "3.402823466e+38, 1.7976931348623157e308",
        "-9, -999.99, -9999999999, -999999999.999999999, -99999999999999999999.9999999999, "
        "-99999999999999999999999999999999999.999999999999999999999999999999, "
        "-99999999999999999999999999999999999999999999999999999999999999999, 0, "
        "-3.402823466e+38, -1.7976931348623157e308",
        "0, 0.01, 1, 0.000000001, -0.0000000001, 0.000000000000000000000000000001, 1, "
        "0.0001, 1.1754944e-38, 2.2250738585072014e-308",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
        "-1, -0.5, 123456789, 123.456, -1234567890.0987654321, -1.5, 42, 12.5, 1.1, -0.1",
    ],
    {"f": "float"},
)

TIMES = Table(
    "times",
    "d DATE, dt0 DATETIME, dt1 DATETIME(1), dt2 DATETIME(2), dt3 DATETIME(3), "
    "dt4 DATETIME(4), dt5 DATETIME(5), dt6 DATETIME(6), ts0 TIMESTAMP NULL, "
    "ts1 TIMESTAMP(1) NULL, ts3 TIMESTAMP(3) NULL, ts6 TIMESTAMP(6) NULL, t0 TIME, "
    "t1 TIME(1), t2 TIME(2), t3 TIME(3), t4 TIME(4), t5 TIME(5), t6 TIME(6)",
    [
        "'1000-01-01', '1000-01-01 00:00:00', '1000-01-01 00:00:00.1', "
        "'1000-01-01 00:00:00.01', '1000-01-01 00:00:00.001', '1000-01-01 00:00:00.0001', "
        "'1000-01-01 00:00:00.00001', '1000-01-01 00:00:00.000001', '1970-01-01 00:00:01', "
        "'1970-01-01 00:00:01.1', '1970-01-01 00:00:01.001', '1970-01-01 00:00:01.000001', "
        "'-838:59:59', '-838:59:58.9', '-838:59:58.99', '-838:59:58.999', "
        "'-838:59:58.9999', '-838:59:58.99999', '-838:59:58.999999'",
        "'9999-12-31', '9999-12-31 23:59:59', '9999-12-31 23:59:59.9', "
        "'9999-12-31 23:59:59.99', '9999-12-31 23:59:59.999', '9999-12-31 23:59:59.9999', "
        "'9999-12-31 23:59:59.99999', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07', "
        "'2038-01-19 03:14:07.9', '2038-01-19 03:14:07.999', '2038-01-19 03:14:07.999999', "
        "'838:59:59', '838:59:58.9', '838:59:58.99', '838:59:58.999', '838:59:58.9999', "
        "'838:59:58.99999', '838:59:58.999999'",
        "'0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00.0', "
        "'2024-00-15 12:00:00.00', '2024-02-00 00:00:00.000', '0000-00-00 00:00:00.0000', "
        "'2024-02-29 12:34:56.12345', '2024-02-29 12:34:56.123456', '0000-00-00 00:00:00', "
        "'0000-00-00 00:00:00.0', '2024-02-29 12:34:56.5', '2024-02-29 12:34:56.654321', "
        "'-00:00:01', '-00:00:00.5', '-00:00:00.01', '-12:34:56.789', '00:00:00.0001', "
        "'-00:00:00.00001', '-00:00:00.000001'",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL",
        "'2024-02-29', '2024-02-29 12:34:56', '2024-02-29 12:34:56.5', "
        "'2024-02-29 12:34:56.25', '2024-02-29 12:34:56.125', '2024-02-29 12:34:56.0625', "
        "'2024-02-29 12:34:56.03125', '2024-02-29 12:34:56.015625', '2024-02-29 12:34:56', "
        "'2024-02-29 12:34:56.5', '2024-02-29 12:34:56.125', '2024-02-29 12:34:56.015625', "
        "'12:34:56', '-12:34:56.5', '100:00:00.25', '-1:02:03.125', '23:59:59.0625', "
        "'-23:59:59.03125', '0:00:00.015625'",
    ],
    {"ts0": "timestamp", "ts1": "timestamp", "ts3": "timestamp", "ts6": "timestamp"},
)

_MB = "héllo wörld ñ 中文 😀"
STRS = Table(
    "strs",
    "c10 CHAR(10), c255 CHAR(255) CHARACTER SET utf8mb4, vc VARCHAR(100), "
    "vc300 VARCHAR(300) CHARACTER SET latin1, vcu VARCHAR(100) CHARACTER SET utf8mb4, "
    "vc2 VARCHAR(20) CHARACTER SET ucs2, vcg VARCHAR(20) CHARACTER SET greek, "
    "b8 BINARY(8), vb VARBINARY(300), tb TINYBLOB, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB, "
    "tt TINYTEXT, tx TEXT CHARACTER SET utf8mb4, mt MEDIUMTEXT CHARACTER SET utf8mb4, "
    "lt LONGTEXT, e ENUM('', 'a', 'b b', 'ü', 'last'), s SET('x', 'y', 'z', 'ä'), "
    "e2 ENUM(" + ", ".join(f"'v{i}'" for i in range(300)) + "), "
    "s64 SET(" + ", ".join(f"'m{i}'" for i in range(64)) + ")",
    [
        "'', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', 'v0', ''",
        f"'abc  ', '{_MB}', 'plain', '{'é' * 300}', '{_MB}', 'ucs2 ü', 'αβγ', "
        "'a\\0\\0', X'00FF00', X'0001', REPEAT('x', 65535), REPEAT('ab', 100000), "
        f"'long', '{_MB}', '{_MB * 10}', REPEAT('é', 70000), REPEAT('z', 300000), 'ü', "
        "'x,z,ä', 'v299', 'm0,m63'",
        "'0123456789', REPEAT('😀', 255), REPEAT('v', 100), REPEAT('x', 300), "
        "REPEAT('ü', 100), REPEAT('ü', 20), REPEAT('ω', 20), X'0102030405060708', "
        "REPEAT(X'FF', 300), REPEAT(X'00', 255), '', '', '', REPEAT('t', 255), '', '', '', "
        "'last', 'x,y,z,ä', 'v150', '" + ",".join(f"m{i}" for i in range(64)) + "'",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
        f"'x', 'y', 'z', 'w', 'v', 'u', 't', 'b', 'c', 'd', 'e', 'f', "
        f"REPEAT('L', {BIG_BLOB}), 'g', 'h', 'i', 'j', 'a', 'y', 'v1', 'm5'",
    ],
    {"b8": "bytes", "vb": "bytes", "tb": "bytes", "bl": "bytes", "mb": "bytes",
     "lb": "bytes", "s": "set", "s64": "set"},
)

SPECIAL = Table(
    "special",
    "j JSON, g GEOMETRY, pt POINT, ls LINESTRING, pg POLYGON, u UUID, i4 INET4, i6 INET6",
    [
        "'{\"a\": [1, 2.5, \"x\", null, true, {\"b\": \"é\"}]}', "
        "ST_GeomFromText('POINT(1 2)'), POINT(3, 4), "
        "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 3)'), "
        "ST_GeomFromText('POLYGON((0 0, 0 1, 1 1, 0 0))'), "
        "'01234567-89ab-4def-8123-456789abcdef', '1.2.3.4', '2001:db8::1'",
        "'[]', ST_GeomFromText('POINT(-1.5 1e300)', 4326), POINT(0, 0), "
        "ST_GeomFromText('LINESTRING(0 0, 0 0)'), "
        "ST_GeomFromText('POLYGON((0 0, 0 2, 2 2, 2 0, 0 0), (1 1, 1 1.5, 1.5 1.5, 1 1))'), "
        "'ffffffff-ffff-4fff-bfff-ffffffffffff', '255.255.255.255', "
        "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
        "'\"just a string\"', NULL, NULL, NULL, NULL, '01234567-89ab-4def-8123-456789ab0000', "
        "'0.0.0.0', '1::'",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
        "'{}', ST_GeomFromText('MULTIPOINT(1 1, 2 2)'), POINT(1, 1), "
        "ST_GeomFromText('LINESTRING(5 5, 6 6)'), ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))'),"
        " '00000000-0000-4000-8000-000000000000', '10.0.0.1', '::'",
    ],
    {"j": "json", "g": "geometry", "pt": "geometry", "ls": "geometry", "pg": "geometry",
     "u": "uuid", "i4": "inet", "i6": "inet"},
)

# The types the typed tap's decode_columns kernel converts (relay/tap/typed_images.py):
# its rows events go straight into Arrow buffers, so every value here crosses the kernel.
# No zero dates: an event holding one is given back to the row codec (TIMES has them).
# latin1 without the five bytes cp1252 leaves undefined: python-mysql-replication cannot
# decode those (tests/unit/test_typed_images.py has them).
_CP1252 = bytes(range(0x80, 0xA0)).decode("cp1252", "ignore") + " é"  # latin1's 0x80-0x9F
COMMON = Table(
    "common",
    "ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, "
    "miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED, y YEAR, "
    "d5 DECIMAL(5,2), d38 DECIMAL(38,10), f FLOAT, db DOUBLE, d DATE, dt0 DATETIME, "
    "dt3 DATETIME(3), dt6 DATETIME(6), ts0 TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL, "
    "c10 CHAR(10) CHARACTER SET utf8mb4, vc VARCHAR(100) CHARACTER SET utf8mb4, "
    "vl VARCHAR(300) CHARACTER SET latin1, b8 BINARY(8), vb VARBINARY(300), bl BLOB, "
    "tx TEXT CHARACTER SET utf8mb4",
    [
        "-128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, 1901, "
        "-999.99, -9999999999999999999999999999.9999999999, -3.402823466e+38, "
        "-1.7976931348623157e308, '1000-01-01', '1000-01-01 00:00:00', "
        "'1000-01-01 00:00:00.001', '1000-01-01 00:00:00.000001', '1970-01-01 00:00:01', "
        "'1970-01-01 00:00:01.000001', '', '', '', '', '', '', ''",
        "127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
        "9223372036854775807, 18446744073709551615, 2155, 999.99, "
        "9999999999999999999999999999.9999999999, 3.402823466e+38, 1.7976931348623157e308, "
        "'9999-12-31', '9999-12-31 23:59:59', '9999-12-31 23:59:59.999', "
        "'9999-12-31 23:59:59.999999', '2038-01-19 03:14:07', '2038-01-19 03:14:07.999999', "
        f"'0123456789', '{_MB}', '{'é' * 300}', X'0102030405060708', REPEAT(X'FF', 300), "
        f"REPEAT(X'00', 255), '{_MB * 10}'",
        "-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, 0, -0.5, -1.5, 1.1, -0.1, '2024-02-29', "
        "'2024-02-29 12:34:56', '2024-02-29 12:34:56.125', '2024-02-29 12:34:56.654321', "
        "'2024-02-29 12:34:56', '2024-02-29 12:34:56.015625', 'abc  ', 'plain', "
        f"'{_CP1252}', 'a\\0\\0', X'00FF00', X'0001', 'ü'",
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
        "0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2024, 0, 0, 0, 0, '1970-01-01', "
        "'1970-01-01 00:00:00', '1970-01-01 00:00:00.000', '1970-01-01 00:00:00.000000', "
        "'1970-01-01 00:00:01', '1970-01-01 00:00:01.5', 'x', 'y', X'A0FEFF', X'', "
        "X'', '', ''",
    ],
    {"f": "float", "ts0": "timestamp", "ts6": "timestamp", "b8": "bytes", "vb": "bytes",
     "bl": "bytes"},
)

TABLES = (INTS, NUMS, TIMES, STRS, SPECIAL, COMMON)


def connect(server: MariaDB, database: str | None = None) -> pymysql.Connection:
    conn = pymysql.connect(unix_socket=server.socket_path, user="root", autocommit=True,
                           database=database, max_allowed_packet=1 << 30, charset="utf8mb4")
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET sql_mode = 'NO_ENGINE_SUBSTITUTION'")  # zero dates allowed
    return conn


def select_all(server: MariaDB, schema: str, table: Table) -> dict[int, dict[str, Any]]:
    with contextlib.closing(connect(server, schema)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table.name} ORDER BY id")
        names = [d[0] for d in cur.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def workload(server: MariaDB, schema: str, *, image: str = "FULL") -> dict[str, Any]:
    """Insert every table's rows, update each row to the next one's values, delete them.
    Returns the SELECT snapshots: after the inserts and after the updates."""
    snapshots: dict[str, Any] = {}
    with contextlib.closing(connect(server)) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION binlog_row_image = '{image}'")
        cur.execute(f"CREATE DATABASE {schema}")
        cur.execute(f"USE {schema}")
        for t in TABLES:
            cur.execute(f"CREATE TABLE {t.name} (id INT PRIMARY KEY, {t.ddl})")
            cur.execute(f"CREATE TABLE {t.name}_src LIKE {t.name}")
            for i, values in enumerate(t.rows, 1):
                cur.execute(f"INSERT INTO {t.name} VALUES ({i}, {values})")
            inserted = select_all(server, schema, t)
            cur.execute(f"INSERT INTO {t.name}_src SELECT * FROM {t.name}")
            cols = [name for name in inserted[1] if name != "id"]
            n = len(t.rows)
            cur.execute(f"UPDATE {t.name} JOIN {t.name}_src s ON s.id = {t.name}.id % {n} + 1 "
                        "SET " + ", ".join(f"{t.name}.{c} = s.{c}" for c in cols))
            updated = select_all(server, schema, t)
            cur.execute(f"DELETE FROM {t.name}")
            snapshots[t.name] = (inserted, updated)
    return snapshots


def normalize(kind: str | None, value: Any) -> Any:
    """A SELECT value (pymysql's conversion) in the form the row codec decodes to."""
    if value is None:
        return None
    if kind == "bit":
        return int.from_bytes(value, "big")
    if kind == "set":
        return frozenset(value.split(",")) if value else frozenset()
    if kind == "json":
        return json.loads(value)
    if kind == "uuid":
        return uuid.UUID(value)
    if kind == "inet":
        return ipaddress.ip_address(value)
    if kind == "timestamp" and isinstance(value, datetime):
        return value.replace(tzinfo=UTC)
    return value


def decoded_form(kind: str | None, value: Any) -> Any:
    """A decoded value in the form to compare: floats as float32, geometry with its SRID,
    zero dates in the text form pymysql returns."""
    if value is None:
        return None
    if kind == "geometry":
        assert isinstance(value, Geometry)
        return struct.pack("<I", value.srid) + bytes(value)
    if isinstance(value, InvalidTemporal):
        return str(value)
    return value


def compare_images(table: Table, image: dict[str, Any], expected: dict[str, Any],
                   where: str) -> None:
    for name, got in image.items():
        kind = table.kinds.get(name)
        want = normalize(kind, expected[name])
        if kind == "float" and want is not None and got is not None:
            # The server prints FLOAT with 6 significant digits: compare to that.
            assert math.isclose(got, want, rel_tol=1e-5), f"{where}.{name}: {got} != {want}"
            assert struct.unpack("<f", struct.pack("<f", got))[0] == got  # a float32 value
            continue
        g = decoded_form(kind, got)
        if isinstance(got, JsonPartial):
            raise AssertionError(f"{where}.{name}: partial JSON from MariaDB")
        assert g == want, f"{where}.{name}: decoded {g!r}, SELECT gave {want!r}"


Check = Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]
