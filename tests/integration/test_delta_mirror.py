"""`relay mirror`: typed Delta tables kept equal to a real primary's tables through real
Spark and delta-rs, with the driver killed (SIGKILL) inside a snapshot batch after one
was committed (and a column added while it is down), and stopped (SIGTERM) in the stream,
while a writer changes rows; a relay restarted under a running job."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pymysql
import pytest

from relay.tap.client import TapClient
from relay.tap.mirror import MirrorJob, MirrorSettings, Trigger
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, wait_until
from tests.integration import workload
from tests.integration.spark_jvm import java_options, warm_up

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSWORD = "mirror-pw"
TOP = 2 ** 64 - 1
ROWS = 10_000
TABLES = {"big": ("id",), "pairs": ("a", "b"), "still": ("k",)}


@pytest.fixture(scope="module", autouse=True)
def _jvm_archive() -> None:
    warm_up()


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(base_dir=str(tmp_path_factory.mktemp("mirror-primary")))
    server.start()
    server.execute_many([
        f"GRANT SELECT ON *.* TO '{server.repl_user}'@'%'",
        "CREATE DATABASE mir",
        "CREATE TABLE mir.big (id BIGINT UNSIGNED PRIMARY KEY, qty INT NOT NULL, "
        "price DECIMAL(12,2), wide DECIMAL(65,30), at DATETIME(3), "
        "note VARCHAR(40) CHARACTER SET utf8mb4, kind ENUM('a','b','c'), doc JSON, "
        "raw VARBINARY(8))",
        "INSERT INTO mir.big SELECT IF(seq % 3, 18446744073709551615 - seq * 7, seq), "
        "seq % 97, -seq / 7, seq / 3, TIMESTAMPADD(MICROSECOND, seq * 1000, "
        "'2025-06-25 09:00:40'), CONCAT('n', seq, IF(seq % 5, '', ' \U0001F600')), "
        "ELT(1 + seq % 3, 'a', 'b', 'c'), IF(seq % 4, JSON_OBJECT('n', seq), NULL), "
        f"UNHEX(HEX(seq)) FROM mir.seq_1_to_{ROWS}",
        "CREATE TABLE mir.pairs (a INT, b VARCHAR(200) COLLATE utf8mb4_bin, v INT NOT NULL, "
        "PRIMARY KEY (a, b))",
        "INSERT INTO mir.pairs SELECT seq % 50, CONCAT('k', seq), seq FROM mir.seq_1_to_3000",
        "CREATE TABLE mir.still (k SMALLINT UNSIGNED PRIMARY KEY, d DATE NOT NULL, f FLOAT, "
        "y YEAR, t TIMESTAMP(6) NULL, c CHAR(3) CHARACTER SET latin1)",
        "INSERT INTO mir.still SELECT seq, '2024-02-29' + INTERVAL seq DAY, seq / 8, "
        "1990 + seq, FROM_UNIXTIME(1700000000 + seq), 'abc' FROM mir.seq_1_to_40",
    ])
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def relay_process(primary: MariaDB, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[RelayProcess]:
    port = free_port()
    proc = RelayProcess(str(tmp_path_factory.mktemp("mirror-relay")), primary.url,
                        {"tap": {"listen": f"127.0.0.1:{port}"}},
                        f'[[tap.users]]\nname = "spark"\npassword = "{PASSWORD}"\n')
    proc.start()
    _wait_for_tap(f"127.0.0.1:{port}")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def relay(relay_process: RelayProcess) -> str:
    return str(relay_process.settings["tap"]["listen"])


def _wait_for_tap(endpoint: str) -> None:
    def up() -> bool:
        try:
            with TapClient(endpoint, "spark", PASSWORD, timeout=5):
                return True
        except Exception:
            return False
    wait_until(up, 60, "the tap to listen")


def _connect(primary: MariaDB, **kw: Any) -> Any:
    return pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                           unix_socket=primary.socket_path, autocommit=True, **kw)


class Writer(workload.Writer):
    """Updates, deletes and inserts in mir.big and mir.pairs (mir.still is left alone)."""

    def step(self, cur: Any, rnd: random.Random) -> None:
        seq = 1 + rnd.randrange(ROWS)
        key = TOP - seq * 7 if seq % 3 else seq
        kind = rnd.randrange(5)
        if kind == 0:
            cur.execute("DELETE FROM mir.big WHERE id = %s", (key,))
        elif kind == 1:
            cur.execute("INSERT IGNORE INTO mir.big VALUES (%s, -1, -0.5, "
                        "-1.000000000000000000000000000001, NOW(3), 'new \u00e9', 'c', "
                        "'[1, 2]', NULL)", (TOP - rnd.randrange(ROWS * 7),))
        elif kind == 2:
            cur.execute("UPDATE mir.pairs SET v = v + 1, b = CONCAT(b, 'u') WHERE a = %s AND "
                        "b LIKE %s", (rnd.randrange(50), f"k{rnd.randrange(30)}%"))
        else:
            cur.execute("UPDATE mir.big SET qty = qty + 1, note = CONCAT('u', note), "
                        "doc = NULL WHERE id = %s", (key,))


def _env(primary: MariaDB) -> dict[str, str]:
    """A mirror job's environment: the passwords, no Spark UI, this tree."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               RELAY_TAP_PASSWORD=PASSWORD, SNAPSHOT_PASSWORD=primary.repl_password,
               PYSPARK_SUBMIT_ARGS=f"--conf spark.ui.enabled=false --driver-java-options "
                                   f"'{java_options()}' pyspark-shell")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _job(relay: str, primary: MariaDB, target: str, ck: str, log: str,
         trigger: str) -> subprocess.Popen[bytes]:
    env = _env(primary)
    cmd = [sys.executable, "-m", "relay.cli", "mirror", "--endpoint", relay, "--user", "spark",
           "--tables", "mir.big,mir.pairs", "--tables", "mir.st%", "--target", target,
           "--checkpoint", ck, "--source", f"mysql://{primary.repl_user}@127.0.0.1:"
           f"{primary.port}", "--chunk-rows", "4000", "--chunks-per-batch", "1",
           "--trigger", trigger, "--master", "local[2]", "--buckets", "8", "--history",
           "--progress-every", "5"]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _batches(ck: str, table: str) -> list[dict[str, Any]]:
    """The offsets Spark logged for the table's query, one per planned batch."""
    d = os.path.join(ck, f"mir.{table}", "offsets")
    if not os.path.isdir(d):
        return []
    out = []
    for name in sorted((n for n in os.listdir(d) if n.isdigit()), key=int):
        with open(os.path.join(d, name)) as f:
            out.append(json.loads(f.read().splitlines()[-1]))
    return out


