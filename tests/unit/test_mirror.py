"""relay.tap.mirror without Spark: the names, the layout and the merge into a real Delta
table (delta-rs), fed the Arrow rows the Spark side hands it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from relay.tap.evolution import SchemaEvolution
from relay.tap.mirror import (
    BatchReport,
    MirrorError,
    MirrorJob,
    MirrorSettings,
    TableMirror,
    Trigger,
    TriggerMode,
    bucket_count,
    check_checkpoint,
    check_table,
    clear_torn_start,
    ensure_history,
    ensure_table,
    follow_columns,
    history_schema,
    merge_history,
    merge_rows,
    restart_delay,
    schema_change_of,
    transactions_behind,
)
from relay.tap.snapshot import ColumnSpec, TableSpec

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string()),
                    pa.field("_position", pa.int64(), nullable=False),
                    pa.field("_change", pa.int32(), nullable=False),
                    pa.field("_bucket", pa.int32(), nullable=False)])


def _mirror(tmp_path: Path, buckets: int = 4, schema: pa.Schema = SCHEMA) -> TableMirror:
    if buckets == 1:
        schema = schema.remove(schema.get_field_index("_bucket"))
    return TableMirror(table="shop.t", keys=("id",), path=str(tmp_path / "t"),
                       checkpoint=str(tmp_path / "ck"), name="m:shop.t", buckets=buckets,
                       schema=schema, evolution=SchemaEvolution.FAIL)


def _rows(records: Sequence[tuple[int, str | None, int, int, str]], buckets: int = 4) -> pa.Table:
    """(id, v, position, change, op) records as the Spark side reduces them."""
    data: dict[str, Any] = {
        "id": [r[0] for r in records], "v": [r[1] for r in records],
        "_position": [r[2] for r in records], "_change": [r[3] for r in records]}
    if buckets > 1:
        data["_bucket"] = pa.array([r[0] % buckets for r in records], pa.int32())
    data["_op"] = [r[4] for r in records]
    return pa.table(data)


def _merge(m: TableMirror, records: Sequence[tuple[int, str | None, int, int, str]], batch: int,
           reset: int | None = None) -> BatchReport:
    report = BatchReport(m.table, batch)
    merge_rows(m, _rows(records, m.buckets), batch, reset, report)
    return report


def _table(m: TableMirror) -> dict[int, tuple[str | None, int, int]]:
    return {r["id"]: (r["v"], r["_position"], r["_change"])
            for r in DeltaTable(m.path).to_pyarrow_table().to_pylist()}


def test_the_merge_keeps_the_newest_record_of_each_key(tmp_path: Path) -> None:
    m = _mirror(tmp_path)
    ensure_table(m)
    _merge(m, [(i, f"s{i}", 100, 2**31 - 1, "upsert") for i in range(40)], 0)
    report = _merge(m, [(1, "new", 200, 0, "upsert"), (2, None, 200, 1, "delete"),
                        (3, "older", 50, 0, "upsert"),    # older than the snapshot's row
                        (99, "ins", 210, 0, "upsert")], 1)
    rows = _table(m)
    assert rows[1] == ("new", 200, 0) and 2 not in rows and rows[3] == ("s3", 100, 2**31 - 1)
    assert rows[99] == ("ins", 210, 0) and len(rows) == 40
    assert (report.upserts, report.deletes) == (3, 1)
    assert DeltaTable(m.path).transaction_version(m.app_id) == 1
    # A delete older than the row it names leaves the row.
    _merge(m, [(1, None, 150, 0, "delete")], 2)
    assert _table(m)[1] == ("new", 200, 0)


def test_a_batch_merged_again_changes_nothing(tmp_path: Path) -> None:
    m = _mirror(tmp_path)
    ensure_table(m)
    batch = [(1, "a", 10, 0, "upsert"), (2, "b", 10, 1, "upsert")]
    _merge(m, batch, 0)
    before = _table(m)
    _merge(m, [(2, None, 10, 1, "delete"), (1, "a", 10, 0, "upsert")], 0)  # same positions
    assert _table(m) == before


def test_a_snapshot_end_removes_the_rows_it_did_not_find(tmp_path: Path) -> None:
    m = _mirror(tmp_path, buckets=1)
    ensure_table(m)
    _merge(m, [(i, "old", 10, 0, "upsert") for i in range(5)], 0)
    # A new snapshot from position 100 found rows 0 and 1 (position 100 on), not 2 to 4.
    _merge(m, [(0, "snap", 100, 2**31 - 1, "upsert"), (1, "snap", 101, 2**31 - 1, "upsert")],
           1)
    _merge(m, [], 2, reset=100)
    assert _table(m) == {0: ("snap", 100, 2**31 - 1), 1: ("snap", 101, 2**31 - 1)}
    assert DeltaTable(m.path).transaction_version(m.app_id) == 2


def test_a_merge_rewrites_only_the_buckets_of_its_keys(tmp_path: Path) -> None:
    m = _mirror(tmp_path, buckets=8)
    ensure_table(m)
    _merge(m, [(i, "x", 1, 0, "upsert") for i in range(8000)], 0)
    report = _merge(m, [(8, "y", 2, 0, "upsert"), (16, None, 2, 1, "delete")], 1)  # bucket 0
    assert report.files_rewritten == 1
    assert report.rewritten == 1000 - 2      # the rest of bucket 0, not of the table
    unbucketed = _mirror(tmp_path / "one", buckets=1)
    ensure_table(unbucketed)
    _merge(unbucketed, [(i, "x", 1, 0, "upsert") for i in range(8000)], 0)
    assert _merge(unbucketed, [(8, "y", 2, 0, "upsert")], 1).rewritten == 7999


def test_a_target_of_another_table_or_type_is_refused_by_name(tmp_path: Path) -> None:
    m = _mirror(tmp_path)
    ensure_table(m)
    config = DeltaTable(m.path).metadata().configuration
    assert config == {"relay.source": "shop.t", "relay.primaryKey": "id", "relay.buckets": "4",
                      "relay.mirrorKind": "current"}
    other = TableMirror(**{**m.__dict__, "table": "shop.u"})
    with pytest.raises(MirrorError, match=r"mirrors shop\.t by key id, not shop\.u"):
        ensure_table(other)
    changed = SCHEMA.set(1, pa.field("v", pa.int64()))
    with pytest.raises(MirrorError, match=r"shop\.t: column v is int64 at the source but "
                                          r"string in the Delta table"):
        ensure_table(TableMirror(**{**m.__dict__, "schema": changed}))
    added = SCHEMA.append(pa.field("w", pa.int32()))
    with pytest.raises(MirrorError, match=r"column w is at the source but not in the Delta "
                                          r"table.*add_columns"):
        ensure_table(TableMirror(**{**m.__dict__, "schema": added}))


NOT_NULL_V = SCHEMA.set(1, pa.field("v", pa.string(), nullable=False))


def test_a_column_dropped_while_merging_becomes_nullable(tmp_path: Path) -> None:
    """A NOT NULL column the source dropped mid-run (add_columns keeps it, NULL in later
    images): the merge makes the Delta column nullable, and deletes (key only) do not
    count as such rows."""
    m = _mirror(tmp_path, schema=NOT_NULL_V)
    ensure_table(m)
    _merge(m, [(1, "a", 10, 0, "upsert"), (2, "b", 10, 1, "upsert")], 0)
    assert not DeltaTable(m.path).schema().to_arrow().field("v").nullable
    _merge(m, [(2, None, 11, 0, "delete")], 1)      # a delete carries its key only
    assert not DeltaTable(m.path).schema().to_arrow().field("v").nullable
    _merge(m, [(3, None, 12, 0, "upsert"), (1, None, 12, 1, "upsert")], 2)
    assert DeltaTable(m.path).schema().to_arrow().field("v").nullable
    assert _table(m) == {1: (None, 12, 1), 3: (None, 12, 0)}


def test_a_column_added_at_the_source_is_added_before_the_merge(tmp_path: Path) -> None:
    """An added column becomes a nullable Delta column (NULL in the rows before); the
    other columns keep their NOT NULL."""
    m = _mirror(tmp_path, schema=NOT_NULL_V)
    ensure_table(m)
    _merge(m, [(1, "a", 10, 0, "upsert")], 0)
    wider = TableMirror(**{**m.__dict__, "schema": NOT_NULL_V.insert(
        2, pa.field("w", pa.int32(), nullable=False))})
    rows = _rows([(2, "b", 11, 0, "upsert")])
    rows = rows.add_column(2, "w", pa.array([7], pa.int32()))
    assert follow_columns(wider, DeltaTable(m.path), rows, "dropped") is True
    assert follow_columns(wider, DeltaTable(m.path), rows, "dropped") is False   # done
    merge_rows(wider, rows, 1, None, BatchReport(m.table, 1))
    schema = DeltaTable(m.path).schema().to_arrow()
    assert schema.field("w").nullable and not schema.field("v").nullable
    assert not schema.field("id").nullable
    got = {r["id"]: r["w"] for r in DeltaTable(m.path).to_pyarrow_table().to_pylist()}
    assert got == {1: None, 2: 7}
    # A column added and another dropped in one batch: two metadata commits on one table.
    wider2 = TableMirror(**{**wider.__dict__, "schema": wider.schema.insert(
        3, pa.field("x", pa.int32()))})
    both = _rows([(3, None, 12, 0, "upsert")]).add_column(2, "w", pa.array([1], pa.int32()))
    both = both.add_column(3, "x", pa.array([5], pa.int32()))
    merge_rows(wider2, both, 2, None, BatchReport(m.table, 2))
    schema = DeltaTable(m.path).schema().to_arrow()
    assert schema.field("x").nullable and schema.field("v").nullable
    got = {r["id"]: (r["v"], r["x"]) for r in DeltaTable(m.path).to_pyarrow_table().to_pylist()}
    assert got == {1: ("a", None), 2: ("b", None), 3: (None, 5)}


def test_a_target_column_the_plan_has_nullable_is_made_nullable(tmp_path: Path) -> None:
    """At start: the source dropped a NOT NULL column since the last run (the plan has it
    nullable); the Delta column is relaxed, a metadata change, and the rows are kept."""
    m = _mirror(tmp_path, schema=NOT_NULL_V)
    ensure_table(m)
    _merge(m, [(1, "a", 10, 0, "upsert")], 0)
    ensure_table(TableMirror(**{**m.__dict__, "schema": SCHEMA}))
    assert DeltaTable(m.path).schema().to_arrow().field("v").nullable
    assert _table(m) == {1: ("a", 10, 0)}


def test_schema_changes_are_told_apart_in_a_query_error() -> None:
    """The tap's error as Spark reports it (the Python traceback inside its text)."""
    def spark_error(line: str) -> str:
        return ("[STREAM_FAILED] Query [id = 1] terminated with exception: ...\n"
                "Traceback (most recent call last):\n  File \"x.py\", line 1\n" + line)
    added = spark_error("relay.tap.evolution.ColumnsAdded: shop.t changed its columns at "
                        "x (new columns w): restart the query")
    dropped = spark_error("relay.tap.evolution.SchemaChanged: shop.t changed its columns")
    assert schema_change_of(added) == "ColumnsAdded"
    assert schema_change_of(dropped) == "SchemaChanged"
    assert schema_change_of(spark_error("ValueError: no")) is None


