"""The snapshot's row reader (relay/tap/textresult.py and the text-result kernels) against
real servers: MariaDB 10.11 and 11.8, MySQL 9.7. A chunk read the relay's way gives the
rows PyMySQL's own cursor gives, their JSON images are the generated writer's, written by
the kernel (it took rows), a row of several packets (17 MB) comes whole, an error the
server sends among the rows is PyMySQL's error, and the connection goes on after each."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pymysql.cursors
import pytest

from relay.tap.json_images import JsonImages
from relay.tap.snapshot import (
    Chunk,
    ChunkReader,
    SourceSpec,
    TableSpec,
    describe,
    json_row_writer,
    json_text_plan,
    plan_chunks,
    plan_is_stale,
)
from relay.testing.mariadb import MariaDB

pytestmark = pytest.mark.integration

BIG = 17 << 20  # past one packet's 16 MiB payload
DIGITS = "(" + " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10)) + ")"


class CountedImages(JsonImages):
    """JsonImages that counts the rows the kernel wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.by_kernel = 0

    def kernel_took(self, rows: int) -> None:
        self.by_kernel += rows
        super().kernel_took(rows)


def fill(server: MariaDB) -> None:
    server.execute_many([
        "SET SESSION sql_mode = ''",
        "CREATE DATABASE s CHARACTER SET utf8mb4",
        "CREATE TABLE s.t (id INT PRIMARY KEY, z INT(5) ZEROFILL, u BIGINT UNSIGNED, "
        "y YEAR, d DECIMAL(30,10), dt DATETIME(3), ts TIMESTAMP(6) NULL, da DATE, "
        "v VARCHAR(20) CHARACTER SET latin1, e ENUM('a','ü'), x TEXT, b VARBINARY(10), "
        "big LONGBLOB)",
        "INSERT INTO s.t VALUES (1, 7, 18446744073709551615, 2024, -0.0000000010, "
        "'2024-02-29 10:00:00.123', '2038-01-19 03:14:07.999999', '2024-03-30', "
        "'caf\\xe9', 'ü', 'a\"\\\\\\n\\t\U0001f600', 0x00ff, NULL)",
        "INSERT INTO s.t VALUES (2, NULL, 0, 0, 12.5, '0000-00-00 00:00:00', NULL, "
        "'0000-00-00', NULL, NULL, '', '', NULL)",
        f"INSERT INTO s.t VALUES (3, 0, 1, 1901, 0, '2024-01-02 03:04:05', "
        f"'1970-01-01 00:00:01', '2024-02-28', 'x', 'a', REPEAT('é', 1000), 'b', "
        f"REPEAT('x', {BIG}))",
        "INSERT INTO s.t (id, z, u, d, dt, ts, da, v, x) "
        "SELECT i, i, i * 3, i / 7, '2020-01-02 03:04:05.5', '2021-01-01 01:01:01.25', "
        "'2020-02-02', 'abc', 'défg' FROM (SELECT 10 + a.d + 10 * b.d + 100 * c.d "
        f"+ 1000 * e.d AS i FROM {DIGITS} a, {DIGITS} b, {DIGITS} c, {DIGITS} e) n "
        "WHERE i < 5010",
        f"GRANT SELECT ON s.* TO '{server.repl_user}'@'%'",
    ])


def connect(server: MariaDB) -> Any:
    return SourceSpec.parse(server.url, default_address=None, user=None, password=None,
                            password_env=None).connect()


@contextlib.contextmanager
def planned(mariadb_factory: Callable[..., MariaDB],
            ) -> Iterator[tuple[MariaDB, Any, TableSpec, Chunk]]:
    """A filled server, a connection to it, s.t's plan and its one chunk."""
    server = mariadb_factory()
    fill(server)
    conn = connect(server)
    try:
        spec = describe(conn, "s", "t")
        chunk, = plan_chunks(conn, spec, 0, 1_000_000)
        yield server, conn, spec, chunk
    finally:
        conn.close()


