"""The snapshot's pieces without servers: boundary keys survive the trip through the relay,
text values become the row codec's values, the relay keeps plans and progress across a
restart, and the data source refuses options it does not know."""

from __future__ import annotations

import importlib
import json
import os
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from relay.binlog.jsonb import JSON_NULL
from relay.binlog.jsonvalue import datetime_text, jsonable, time_text
from relay.binlog.values import InvalidTemporal
from relay.tap.snapshot import (
    Chunk,
    ColumnSpec,
    SnapshotError,
    SourceSpec,
    TableSpec,
    converter,
    json_row_writer,
)
from relay.tap.snapshots import SnapshotRegistry


def dev_dependency(name: str) -> None:
    """`name` is a dev dependency (scripts/setup installs it): under CI its absence fails
    the test; elsewhere the test is skipped."""
    if os.environ.get("CI"):
        importlib.import_module(name)
    else:
        pytest.importorskip(name)


def test_chunk_keys_round_trip_through_the_wire() -> None:
    key = ((1 << 64) - 1, "Äb ", b"\x00\xff", Decimal("1.500000000000000000000000000000"),
           datetime(2024, 1, 2, 3, 4, 5, 6), datetime(2024, 1, 2, tzinfo=UTC),
           date(2024, 2, 29), timedelta(hours=-838, minutes=-59, seconds=-59))
    chunk = Chunk(3, 1, key, None)
    assert Chunk.from_wire(chunk.to_wire()) == chunk