def test_names_are_unique_per_target_unless_given() -> None:
    one = MirrorSettings("relay:4000", ("shop.t",), "/data/a", "/ck/a")
    two = MirrorSettings("relay:4000", ("shop.t",), "/data/b", "/ck/a")
    assert one.prefix != two.prefix and one.prefix.startswith("mirror-")
    assert MirrorSettings("relay:4000", ("shop.t",), "/data/a", "/ck", name="x").prefix == "x"
    options = one.reader_options("shop.t")
    assert options["table"] == "shop.t" and "tables" not in options
    assert options["schemaEvolution"] == "add_columns"   # the mirror's default
    assert MirrorSettings("e:1", ("shop.t",), "/d", "/c", options={
        "schemaEvolution": "fail"}).reader_options("shop.t")["schemaEvolution"] == "fail"
    assert MirrorSettings("e:1", ("shop.%",), "/d", "/c").reader_options("shop.%")[
        "tables"] == "shop.%"


def test_bucket_counts_grow_with_the_table() -> None:
    assert [bucket_count(n) for n in (0, 25_000, 25_001, 60_000, 300_000, 10**9)] == [
        1, 1, 2, 4, 16, 256]


def test_transactions_behind_counts_gtids() -> None:
    assert transactions_behind("0-1-10,1-1-5", "0-1-15,1-1-5,2-1-3") == 8
    assert transactions_behind("0-1-10", "0-1-10") == 0
    sid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    assert transactions_behind(f"{sid}:1-10", f"{sid}:1-25") == 15
    assert transactions_behind(None, None) is None


