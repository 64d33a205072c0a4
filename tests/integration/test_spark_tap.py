"""The Spark data source against a relay mirroring a real primary, with real Spark:
typed images equal SELECT for every column type family and the JSON form round-trips;
a streaming query into Parquet killed with SIGKILL three times during a workload holds
every row change exactly once; a batch read equals the streaming output of the same
range; the same job on a standalone cluster (a master and two workers) gives the same
output as local[2].

The snapshot: tables with a BIGINT UNSIGNED key near 2^64, a composite key and a case-
and accent-insensitive VARCHAR key are snapshotted while a workload updates, deletes and
inserts rows in them (in the chunks being read too), then streamed; the records reduced
to the last per key (relay.tap.spark.latest_per_key) equal the primary's tables row for
row and value for value. A table without a key is refused with the way out, then taken
with snapshotKeyColumns."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from ipaddress import ip_address
from typing import Any

import pymysql
import pytest
from rich.console import Console

from relay.binlog.changes import RowsStatement
from relay.binlog.coltypes import ColumnType as CT
from relay.binlog.jsonvalue import datetime_text, image_jsonable, jsonable
from relay.binlog.plans import column_steps
from relay.binlog.tablemap import TableMap, TypeHints
from relay.binlog.values import Geometry
from relay.config import Source
from relay.sources import open_source
from relay.status_view import render
from relay.tap.arrow import arrow_schema
from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.tap.spark import decode_table, latest_per_key, register
from relay.tap.sparktypes import INVALID_TEMPORALS, spark_type
from relay.testing.certs import Certs
from relay.testing.mariadb import MariaDB, free_port
from relay.upstream.control import fetch_type_hints
from tests.conftest import RelayProcess, wait_until
from tests.integration import typed_tables as T
from tests.integration import workload
from tests.integration.spark_jvm import java_options, warm_up

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "spark_tap_to_parquet.py")
PASSWORD = "tap-pw"
TYPED = "tap_types"
FLOW = "flow"


@pytest.fixture(scope="module", autouse=True)
def _jvm_archive() -> None:
    """Start making the Spark JVMs' class archive while the servers start (spark_jvm.py)."""
    warm_up()


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(base_dir=str(tmp_path_factory.mktemp("spark-primary")))
    server.start()
    server.execute_many([f"GRANT SELECT ON *.* TO '{server.repl_user}'@'%'"])
    yield server
    server.cleanup()


@dataclass
class TapRelay:
    process: RelayProcess
    endpoint: str


@pytest.fixture(scope="module")
def relay(primary: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TapRelay]:
    port = free_port()
    proc = RelayProcess(str(tmp_path_factory.mktemp("spark-relay")), primary.url,
                        {"tap": {"listen": f"127.0.0.1:{port}"}},
                        f'[[tap.users]]\nname = "spark"\npassword = "{PASSWORD}"\n')
    proc.start()
    ep = f"127.0.0.1:{port}"
    wait_until(lambda: _tap_up(ep), 60, "the tap to listen")
    yield TapRelay(proc, ep)
    proc.stop()


def endpoint(relay: TapRelay) -> str:
    return relay.endpoint


def _tap_up(ep: str) -> bool:
    with contextlib.suppress(OSError, Exception), TapClient(ep, "spark", PASSWORD, timeout=5):
        return True
    return False


def wait_caught_up(relay: TapRelay, primary: MariaDB) -> None:
    def check() -> bool:
        with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
            return bool(tap.status()["gtid_state"] == primary.gtid_binlog_pos())
    wait_until(check, 90, "the tap to serve everything the primary wrote")