def _in_snapshot(offset: dict[str, Any]) -> bool:
    snap = offset.get("snapshot")
    return isinstance(snap, dict) and (int(snap["next"]) < int(snap["chunks"])
                                       or snap.get("ended") is False)


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-4000:]


def _same(got: Any, want: Any) -> bool:
    """A Delta value against PyMySQL's: BIGINT UNSIGNED is DECIMAL(20,0), DECIMALs wider
    than 38 digits are text, YEAR a number."""
    if isinstance(want, Decimal) or (isinstance(got, Decimal) and isinstance(want, int)):
        return got is not None and Decimal(got) == Decimal(want)
    if isinstance(want, datetime) and got is not None and got.tzinfo is not None:
        return bool(got.astimezone(UTC).replace(tzinfo=None) == want)  # TIMESTAMP, in UTC
    if isinstance(want, float):
        return got is not None and abs(got - want) <= abs(want) * 1e-6
    return bool(got == want)


def _select(primary: MariaDB, table: str) -> tuple[list[dict[str, Any]], list[str]]:
    conn = _connect(primary, cursorclass=pymysql.cursors.DictCursor,
                    init_command="SET time_zone = '+00:00'")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            return list(cur.fetchall()), [d[0] for d in cur.description]
    finally:
        conn.close()