def test_a_failed_query_restarts_sooner_than_later() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4, 6, 20)] == [1, 2, 4, 8, 30, 30]
    assert MirrorSettings("e:1", ("shop.t",), "/d", "/c").restarts == 5


class _Query:
    """A streaming query's state as MirrorJob reads it (the policy's unit test: the job
    against real Spark is tests/integration/test_delta_mirror.py)."""

    def __init__(self, error: str | None = None, progress: dict[str, Any] | None = None
                 ) -> None:
        self.isActive = error is None
        self.error = error
        self.lastProgress = progress

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False


class _Job(MirrorJob):
    """MirrorJob whose queries start as `starts` says (a query, or an error raised)."""

    def __init__(self, tmp_path: Path, restarts: int, queries: list[Any]) -> None:
        super().__init__(None, MirrorSettings("e:1", ("shop.%",), "/d", "/c",
                                              restarts=restarts))
        self.mirrors = [_mirror(tmp_path / str(i)) for i in range(len(queries))]
        self.queries = queries
        self.starts: list[Any] = []

    def _start_query(self, m: TableMirror) -> Any:
        got = self.starts.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


def test_a_failed_query_starts_again_while_the_others_run_until_its_budget_is_spent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("relay.tap.mirror.time.monotonic", lambda: clock[0])
    other = _Query()
    job = _Job(tmp_path, 2, [_Query("java.net.ConnectException: refused"), other])
    assert job.restart_failed() == (True, False)          # due in 1 s; the other runs
    assert job.failures == {"shop.t": 1} and job.restarts == {}
    job.starts = [RuntimeError("the tap is unreachable")]
    clock[0] += 1
    assert job.restart_failed() == (True, False)          # the start failed: due in 2 s
    assert job.failures == {"shop.t": 2} and job.restarts == {}
    clock[0] += 1
    assert job.restart_failed() == (True, False)          # not due yet
    fresh = _Query()
    job.starts = [fresh]
    clock[0] += 1
    assert job.restart_failed() == (True, False) and job.queries[0] is fresh
    assert job.restarts == {"shop.t": 1}
    fresh.lastProgress = {"batchId": 3}                   # progress: counts from 0 again
    job.restart_failed()
    for _ in (1, 2):   # two failures in a row: restarted (the budget is 2)
        job.queries[0] = _Query("lost")
        assert job.restart_failed() == (True, False)
        clock[0] += 30
        job.starts = [_Query()]
        job.restart_failed()
    job.queries[0] = _Query("lost")   # the third in a row: the job stops
    assert job.restart_failed() == (True, True) and job.failed()
    assert job.failures == {"shop.t": 5} and job.restarts == {"shop.t": 3}