def spark_env() -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               RELAY_TAP_PASSWORD=PASSWORD,
               # drivers the tests start need no web UI (a second off each start)
               PYSPARK_SUBMIT_ARGS=f"--conf spark.ui.enabled=false --driver-java-options "
                                   f"'{java_options()}' pyspark-shell")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def to_arrow_schema(schema: Any, timezone: str) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

    return spark_to_arrow(schema, timezone=timezone, prefers_large_types=False)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    saved = dict(os.environ)  # restored after: the next module on this worker runs clean
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("relay-tap-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    os.environ.clear()
    os.environ.update(saved)


def reader(spark: Any, relay: TapRelay, **options: Any) -> Any:
    r = (spark.read.format("relay").option("endpoint", endpoint(relay))
         .option("user", "spark").option("password", PASSWORD))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


# --- typed images and the JSON form --------------------------------------------------------


def _hints(primary: MariaDB) -> dict[tuple[str, str, str], str]:
    return asyncio.run(fetch_type_hints(Source.parse(primary.url), timeout=10))


def _codec_form(col: Any, value: Any, table: TableMap) -> Any:
    """A typed Spark value back in the form the row codec decodes to."""
    if value is None:
        return None
    hint = (col.hint or "").split("(")[0]
    t = col.type
    if hint == "json" or t == CT.JSON:
        return json.loads(value)
    if hint == "uuid":
        return uuid.UUID(value)
    if hint in ("inet4", "inet6"):
        return ip_address(value)
    if t == CT.GEOMETRY:
        return Geometry(bytes(value[4:]), int.from_bytes(value[:4], "little"))
    if t in (CT.TIMESTAMP, CT.TIMESTAMP2):
        return value.astimezone(UTC)  # PySpark hands TIMESTAMPs out in local time
    if t in (CT.TIME, CT.TIME2):  # a day-time interval: a timedelta in PySpark
        assert isinstance(value, timedelta), value
        return value
    if t == CT.SET:
        return frozenset(value)
    if isinstance(value, Decimal) and (t == CT.BIT or t == CT.LONGLONG):
        return int(value)
    if t in (CT.DECIMAL, CT.NEWDECIMAL) and isinstance(value, str):
        return Decimal(value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


_TEMPORAL = {CT.DATE, CT.NEWDATE, CT.DATETIME, CT.DATETIME2, CT.TIMESTAMP, CT.TIMESTAMP2}


def _expected(table: TableMap, select_row: dict[str, Any]) -> dict[str, Any]:
    """What SELECT gave, with zero dates (text in pymysql) as the typed form's NULL."""
    out = dict(select_row)
    for col in table.columns:
        if col.type in _TEMPORAL and isinstance(out.get(col.name), str):
            out[col.name] = None
    return out


@pytest.fixture(scope="module")
def typed_workload(primary: MariaDB, relay: TapRelay) -> dict[str, Any]:
    snapshots = T.workload(primary, TYPED)
    wait_caught_up(relay, primary)
    return snapshots


def test_typed_images_equal_select(primary: MariaDB, relay: TapRelay,
                                   typed_workload: dict[str, Any], spark: Any,
                                   tmp_path: Any) -> None:
    # `spark` after the servers and the workload: its JVM waits for the class archive.
    hints = _hints(primary)
    types = ",".join(f"{s}.{t}.{c}={h}" for (s, t, c), h in hints.items() if s == TYPED)
    checked: Counter[str] = Counter()
    for spec in T.TABLES:
        name = f"{TYPED}.{spec.name}"
        with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
            table = decode_table(tap.schema(name), TypeHints.parse(types.split(",")))
        # COMMON's rows events cross the decode_columns kernel; the others' the row codec.
        assert (column_steps(table, [spark_type(c) for c in table.columns]) is not None) == \
            (spec is T.COMMON), name
        df = reader(spark, relay, table=name, types=types)
        names = df.schema["after"].dataType.fieldNames()
        assert names[:len(table.columns)] == [c.name for c in table.columns]
        assert names[len(table.columns):] in ([], [INVALID_TEMPORALS])
        # Executors' batches must be Spark's own Arrow form of the schema, to the detail.
        assert to_arrow_schema(df.schema, timezone="UTC") == arrow_schema("typed", table)
        rows = df.orderBy("position", "change").collect()
        # Into Parquet and back: the same types and every value exactly (DECIMAL(65,30)
        # as text, 2^64-1 as DECIMAL(20,0), TIME as an interval, zero dates beside).
        stored = str(tmp_path / spec.name)
        df.write.parquet(stored)
        back = spark.read.parquet(stored)
        assert [(f.name, f.dataType) for f in back.schema] == \
            [(f.name, f.dataType) for f in df.schema], name
        assert back.orderBy("position", "change").collect() == rows, name
        inserted, updated = typed_workload[spec.name]
        ops = [r.op for r in rows]
        n = len(spec.rows)
        assert ops == ["insert"] * n + ["update"] * n + ["delete"] * n, (name, ops)
        for r in rows:
            images = {}
            for side in ("before", "after"):
                img = getattr(r, side)
                images[side] = None if img is None else {
                    c.name: _codec_form(c, img[c.name], table) for c in table.columns}
            where = f"{name} {r.op} at {r.position}/{r.change}"
            if r.op == "insert":
                after = images["after"]
                assert after is not None and images["before"] is None
                T.compare_images(spec, after, _expected(table, inserted[after["id"]]), where)
                # Zero dates are NULL in their column and kept as text beside it.
                zero = {c.name: v for c in table.columns
                        if c.type in _TEMPORAL and isinstance(
                            v := inserted[after["id"]].get(c.name), str)}
                if INVALID_TEMPORALS in names:
                    assert dict(r.after[INVALID_TEMPORALS] or {}) == zero, where
                else:
                    assert not zero
            elif r.op == "update":
                before, after = images["before"], images["after"]
                assert before is not None and after is not None
                T.compare_images(spec, before, _expected(table, inserted[before["id"]]), where)
                T.compare_images(spec, after, _expected(table, updated[after["id"]]), where)
            else:
                before = images["before"]
                assert before is not None and images["after"] is None
                T.compare_images(spec, before, _expected(table, updated[before["id"]]), where)
            checked[r.op] += 1
    assert checked["insert"] == checked["update"] == checked["delete"] == \
        sum(len(t.rows) for t in T.TABLES)


def test_json_form_round_trips_and_batch_equals_stream(
        spark: Any, primary: MariaDB, relay: TapRelay, typed_workload: dict[str, Any],
        tmp_path: Any) -> None:
    hints = _hints(primary)
    types = ",".join(f"{s}.{t}.{c}={h}" for (s, t, c), h in hints.items() if s == TYPED)
    with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
        end = tap.resolve("latest")  # pinned: the batch and the stream read the same range
    from pyspark import StorageLevel

    # Read from the relay once: each table's look below, and the comparison with the
    # stream, filter this copy (kept on disk: the strs images hold 20 MB values).
    df = reader(spark, relay, tables=f"{TYPED}.%", types=types, end=str(end)).persist(
        StorageLevel.DISK_ONLY)
    assert to_arrow_schema(df.schema, timezone="UTC") == arrow_schema("json")
    maps = reader(spark, relay, tables=f"{TYPED}.ints", images="map", end=str(end))
    assert to_arrow_schema(maps.schema, timezone="UTC") == arrow_schema("map")
    assert maps.where("op = 'insert'").count() == len(T.INTS.rows)
    got = []
    for spec in T.TABLES:  # a table at a time: the strs images hold 20 MB values
        for name in (spec.name, f"{spec.name}_src"):
            part = df.where(df.table == name).orderBy("position", "change")
            got += [(r.position, r.change, r.op, r.table,
                     None if r.before is None else json.loads(r.before),
                     None if r.after is None else json.loads(r.after))
                    for r in part.toLocalIterator()]
    got.sort(key=lambda g: (g[0], g[1]))
    changes = [g[2:] for g in got]
    index = "file://" + os.path.join(primary.datadir, "mariadb-bin.index")
    want = []
    for tx in open_source(index, hints=TypeHints(hints)).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement) and st.table.schema == TYPED:
                for ch in st.changes():
                    want.append((ch.op, ch.table, _json(st.table, ch.before),
                                 _json(st.table, ch.after)))
    assert len(changes) == len(want) > 60
    assert changes == want
    # The same range as a stream (availableNow, a few rows a batch) into Parquet.
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    q = (spark.readStream.format("relay").option("endpoint", endpoint(relay))
         .option("user", "spark").option("passwordEnv", "RELAY_TAP_PASSWORD")
         .option("tables", f"{TYPED}.%").option("types", types)
         .option("maxRowsPerBatch", 40).load()
         .where(f"position <= {end}")
         .writeStream.format("parquet").option("checkpointLocation", ck)
         .trigger(availableNow=True).start(out))
    q.awaitTermination(300)
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) >= 3, batches  # the cap made several batches, and none was lost
    streamed = spark.read.parquet(out)
    assert streamed.count() == df.count() == len(want)
    try:
        assert streamed.exceptAll(df).count() == 0 and df.exceptAll(streamed).count() == 0
    finally:
        df.unpersist()


def _json(table: TableMap, image: Any) -> Any:
    return None if image is None else json.loads(json.dumps(
        image_jsonable(table, image), ensure_ascii=False))