def _assert_equal(table: str, keys: tuple[str, ...], rows: list[dict[str, Any]],
                  expected: list[dict[str, Any]]) -> None:
    """Delta rows against the primary's, value for value."""
    mirror = {tuple(str(r[k]) for k in keys): r for r in rows}
    want_keys = {tuple(str(r[k]) for k in keys) for r in expected}
    assert len(mirror) == len(rows), table
    assert (sorted(want_keys - mirror.keys())[:5], sorted(mirror.keys() - want_keys)[:5]) == (
        [], []), table
    for want in expected:
        got = mirror[tuple(str(want[k]) for k in keys)]
        for name, value in want.items():
            if name == "kind":  # an ENUM: its member's name
                assert got[name] == value
            elif name == "y":   # YEAR: a SMALLINT
                assert got[name] == int(value)
            elif name == "doc" and value is not None:   # JSON: its text
                assert got[name].replace(" ", "") == value.replace(" ", "")
            else:
                assert _same(got[name], value), (table, name, got[name], value)


def _assert_mirrors(primary: MariaDB, target: str) -> None:
    from deltalake import DeltaTable

    for table, keys in TABLES.items():
        dt = DeltaTable(os.path.join(target, f"mir.{table}"))
        config = dt.metadata().configuration
        assert config["relay.source"] == f"mir.{table}"
        assert config["relay.primaryKey"] == ",".join(keys)
        expected, names = _select(primary, f"mir.{table}")
        # the source's columns in its order, then the ordering columns
        assert [f for f in dt.schema().to_arrow().names if not f.startswith("_")] == names
        _assert_equal(table, keys, dt.to_pyarrow_table().to_pylist(), expected)


def _history_as_of(target: str, table: str, position: int) -> list[dict[str, Any]]:
    """The history table's versions valid at the relay log position `position`: a
    change's position is where its transaction ends, so the state after the transaction
    ending at p holds the versions from <= p < to."""
    from deltalake import DeltaTable

    rows = DeltaTable(os.path.join(target, f"mir.{table}__history")).to_pyarrow_table()
    return [r for r in rows.to_pylist() if r["_valid_from_position"] <= position and (
        r["_valid_to_position"] is None or r["_valid_to_position"] > position)]


def _types(target: str, table: str) -> dict[str, tuple[str, bool]]:
    import pyarrow as pa
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(os.path.join(target, f"mir.{table}")).schema().to_arrow())
    return {name: (str(schema.field(name).type), schema.field(name).nullable)
            for name in schema.names}


