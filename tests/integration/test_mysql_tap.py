"""The tap, send rules and CDC clients on a MySQL-flavour relay log (issue 32), against a
real MySQL 9.7 primary (a Debian root: relay/testing/builds.py; without one the module is
skipped, and under CI it fails instead).

One primary and one relay for the module. The primary writes rows of varied types (INT,
BIGINT UNSIGNED near 2^64, DECIMAL, DATETIME(3), utf8mb4 text with emoji, JSON, ENUM),
among them a compressed transaction (TRANSACTION_PAYLOAD), a tagged one and one both
tagged and compressed. Then:

- Spark reads the tap: a batch read (typed and JSON images) reduced to the last record per
  key, a snapshot read (typed and JSON), and a Structured Streaming query (snapshot, then
  the stream, in bounded availableNow runs) all equal SELECT on the primary; the query's
  offsets and the tap's status carry the MySQL GTID set the primary reports.
- A send rule masks people.email for the downstream user `analytics`: neither
  python-mysql-replication (MySQL mode, by GTID set) nor MySQL's own mysqlbinlog
  (BINLOG-DUMP-GTIDS, --raw, then -v, which decodes the compressed transactions) reading
  the relay as `analytics` gets a masked value, while `repl` (no rule) gets them all.
- zongji (Node, MySQL mode) reads the same row changes from the relay as from the primary.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import pymysql
import pymysql.cursors
import pytest

from relay.binlog.gtid import GtidSet, MysqlGtid
from relay.binlog.jsonvalue import datetime_text, jsonable
from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.tap.spark import latest_per_key, register
from relay.tap.sparktypes import INVALID_TEMPORALS
from relay.testing.builds import ServerBuild
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, check_output, required_build, wait_until
from tests.integration import spark_jvm, workload
from tests.integration.common import listening

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_DIR = os.path.join(ROOT, "tests", "cdc")
DB = "mtap"
TAP_USER, TAP_PASSWORD = "spark", "tap-pw"
USERS = {"repl": "relaypass", "analytics": "pw-analytics", "cdc": "cdcpw"}
CDC_USER, CDC_PASSWORD = "cdc", "cdcpw"
STOP_TABLE = f"{DB}.zz_stop"
TAG = "nightly"
# people.email values: masked for `analytics`; each must reach `repl` (a positive control).
MARKERS = ("alice@example.com", "bob@example.com", "carol@example.com",
           "dave@example.com", "erin@example.com")
RULES = textwrap.dedent(f"""
    [[rules]]
    name = "mask-email"
    at = "send"
    clients = ["analytics"]
    [[rules.mask]]
    column = "{DB}.people.email"
    with = "null"

    [[tap.users]]
    name = "{TAP_USER}"
    password = "{TAP_PASSWORD}"
""")
TOP = (1 << 64) - 1


def _mysql() -> ServerBuild:
    return required_build("mysql-9.7")


def _root(primary: MariaDB) -> pymysql.Connection:
    return pymysql.connect(unix_socket=primary.socket_path, user="root", autocommit=True,
                           charset="utf8mb4")


def _t_row(i: int) -> tuple[Any, ...]:
    """A row of mtap.t: every type family of the module's table."""
    return (i, TOP - i if i % 2 else i * 1000, Decimal(f"{'-' if i % 3 == 0 else ''}{i}.{i:06d}"),
            f"2026-03-{1 + i % 28:02d} 12:34:{i % 60:02d}.{(i * 7) % 1000:03d}",
            f"näme {i} 😀🚀",
            json.dumps({"n": i, "tags": ["x", "🙂"], "nested": {"f": i + 0.5, "ok": i % 2 == 0},
                        "none": None}),
            ("red", "green", "blue")[i % 3])