# --- streaming through crashes, and a standalone cluster ------------------------------------


class Workload:
    """Transactions of 1-20 row changes into flow.t until stopped."""

    def __init__(self, primary: MariaDB) -> None:
        self.primary = primary
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self.transactions = 0

    def start(self) -> Workload:
        self.primary.execute_many([f"CREATE DATABASE {FLOW}", f"CREATE TABLE {FLOW}.t "
                                   "(id INT PRIMARY KEY, k INT, v VARCHAR(40))"])
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with contextlib.closing(T.connect(self.primary, FLOW)) as conn, \
                    conn.cursor() as cur:
                next_id = 1
                i = 0
                while not self.stop.is_set():
                    i += 1
                    n = i % 20 + 1
                    cur.execute("BEGIN")
                    cur.executemany("INSERT INTO t VALUES (%s, %s, %s)",
                                    [(next_id + j, j, f"v{next_id + j}") for j in range(n)])
                    if i % 3 == 0:
                        cur.execute("UPDATE t SET k = k + 1 WHERE id BETWEEN %s AND %s",
                                    (next_id - 30, next_id - 25))
                    if i % 5 == 0:
                        cur.execute("DELETE FROM t WHERE id BETWEEN %s AND %s",
                                    (next_id - 60, next_id - 58))
                    cur.execute("COMMIT")
                    next_id += n
                    self.transactions += 1
                    time.sleep(0.01)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error


def run_job(relay: TapRelay, out: str, ck: str, trigger: str, log: str,
            master: str = "local[2]", extra: list[str] | None = None,
            drain: bool = False) -> subprocess.Popen[bytes]:
    """The example streaming job: small batches of small partitions while it may be
    killed mid-stream; a drain takes bigger ones (each task costs Spark some 50 ms)."""
    rows, per_task = (20_000, 2_000) if drain else (400, 150)
    cmd = [sys.executable, EXAMPLE, "--endpoint", endpoint(relay), "--user", "spark",
           "--out", out, "--checkpoint", ck, "--tables", f"{FLOW}.%", "--trigger", trigger,
           "--max-rows-per-batch", str(rows), "--max-rows-per-partition", str(per_task),
           "--master", master, *(extra or [])]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=spark_env(),
                                start_new_session=True, cwd=ROOT)


def committed_batches(ck: str) -> int:
    commits = os.path.join(ck, "commits")
    return len([n for n in os.listdir(commits) if n.isdigit()]) if os.path.isdir(commits) else 0


def primary_keys(primary: MariaDB) -> Counter[tuple[str, int]]:
    """(op, id) of every row change of flow.t in the primary's own binlog."""
    index = "file://" + os.path.join(primary.datadir, "mariadb-bin.index")
    keys: Counter[tuple[str, int]] = Counter()
    for ch in open_source(index).changes():
        if ch.schema == FLOW:
            image = ch.after if ch.after is not None else ch.before
            assert image is not None
            keys[(ch.op, image.get("id"))] += 1
    return keys


def two_batches_or_exit(job: subprocess.Popen[bytes], ck: str) -> bool:
    """The streaming job committed two batches, or exited."""
    return committed_batches(ck) >= 2 or job.poll() is not None


