"""The row codec against a real primary: every column type family with edge values, in
FULL, MINIMAL and NOBLOB row images and with log_bin_compress=ON, decodes to what SELECT
returns; every table map and rows event encodes back to its bytes; and `relay changes`
prints the same lines from the primary's files, from a relay log and from the live
primary."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from relay.binlog import describe
from relay.binlog.changes import RowsStatement
from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.file import iter_file_events
from relay.binlog.rows import ROWS_TYPES
from relay.binlog.tablemap import TypeHints
from relay.config import Source
from relay.sources import open_source
from relay.testing.mariadb import MariaDB
from relay.upstream.control import fetch_type_hints
from tests.conftest import RelayProcess, wait_until
from tests.integration import typed_tables as T

pytestmark = pytest.mark.integration

MODES = ("FULL", "MINIMAL", "NOBLOB", "compressed")


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(base_dir=str(tmp_path_factory.mktemp("codec-primary")),
                     options={"log_bin_compress_min_len": "10",
                              "max_binlog_size": "64M"})
    server.start()
    # The relay's replica user sees tables' definitions in information_schema (for the
    # column type hints) and none of their rows.
    server.execute_many([f"GRANT REFERENCES ON *.* TO '{server.repl_user}'@'%'"])
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def snapshots(primary: MariaDB) -> dict[str, dict[str, Any]]:
    """Run the workload once per mode, each in its own schema."""
    out = {}
    for mode in MODES:
        schema = f"codec_{mode.lower()}"
        if mode == "compressed":
            primary.execute_many(["SET GLOBAL log_bin_compress = ON"])
            out[mode] = T.workload(primary, schema)
            primary.execute_many(["SET GLOBAL log_bin_compress = OFF"])
        else:
            out[mode] = T.workload(primary, schema, image=mode)
    # MariaDB's pre-10.1.2 temporal formats (no precision in the binlog: needs hints).
    with contextlib.closing(T.connect(primary)) as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL mysql56_temporal_format = OFF")
        cur.execute("CREATE DATABASE codec_old")
        cur.execute("CREATE TABLE codec_old.t (id INT PRIMARY KEY, dt DATETIME, "
                    "dt3 DATETIME(3), dt6 DATETIME(6), tm TIME, tm2 TIME(2), tm5 TIME(5), "
                    "ts TIMESTAMP NULL, ts4 TIMESTAMP(4) NULL)")
        cur.execute("SET GLOBAL mysql56_temporal_format = ON")
        cur.execute("INSERT INTO codec_old.t VALUES (1, '2024-02-29 12:34:56', "
                    "'2024-02-29 12:34:56.125', '9999-12-31 23:59:59.999999', '-838:59:59', "
                    "'-12:34:56.78', '838:59:58.99999', '2038-01-19 03:14:07', "
                    "'1970-01-01 00:00:01.0001'), (2, '0000-00-00 00:00:00', "
                    "'1000-01-01 00:00:00.001', NULL, '00:00:00', '-00:00:00.01', "
                    "'-00:00:00.00001', NULL, NULL)")
    return out


def _hints(primary: MariaDB) -> TypeHints:
    found = asyncio.run(fetch_type_hints(Source.parse(primary.url), timeout=10))
    return TypeHints(found)


def _index(primary: MariaDB) -> str:
    return "file://" + os.path.join(primary.datadir, "mariadb-bin.index")


def _changes_of(primary: MariaDB, schema: str) -> tuple[list[Any], Counter[int]]:
    """The decoded row changes of one schema, and the types of their rows events."""
    hints = _hints(primary)
    types: Counter[int] = Counter()
    for tx in open_source(_index(primary), hints=hints).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement) and st.table.schema == schema:
                types.update(ev.type_code for ev, _rev in st.events())
    changes = [ch for ch in open_source(_index(primary), hints=hints).changes()
               if ch.schema == schema]
    return changes, types


@pytest.mark.parametrize("mode", MODES)
def test_decoded_values_equal_select(primary: MariaDB, snapshots: dict[str, Any],
                                     mode: str) -> None:
    schema = f"codec_{mode.lower()}"
    changes, types = _changes_of(primary, schema)
    by_table = {t.name: t for t in T.TABLES}
    seen: Counter[tuple[str, str]] = Counter()
    for ch in changes:
        if ch.table.endswith("_src"):
            continue  # the copies the updates read from
        table = by_table[ch.table]
        inserted, updated = snapshots[mode][ch.table]
        before = ch.before.asdict() if ch.before is not None else None
        after = ch.after.asdict() if ch.after is not None else None
        where = f"{mode} {ch.op} {ch.table} at {ch.position}"
        if ch.op == "insert":
            assert after is not None
            T.compare_images(table, after, inserted[after["id"]], where)
        elif ch.op == "update":
            assert before is not None and after is not None
            row_id = before["id"]  # every image carries the primary key
            T.compare_images(table, before, inserted[row_id], where + " before")
            T.compare_images(table, after, updated[row_id], where + " after")
            if mode == "MINIMAL":
                assert set(before) == {"id"}, where
        else:
            assert before is not None
            T.compare_images(table, before, updated[before["id"]], where)
        seen[(ch.table, ch.op)] += 1
    for t in T.TABLES:
        for op in ("insert", "update", "delete"):
            assert seen[(t.name, op)] == len(t.rows), (mode, t.name, op, seen)
    if mode == "compressed":
        assert types.keys() & {EventType.WRITE_ROWS_COMPRESSED_V1,
                                EventType.UPDATE_ROWS_COMPRESSED_V1,
                                EventType.DELETE_ROWS_COMPRESSED_V1} == {
            EventType.WRITE_ROWS_COMPRESSED_V1, EventType.UPDATE_ROWS_COMPRESSED_V1,
            EventType.DELETE_ROWS_COMPRESSED_V1}
    else:
        assert types.keys() <= {EventType.WRITE_ROWS_V1, EventType.UPDATE_ROWS_V1,
                                EventType.DELETE_ROWS_V1}


def test_old_temporal_formats_with_hints(primary: MariaDB, snapshots: dict[str, Any]) -> None:
    changes, _ = _changes_of(primary, "codec_old")
    with contextlib.closing(T.connect(primary, "codec_old")) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM t ORDER BY id")
        names = [d[0] for d in cur.description]
        rows = {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}
    assert len(changes) == 2
    kinds = {"ts": "timestamp", "ts4": "timestamp"}
    table = T.Table("t", "", [], kinds)
    for ch in changes:
        assert ch.after is not None
        after = ch.after.asdict()
        T.compare_images(table, after, rows[after["id"]], f"codec_old at {ch.position}")
    # Without the hints the columns cannot be read; the error says so, never a wrong value.
    with pytest.raises(Exception, match="type hint"):
        for ch in open_source(_index(primary)).changes():
            if ch.schema == "codec_old" and ch.after is not None:
                ch.after.asdict()


def test_a_table_map_made_from_information_schema_equals_the_primary_s(
        primary: MariaDB, snapshots: dict[str, Any]) -> None:
    """What the tap answers for a table with no change yet: the map made from the
    primary's information_schema decodes to the same columns as the primary's own map,
    for every column type family, a composite key and ENUM values with quotes."""
    with contextlib.closing(T.connect(primary)) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE codec_describe")
        cur.execute("CREATE TABLE codec_describe.comp (a VARCHAR(10) NOT NULL, "
                    "b BIGINT UNSIGNED NOT NULL, y YEAR, c TINYINT, "
                    "e ENUM('it''s', 'back\\\\slash', 'ü') CHARACTER SET utf8mb4, "
                    "PRIMARY KEY (b, a))")
        cur.execute("INSERT INTO codec_describe.comp VALUES ('a', 1, 2024, -1, 'ü')")
        cur.execute("CREATE TABLE codec_describe.nokey (a INT, b CHAR(3))")
        cur.execute("INSERT INTO codec_describe.nokey VALUES (1, 'x')")
        wanted = [("codec_full", t.name) for t in T.TABLES] + [
            ("codec_describe", "comp"), ("codec_describe", "nokey")]
        made = {}
        for schema, table in wanted:
            cur.execute(describe.describe_sql(schema, table))
            columns = [describe.ColumnDescription.of_row(r) for r in cur.fetchall()]
            cur.execute(describe.primary_key_sql(schema, table))
            key = [r[0] for r in cur.fetchall()]
            made[(schema, table)] = describe.table_map(schema, table, columns, key)
        with pytest.raises(describe.DescribeError, match="no such table"):
            cur.execute(describe.describe_sql("codec_describe", "absent"))
            describe.table_map("codec_describe", "absent", [], [])
    real = {}
    for tx in open_source(_index(primary)).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement) and (st.table.schema, st.table.table) in made:
                real[(st.table.schema, st.table.table)] = st.table
    assert real.keys() == made.keys()
    for name, theirs in real.items():
        ours = made[name]
        assert ours.primary_key == theirs.primary_key, name
        assert ours.column_types == theirs.column_types, name
        assert ours.metadata == theirs.metadata, name
        assert ours.null_bits == theirs.null_bits, name
        for mine, server in zip(ours.columns, theirs.columns, strict=True):
            assert mine == server, (name, mine, server)
    assert real[("codec_describe", "comp")].primary_key == (1, 0)
    assert real[("codec_describe", "comp")].columns[4].members == ("it's", "back\\slash", "ü")


def _events(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for raw in iter_file_events(f):
            yield raw.data


def test_every_event_round_trips(primary: MariaDB, snapshots: dict[str, Any]) -> None:
    """decode -> encode gives the original bytes for every TABLE_MAP and rows event of
    the test binlogs, compressed ones included."""
    primary.execute_many(["FLUSH BINARY LOGS"])
    hints = _hints(primary)
    counts: Counter[int] = Counter()
    for name in primary.binlog_files():
        decoder = StreamDecoder(hints)
        for data in _events(primary.binlog_path(name)):
            typ = data[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                decoder.format_description(data)
            elif typ == EventType.TABLE_MAP:
                tm = decoder.table_map(data)
                assert tm.encode() == decoder.body(data)
                counts[typ] += 1
            elif typ in ROWS_TYPES:
                rev = decoder.rows_event(data)
                table = decoder.table_for(rev)
                rows = list(rev.rows(table, decoder.codecs))
                assert rev.encode(table, rows, decoder.codecs) == decoder.body(data), (
                    f"{name}: {EventType(typ).name} of {table.qualified} does not round-trip")
                counts[typ] += 1
    assert counts[EventType.TABLE_MAP] > 50
    assert counts[EventType.UPDATE_ROWS_V1] and counts[EventType.UPDATE_ROWS_COMPRESSED_V1]


def _changes_cli(source: str, *extra: str) -> list[dict[str, Any]]:
    res = subprocess.run([sys.executable, "-m", "relay.cli", "changes", source, *extra],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if not source.startswith("mysql:"):  # files: the line kernel's bytes, the general path's
        general = subprocess.run(
            [sys.executable, "-m", "relay.cli", "changes", source, *extra],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "RELAY_LINE_KERNEL": "0"})
        assert general.returncode == 0, general.stderr[-2000:]
        assert general.stdout == res.stdout
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    for line in lines:  # positions are each source's own
        line.pop("file")
        line.pop("pos")
    return lines


def test_changes_cli_same_from_file_relay_log_and_live(
        primary: MariaDB, snapshots: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
        ) -> None:
    relay = RelayProcess(str(tmp_path_factory.mktemp("codec-relay")), primary.url)
    relay.start()
    try:
        target = primary.gtid_binlog_pos()

        def caught_up() -> bool:
            status, body = relay.http("/status")
            return status == 200 and target in body
        wait_until(caught_up, 120, "the relay to mirror the primary")
        args = ("--table", "codec_full.*", "--table", "codec_compressed.ints",
                "--queries")
        from_file = _changes_cli(_index(primary), *args, "--types-from", primary.url)
        from_relay = _changes_cli(f"relay://{relay.data_dir}", *args,
                                  "--types-from", primary.url)
        from_live = _changes_cli(primary.url, *args)
    finally:
        relay.stop()
    assert len(from_file) > 60
    assert {line["table"] for line in from_file if "table" in line} >= {
        "ints", "nums", "times", "strs", "special"}
    assert from_relay == from_file
    assert from_live == from_file
    uuids = [line["after"]["u"] for line in from_file
             if line.get("table") == "special" and line["op"] == "insert"]
    assert "01234567-89ab-4def-8123-456789abcdef" in uuids  # hints applied everywhere
