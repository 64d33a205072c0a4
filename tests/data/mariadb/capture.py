"""Capture a small MariaDB binlog of every column type, for tests that run without a server.

    python tests/data/mariadb/capture.py

Starts a throwaway mariadbd, runs inserts, updates and deletes over every column type family
in FULL and MINIMAL row images and with log_bin_compress=ON, and copies the binlog to
tests/data/mariadb/types.000001 (and the type hints the tests need to hints.json).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from relay.testing.mariadb import running

HERE = os.path.dirname(os.path.abspath(__file__))

TABLE = """CREATE TABLE t (
  id INT PRIMARY KEY, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT,
  miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED, b9 BIT(9),
  y YEAR, d5 DECIMAL(5,2), d65 DECIMAL(65,30), f FLOAT, db DOUBLE, dd DATE, dt DATETIME,
  dt3 DATETIME(3), dt6 DATETIME(6), ts TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, t0 TIME,
  t4 TIME(4), c10 CHAR(10), c300 CHAR(100) CHARACTER SET utf8mb4, vc VARCHAR(20),
  vc300 VARCHAR(300), vcu VARCHAR(50) CHARACTER SET utf8mb4, vb VARBINARY(10), b4 BINARY(4),
  tx TEXT CHARACTER SET utf8mb4, bl BLOB, lb LONGBLOB, e ENUM('a','b','c'), s SET('x','y','z'),
  j JSON, g GEOMETRY, u UUID, i4 INET4, i6 INET6)"""

ROWS = [
    "(1, -128, 255, -32768, -8388608, 16777215, -2147483648, 4294967295, "
    "-9223372036854775808, 18446744073709551615, b'100000001', 1901, -999.99, "
    "-1.000000000000000000000000000001, -1.5, 1e300, '1000-01-01', '1000-01-01 00:00:00', "
    "'2024-02-29 12:34:56.125', '9999-12-31 23:59:59.999999', '1970-01-01 00:00:01', "
    "'2038-01-19 03:14:07.99', '-838:59:59', '-00:00:00.0001', 'abc  ', REPEAT('😀', 100), "
    "'', REPEAT('x', 300), 'héllo wörld 中文 😀', X'00FF', 'a', 'text ü', X'000102', "
    "REPEAT('L', 3000), 'c', 'x,z', '{\"a\": [1, null, {\"b\": \"é\"}]}', POINT(1, 2), "
    "'01234567-89ab-4def-8123-456789abcdef', '10.0.0.1', '2001:db8::1')",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(3, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'0', 0, 0, 0, 0, 0, '0000-00-00', '0000-00-00 00:00:00', "
    "'0000-00-00 00:00:00.000', '2024-00-01 00:00:00', '0000-00-00 00:00:00', NULL, "
    "'00:00:00', '12:00:00.5', '', '', '', '', '', '', '', '', '', '', 'a', '', '[]', "
    "ST_GeomFromText('LINESTRING(0 0, 1 1)', 4326), '00000000-0000-4000-8000-000000000000', "
    "'0.0.0.0', '::')",
]


def main() -> None:
    with running(options={"log_bin_compress_min_len": "10"}) as server:
        server.execute_many([
            "SET GLOBAL mysql56_temporal_format = OFF",
            "CREATE DATABASE old",
            "CREATE TABLE old.t (id INT PRIMARY KEY, dt DATETIME, dt3 DATETIME(3), tm TIME, "
            "tm2 TIME(2), ts6 TIMESTAMP(6) NULL)",
            "SET GLOBAL mysql56_temporal_format = ON",
            "INSERT INTO old.t VALUES (1, '2024-02-29 12:34:56', '2024-02-29 12:34:56.125', "
            "'-12:34:56', '-12:34:56.78', '2038-01-19 03:14:07.654321')",
        ])
        for schema, image, compress in (("full", "FULL", "OFF"), ("minimal", "MINIMAL", "OFF"),
                                        ("noblob", "NOBLOB", "OFF"),
                                        ("compressed", "FULL", "ON")):
            server.execute_many([f"SET GLOBAL log_bin_compress = {compress}",
                                 f"CREATE DATABASE {schema}"])
            conn = server.root(schema)
            with conn.cursor() as cur:
                cur.execute("SET sql_mode = 'NO_ENGINE_SUBSTITUTION'")
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(f"SET SESSION binlog_row_image = '{image}'")
                cur.execute(TABLE)
                cur.execute("INSERT INTO t VALUES " + ", ".join(ROWS))
                cur.execute("UPDATE t SET vc = CONCAT('u', id), i = i DIV 2, j = '{}' "
                            "WHERE id <> 2")
                cur.execute("UPDATE t SET ti = 7, lb = 'short' WHERE id = 2")
                cur.execute("DELETE FROM t WHERE id IN (1, 3)")
                cur.execute("BEGIN")
                cur.execute("INSERT INTO t (id, vc) VALUES (10, 'in tx'), (11, 'two')")
                cur.execute("COMMIT")
            conn.close()
        # One statement, rows events for two tables (the table maps come first).
        server.execute_many([
            "SET GLOBAL log_bin_compress = OFF", "CREATE DATABASE multi",
            "CREATE TABLE multi.a (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE multi.b (id INT PRIMARY KEY, v INT)",
            "INSERT INTO multi.a VALUES (1, 1), (2, 2)", "INSERT INTO multi.b VALUES (1, 1), (2, 2)",
            "UPDATE multi.a JOIN multi.b ON a.id = b.id SET a.v = a.v + 1, b.v = b.v + 1",
        ])
        server.execute_many(["FLUSH BINARY LOGS"])
        first = server.binlog_files()[0]
        shutil.copy(server.binlog_path(first), os.path.join(HERE, "types.000001"))
        hints = {}
        for schema in ("full", "minimal", "noblob", "compressed"):
            hints.update({f"{schema}.t.u": "uuid", f"{schema}.t.i4": "inet4",
                          f"{schema}.t.i6": "inet6", f"{schema}.t.j": "json"})
        hints.update({"old.t.dt3": "datetime(3)", "old.t.tm2": "time(2)",
                      "old.t.ts6": "timestamp(6)"})
        with open(os.path.join(HERE, "hints.json"), "w") as f:
            json.dump(hints, f, indent=1, sort_keys=True)
    print("wrote", os.path.join(HERE, "types.000001"))


if __name__ == "__main__":
    main()