@pytest.fixture(scope="module")
def streamed(primary: MariaDB, relay: TapRelay,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example job run against a live workload, SIGKILLed mid-stream and restarted
    from its checkpoint, then drained with availableNow. (One kill: each costs a driver's
    start, some 40 s of the suite.)"""
    work = str(tmp_path_factory.mktemp("stream"))
    out, ck, log = (os.path.join(work, n) for n in ("out", "ck", "job.log"))
    load = Workload(primary).start()
    try:
        job = run_job(relay, out, ck, "1 second", log)
        try:
            wait_until(functools.partial(two_batches_or_exit, job, ck), 240,
                       "the streaming job to commit batches")
            assert job.poll() is None, _tail(log)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)  # the driver and its JVM
            job.wait(30)
    finally:
        load.finish()
    wait_caught_up(relay, primary)
    job = run_job(relay, out, ck, "available-now", log, drain=True)
    assert job.wait(300) == 0, _tail(log)
    return {"out": out, "transactions": load.transactions, "log": log}


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-3000:]


def test_streaming_survives_kill9_exactly_once(spark: Any, primary: MariaDB,
                                               streamed: dict[str, Any]) -> None:
    assert streamed["transactions"] > 50
    df = spark.read.parquet(streamed["out"])  # through Spark: only committed batches count
    total = df.count()
    assert total == df.select("position", "change").distinct().count()
    keys = Counter((r.op, int(r.id)) for r in df.selectExpr(
        "op", "get_json_object(coalesce(after, before), '$.id') AS id").collect())
    expected = primary_keys(primary)
    assert total == sum(expected.values())
    assert keys == expected


def test_standalone_cluster_gives_the_same_output(spark: Any, relay: TapRelay,
                                                  streamed: dict[str, Any],
                                                  tmp_path: Any) -> None:
    from pyspark.find_spark_home import _find_spark_home

    spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = dict(spark_env(), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(tmp_path),
               SPARK_DAEMON_JAVA_OPTS=java_options())
    procs = []
    log = str(tmp_path / "cluster.log")
    with open(log, "ab") as f:
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        for i in range(2):
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(free_port()), "--work-dir", str(tmp_path / f"w{i}")],
                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    try:
        wait_until(lambda: _tail(log).count("Successfully registered with master") >= 2, 120,
                   "two workers to register with the master")
        out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
        job = run_job(relay, out, ck, "available-now", str(tmp_path / "job.log"),
                      master=master_url, drain=True,
                      extra=["--conf", f"spark.executor.extraJavaOptions={java_options()}",
                             "--conf", "spark.executor.memory=512m",
                             "--conf", "spark.executor.cores=1",
                             "--conf", "spark.driver.host=127.0.0.1",
                             "--conf", "spark.driver.bindAddress=127.0.0.1"])
        assert job.wait(300) == 0, _tail(str(tmp_path / "job.log"))
        # Both workers ran tasks: executors on each fetched from the tap themselves.
        assert "app-" in "".join(os.listdir(str(tmp_path / "w0"))) and \
            "app-" in "".join(os.listdir(str(tmp_path / "w1")))
        local = spark.read.parquet(streamed["out"])
        cluster = spark.read.parquet(out)
        assert cluster.count() == local.count() > 0
        assert cluster.exceptAll(local).count() == 0 and local.exceptAll(cluster).count() == 0
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


# --- the snapshot ---------------------------------------------------------------------------

TOP = (1 << 64) - 1
BIG_ROWS = 200_000
CI_VALUES = ["a", "A ", "b", "B", "ä", "Äb", "c", "Ç", "d  ", "e", "é", "E", "f", "ß",
             "ss", "z", "Z", "å", "ø", "O", "o", "ō", "x y", "x  y", "X Y", "ij", "İ"]
SNAP_TABLES = {"big": ["id"], "comp": ["a", "b"], "ci": ["k"]}


def _snap_source(primary: MariaDB) -> str:
    return f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:{primary.port}"


@pytest.fixture(scope="module")
def tables(primary: MariaDB) -> None:
    primary.execute_many([
        "CREATE DATABASE snap",
        "CREATE TABLE snap.big (id BIGINT UNSIGNED PRIMARY KEY, v INT, s VARCHAR(40), "
        "d DECIMAL(65,30), t DATETIME(6))",
        "CREATE TABLE snap.comp (a INT, b VARCHAR(200) COLLATE utf8mb4_bin, v INT, "
        "PRIMARY KEY (a, b))",
        "CREATE TABLE snap.ci (k VARCHAR(32) COLLATE utf8mb4_unicode_ci PRIMARY KEY, v INT)",
        "CREATE TABLE snap.nokey (a INT, b INT)",
    ])
    conn = _snap_connect(primary)
    with conn.cursor() as cur:
        rows = [(TOP - i * 7 if i % 3 else i, i, f"row {i}", f"{i}.{i:030d}",
                 f"2024-01-{1 + i % 28:02d} 00:00:{i % 60:02d}.{i % 1000:06d}")
                for i in range(BIG_ROWS)]
        cur.executemany("INSERT INTO snap.big VALUES (%s, %s, %s, %s, %s)", rows)
        cur.executemany("INSERT INTO snap.comp VALUES (%s, %s, %s)",
                        [(i % 50, f"k{i}", i) for i in range(3000)])
        for i, v in enumerate(CI_VALUES):
            cur.execute("INSERT IGNORE INTO snap.ci VALUES (%s, %s)", (v, i))
        cur.executemany("INSERT INTO snap.nokey VALUES (%s, %s)", [(i, i) for i in range(50)])
    conn.close()


def _snap_connect(primary: MariaDB) -> Any:
    return pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                           unix_socket=primary.socket_path, autocommit=True)


class SnapshotWorkload(workload.Writer):
    """Updates, deletes and inserts in the three tables until stopped."""

    seed = 7
    pause = 0.003  # at most 300 a second: two cores serve Spark too

    def step(self, cur: Any, rnd: random.Random) -> None:
        i = rnd.randrange(BIG_ROWS)
        big = TOP - i * 7 if i % 3 else i
        kind = rnd.randrange(6)
        if kind == 0:
            cur.execute("DELETE FROM snap.big WHERE id = %s", (big,))
        elif kind == 1:
            cur.execute("INSERT IGNORE INTO snap.big VALUES (%s, -1, 'new', 1.5, NOW(6))",
                        (TOP - rnd.randrange(BIG_ROWS * 7),))
        elif kind == 2:
            cur.execute("UPDATE snap.comp SET v = v + 1, b = CONCAT(b, 'u') WHERE a = %s AND "
                        "b LIKE %s", (rnd.randrange(50), f"k{rnd.randrange(30)}%"))
        elif kind == 3:
            v = rnd.choice(CI_VALUES)
            cur.execute("INSERT INTO snap.ci VALUES (%s, 0) ON DUPLICATE KEY UPDATE v = v + 1",
                        (v,))
            if rnd.random() < 0.3:
                cur.execute("DELETE FROM snap.ci WHERE k = %s", (rnd.choice(CI_VALUES),))
        else:
            cur.execute("UPDATE snap.big SET v = v + 1, s = CONCAT('u', s) WHERE id = %s",
                        (big,))


def _snap_expected(primary: MariaDB, table: str, keys: list[str] | None = None,
                   ) -> dict[tuple[str, ...], dict[str, Any]]:
    conn = pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                           unix_socket=primary.socket_path, cursorclass=pymysql.cursors.DictCursor)
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM snap.{table}")
        rows = cur.fetchall()
        fsp = {str(d[0]): int(d[5] or 0) for d in cur.description}  # fraction digits
    conn.close()
    out = {}
    for r in rows:
        image = {k: datetime_text(v, fsp[k]) if isinstance(v, datetime) else jsonable(v)
                 for k, v in r.items()}
        out[tuple(str(image[k]) for k in keys or SNAP_TABLES[table])] = image
    return out


def _snap_mirror(spark: Any, out: str, table: str, keys: list[str] | None = None,
                 ) -> dict[tuple[str, ...], dict[str, Any]]:
    keys = keys or SNAP_TABLES[table]
    changes = spark.read.parquet(out).where(f"`table` = '{table}'")
    latest = latest_per_key(changes, keys).where("op = 'upsert'").collect()
    mirror: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in latest:
        key = tuple(str(r[k]) for k in keys)
        assert key not in mirror
        mirror[key] = json.loads(r["image"])
    return mirror


def _snap_stream(spark: Any, relay: TapRelay, primary: MariaDB, out: str, ck: str,
                 **extra: Any) -> list[dict[str, Any]]:
    """An availableNow run of the snapshot query; the snapshot progress (chunks done and
    planned per table) its batches reported in the query's progress."""
    r = (spark.readStream.format("relay").option("endpoint", endpoint(relay))
         .option("user", "spark").option("password", PASSWORD)
         .option("tables", "snap.big,snap.comp,snap.ci")
         .option("snapshot", "initial").option("snapshotSource", _snap_source(primary))
         .option("snapshotChunkRows", 20_000).option("snapshotChunksPerBatch", 3)
         .option("snapshotChunksPerTable", 2).option("name", "snap-test"))
    for k, v in extra.items():
        r = r.option(k, v)
    q = (r.load().writeStream.format("parquet").option("checkpointLocation", ck)
         .trigger(availableNow=True).start(out))
    q.awaitTermination(600)
    assert q.exception() is None, q.exception()
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in q.recentProgress]
    return [e["snapshot"]["progress"] for e in ends if "progress" in e.get("snapshot", {})]