def write(primary: MariaDB, start: int, rounds: int) -> None:
    """Inserts, updates and deletes in mtap.t, and people rows with marker addresses;
    then a compressed transaction, a tagged one, and one tagged and compressed."""
    with contextlib.closing(_root(primary)) as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {DB}.t VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        [_t_row(i) for i in range(start, start + rounds)])
        for i in range(start, start + rounds, 3):
            cur.execute(f"UPDATE {DB}.t SET s = CONCAT(s, ' ✓'), d = d * 2, "
                        "j = JSON_SET(j, '$.m', %s), e = 'blue' WHERE id = %s", (i, i))
        cur.execute(f"DELETE FROM {DB}.t WHERE id = %s", (start + 4,))
        n = start // 100
        cur.execute(f"INSERT INTO {DB}.people VALUES (%s, 'alice', %s), (%s, 'bob', %s)",
                    (n * 10 + 1, MARKERS[0], n * 10 + 2, MARKERS[1]))
        cur.execute(f"UPDATE {DB}.people SET name = 'bobby' WHERE id = %s", (n * 10 + 2,))
        # compressed (TRANSACTION_PAYLOAD): rows of both tables, a marker among them
        cur.execute("SET SESSION binlog_transaction_compression = ON")
        cur.execute("BEGIN")
        cur.execute(f"UPDATE {DB}.t SET big = GREATEST(big, 1) - 1, ts = '2026-12-31 23:59:59.999' "
                    "WHERE id BETWEEN %s AND %s", (start, start + 3))
        cur.execute(f"INSERT INTO {DB}.t VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    _t_row(start + 500))
        cur.execute(f"INSERT INTO {DB}.people VALUES (%s, 'carol', %s)",
                    (n * 10 + 3, MARKERS[2]))
        cur.execute("COMMIT")
        cur.execute("SET SESSION binlog_transaction_compression = OFF")
        # tagged (GTID_TAGGED_LOG_EVENT)
        cur.execute(f"SET gtid_next = 'AUTOMATIC:{TAG}'")
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {DB}.t VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    _t_row(start + 501))
        cur.execute(f"INSERT INTO {DB}.people VALUES (%s, 'dave', %s)",
                    (n * 10 + 4, MARKERS[3]))
        cur.execute(f"DELETE FROM {DB}.t WHERE id = %s", (start + 1,))
        cur.execute("COMMIT")
        # tagged and compressed
        cur.execute("SET SESSION binlog_transaction_compression = ON")
        cur.execute("BEGIN")
        cur.execute(f"UPDATE {DB}.people SET email = %s WHERE id = %s",
                    (MARKERS[4], n * 10 + 1))
        cur.execute(f"UPDATE {DB}.t SET e = NULL, j = NULL WHERE id = %s", (start + 2,))
        cur.execute("COMMIT")
        cur.execute("SET SESSION binlog_transaction_compression = OFF")
        cur.execute("SET gtid_next = 'AUTOMATIC'")


# --- the primary and the relay -----------------------------------------------------------


@dataclass
class Setup:
    primary: MariaDB
    relay: RelayProcess
    tap: str          # the tap's endpoint


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    primary = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("mysql-tap")))
    primary.start()
    tap_port = free_port()
    relay = RelayProcess(
        str(tmp_path_factory.mktemp("mysql-tap-relay")),
        # caching_sha2_password's full authentication over plain text takes the server's key
        f"{primary.url}?get-server-public-key=true",
        {"downstream": {"listen": f"127.0.0.1:{free_port()}", "write_timeout": "30s",
                        "catchup_wait": "3s"},
         "tap": {"listen": f"127.0.0.1:{tap_port}"}, "users": dict(USERS)},
        RULES)
    try:
        primary.execute_many([
            # the snapshot's reads and the relay's type look-ups, as the upstream account
            f"GRANT SELECT ON *.* TO '{primary.repl_user}'@'%'",
            f"CREATE USER '{CDC_USER}'@'%' IDENTIFIED WITH caching_sha2_password BY "
            f"'{CDC_PASSWORD}'",
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{CDC_USER}'@'%'",
            f"CREATE DATABASE {DB}",
            f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, big BIGINT UNSIGNED, "
            "d DECIMAL(30,6), ts DATETIME(3), "
            "s VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_ai_ci, j JSON, "
            "e ENUM('red', 'green', 'blue'))",
            f"CREATE TABLE {DB}.people (id INT PRIMARY KEY, name VARCHAR(40), "
            "email VARCHAR(100))",
            f"CREATE TABLE {STOP_TABLE} (id INT PRIMARY KEY)"])
        write(primary, 0, 30)
        relay.start()
        wait_until(lambda: listening(relay.port) and listening(tap_port), 30,
                   "the relay to listen")
        setup = Setup(primary, relay, f"127.0.0.1:{tap_port}")
        wait_caught_up(setup)
        yield setup
    finally:
        relay.stop()
        primary.kill()   # (its data is not looked at again: no clean shutdown to wait for)
        primary.cleanup()
    check_output(relay)