@pytest.mark.parametrize(("kind", "text", "value"), [
    ("bigint", b"18446744073709551615", (1 << 64) - 1),
    ("decimal", b"-0.000000000000000000000000000001", Decimal("-1E-30")),
    ("float", b"1.1", 1.100000023841858),
    ("double", b"0.1", 0.1),
    ("bit", b"\x01\x02", 258),
    ("date", b"0000-00-00", InvalidTemporal("date", 0, 0, 0)),
    ("datetime", b"2024-01-02 03:04:05.120", datetime(2024, 1, 2, 3, 4, 5, 120000)),
    ("timestamp", b"2024-01-02 03:04:05", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("time", b"-838:59:59.000000", -timedelta(hours=838, minutes=59, seconds=59)),
    ("set", b"a,c", frozenset({"a", "c"})),
    ("set", b"", frozenset()),
    ("varchar", "é".encode(), "é"),
    # MySQL's JSON: the document, as the log's binary JSON decodes to
    ("json", '{"b": [1, 2.5, "🙂"], "a": null}'.encode(), {"b": [1, 2.5, "🙂"], "a": None}),
    ("json", b"null", JSON_NULL),
    ("json", b'"text"', "text"),
])
def test_text_values_become_the_codecs_values(kind: str, text: bytes, value: object) -> None:
    got = converter(ColumnSpec("c", kind, binary=False))(text)
    assert got == value and jsonable(got) == jsonable(value)


def test_binary_columns_stay_bytes() -> None:
    assert converter(ColumnSpec("c", "varbinary", binary=True))(b"\xff\x00") == b"\xff\x00"


def test_source_urls() -> None:
    spec = SourceSpec.parse("mysql://reader:s%40cret@db:3307", default_address=None,
                            user=None, password=None, password_env=None)
    assert (spec.host, spec.port, spec.user, spec.password) == ("db", 3307, "reader", "s@cret")
    assert "s@cret" not in repr(spec)
    with pytest.raises(SnapshotError, match="snapshotSource"):
        SourceSpec.parse(None, default_address=None, user="u", password=None,
                         password_env=None)
    with pytest.raises(SnapshotError, match="NOT_SET_ANYWHERE"):
        SourceSpec.parse("mysql://u@h", default_address=None, user=None, password=None,
                         password_env="NOT_SET_ANYWHERE")


def test_the_relay_keeps_plans_and_progress_across_a_restart(tmp_path: object) -> None:
    directory = str(tmp_path)
    reg = SnapshotRegistry(directory)
    tables = [{"schema": "s", "table": "t", "keys": ["id"], "unique": True,
               "columns": [["id", "bigint", False]]}]
    chunks = [Chunk(0, 0, None, (10,)).to_wire(), Chunk(1, 0, (10,), (20,)).to_wire()]
    snap = reg.create("job", 1 << 32 | 4, tables, chunks)
    assert reg.chunk_done(snap.id, 1, 7) and reg.chunk_done(snap.id, 1, 8)  # a retry
    assert not reg.chunk_done("nope", 0, 1)
    again = SnapshotRegistry(directory)
    again.load()
    loaded = again.owned("", snap.id)   # (created with no owner: the anonymous one)
    assert loaded is not None and loaded.chunks == chunks and loaded.start == 1 << 32 | 4
    assert loaded.progress() == {"s.t": {"chunks": 2, "chunks_done": 1, "rows": 8}}
    assert again.drop(snap.id) and not os.listdir(again.directory)
    # A re-snapshot asked for stays until a plan takes its tables.
    again.request("job", ["s.t", "s.u"])
    again.request("job", ["s.t"])
    assert again.requested("job") == ["s.t", "s.u"] and again.requested("other") == []
    again.taken("job", ["s.t"])
    assert again.requested("job") == ["s.u"]
    again.taken("job", ["s.u"])
    assert again.requested("job") == []
    # A request with a token (the resnapshot option) is honoured once, across restarts;
    # an untaken request survives a restart too.
    assert again.request("job", ["s.t"], token="t1")
    assert not again.request("job", ["s.t"], token="t1")
    third = SnapshotRegistry(directory)
    third.load()
    assert third.requested("job") == ["s.t"]
    assert not third.request("job", ["s.u"], token="t1") and third.requested("job") == ["s.t"]
    assert third.request("job", ["s.u"], token="t2")
    third.forget("job")
    assert third.requested("job") == [] and third.request("job", ["s.t"], token="t1")


def test_chunks_of_tables_in_turn_and_bounded_per_table() -> None:
    dev_dependency("pyspark")
    from relay.tap.spark import interleave, next_chunks

    a = [Chunk(i, 0, None, None) for i in range(5)]
    b = [Chunk(i, 1, None, None) for i in range(2)]
    order = interleave([a, b])
    assert [c.table for c in order] == [0, 1, 0, 1, 0, 0, 0]
    assert [c.index for c in order] == list(range(7))
    assert next_chunks(order, 0, 16, 0) == 7            # no bound of its own
    assert next_chunks(order, 0, 3, 0) == 3             # the batch bound
    assert next_chunks(order, 0, 16, 2) == 4            # a third chunk of table 0 waits
    assert next_chunks(order, 4, 16, 2) == 6
    assert next_chunks(order, 6, 16, 2) == 7
    assert next_chunks(order, 4, 16, 1) == 5            # at least one chunk a batch


def test_unknown_options_are_refused_naming_the_closest() -> None:
    dev_dependency("pyspark")
    from relay.tap.spark import TapOptions

    with pytest.raises(ValueError, match="maxRowsPerBatch"):
        TapOptions({"endpoint": "h:1", "maxRowPerBatch": "10"})
    with pytest.raises(ValueError, match="leave start out"):
        TapOptions({"endpoint": "h:1", "table": "s.t", "snapshot": "initial",
                    "start": "earliest", "snapshotSource": "mysql://u@h"})
    with pytest.raises(ValueError, match="tables it copies"):
        TapOptions({"endpoint": "h:1", "snapshot": "initial"})
    o = TapOptions({"endpoint": "h:1", "table": "s.t", "snapshot": "initial",
                    "snapshotSource": "mysql://u@h", "snapshotKeyColumns": "a,b",
                    "queryName": "spark passes this"})
    assert o.snapshot_keys == {"s.t": ["a", "b"]}


def test_a_query_without_a_name_is_named_by_what_it_reads() -> None:
    dev_dependency("pyspark")
    from relay.tap.spark import TapOptions

    orders = {"endpoint": "h:1", "table": "shop.orders", "password": "a"}
    name = TapOptions(orders).name
    assert name.startswith("spark-")
    assert TapOptions({**orders, "password": "b", "batchRows": "10"}).name == name
    assert TapOptions({**orders, "table": "shop.items"}).name != name
    assert TapOptions({**orders, "images": "json"}).name != name
    assert TapOptions({**orders, "name": "orders-job"}).name == "orders-job"


def test_the_raw_json_writer_writes_what_converting_and_dumping_writes() -> None:
    cols = [ColumnSpec("i", "int", False), ColumnSpec("z", "int", False),
            ColumnSpec("y", "year", False), ColumnSpec("d", "decimal", False),
            ColumnSpec("s", "varchar", False), ColumnSpec("e", "enum", False),
            ColumnSpec("b", "varbinary", True), ColumnSpec("t", "datetime", False),
            ColumnSpec("ts", "timestamp", False), ColumnSpec("tm", "time", False),
            ColumnSpec("st", "set", False), ColumnSpec("f", "float", False),
            ColumnSpec("dt", "date", False), ColumnSpec("bit", "bit", False),
            ColumnSpec("we\"ird", "text", False)]
    spec = TableSpec("s", "t", tuple(cols), ("i",), True)
    rows = [
        (b"-5", b"00042", b"0000", b"-0.000000000000000000000000000001", "é\"\\\n".encode(),
         b"a", b"\x00\xff", b"2024-01-02 03:04:05.120", b"2024-01-02 03:04:05",
         b"-838:59:59.000000", b"a,c", b"1.1", b"0000-00-00", b"\x01\x00", b"x"),
        tuple([b"7"] + [None] * (len(cols) - 1)),
    ]
    for d, t, ts in [(b"0.000001", b"2024-02-29 00:00:00", b"2024-01-02 03:04:05.5"),
                     (b"0.0000001", b"2024-01-02 03:04:05.000000", b"0000-00-00 00:00:00"),
                     (b"-0.00", b"0999-01-01 00:00:00", b"2038-01-19 03:14:07.999999"),
                     (b"123.450", b"2024-00-10 00:00:00", b"1970-01-01 00:00:01"),
                     (b"99999999999999999999999999999999999.999999999999999999999999999999",
                      b"2024-04-31 10:00:00", b"2024-12-28 23:59:59.000100")]:
        changed = list(rows[0])
        changed[3], changed[7], changed[8] = d, t, ts
        rows.append(tuple(changed))
    write = json_row_writer(spec)

    def as_json(col: ColumnSpec, text: bytes) -> object:
        """What converting and dumping writes, temporals with the digits the text has
        (the column's precision)."""
        value, digits = converter(col)(text), len(text.partition(b".")[2])
        if isinstance(value, datetime):
            return datetime_text(value, digits)
        if isinstance(value, timedelta):
            return time_text(value, digits)
        return jsonable(value)

    for row in rows:
        expected = json.dumps({c.name: None if v is None else as_json(c, v)
                               for c, v in zip(cols, row, strict=True)},
                              ensure_ascii=False, separators=(",", ":"))
        assert write(row) == expected
        assert json.loads(write(row))["i"] == int(row[0] or b"0")


def test_a_mysql_json_column_is_written_as_its_document() -> None:
    """A snapshot row's JSON column (MySQL's JSON type) goes out nested, as a change's
    image writes the document the log's binary JSON decodes to (not as a string of its
    text): a mirror of snapshot rows and changes holds one form."""
    spec = TableSpec("s", "t", (ColumnSpec("i", "int", False), ColumnSpec("j", "json", False)),
                     ("i",), True)
    write = json_row_writer(spec)
    text = '{"n": 1, "t": ["x", "🙂", null], "o": {"f": 0.5, "ok": true}}'
    assert json.loads(write((b"1", text.encode()))) == {"i": 1, "j": json.loads(text)}
    assert write((b"2", text.encode())) == json.dumps(
        {"i": 2, "j": json.loads(text)}, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(write((b"3", b"null"))) == {"i": 3, "j": None}
    assert json.loads(write((b"4", None))) == {"i": 4, "j": None}


def test_snapshot_rows_and_changes_print_temporals_alike() -> None:
    """A snapshot's JSON writer (from the server's text) and the change path's (from the
    binlog's binary values, decoded with the column's metadata) give the same text for
    DATETIME(3), TIMESTAMP(3), TIME(2) and DATE values: whole seconds, zero and impossible
    dates, negative times."""
    dev_dependency("pyarrow")
    from relay.binlog import values as V
    from relay.binlog.describe import ColumnDescription, table_map
    from relay.binlog.jsonwriter import json_writer
    from relay.binlog.rowcodec import RowImage

    def col(name: str, kind: str, fsp: int | None) -> ColumnDescription:
        return ColumnDescription(name, kind, kind if fsp is None else f"{kind}({fsp})", True,
                                 None, None, fsp, None, None)

    table = table_map("s", "t", [col("d3", "datetime", 3), col("ts3", "timestamp", 3),
                                 col("t2", "time", 2), col("dt", "date", None)], [])
    spec = TableSpec("s", "t", (ColumnSpec("d3", "datetime", False, 3),
                                ColumnSpec("ts3", "timestamp", False, 3),
                                ColumnSpec("t2", "time", False, 2),
                                ColumnSpec("dt", "date", False, 0)), ("d3",), True)
    rows = [(b"2024-01-02 03:04:05.000", b"2024-01-02 03:04:05.120", b"-838:59:59.00",
             b"2024-01-02"),
            (b"0000-00-00 00:00:00.000", b"0000-00-00 00:00:00.000", b"00:00:00.50",
             b"0000-00-00"),
            (b"2024-02-30 10:00:00.001", b"2038-01-19 03:14:07.999", b"-00:00:01.00",
             b"2024-00-10")]
    snapshot = json_row_writer(spec)
    row_type = type("Row", (RowImage,), {"__slots__": (), "columns": table.names})
    change = json_writer(table, table.names)
    for row in rows:
        # What the binlog holds for these values, decoded as the row codec decodes it.
        d3 = V.datetime2_value(V.encode_datetime2(converter(spec.columns[0])(row[0]), 3), 0, 3)
        ts3 = V.timestamp2_value(V.encode_timestamp2(converter(spec.columns[1])(row[1]), 3),
                                 0, 3)
        t2 = V.time2_value(V.encode_time2(converter(spec.columns[2])(row[2]), 2), 0, 2)
        dt = V.date_value(V.encode_date(converter(spec.columns[3])(row[3])), 0)
        assert snapshot(row) == change(row_type((d3, ts3, t2, dt))), row



def test_a_task_reads_a_run_of_one_tables_chunks() -> None:
    """Chunks become tasks of about maxRowsPerPartition rows (or numPartitions tasks),
    never mixing tables, in the plan's order."""
    from relay.tap.spark import TapOptions, snapshot_partitions

    specs = [TableSpec("s", name, (ColumnSpec("i", "int", False),), ("i",), True)
             for name in ("a", "b")]
    chunks = [Chunk(i, 0 if i < 7 else 1, None, None) for i in range(10)]

    def tasks(**options: str) -> list[list[tuple[str, int]]]:
        o = TapOptions({"endpoint": "h:1", "tables": "s.%", "snapshot": "initial",
                        "snapshotChunkRows": "100", **options})
        return [[(p.spec.table, c.index) for c in p.chunks]
                for p in snapshot_partitions(chunks, specs, None, "e", o, None)]

    assert tasks(maxRowsPerPartition="300") == [
        [("a", 0), ("a", 1), ("a", 2)], [("a", 3), ("a", 4), ("a", 5)], [("a", 6)],
        [("b", 7), ("b", 8), ("b", 9)]]
    assert tasks(maxRowsPerPartition="50") == [[("a" if i < 7 else "b", i)]
                                               for i in range(10)]
    assert tasks(numPartitions="2") == [[("a", i) for i in range(5)],
                                        [("a", 5), ("a", 6)],
                                        [("b", 7), ("b", 8), ("b", 9)]]
    assert tasks() == [[("a", i) for i in range(7)], [("b", 7), ("b", 8), ("b", 9)]]