def test_no_key_is_refused_with_the_way_out(spark: Any, primary: MariaDB, relay: TapRelay,
                                            tables: None) -> None:
    def read(**extra: str) -> Any:
        r = (spark.read.format("relay").option("endpoint", endpoint(relay))
             .option("user", "spark").option("password", PASSWORD)
             .option("table", "snap.nokey").option("images", "json")
             .option("snapshot", "initial"))
        for k, v in extra.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match="snapshotKeyColumns"):
        read(snapshotSource=_snap_source(primary)).collect()
    # Without snapshotSource the reads go to the primary the relay follows.
    rows = read(snapshotKeyColumns="a,b", snapshotUser=primary.repl_user,
                snapshotPassword=primary.repl_password).where("op = 'snapshot'").collect()
    assert sorted(json.loads(r["after"])["a"] for r in rows) == list(range(50))


def test_typed_snapshot_of_a_table_the_log_never_saw(spark: Any, primary: MariaDB,
                                                     relay: TapRelay) -> None:
    """A table written before the relay's log began (here: with the binlog off) has no
    TABLE_MAP in the log: a typed read takes its schema from the primary and its rows
    from the snapshot, values exact (BIGINT UNSIGNED at 2^64-1, a signed TINYINT after a
    YEAR, DECIMAL(65,30), DATETIME(3) with zero milliseconds)."""
    conn = _snap_connect(primary)
    with conn.cursor() as cur:
        cur.execute("SET sql_log_bin = 0")
        cur.execute("CREATE DATABASE quiet")
        cur.execute("CREATE TABLE quiet.t (id BIGINT UNSIGNED PRIMARY KEY, y YEAR, "
                    "n TINYINT, d DECIMAL(65,30), ts DATETIME(3))")
        cur.execute("INSERT INTO quiet.t VALUES (18446744073709551615, 2024, -1, "
                    "'-12345678901234567890123456789012345.123456789012345678901234567890', "
                    "'2024-02-29 12:34:56.000'), (1, 1901, 127, 0, NULL)")
    conn.close()
    rows = (spark.read.format("relay").option("endpoint", endpoint(relay))
            .option("user", "spark").option("password", PASSWORD)
            .option("table", "quiet.t").option("snapshot", "initial")
            .option("snapshotUser", primary.repl_user)
            .option("snapshotPassword", primary.repl_password).load()
            .where("op = 'snapshot'").collect())
    got = {r["after"]["id"]: r["after"].asDict() for r in rows}
    assert got.keys() == {Decimal(2**64 - 1), Decimal(1)}
    top = got[Decimal(2**64 - 1)]
    assert (top["y"], top["n"]) == (2024, -1)
    assert str(top["d"]) == \
        "-12345678901234567890123456789012345.123456789012345678901234567890"
    assert top["ts"] == datetime(2024, 2, 29, 12, 34, 56)
    assert (got[Decimal(1)]["n"], got[Decimal(1)]["ts"]) == (127, None)


def test_alter_table_mid_stream_under_each_schema_evolution_mode(
        spark: Any, primary: MariaDB, relay: TapRelay) -> None:
    """A column added, one dropped, one made longer and one renamed between row changes:
    the default stops with the columns named, add_columns reads every row under the union
    of the table's versions, json keeps what does not fit in __rescued; each row carries
    the version of the table it was written under."""
    primary.execute_many([
        "CREATE DATABASE evo",
        "CREATE TABLE evo.t (id INT PRIMARY KEY, qty INT, note VARCHAR(10))",
        "INSERT INTO evo.t VALUES (1, 10, 'a')",
        "ALTER TABLE evo.t ADD COLUMN price DECIMAL(10,2)",
        "INSERT INTO evo.t VALUES (2, 20, 'b', 9.99)",
        "ALTER TABLE evo.t DROP COLUMN qty",
        "INSERT INTO evo.t VALUES (3, 'c', 1.50)",
        "ALTER TABLE evo.t MODIFY note VARCHAR(20)",
        "INSERT INTO evo.t VALUES (4, 'd', 2.00)",
        "ALTER TABLE evo.t RENAME COLUMN note TO label",
        "INSERT INTO evo.t VALUES (5, 'e', 3.00)",
    ])
    wait_caught_up(relay, primary)

    def read(**extra: str) -> list[Any]:
        return sorted(reader(spark, relay, table="evo.t", **extra).collect(),
                      key=lambda r: r["after"]["id"])

    with pytest.raises(Exception, match="changed its columns") as err:
        read()
    assert "qty" in str(err.value) and "schemaEvolution=add_columns" in str(err.value)
    rows = read(schemaEvolution="add_columns")  # a rename: the old name stays, NULL after
    assert [r["after"].asDict() for r in rows] == [
        {"id": 1, "label": None, "price": None, "qty": 10, "note": "a"},
        {"id": 2, "label": None, "price": Decimal("9.99"), "qty": 20, "note": "b"},
        {"id": 3, "label": None, "price": Decimal("1.50"), "qty": None, "note": "c"},
        {"id": 4, "label": None, "price": Decimal("2.00"), "qty": None, "note": "d"},
        {"id": 5, "label": "e", "price": Decimal("3.00"), "qty": None, "note": None}]
    assert len({r["schema_version"] for r in rows}) == 5
    rows = read(schemaEvolution="json")  # the table as it is now; the rest in __rescued
    assert [(r["after"]["label"], r["after"]["price"], r["after"]["__rescued"])
            for r in rows] == [
        (None, None, '{"note":"a","qty":10}'), (None, Decimal("9.99"), '{"note":"b","qty":20}'),
        (None, Decimal("1.50"), '{"note":"c"}'), (None, Decimal("2.00"), '{"note":"d"}'),
        ("e", Decimal("3.00"), None)]