def tap_client(setup: Setup) -> TapClient:
    return TapClient(setup.tap, TAP_USER, TAP_PASSWORD)


def wait_caught_up(setup: Setup) -> None:
    """The tap serves every transaction the primary executed."""
    def check() -> bool:
        with contextlib.suppress(OSError, TapError), tap_client(setup) as tap:
            return bool(tap.status()["gtid_state"] == setup.primary.gtid_binlog_pos())
        return False
    wait_until(check, 60, "the tap to serve everything the primary wrote")


def select(primary: MariaDB, table: str) -> dict[int, dict[str, Any]]:
    with contextlib.closing(pymysql.connect(
            unix_socket=primary.socket_path, user="root", charset="utf8mb4",
            cursorclass=pymysql.cursors.DictCursor)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {DB}.{table}")
        return {int(r["id"]): r for r in cur.fetchall()}


def select_json(primary: MariaDB, table: str) -> dict[int, dict[str, Any]]:
    """SELECT as the tap's JSON images write rows: decimals as text, DATETIME(3) in ISO
    form with its three digits, a JSON column as its document."""
    out = {}
    for key, row in select(primary, table).items():
        image = {}
        for name, value in row.items():
            if isinstance(value, datetime):
                image[name] = datetime_text(value, 3)
            elif name == "j" and value is not None:
                image[name] = json.loads(value)
            else:
                image[name] = jsonable(value)
        out[key] = image
    return out


# --- Spark ---------------------------------------------------------------------------------


def _java_options() -> str:
    """The Spark modules' class archive when this process made it already; else the
    client compiler only (making the archive takes longer than this module's Spark work
    gains from it: spark_jvm.py)."""
    if spark_jvm.java_options.cache_info().currsize:
        return spark_jvm.java_options()
    return spark_jvm.C1_ONLY


@pytest.fixture(scope="module")
def spark(setup: Setup) -> Iterator[Any]:
    # after the servers: the JVM's archive was being made meanwhile
    saved = dict(os.environ)
    os.environ.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      PYSPARK_SUBMIT_ARGS="--conf spark.ui.enabled=false "
                                          f"--driver-java-options '{_java_options()}' "
                                          "pyspark-shell")
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("relay-mysql-tap-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    os.environ.clear()
    os.environ.update(saved)


def reader(spark: Any, setup: Setup, *, stream: bool = False, **options: Any) -> Any:
    r = spark.readStream if stream else spark.read
    r = (r.format("relay").option("endpoint", setup.tap).option("user", TAP_USER)
         .option("password", TAP_PASSWORD))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def typed_expected(primary: MariaDB) -> dict[int, dict[str, Any]]:
    """SELECT in the typed form's values: BIGINT UNSIGNED as DECIMAL(20,0), JSON as its
    document (compared parsed)."""
    out = {}
    for key, row in select(primary, "t").items():
        row = dict(row)
        row["big"] = None if row["big"] is None else Decimal(row["big"])
        row["j"] = None if row["j"] is None else json.loads(row["j"])
        out[key] = row
    return out


def _typed_image(image: Any) -> dict[str, Any]:
    """A typed image's values, its JSON document parsed: written as the tap writes a
    change's document (compact, keys in the document's order), a snapshot row's too."""
    values: dict[str, Any] = image.asDict()
    assert values.pop(INVALID_TEMPORALS) is None   # (no zero date here)
    text = values["j"]
    if text is not None:
        values["j"] = json.loads(text)
        assert text == json.dumps(values["j"], ensure_ascii=False, separators=(",", ":"))
    return values


def _json_image(image: str | None) -> dict[str, Any] | None:
    return None if image is None else dict(json.loads(image))


def last_per_key(records: list[Any], image: Callable[[Any], dict[str, Any] | None],
                 ) -> dict[str, dict[int, dict[str, Any]]]:
    """What a mirror of the records holds, per table and id: the records applied in
    (position, change) order (a snapshot row as an upsert; its snapshot_end drops
    nothing here, every table is copied whole)."""
    tables: dict[str, dict[int, dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (r["position"], r["change"])):
        rows = tables.setdefault(r["table"], {})
        before, after = image(r["before"]), image(r["after"])
        if before is not None:
            rows.pop(int(before["id"]), None)
        if after is not None:
            rows[int(after["id"])] = after
    return tables


def test_spark_batch_reads_equal_select(spark: Any, setup: Setup) -> None:
    """Every change of the log through the tap, applied in order, is the table: typed
    images (a STRUCT of the table's columns) and JSON images; every change carries its
    MySQL GTID, the tagged ones theirs."""
    primary = setup.primary
    typed = reader(spark, setup, table=f"{DB}.t")
    assert [(f.name, f.dataType.simpleString()) for f in typed.schema["after"].dataType] == [
        ("id", "int"), ("big", "decimal(20,0)"), ("d", "decimal(30,6)"),
        ("ts", "timestamp_ntz"), ("s", "string"), ("j", "string"), ("e", "string"),
        (INVALID_TEMPORALS, "map<string,string>")]
    mirror = last_per_key(typed.collect(),
                          lambda i: None if i is None else _typed_image(i))
    assert mirror == {"t": typed_expected(primary)}

    changes = reader(spark, setup, tables=f"{DB}.%").collect()
    mirror = last_per_key(changes, _json_image)
    for table in ("t", "people"):
        assert mirror[table] == select_json(primary, table), table
    ops = Counter(r["op"] for r in changes if r["table"] == "t")
    # 30 + 2 inserts, 10 + 4 + 1 updates, 2 deletes (the first workload)
    assert ops == {"insert": 32, "update": 15, "delete": 2}, ops
    # Each change's GTID is a transaction of the primary's, tagged ones as uuid:tag:gno.
    executed = GtidSet.parse(primary.gtid_binlog_pos())
    gtids = {r["gtid"] for r in changes}
    assert gtids and all(executed.contains(MysqlGtid.parse(g)) for g in gtids), gtids
    assert len({g for g in gtids if MysqlGtid.parse(g).tag == TAG}) == 2, gtids


def test_spark_snapshot_reads_equal_select(spark: Any, setup: Setup) -> None:
    """A snapshot read (snapshot = initial) delivers the tables as SELECT gives them,
    typed and as JSON, each row placed at a position of the relay's log."""
    primary = setup.primary
    options: dict[str, Any] = {"snapshot": "initial", "snapshotUser": primary.repl_user,
               "snapshotPassword": primary.repl_password,
               "snapshotSource": f"mysql://127.0.0.1:{primary.port}"
                                 "?get-server-public-key=true"}
    typed = reader(spark, setup, table=f"{DB}.t", **options).where("op = 'snapshot'")
    assert {r["after"]["id"]: _typed_image(r["after"]) for r in typed.collect()} == \
        typed_expected(primary)
    rows = reader(spark, setup, tables=f"{DB}.t,{DB}.people", **options) \
        .where("op = 'snapshot'").collect()
    for table in ("t", "people"):
        assert {int(json.loads(r["after"])["id"]): json.loads(r["after"]) for r in rows
                if r["table"] == table} == select_json(primary, table), table


def _offsets(ck: str) -> list[dict[str, Any]]:
    """The offsets Spark logged for each batch, in order."""
    d = os.path.join(ck, "offsets")
    out = []
    for name in sorted((n for n in os.listdir(d) if n.isdigit()), key=int):
        with open(os.path.join(d, name)) as f:
            out.append(json.loads(f.read().splitlines()[-1]))
    return out


class Writer(workload.Writer):
    """Single-row transactions into mtap.t (updates, inserts, deletes) until stopped."""

    seed = 5
    pause = 0.005

    def step(self, cur: Any, rnd: random.Random) -> None:
        i = rnd.randrange(2000, 2040)
        kind = rnd.randrange(4)
        if kind == 0:
            cur.execute(f"INSERT IGNORE INTO {DB}.t VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        _t_row(i))
        elif kind == 1:
            cur.execute(f"DELETE FROM {DB}.t WHERE id = %s", (i,))
        else:
            cur.execute(f"UPDATE {DB}.t SET d = d + 1, s = CONCAT(LEFT(s, 40), '+'), "
                        "j = JSON_SET(COALESCE(j, '{}'), '$.w', %s) WHERE id = %s",
                        (self.done, rnd.choice([i, i % 30])))


def test_spark_stream_with_snapshot_carries_gtid_sets(spark: Any, setup: Setup,
                                                      tmp_path: Any) -> None:
    """A streaming query: a snapshot of both tables taken while a writer changes one,
    then the stream, in availableNow runs (more transactions, compressed and tagged
    among them, between the runs). The mirror (relay.tap.spark.latest_per_key) equals
    SELECT once the stream caught up; the offsets carry the GTID set before their
    position, the last one the primary's gtid_executed, as the tap's status does."""
    primary = setup.primary
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run(**limit: int) -> Any:
        q = (reader(spark, setup, stream=True, tables=f"{DB}.t,{DB}.people",
                    snapshot="initial", snapshotUser=primary.repl_user,
                    snapshotPassword=primary.repl_password, snapshotChunkRows=10,
                    snapshotChunksPerBatch=1,
                    snapshotSource=f"mysql://127.0.0.1:{primary.port}"
                                   "?get-server-public-key=true",
                    name="mysql-stream", **limit)
             .writeStream.format("parquet").option("checkpointLocation", ck)
             .trigger(availableNow=True).start(out))
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
        return q

    def mirror() -> dict[str, dict[int, Any]]:
        latest = latest_per_key(spark.read.parquet(out), ["id"]).where("op = 'upsert'")
        tables: dict[str, dict[int, Any]] = {}
        for r in latest.collect():
            tables.setdefault(r["table"], {})[int(r["id"])] = json.loads(r["image"])
        return tables

    with Writer(primary) as writer:
        wait_until(lambda: writer.done > 20, 30, "the writer to start")
        run()   # the snapshot (a chunk a batch) while the table changes
        assert writer.done > 100, "the writer ran during the snapshot"
    first = _offsets(ck)
    assert sum(1 for o in first if "snapshot" in o) >= 4, first
    wait_caught_up(setup)
    run()
    assert mirror() == {table: select_json(primary, table) for table in ("t", "people")}
    first = _offsets(ck)
    write(primary, 100, 20)
    wait_caught_up(setup)
    q = run(maxRowsPerBatch=8)
    assert mirror() == {table: select_json(primary, table) for table in ("t", "people")}
    offsets = _offsets(ck)
    assert len(offsets) - len(first) >= 3, offsets  # maxRowsPerBatch: several batches
    executed = primary.gtid_binlog_pos()
    assert f":{TAG}:" in executed
    assert offsets[-1]["gtid"] == executed, offsets[-1]
    # every offset's set, in order: each holds the one before it
    sets = [GtidSet.parse(o["gtid"]) for o in offsets]
    assert all(b.covers(a) for a, b in itertools.pairwise(sets)), sets
    assert len(set(map(str, sets))) > 3
    assert json.loads(q.recentProgress[-1]["sources"][0]["endOffset"])["gtid"] == executed
    with tap_client(setup) as tap:
        status = tap.status()
    assert status["gtid_state"] == executed
    assert MysqlGtid.parse(status["last_gtid"])
    relay_status = setup.relay.status()
    assert relay_status["relay_log"]["flavour"] == "mysql"
    assert relay_status["relay_log"]["gtid_pos"] == executed
    assert f"{TAP_USER}/mysql-stream" in relay_status["tap"]["subscribers"]


# --- a send rule's mask, for MySQL-mode readers of the relay ----------------------------------


def _markers_in(data: bytes | str) -> list[str]:
    text = data if isinstance(data, str) else data.decode("latin-1")
    return [m for m in MARKERS if m in text]


def _pmr_people(port: int, user: str, password: str, first: str) -> list[tuple[str, Any]]:
    """python-mysql-replication, MySQL mode, auto-positioned after the first transaction:
    the row changes of people (it does not decode compressed transactions)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": port, "user": user,
                             "password": password},
        server_id=4646, is_mariadb=False, blocking=False, auto_position=first,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
    try:
        return [(type(e).__name__, row) for e in stream if e.table == "people"
                for row in e.rows]
    finally:
        stream.close()


def _mysqlbinlog_raw(setup: Setup, user: str, password: str) -> tuple[bytes, str]:
    """MySQL's mysqlbinlog reading the relay by GTID (BINLOG-DUMP-GTIDS) with --raw, as
    `user`: the bytes it received, and its -v decoding of them (compressed transactions
    decoded)."""
    b = setup.primary.build
    assert b is not None
    inside = f"/srv/relay-tests/mtap-raw-{user}"
    stage = b.host_path(inside)
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    first = os.path.basename(setup.relay.segments()[0])
    res = subprocess.run(b.command(
        b.tool("mysqlbinlog"), "--read-from-remote-source=BINLOG-DUMP-GTIDS", "--raw",
        "--host=127.0.0.1", f"--port={setup.relay.port}", f"--user={user}",
        f"--password={password}", "--get-server-public-key", "--to-last-log",
        f"--result-file={inside}/", first), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    names = sorted(os.listdir(stage))
    assert names
    raw = b""
    for name in names:
        with open(os.path.join(stage, name), "rb") as f:
            raw += f.read()
    decoded = subprocess.run(b.command(b.tool("mysqlbinlog"), "-v",
                                       "--base64-output=decode-rows",
                                       *(f"{inside}/{n}" for n in names)),
                             capture_output=True, text=True, timeout=120)
    assert decoded.returncode == 0, decoded.stderr
    return raw, decoded.stdout


def _rows_and_gtids(decoded: str) -> list[str]:
    """mysqlbinlog -v's GTIDs and row changes."""
    keep = re.compile(r"^(SET @@SESSION.GTID_NEXT= '[^A]|### )")
    return [line for line in decoded.splitlines() if keep.match(line)]


def test_a_send_rule_masks_for_mysql_readers(setup: Setup) -> None:
    """people.email is masked (NULL) for `analytics` in every transaction it gets,
    compressed and tagged ones included; every other value, and every transaction, as
    `repl` (no rule) gets them."""
    primary, relay = setup.primary, setup.relay
    executed = GtidSet.parse(primary.gtid_binlog_pos())
    (sid, _), _ = next(iter(executed.intervals()))
    first = f"{sid}:1"
    control = _pmr_people(relay.port, "repl", USERS["repl"], first)
    masked = _pmr_people(relay.port, "analytics", USERS["analytics"], first)
    # (the uncompressed transactions' rows: the library skips TRANSACTION_PAYLOAD)
    assert {MARKERS[0], MARKERS[1], MARKERS[3]} <= set(_markers_in(repr(control)))
    assert len(masked) == len(control) > 0
    assert not _markers_in(repr(masked))
    for (kind, ours), (kind_c, theirs) in zip(masked, control, strict=True):
        assert kind == kind_c
        for side in ("values", "before_values", "after_values"):
            if side in theirs:
                assert ours[side] == {**theirs[side], "email": None}
    # MySQL's mysqlbinlog: every byte received, and its decoding (compressed ones too).
    raw, decoded = _mysqlbinlog_raw(setup, "repl", USERS["repl"])
    assert {MARKERS[0], MARKERS[1], MARKERS[3]} <= set(_markers_in(raw))
    assert set(_markers_in(decoded)) == set(MARKERS)
    theirs = _rows_and_gtids(decoded)
    raw, decoded = _mysqlbinlog_raw(setup, "analytics", USERS["analytics"])
    assert not _markers_in(raw) and not _markers_in(decoded)
    # The same transactions and rows, email (people's third column) NULL in each.
    assert _rows_and_gtids(decoded) == [
        re.sub(r"^###   @3='[^']*@example\.com'$", "###   @3=NULL", line) for line in theirs]
    assert any(f":{TAG}:" in line for line in theirs)


# --- zongji -----------------------------------------------------------------------------------


def _node_ready() -> bool:
    return shutil.which("node") is not None and os.path.isdir(
        os.path.join(NODE_DIR, "node_modules", "@vlasky", "zongji"))


def _zongji(port: int, start: str) -> tuple[list[dict[str, Any]], str]:
    proc = subprocess.run(
        ["node", "zongji_read.mjs", "127.0.0.1", str(port), CDC_USER, CDC_PASSWORD, start,
         STOP_TABLE], cwd=NODE_DIR, capture_output=True, text=True, timeout=60,
        env={**os.environ, "ZONGJI_UNSUPPORTED": "report"})
    return [json.loads(line) for line in proc.stdout.splitlines()], \
        f"exit {proc.returncode}: {proc.stderr[-3000:]}"


def test_zongji_reads_the_relay_as_the_primary(setup: Setup) -> None:
    """zongji (MySQL mode: COM_BINLOG_DUMP_GTID, caching_sha2_password) from the start
    of the GTID history: the same row changes, GTIDs (tagged ones too) and notices of the
    compressed transactions it cannot decode, from the relay as from the primary."""
    if not _node_ready():
        if os.environ.get("CI"):
            raise AssertionError("node or tests/cdc/node_modules missing; scripts/setup "
                                 "installs them")
        pytest.skip("node and `npm ci` in tests/cdc are needed (scripts/setup)")
    primary = setup.primary
    primary.execute_many([f"INSERT INTO {STOP_TABLE} VALUES (1)"])
    wait_caught_up(setup)
    theirs, why = _zongji(primary.port, "gtid:")
    assert theirs and theirs[-1].get("table") == STOP_TABLE, why
    ours, why = _zongji(setup.relay.port, "gtid:")
    assert ours and ours[-1].get("table") == STOP_TABLE, why
    assert ours == theirs
    assert any(r.get("unsupported") for r in theirs)   # compressed: not decoded
    assert any(f":{TAG}:" in str(r.get("gtid")) for r in theirs)
    assert {r["table"] for r in theirs if "table" in r} == \
        {f"{DB}.t", f"{DB}.people", STOP_TABLE}


def test_a_typed_delta_mirror_of_a_mysql_primary(spark: Any, setup: Setup,
                                                 tmp_path: Any) -> None:
    """relay.tap.mirror from a MySQL 9.7 primary (GTID sets, caching_sha2 snapshot logins,
    JSON, ENUM, BIGINT UNSIGNED, DATETIME(3)): the Delta tables equal SELECT after the
    snapshot and after more changes, and the history's current versions are the table."""
    from deltalake import DeltaTable

    from relay.tap.mirror import MirrorJob, MirrorSettings

    primary = setup.primary
    settings = MirrorSettings(
        endpoint=setup.tap, tables=(f"{DB}.t", f"{DB}.people"), target=str(tmp_path / "d"),
        checkpoint=str(tmp_path / "ck"), user=TAP_USER, options={"password": TAP_PASSWORD},
        source=f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:"
               f"{primary.port}?get-server-public-key=true", history=True)

    def mirrored(table: str) -> dict[int, dict[str, Any]]:
        rows = DeltaTable(str(tmp_path / "d" / f"{DB}.{table}")).to_pyarrow_table()
        out = {}
        for r in rows.to_pylist():
            image = {k: v for k, v in r.items() if not k.startswith("_")}
            if table == "t":
                image["j"] = None if image["j"] is None else json.loads(image["j"])
            out[int(r["id"])] = image
        return out

    def current_history(table: str) -> dict[int, dict[str, Any]]:
        rows = DeltaTable(str(tmp_path / "d" / f"{DB}.{table}__history")).to_pyarrow_table()
        return {int(r["id"]): r for r in rows.to_pylist() if r["_valid_to_position"] is None}

    for round_ in ("the snapshot", "then the changes"):
        if round_ != "the snapshot":
            write(primary, 5000, 12)   # (the Writer's keys are 2000 to 2039)
            wait_caught_up(setup)
        assert MirrorJob(spark, settings).run() == 0
        assert mirrored("t") == typed_expected(primary), round_
        assert mirrored("people") == select(primary, "people"), round_
        assert current_history("t").keys() == mirrored("t").keys()