def test_mirror_survives_kills_and_a_stop_and_equals_the_primary(
        primary: MariaDB, relay: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    target, ck, log = (str(tmp_path / n) for n in ("delta", "ck", "job.log"))
    with Writer(primary) as writer:
        # SIGKILL as the snapshot's second batch begins: the first is committed (Spark
        # logs a batch's offsets once the one before has ended), the second is replayed.
        # (Each driver's start costs the suite some 40 s: one kill, not one per place.)
        job = _job(relay, primary, target, ck, log, trigger="1 second")
        wait_until(lambda: len(_batches(ck, "big")) >= 2 or job.poll() is not None, 240,
                   "the snapshot's second batch")
        assert job.poll() is None, _tail(log)
        assert _in_snapshot(_batches(ck, "big")[1])
        os.killpg(job.pid, signal.SIGKILL)   # the driver: Python and its JVM
        job.wait()
        # While no driver runs: a column added and the key's VARCHAR widened (the next
        # driver plans the table with them, and follows the rows before without).
        primary.execute_many(["ALTER TABLE mir.pairs ADD COLUMN x INT NULL, "
                              "MODIFY b VARCHAR(250) COLLATE utf8mb4_bin"])
        # The stream: SIGTERM stops the queries, the batch in flight is abandoned, the
        # job ends cleanly.
        seen = len(_batches(ck, "big"))
        job = _job(relay, primary, target, ck, log, trigger="1 second")
        wait_until(lambda: sum(not _in_snapshot(b) for b in _batches(ck, "big")[seen:]) >= 2
                   or job.poll() is not None, 300, "batches of the stream")
        # Copies of the tables at two GTIDs, for the history tables.
        copies = []
        for i in range(2):
            wrote = writer.done

            def wrote_more(wrote: int = wrote) -> bool:
                return writer.done >= wrote + 50
            wait_until(wrote_more, 60, "changes between the copies")
            with writer.paused():
                gtid = primary.gtid_binlog_pos()
                primary.execute_many(["CREATE DATABASE IF NOT EXISTS copies"] + [
                    f"CREATE TABLE copies.{t}_{i} AS SELECT * FROM mir.{t}"
                    for t in ("big", "pairs")])
            copies.append((gtid, i))
        assert job.poll() is None, _tail(log)
        stopping = os.path.getsize(log)
        job.send_signal(signal.SIGTERM)
        assert job.wait(120) == 0, _tail(log)
        with open(log, errors="replace") as f:   # no traceback through the mirror's code
            f.seek(stopping)
            assert "relay/tap/mirror.py" not in f.read()
        assert writer.done > 100
    # Catch up, then stop: in this process's session (a third driver's start would cost
    # the suite some 40 s), from the checkpoint the command's drivers left.
    spark = request.getfixturevalue("spark")   # (not before: its JVM would slow theirs)
    assert MirrorJob(spark, MirrorSettings(
        endpoint=relay, tables=("mir.big", "mir.pairs", "mir.st%"), target=target,
        checkpoint=ck, user="spark", options={"password": PASSWORD},
        source=primary.url, chunk_rows=4000, chunks_per_batch=1, buckets=8,
        history=True)).run() == 0
    _assert_mirrors(primary, target)
    # The history as of each copy's GTID equals the copy.
    with TapClient(relay, "spark", PASSWORD) as tap:
        for gtid, i in copies:
            at = tap.resolve(gtid)   # where the copy's state ends in the log
            for table in ("big", "pairs"):
                expected, _ = _select(primary, f"copies.{table}_{i}")
                _assert_equal(f"{table} at {gtid}", TABLES[table],
                              _history_as_of(target, table, at), expected)
    assert _types(target, "big") == {
        "id": ("decimal128(20, 0)", False), "qty": ("int32", False),
        "price": ("decimal128(12, 2)", True), "wide": ("string", True),
        "at": ("timestamp[us]", True), "note": ("string", True), "kind": ("string", True),
        "doc": ("string", True), "raw": ("binary", True),
        "__invalid_temporals": ("map<string, string>", True),
        "_position": ("int64", False), "_change": ("int32", False),
        "_bucket": ("int32", False)}
    assert _types(target, "pairs")["x"] == ("int32", True)   # added while killed
    assert _types(target, "still")["d"] == ("date32[day]", False)
    assert _types(target, "still")["t"][0] == "timestamp[us, tz=UTC]"


def _aborted(primary: MariaDB) -> dict[str, int]:
    return {str(name): int(str(value)) for name, value in
            primary.query("SHOW GLOBAL STATUS LIKE 'Aborted%'")}


@pytest.fixture(scope="module")
def spark(relay: str) -> Iterator[Any]:
    """A local Spark session in this process, for the runs no test kills (a job's start
    is then a query's, not a JVM's)."""
    saved = dict(os.environ)
    os.environ.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      PYSPARK_SUBMIT_ARGS=f"--conf spark.ui.enabled=false --driver-java-options "
                                          f"'{java_options()}' pyspark-shell")
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("relay-mirror-tests")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    os.environ.clear()
    os.environ.update(saved)


def _settings(primary: MariaDB, relay: str, table: str, target: str,
              **more: Any) -> MirrorSettings:
    return MirrorSettings(
        endpoint=relay, tables=(table,), target=target, checkpoint=target + "-ck",
        user="spark", options={"password": PASSWORD, **more.pop("options", {})},
        source=f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:"
               f"{primary.port}", **more)


def test_two_mirrors_of_a_table_are_two_subscribers_and_leave_no_aborted_connection(
        spark: Any, primary: MariaDB, relay: str, tmp_path: Any) -> None:
    """Two targets of mir.still: each its own snapshot and subscriber; the snapshots'
    logins leave no aborted connection on the primary (Aborted_connects_preauth counted
    each chunk's connection when PREFERRED TLS was tried first, then refused)."""
    from deltalake import DeltaTable

    before = _aborted(primary)
    targets = [str(tmp_path / t) for t in ("one", "two")]
    for target in targets:
        assert MirrorJob(spark, _settings(primary, relay, "mir.still", target,
                                          chunk_rows=10)).run() == 0
    expected, _ = _select(primary, "mir.still")
    for target in targets:
        _assert_equal("still", TABLES["still"], DeltaTable(
            os.path.join(target, "mir.still")).to_pyarrow_table().to_pylist(), expected)
    with TapClient(relay, "spark", PASSWORD) as tap:
        names = set(tap.status()["subscribers"])
    ours = {MirrorSettings(relay, ("mir.still",), t, "").prefix + ":mir.still"
            for t in targets}
    assert len(ours) == 2 and ours <= names, names
    assert _aborted(primary) == before