def test_alter_table_during_its_snapshot_copies_it_again(
        spark: Any, primary: MariaDB, relay: TapRelay, tmp_path: Any) -> None:
    """A column added while the table's snapshot is under way: the chunks read after it
    deliver nothing and ask for the table again, which is copied under its new columns,
    and the mirror equals the primary's table, new column included."""
    primary.execute_many(["CREATE DATABASE ddlsnap",
                          "CREATE TABLE ddlsnap.t (id INT PRIMARY KEY, v INT)"])
    conn = _snap_connect(primary)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO ddlsnap.t VALUES (%s, %s)", [(i, i) for i in range(500)])
    conn.close()
    wait_caught_up(relay, primary)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    q = (spark.readStream.format("relay").option("endpoint", endpoint(relay))
         .option("user", "spark").option("password", PASSWORD).option("tables", "ddlsnap.t")
         .option("snapshot", "initial").option("snapshotSource", _snap_source(primary))
         .option("snapshotChunkRows", 100).option("snapshotChunksPerBatch", 1)
         .option("name", "ddl-snap").load()
         .writeStream.format("parquet").option("checkpointLocation", ck)
         .trigger(processingTime="1 second").start(out))

    def chunks_done() -> int:
        with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
            snaps = [s for s in tap.status()["snapshots"].values() if s["name"] == "ddl-snap"]
        return sum(t["chunks_done"] for s in snaps for t in s["tables"].values())

    def mirror() -> dict[str, Any]:
        changes = spark.read.parquet(out)
        return {str(r["id"]): json.loads(r["image"]) for r in latest_per_key(
            changes, ["id"]).where("op = 'upsert'").collect()}

    try:
        wait_until(lambda: chunks_done() >= 1, 60, "the snapshot to be under way")
        primary.execute_many(["ALTER TABLE ddlsnap.t ADD COLUMN w INT NOT NULL DEFAULT 7"])
        assert chunks_done() < 5, "the column came after the snapshot: nothing to test"
        expected = {str(i): {"id": i, "v": i, "w": 7} for i in range(500)}
        wait_until(lambda: committed_batches(ck) > 0 and mirror() == expected and
                   spark.read.parquet(out).where("op = 'snapshot_end'").count() > 0, 120,
                   "the table copied again under its new columns, and its end")
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    assert spark.read.parquet(out).where("op = 'snapshot'").count() > 500
    # Only the copy under the new columns ends with a snapshot_end: the first copy's
    # would have told a mirror to drop the rows its changed chunks never delivered.
    assert spark.read.parquet(out).where("op = 'snapshot_end'").count() == 1


def test_misspelt_options_are_refused(spark: Any, relay: TapRelay) -> None:
    with pytest.raises(Exception, match="maxRowsPerBatch"):
        (spark.read.format("relay").option("endpoint", endpoint(relay))
         .option("maxRowPerBatch", 10).load().collect())
    # An empty range (start = end) is an empty result, not a task failure (Spark hands a
    # placeholder partition to a reader that planned none).
    with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
        last = tap.resolve("latest")
    empty = (spark.read.format("relay").option("endpoint", endpoint(relay))
             .option("user", "spark").option("passwordEnv", "RELAY_TAP_PASSWORD")
             .option("start", str(last)).option("end", str(last)).load())
    assert empty.count() == 0


def test_snapshot_during_a_workload_then_stream_equals_the_primary(
        spark: Any, primary: MariaDB, relay: TapRelay, tables: None) -> None:
    wait_caught_up(relay, primary)
    with tempfile.TemporaryDirectory() as tmp:
        out, ck = os.path.join(tmp, "out"), os.path.join(tmp, "ck")
        with SnapshotWorkload(primary) as work:
            wait_until(lambda: work.done > 50, 30, "the workload to start")
            progress = _snap_stream(spark, relay, primary, out, ck)
            assert work.done > 200, "the workload ran during the snapshot"
        # The query's progress reports say how far the snapshot is, per table; a batch
        # took at most 2 chunks of a table (snapshotChunksPerTable), tables in turn.
        assert progress and all(done == total for done, total in progress[-1].values()), \
            progress
        before = {t: 0 for t in progress[0]}
        for p in progress:
            assert all(p[t][0] - before[t] <= 2 for t in p), progress
            before = {t: p[t][0] for t in p}
        assert sum(1 for p in progress[:1] for t in p if p[t][0]) >= 2, progress
        wait_caught_up(relay, primary)
        _snap_stream(spark, relay, primary, out, ck)  # the rest of the stream
        snapshot_rows = spark.read.parquet(out).where("op = 'snapshot'").count()
        assert snapshot_rows > BIG_ROWS * 0.9
        for table in SNAP_TABLES:
            mirror, expected = _snap_mirror(spark, out, table), _snap_expected(primary, table)
            assert mirror.keys() == expected.keys(), table
            for key, row in expected.items():
                assert mirror[key] == row, (table, key)
        with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
            progress = [s for s in tap.status()["snapshots"].values()
                        if s["name"] == "snap-test"]
        assert len(progress) == 1, progress
        assert all(t["chunks_done"] == t["chunks"] for t in progress[0]["tables"].values()), \
            progress
        status = relay.process.status()["tap"]["snapshots"]
        assert {s["name"] for s in status.values()} >= {"snap-test"}
        metrics = relay.process.http("/metrics")[1]
        assert 'relay_tap_snapshot_chunks{snapshot=' in metrics
        console = Console(record=True, width=200)
        console.print(render(relay.process.status()))  # what `relay status` shows
        shown = console.export_text()
        assert "subscriber" in shown and "snap-test" in shown and "snap.big" in shown
        # A re-snapshot of one table with the resnapshot option on the restarted query:
        # it copies the table again, then goes on with the stream from where it was; the
        # same options again (a restart) copy nothing more.
        ci_rows = "op = 'snapshot' AND `table` = 'ci'"
        copied = spark.read.parquet(out).where(ci_rows).count()
        primary.execute_many(["UPDATE snap.ci SET v = v + 100"])
        wait_caught_up(relay, primary)
        _snap_stream(spark, relay, primary, out, ck, resnapshot="snap.ci")
        again = spark.read.parquet(out).where(ci_rows).count()
        assert again > copied
        assert _snap_mirror(spark, out, "ci") == _snap_expected(primary, "ci")
        with TapClient(endpoint(relay), "spark", PASSWORD) as tap:
            assert tap.snapshot_requested("snap-test") == []
        _snap_stream(spark, relay, primary, out, ck, resnapshot="snap.ci")
        assert spark.read.parquet(out).where(ci_rows).count() == again


def _offsets(ck: str) -> list[dict[str, Any]]:
    """The offsets Spark logged for each batch, in order."""
    d = os.path.join(ck, "offsets")
    if not os.path.isdir(d):
        return []
    out = []
    for name in sorted((n for n in os.listdir(d) if n.isdigit()), key=int):
        with open(os.path.join(d, name)) as f:
            lines = f.read().splitlines()
        if len(lines) >= 3:
            out.append(json.loads(lines[-1]))
    return out


def _com_begin(server: MariaDB) -> int:
    """Transactions begun: a snapshot chunk reads in one (START TRANSACTION WITH
    CONSISTENT SNAPSHOT); the planning reads none."""
    return int(str(server.query("SHOW GLOBAL STATUS LIKE 'Com_begin'")[0][1]))