def test_a_job_of_one_table_runs_on_through_its_querys_restart(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               ) -> None:
    """The pass that starts the only query again says the job runs (it ended there, the
    restarted query running on unwatched: CI at d4de9e7)."""
    clock = [100.0]
    monkeypatch.setattr("relay.tap.mirror.time.monotonic", lambda: clock[0])
    job = _Job(tmp_path, 2, [_Query("lost")])
    assert job.restart_failed() == (True, False)
    clock[0] += 1
    job.starts = [_Query()]
    assert job.restart_failed() == (True, False)
    job.queries[0] = _Query("relay.tap.evolution.ColumnsAdded: shop.t (new columns w)")
    job.mirrors[0] = replace(job.mirrors[0], evolution=SchemaEvolution.ADD_COLUMNS)
    fresh = _Query()
    monkeypatch.setattr(job, "_restart_with_added_columns",
                        lambda i, m: job.queries.__setitem__(i, fresh))
    assert job.restart_failed() == (True, False) and job.queries[0] is fresh


def test_a_type_change_is_not_retried_and_a_stop_in_the_backoff_is_a_failure(
        tmp_path: Path) -> None:
    changed = "relay.tap.evolution.SchemaChanged: shop.t changed its columns"
    job = _Job(tmp_path, 5, [_Query(changed)])
    assert job.restart_failed() == (False, True) and job.failures == {}
    job = _Job(tmp_path, 5, [_Query("lost")])
    assert job.restart_failed() == (True, False)
    job.stop()   # in the backoff: the query is failed (run() exits 1)
    assert job.failed()