def test_columns_added_and_dropped_and_a_relay_restarted_while_it_runs(
        spark: Any, primary: MariaDB, relay: str, relay_process: RelayProcess,
        tmp_path: Any) -> None:
    """While the job runs: the relay stopped after the snapshot and started again (the
    table's query fails, and starts again from its checkpoint once the relay is back);
    then the mirror's default schemaEvolution (add_columns): an ALTER that adds a column
    and widens a VARCHAR (the table's query stops on the first row with the new column,
    and the job starts it again with it: the merge adds the Delta column, NULL in the rows
    before), then a dropped NOT NULL column (its Delta column becomes nullable, NULL in
    the rows changed after the drop)."""
    import threading

    from deltalake import DeltaTable

    target = str(tmp_path / "delta")
    path = os.path.join(target, "mir.pairs")
    _, columns = _select(primary, "mir.pairs")   # (x too, when the kill test ran before)
    # (restarts 1, 2, 4, 8, 16 s apart: the relay's start under the suite's load fits)
    job = MirrorJob(spark, _settings(primary, relay, "mir.pairs", target,
                                     trigger=Trigger.parse("1 second"), restarts=6))
    count = int(str(primary.query("SELECT COUNT(*) FROM mir.pairs")[0][0]))
    failed: list[BaseException] = []

    def rows() -> list[dict[str, Any]]:
        if not DeltaTable.is_deltatable(path):
            return []
        return list(DeltaTable(path).to_pyarrow_table().to_pylist())

    def alter() -> None:
        try:
            wait_until(lambda: len(rows()) == count, 120, "the snapshot")
            relay_process.stop()
            primary.execute_many(["UPDATE mir.pairs SET v = -v WHERE a = 3"])   # while down
            wait_until(lambda: job.failures.get("mir.pairs", 0) >= 1, 60,
                       "the query's failure")
            relay_process.start()
            _wait_for_tap(relay)
            wait_until(lambda: all(r["v"] < 0 for r in rows() if r["a"] == 3), 120,
                       "the changes made while the relay was down")
            primary.execute_many([
                "ALTER TABLE mir.pairs ADD COLUMN w INT NULL, MODIFY b VARCHAR(300) "
                "COLLATE utf8mb4_bin",
                "UPDATE mir.pairs SET w = v, b = CONCAT(b, '-wider-than-before') WHERE a < 5",
                "INSERT INTO mir.pairs (a, b, v, w) VALUES (99, 'after', 1, 2)"])
            wait_until(lambda: any(r["a"] == 99 and r.get("w") == 2 for r in rows()), 120,
                       "the added column in the Delta table")
            primary.execute_many(["ALTER TABLE mir.pairs DROP COLUMN v",
                                  "UPDATE mir.pairs SET w = -1 WHERE a = 7"])
            wait_until(lambda: any(r["a"] == 7 and r["w"] == -1 for r in rows()), 120,
                       "the changes after the drop in the Delta table")
        except BaseException as exc:
            failed.append(exc)
        finally:
            job.stop()

    thread = threading.Thread(target=alter)
    thread.start()
    try:
        assert job.run(progress_every=600) == 0
    finally:
        job.stop()
        thread.join(400)
    assert not failed, failed
    assert job.restarts["mir.pairs"] >= 1, job.failures
    dt = DeltaTable(path)
    schema = dt.schema().to_arrow()
    assert [n for n in schema.names if not n.startswith("_")] == [*columns, "w"]
    assert schema.field("v").nullable   # dropped at the source: NULL from then on
    got = dt.to_pyarrow_table().to_pylist()
    assert {r["v"] is None for r in got if r["a"] == 7} == {True}
    assert all(r["v"] is not None for r in got if r["a"] not in (7, 99))
    expected, _ = _select(primary, "mir.pairs")
    assert any(r["w"] is not None for r in expected) and any(r["w"] is None for r in expected)
    _assert_equal("pairs", TABLES["pairs"], got, expected)