def test_snapshot_from_a_replica_lines_up_with_the_stream(
        spark: Any, primary: MariaDB, relay: TapRelay, tables: None,
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """snapshotSource a replica that logs what it applies (log_slave_updates): each
    chunk's read view is placed in the relay's log by the primary's GTIDs the replica
    logged, so the snapshot, taken while the primary changes the table, and the stream
    hand over with no gap and no duplicate."""
    replica = mariadb_factory(server_id=77, options={"log_slave_updates": "ON"})
    replica.execute_many(["SET sql_log_bin = 0",
                          f"GRANT SELECT ON *.* TO '{replica.repl_user}'@'%'",
                          "CREATE DATABASE snap",  # what it has of the primary's: the new table
                          f"SET GLOBAL gtid_slave_pos = '{primary.gtid_binlog_pos()}'"])
    replica.replicate_from("127.0.0.1", primary.port, user=primary.repl_user,
                           password=primary.repl_password)
    primary.execute_many([
        "CREATE TABLE snap.rep (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
        "INSERT INTO snap.rep SELECT seq, seq, CONCAT('r', seq) FROM snap.seq_1_to_20000"])
    wait_until(lambda: replica.gtid_binlog_pos() == primary.gtid_binlog_pos(), 60,
               "the replica to catch up")
    stop, done = threading.Event(), [0]

    def work() -> None:
        rnd = random.Random(3)
        with contextlib.closing(_snap_connect(primary)) as conn, conn.cursor() as cur:
            while not stop.is_set():
                i = rnd.randrange(1, 24_000)
                kind = rnd.randrange(3)
                if kind == 0:
                    cur.execute("DELETE FROM snap.rep WHERE id = %s", (i,))
                elif kind == 1:
                    cur.execute("INSERT INTO snap.rep VALUES (%s, -1, 'new') ON DUPLICATE KEY "
                                "UPDATE v = v + 1", (i,))
                else:
                    cur.execute("UPDATE snap.rep SET v = v + 1, s = 'u' WHERE id = %s", (i,))
                done[0] += 1
                time.sleep(0.003)

    def run(out: str, ck: str) -> None:
        q = (spark.readStream.format("relay").option("endpoint", endpoint(relay))
             .option("user", "spark").option("password", PASSWORD)
             .option("table", "snap.rep").option("images", "json")
             .option("snapshot", "initial").option("snapshotSource", _snap_source(replica))
             .option("snapshotChunkRows", 2000).option("snapshotChunksPerBatch", 4)
             .option("name", "from-replica").load()
             .writeStream.format("parquet").option("checkpointLocation", ck)
             .trigger(availableNow=True).start(out))
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()

    with tempfile.TemporaryDirectory() as tmp:
        out, ck = os.path.join(tmp, "out"), os.path.join(tmp, "ck")
        begun = _com_begin(replica)
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            wait_until(lambda: done[0] > 20, 30, "the workload to start")
            run(out, ck)
        finally:
            stop.set()
            thread.join(30)
        assert done[0] > 100
        assert _com_begin(replica) - begun >= 10  # its 10 chunks were read from the replica
        wait_caught_up(relay, primary)
        run(out, ck)  # the rest of the stream
        records = spark.read.parquet(out)
        snapshot = records.where("op = 'snapshot'")
        assert snapshot.count() > 15_000
        assert snapshot.selectExpr("get_json_object(after, '$.id')").distinct().count() == \
            snapshot.count()
        changes = records.where("op != 'snapshot'")
        assert changes.count() > 0
        assert changes.select("position", "change").distinct().count() == changes.count()
        mirror = _snap_mirror(spark, out, "rep", ["id"])
        expected = _snap_expected(primary, "rep", keys=["id"])
        assert mirror.keys() == expected.keys()
        assert all(mirror[k] == row for k, row in expected.items())


def test_when_needed_snapshots_when_the_checkpoint_left_the_log(
        spark: Any, primary: MariaDB, tables: None,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A checkpoint whose position was purged from the relay log: with when_needed the
    query takes a snapshot and goes on from it, instead of failing with not_in_log."""
    port = free_port()
    proc = RelayProcess(
        str(tmp_path_factory.mktemp("when-needed-relay")), primary.url,
        {"tap": {"listen": f"127.0.0.1:{port}"}, "relaylog": {"segment_size": "1MiB"},
         # From here: not the module's whole history (slow to read), and, unlike
         # "current", not raced by the relay's first connection.
         "upstream": {"start": primary.gtid_binlog_pos()}},
        f'[[tap.users]]\nname = "spark"\npassword = "{PASSWORD}"\n'
        '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\nadmin = true\n')
    proc.start()
    ep = f"127.0.0.1:{port}"
    try:
        primary.execute_many([
            "CREATE TABLE snap.wn (id INT PRIMARY KEY, v INT, pad VARCHAR(1000))",
            "INSERT INTO snap.wn SELECT seq, seq, REPEAT('p', 1000) FROM snap.seq_1_to_2000"])
        wait_until(lambda: _tap_up(ep), 60, "the tap to listen")
        relay = TapRelay(proc, ep)
        wait_caught_up(relay, primary)
        with tempfile.TemporaryDirectory() as tmp:
            out, ck = os.path.join(tmp, "out"), os.path.join(tmp, "ck")

            def run() -> None:
                q = (spark.readStream.format("relay").option("endpoint", ep)
                     .option("user", "spark").option("password", PASSWORD)
                     .option("table", "snap.wn").option("images", "json")
                     .option("snapshot", "when_needed")
                     .option("snapshotSource", _snap_source(primary))
                     .option("name", "wn").load()
                     .writeStream.format("parquet").option("checkpointLocation", ck)
                     .trigger(availableNow=True).start(out))
                q.awaitTermination(300)
                assert q.exception() is None, q.exception()

            run()  # from earliest: the whole history is in the log, no snapshot
            assert spark.read.parquet(out).where("op = 'snapshot'").count() == 0
            with TapClient(ep, "spark", PASSWORD) as tap:  # abandoned: no hold on the log
                if "wn" in tap.status()["subscribers"]:  # (Spark commits one batch late)
                    tap.unsubscribe("wn")
            checkpoint = int(_offsets(ck)[-1]["pos"])
            primary.execute_many([*(f"UPDATE snap.wn SET v = v + 1 WHERE id % 3 = {i}"
                                    for i in range(3)),
                                  "DELETE FROM snap.wn WHERE id % 7 = 0"])
            wait_caught_up(relay, primary)
            names = [os.path.basename(p) for p in proc.segments()]
            with contextlib.closing(pymysql.connect(
                    host="127.0.0.1", port=proc.port, user="repl",
                    password="relaypass")) as conn, conn.cursor() as cur:
                cur.execute(f"PURGE BINARY LOGS TO '{names[-1]}'")
                cur.execute("SHOW BINARY LOGS")
                oldest = int(str(cur.fetchall()[0][0]).rsplit(".", 1)[1])
            assert oldest > checkpoint >> 32, "the checkpoint's segment was purged"
            run()  # the checkpoint's position is gone: a snapshot, then the stream
            changes = spark.read.parquet(out)
            assert changes.where("op = 'snapshot'").count() > 0, (
                checkpoint, oldest, _offsets(ck), _tail(proc.log_path))
            latest = latest_per_key(changes, ["id"]).where("op = 'upsert'").collect()
            mirror = {r["id"]: json.loads(r["image"]) for r in latest}
            expected = {int(k[0]): row for k, row in _snap_expected(primary, "wn", keys=["id"]).items()}
            assert {int(k) for k in mirror} == set(expected)
            assert all(mirror[str(k)] == row for k, row in expected.items())
    finally:
        proc.stop()


def test_batch_read_over_tls_equals_plain(spark: Any, primary: MariaDB, relay: TapRelay,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """A relay with [tap.tls]: Spark reads it with tls / tlsCa and gets what the plain tap
    gives; a CA that did not sign the relay's certificate is refused."""
    d = str(tmp_path_factory.mktemp("tls-certs"))
    certs, stranger = Certs(d, "tap"), Certs(d, "stranger")
    port = free_port()
    proc = RelayProcess(str(tmp_path_factory.mktemp("tls-relay")), primary.url,
                        {"tap": {"listen": f"127.0.0.1:{port}"},
                         "relay": {"server_id": 4343}},  # the module's relay is 4242
                        f'[[tap.users]]\nname = "spark"\npassword = "{PASSWORD}"\n'
                        f'[tap.tls]\ncert = "{certs.cert}"\nkey = "{certs.key}"\n')
    proc.start()
    try:
        ep = f"127.0.0.1:{port}"

        def caught_up() -> bool:
            with contextlib.suppress(OSError, TapError), \
                    TapClient(ep, "spark", PASSWORD, tls=True, tls_ca=certs.ca) as tap:
                return bool(tap.status()["gtid_state"] == primary.gtid_binlog_pos())
            return False
        primary.execute_many(["CREATE DATABASE IF NOT EXISTS tls_read",
                              "CREATE TABLE tls_read.t (id INT PRIMARY KEY, v TEXT)",
                              "INSERT INTO tls_read.t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                              "UPDATE tls_read.t SET v = 'B' WHERE id = 2"])
        wait_caught_up(relay, primary)
        wait_until(caught_up, 90, "the TLS tap to serve everything the primary wrote")

        def read(endpoint_: str, **tls: str) -> list[tuple[Any, ...]]:
            r = (spark.read.format("relay").option("endpoint", endpoint_)
                 .option("user", "spark").option("password", PASSWORD)
                 .option("images", "json").option("tables", "tls_read.%"))
            for k, v in tls.items():
                r = r.option(k, v)
            return sorted((row["gtid"], row["table"], row["op"], row["after"] or "",
                           row["before"] or "") for row in r.load().collect())
        over_tls = read(ep, tls="true", tlsCa=certs.ca)
        assert over_tls and over_tls == read(endpoint(relay))
        with pytest.raises(Exception, match="certificate verify failed"):
            read(ep, tlsCa=stranger.ca)
    finally:
        proc.stop()


def test_a_snapshot_of_a_masked_table_fails_the_query(
        spark: Any, primary: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A tap user whose tap rules mask a table's column gets no snapshot of it (its rows
    would come from the primary unmasked): a streaming query and a batch read with
    snapshot=initial fail at once with the relay's reason ('denied'), not retried; the
    same user's changes-only read gets the changes, masked."""
    port = free_port()
    proc = RelayProcess(
        str(tmp_path_factory.mktemp("masked-relay")), primary.url,
        {"tap": {"listen": f"127.0.0.1:{port}"}, "relay": {"server_id": 4545},
         "upstream": {"start": primary.gtid_binlog_pos()}},
        f'[[tap.users]]\nname = "spark"\npassword = "{PASSWORD}"\n'
        '[[rules]]\nname = "no-secrets"\nat = "tap"\nclients = ["spark"]\n'
        '[[rules.mask]]\ncolumn = "masking.t.secret"\nwith = "null"\n')
    proc.start()
    ep = f"127.0.0.1:{port}"
    try:
        primary.execute_many([
            "CREATE DATABASE masking",
            "CREATE TABLE masking.t (id INT PRIMARY KEY, secret VARCHAR(40))",
            "INSERT INTO masking.t VALUES (1, 'marker-one'), (2, 'marker-two')"])
        wait_until(lambda: _tap_up(ep), 60, "the tap to listen")
        wait_caught_up(TapRelay(proc, ep), primary)

        def source(stream: bool, **extra: str) -> Any:
            r = spark.readStream if stream else spark.read
            r = (r.format("relay").option("endpoint", ep).option("user", "spark")
                 .option("password", PASSWORD).option("table", "masking.t")
                 .option("images", "json").option("name", "masked"))
            for k, v in extra.items():
                r = r.option(k, v)
            return r.load()

        snapshot = {"snapshot": "initial", "snapshotSource": _snap_source(primary)}
        with pytest.raises(Exception, match=r"denied.*masking\.t.*masked"):
            source(False, **snapshot).collect()
        with tempfile.TemporaryDirectory() as tmp:
            q = (source(True, **snapshot).writeStream.format("parquet")
                 .option("checkpointLocation", os.path.join(tmp, "ck"))
                 .trigger(availableNow=True).start(os.path.join(tmp, "out")))
            with pytest.raises(Exception, match=r"denied.*masking\.t.*masked"):
                q.awaitTermination(120)  # (raises the query's error once it ends)
            assert not q.isActive, "the query went on after the relay refused"
        with TapClient(ep, "spark", PASSWORD) as tap:
            assert tap.status()["snapshots"] == {} and tap.acked("masked") is None
        rows = source(False).collect()
        assert sorted(json.loads(r["after"])["id"] for r in rows) == [1, 2]
        assert all(json.loads(r["after"])["secret"] is None for r in rows)
    finally:
        proc.stop()