def test_triggers() -> None:
    assert Trigger.parse("available-now").mode is TriggerMode.AVAILABLE_NOW
    assert Trigger.parse("10 seconds") == Trigger(TriggerMode.INTERVAL, "10 seconds")
    assert Trigger.parse("5") == Trigger(TriggerMode.INTERVAL, "5 seconds")
    with pytest.raises(MirrorError, match="available-now or an interval"):
        Trigger.parse("often")


def test_a_torn_first_offset_is_cleared_and_a_written_one_kept(tmp_path: Path) -> None:
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir(parents=True)
    torn = [offsets / ".0.5a1b.tmp", offsets / "..0.5a1b.tmp.crc"]
    for f in torn:
        f.write_text("v1")
    clear_torn_start(str(tmp_path / "ck"))
    assert list(offsets.iterdir()) == []
    for f in [*torn, offsets / "0"]:   # with a written offset, a torn next one is Spark's
        f.write_text("v1")
    clear_torn_start(str(tmp_path / "ck"))
    assert len(list(offsets.iterdir())) == 3


SNAP = 2**31 - 1


def _history_batch(m: TableMirror, records: list[tuple[int, str | None, int, int, str]],
                   ) -> pa.Table:
    """(id, v, position, change, op) change records as the Spark side gives them: with
    the next and the previous change of the same key in the batch."""
    by_key: dict[int, list[tuple[int, str | None, int, int, str]]] = {}
    for r in sorted(records, key=lambda r: (r[0], r[2], r[3])):
        by_key.setdefault(r[0], []).append(r)
    cols: dict[str, list[Any]] = {n: [] for n in (
        "id", "v", "_valid_from_position", "_valid_from_change", "_valid_from_time",
        "_valid_to_position", "_valid_to_change", "_valid_to_time", "_prev_position",
        "_prev_change", "_bucket", "_op")}
    for key_records in by_key.values():
        for i, (k, v, pos, change, op) in enumerate(key_records):
            nxt = key_records[i + 1] if i + 1 < len(key_records) else None
            prev = key_records[i - 1] if i else None
            for name, value in (("id", k), ("v", v), ("_valid_from_position", pos),
                                ("_valid_from_change", change), ("_valid_from_time", None),
                                ("_valid_to_position", nxt and nxt[2]),
                                ("_valid_to_change", nxt and nxt[3]),
                                ("_valid_to_time", None), ("_prev_position", prev and prev[2]),
                                ("_prev_change", prev and prev[3]),
                                ("_bucket", k % m.buckets), ("_op", op)):
                cols[name].append(value)
    types = {n: history_schema(m).field(n).type for n in history_schema(m).names}
    return pa.table({n: pa.array(v, types.get(n, pa.int64() if n.startswith("_prev")
                                              else pa.string())) for n, v in cols.items()})


def _as_of(m: TableMirror, position: int) -> dict[int, str | None]:
    """The history table as of the transaction at `position`."""
    rows = DeltaTable(m.history_path).to_pyarrow_table().to_pylist()
    live = [r for r in rows if r["_valid_from_position"] <= position and (
        r["_valid_to_position"] is None or r["_valid_to_position"] > position)]
    assert len({r["id"] for r in live}) == len(live)   # one version per key at a time
    return {r["id"]: r["v"] for r in live}


def test_history_keeps_a_version_per_change_and_closes_it_at_the_next(tmp_path: Path) -> None:
    m = TableMirror(**{**_mirror(tmp_path).__dict__, "history": True})
    ensure_history(m)
    merge_history(m, _history_batch(m, [(i, "snap", 100, SNAP, "upsert") for i in (1, 2, 3)]),
                  0, None)
    merge_history(m, _history_batch(m, [
        (1, "older", 90, 0, "upsert"),         # the snapshot's row holds it already
        (1, "one", 110, 0, "upsert"), (2, None, 120, 1, "delete"),
        (4, "four", 130, 0, "upsert"), (4, "four'", 140, 0, "upsert")]), 1, None)
    assert _as_of(m, 105) == {1: "snap", 2: "snap", 3: "snap"}
    assert _as_of(m, 115) == {1: "one", 2: "snap", 3: "snap"}
    assert _as_of(m, 125) == {1: "one", 3: "snap"}
    assert _as_of(m, 135) == {1: "one", 3: "snap", 4: "four"}
    assert _as_of(m, 145) == {1: "one", 3: "snap", 4: "four'"}
    # A later batch closes what is open; a delete then an insert of a key reopens it.
    merge_history(m, _history_batch(m, [(4, None, 150, 0, "delete"),
                                        (4, "again", 160, 0, "upsert")]), 2, None)
    assert _as_of(m, 155) == {1: "one", 3: "snap"}
    assert _as_of(m, 165) == {1: "one", 3: "snap", 4: "again"}
    assert DeltaTable(m.history_path).transaction_version(m.history_app_id) == 2
    # A new snapshot from 200 found 1 only: the others' versions end at its start.
    merge_history(m, _history_batch(m, [(1, "one", 200, SNAP, "upsert")]), 3, None)
    merge_history(m, _history_batch(m, []), 4, 200)
    assert _as_of(m, 205) == {1: "one"}
    assert _as_of(m, 165) == {1: "one", 3: "snap", 4: "again"}
    assert len(DeltaTable(m.history_path).to_pyarrow_table()) == 8