@pytest.mark.builds("machine", "mariadb-11.8", "mysql-9.7")
def test_a_chunks_look_at_the_columns_without_collation_ids_judges_as_the_full_one(
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """The per-chunk staleness check reads no collation ids (their join costs the primary
    two thirds of the query): it judges a plan as the full description does, fresh and
    after an ALTER (a type, and a column's character set)."""
    with planned(mariadb_factory) as (server, conn, spec, chunk):
        for alter in ("", "ALTER TABLE s.t MODIFY x MEDIUMTEXT",
                      "ALTER TABLE s.t MODIFY v VARBINARY(20)"):
            if alter:
                server.execute_many(["SET SESSION sql_mode = ''", alter])  # (zero dates)
            reader = ChunkReader(conn, spec, chunk)
            reader.begin()
            full, light = (reader.columns_now(collation_ids=ids) for ids in (True, False))
            reader.end()
            assert plan_is_stale(spec, light) == plan_is_stale(spec, full) == bool(alter)
            assert [c.name for c in light] == [c.name for c in full]
            # the character set's collation stands in for a text column's own
            assert all((lc.collation is None) == (fc.collation is None)
                       for lc, fc in zip(light, full, strict=True))


@pytest.mark.builds("machine", "mariadb-11.8", "mysql-9.7")
def test_a_chunk_read_the_relays_way_is_pymysqls_and_its_json_the_writers(
        mariadb_factory: Callable[..., MariaDB]) -> None:
    with planned(mariadb_factory) as (_, conn, spec, chunk):
        reader = ChunkReader(conn, spec, chunk)
        reader.begin()
        got = [row for batch in reader.raw_rows() for row in batch]
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute("SELECT id, z, u, y, d, dt, ts, da, v, e, x, b, big FROM s.t "
                        "ORDER BY id")
            want = list(cur.fetchall())
        assert len(got) == 5003 and got == want
        assert len(got[2][12] or b"") == BIG

        plan, write = json_text_plan(spec), json_row_writer(spec)
        assert plan is not None
        images = CountedImages()
        reader.begin()
        result = reader.result()
        taken = 0
        while n := result.json_into(images, *plan, write, 4096):
            taken += n
        reader.finish(result)
        assert taken == len(want)
        assert images.array().to_pylist() == [write(row) for row in want]
        # the kernel wrote all but the rows it gives back (zero dates, a DECIMAL under
        # 1e-6, days past the 28th) and the row of several packets
        assert images.by_kernel >= len(want) - 3


@pytest.mark.builds("machine", "mysql-9.7")
def test_an_error_among_the_rows_is_the_servers_and_the_connection_goes_on(
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """A subquery that fails at the 3,000th row: the server has sent rows before its error
    packet; the reader raises PyMySQL's error, and the next query on the connection works."""
    server = mariadb_factory()
    fill(server)
    conn = connect(server)
    try:
        result = conn.text_result(
            "SELECT id, (SELECT 1 UNION ALL SELECT 2 FROM s.t WHERE t.id = 3000) FROM s.t "
            "ORDER BY id", (), "test")
        rows = 0
        with pytest.raises(pymysql.err.MySQLError) as caught:
            for batch in result.rows():
                rows += len(batch)
        assert caught.value.args[0] == 1242  # Subquery returns more than 1 row
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM s.t")
            assert cur.fetchone() == (b"5003",)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.mark.builds("machine")
def test_a_reader_that_stops_early_closes_the_connection(
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """Rows left unread would be taken for the next command's reply: the reader that stops
    early closes the connection instead."""
    server = mariadb_factory()
    fill(server)
    conn = connect(server)
    spec = describe(conn, "s", "t")
    chunk, = plan_chunks(conn, spec, 0, 1_000_000)
    reader = ChunkReader(conn, spec, chunk, batch=10)
    reader.begin()
    rows = reader.raw_rows()
    assert 0 < len(next(rows)) <= 10
    rows.close()
    assert not conn.open