def test_history_follows_a_column_dropped_while_merging(tmp_path: Path) -> None:
    """The history table's NOT NULL column gets NULL in the versions after a drop: it is
    made nullable, and the versions before keep their values."""
    m = TableMirror(**{**_mirror(tmp_path, schema=NOT_NULL_V).__dict__, "history": True})
    ensure_history(m)
    merge_history(m, _history_batch(m, [(1, "a", 100, 0, "upsert")]), 0, None)
    assert not DeltaTable(m.history_path).schema().to_arrow().field("v").nullable
    merge_history(m, _history_batch(m, [(1, None, 110, 0, "upsert")]), 1, None)
    assert DeltaTable(m.history_path).schema().to_arrow().field("v").nullable
    assert (_as_of(m, 105), _as_of(m, 115)) == ({1: "a"}, {1: None})


def test_a_target_column_the_source_no_longer_has_is_made_nullable(tmp_path: Path) -> None:
    """At start, a NOT NULL Delta column the plan does not have (its table map is gone
    from the relay's log, or schemaEvolution is not add_columns) is relaxed too."""
    m = _mirror(tmp_path, schema=NOT_NULL_V)
    ensure_table(m)
    without_v = NOT_NULL_V.remove(NOT_NULL_V.get_field_index("v"))
    ensure_table(TableMirror(**{**m.__dict__, "schema": without_v}))
    schema = DeltaTable(m.path).schema().to_arrow()
    assert schema.field("v").nullable and not schema.field("id").nullable
    assert not schema.field("_position").nullable


def test_a_checkpoint_behind_its_target_is_refused(tmp_path: Path) -> None:
    m = _mirror(tmp_path)
    ensure_table(m)
    offsets = Path(m.checkpoint) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1")
    (offsets / "1").write_text("v1")
    _merge(m, [(1, "a", 10, 0, "upsert")], 1)
    check_checkpoint(m)                       # the table holds batch 1 of 0..1: fine
    _merge(m, [(1, "b", 20, 0, "upsert")], 5)
    with pytest.raises(MirrorError, match=r"holds batch 5 .* planned up to 1: a restored"):
        check_checkpoint(m)
    with_history = TableMirror(**{**m.__dict__, "history": True})
    ensure_history(with_history)
    (offsets / "5").write_text("v1")
    with pytest.raises(MirrorError, match=r"history .* is behind the mirror"):
        check_checkpoint(with_history)


def test_tables_a_mirror_would_get_wrong_are_refused() -> None:
    def spec(keys: tuple[str, ...], columns: tuple[str, ...], unique: bool = True,
             name: str = "t") -> TableSpec:
        return TableSpec("shop", name, tuple(ColumnSpec(c, "int", False) for c in columns),
                         keys, unique)
    check_table(spec(("id",), ("id", "v")))
    with pytest.raises(MirrorError, match="not a primary or NOT NULL unique key"):
        check_table(spec(("v",), ("id", "v"), unique=False))
    with pytest.raises(MirrorError, match="column position has a name the mirror uses"):
        check_table(spec(("id", "position"), ("id", "position")))
    with pytest.raises(MirrorError, match="column _bucket has a name"):
        check_table(spec(("id",), ("id", "_bucket")))
    with pytest.raises(MirrorError, match="cannot make a directory of"):
        check_table(spec(("id",), ("id",), name="a/b"))
