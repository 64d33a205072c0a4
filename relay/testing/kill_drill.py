"""kill -9 of the relay at random moments under a steady workload, with real replicas
(GTID strict mode) and a `mysqlbinlog --read-from-remote-server --stop-never` client
attached: for the suite (a few cycles) and bench/kill9_loop.py (a hundred).

Each cycle starts the relay, lets it stream for a random moment (or kills it while it
starts and recovers), and kills it -9; the replicas reconnect by themselves, the
mysqlbinlog client is started again once the relay listens. After the last cycle the
workload stops and the relay catches up: every replica must hold the primary's data
(CHECKSUM TABLE), with no replication error, and the relay log the primary's
transactions, each once, in order; so must what the last mysqlbinlog client wrote.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pymysql

from relay.binlog.constants import EventType
from relay.binlog.file import iter_file_events
from relay.binlog.gtid import Gtid
from relay.testing.failover_drill import relay_status
from relay.testing.mariadb import MariaDB, find_binary

TABLES = ("drill.t", "drill.big")


@dataclass
class DrillReport:
    cycles: int = 0
    seconds: float = 0.0
    transactions: int = 0            # the workload's commits on the primary
    kills_streaming: int = 0         # kills while the relay streamed
    kills_starting: int = 0          # kills during start-up and recovery
    catch_up_seconds: float = 0.0    # after the last cycle, to the primary's position
    checks: list[str] = field(default_factory=list)


class Writer:
    """Small and larger transactions on the primary in a thread until stopped, about
    `rate` a second."""

    def __init__(self, primary: MariaDB, seed: int, rate: float = 300.0) -> None:
        self.primary = primary
        self.interval = 1.0 / rate  # paced: an unpaced writer fills the disk in minutes
        self.rng = random.Random(seed)
        self.count = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="drill-writer")

    def start(self) -> None:
        self.primary.execute_many([
            "CREATE DATABASE IF NOT EXISTS drill",
            "CREATE TABLE IF NOT EXISTS drill.t (id INT PRIMARY KEY AUTO_INCREMENT, "
            "v VARCHAR(1000), n INT)",
            "CREATE TABLE IF NOT EXISTS drill.big (id INT PRIMARY KEY AUTO_INCREMENT, "
            "b MEDIUMBLOB)"])
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            with contextlib.closing(pymysql.connect(
                    host="127.0.0.1", port=self.primary.port, user="root",
                    autocommit=True)) as conn, conn.cursor() as cur:
                while not self._stop.is_set():
                    k = self.rng.random()
                    if k < 0.7:
                        cur.execute("INSERT INTO drill.t (v, n) VALUES (%s, %s)",
                                    ("v" * self.rng.randint(1, 1000), self.count))
                    elif k < 0.9:
                        cur.execute("BEGIN")
                        for _ in range(self.rng.randint(2, 20)):
                            cur.execute("INSERT INTO drill.t (v, n) VALUES (REPEAT('m', 300), 1)")
                        cur.execute("UPDATE drill.t SET n = n + 1 ORDER BY id DESC LIMIT 10")
                        cur.execute("COMMIT")
                    elif k < 0.97:
                        cur.execute("INSERT INTO drill.big (b) VALUES (REPEAT('b', %s))",
                                    (self.rng.randint(1 << 14, 1 << 18),))
                    else:
                        cur.execute("DELETE FROM drill.t ORDER BY id LIMIT 5")
                    self.count += 1
                    time.sleep(self.interval)
        except BaseException as exc:  # reported by the drill
            self.error = exc


class BinlogClient:
    """`mysqlbinlog --read-from-remote-server --raw --stop-never` through the relay, from
    its first segment, into a directory (started again after each kill)."""

    def __init__(self, port: int, user: str, password: str, out_dir: str) -> None:
        self.port, self.user, self.password, self.out_dir = port, user, password, out_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, first: str) -> None:
        self.stop()
        shutil.rmtree(self.out_dir, ignore_errors=True)
        os.makedirs(self.out_dir)
        self.proc = subprocess.Popen(
            [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
             "--host=127.0.0.1", f"--port={self.port}", f"--user={self.user}",
             f"--password={self.password}", "--raw", "--stop-never",
             f"--result-file={self.out_dir}/", first],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.starts += 1

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def files(self) -> list[str]:
        return sorted(os.path.join(self.out_dir, n) for n in os.listdir(self.out_dir))


def gtids_of(paths: list[str]) -> list[Gtid]:
    """The GTIDs of binlog files, in order (a torn last event is left out)."""
    out = []
    for path in paths:
        with open(path, "rb") as f, contextlib.suppress(Exception):
            for raw in iter_file_events(f, verify_crc=False, where=path):
                data = raw.data
                if data[4] == EventType.GTID:
                    out.append(Gtid(int.from_bytes(data[27:31], "little"),
                                    int.from_bytes(data[5:9], "little"),
                                    int.from_bytes(data[19:27], "little")))
    return out


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _streams(metrics_port: int) -> int:
    up = relay_status(metrics_port).get("upstream")
    return int(up.get("streams", 0)) if isinstance(up, dict) else 0


def _replica_ok(replica: MariaDB) -> dict[str, object]:
    st = replica.slave_status()
    if st.get("Last_SQL_Errno") not in (0, "0", None):
        raise AssertionError(f"replica {replica.server_id}: SQL error: "
                             f"{st.get('Last_SQL_Error')}")
    return st


def run_kill_drill(primary: MariaDB, replicas: list[MariaDB], *,
                   start_relay: Callable[[], object], kill_relay: Callable[[], object],
                   relay_segments: Callable[[], list[str]], metrics_port: int,
                   relay_port: int, user: str, password: str, work_dir: str, cycles: int,
                   seed: int = 20261124) -> DrillReport:
    """The relay is started and killed by the callables; `relay_segments` lists its
    segment files in order. Replicas must already replicate from the relay by GTID."""
    rng = random.Random(seed)
    report = DrillReport()
    writer = Writer(primary, seed)
    client = BinlogClient(relay_port, user, password, os.path.join(work_dir, "mysqlbinlog"))
    t0 = time.monotonic()
    writer.start()
    try:
        for i in range(cycles):
            start_relay()
            if i % 5 != 4:  # most kills hit a relay in mid-stream, with clients on it
                _wait(lambda: _streams(metrics_port) >= 1, 60, "the relay to stream")
                segments = relay_segments()
                if segments:
                    client.start(os.path.basename(segments[0]))
                time.sleep(rng.uniform(0.1, 1.0))
                report.kills_streaming += 1
            else:  # ... some during start-up and recovery
                time.sleep(rng.uniform(0.02, 0.5))
                report.kills_starting += 1
            kill_relay()
            report.cycles += 1
            if writer.error is not None:
                raise AssertionError(f"the workload failed: {writer.error}")
        writer.stop()
        if writer.error is not None:
            raise AssertionError(f"the workload failed: {writer.error}")
        report.transactions = writer.count
        start_relay()
        caught = time.monotonic()
        target = primary.gtid_binlog_pos()
        def relay_at_target() -> bool:
            relay_log = relay_status(metrics_port).get("relay_log")
            return isinstance(relay_log, dict) and relay_log.get("gtid_pos") == target
        _wait(relay_at_target, 300, "the relay to catch up after the last kill")
        report.catch_up_seconds = time.monotonic() - caught
        client.start(os.path.basename(relay_segments()[0]))
        for replica in replicas:
            _wait(lambda r=replica: str(_replica_ok(r) and r.query(  # type: ignore[misc]
                "SELECT @@gtid_slave_pos")[0][0]) == target, 300,
                f"replica {replica.server_id} to converge")
            st = _replica_ok(replica)
            if st.get("Slave_IO_Running") != "Yes" or st.get("Slave_SQL_Running") != "Yes":
                raise AssertionError(f"replica {replica.server_id} stopped: {st}")
            for table in TABLES:
                if replica.query(f"CHECKSUM TABLE {table}") != primary.query(
                        f"CHECKSUM TABLE {table}"):
                    raise AssertionError(f"replica {replica.server_id}: {table} differs")
        report.checks.append(f"{len(replicas)} replicas equal to the primary "
                             "(CHECKSUM TABLE), no replication error")
        expected = gtids_of([primary.binlog_path(n) for n in primary.binlog_files()])
        got = gtids_of(relay_segments())
        if len(got) != len(set(got)):
            raise AssertionError("the relay log holds a transaction twice")
        if got != expected:
            raise AssertionError(f"the relay log's GTIDs differ from the primary's "
                                 f"({len(got)} vs {len(expected)})")
        report.checks.append(f"relay log: the primary's {len(expected)} transactions, each once")
        _wait(lambda: gtids_of(client.files()) == expected, 120,
              "mysqlbinlog through the relay to get every transaction")
        report.checks.append("mysqlbinlog --stop-never through the relay: the same "
                             f"transactions ({client.starts} starts)")
    finally:
        writer.stop()
        client.stop()
    report.seconds = time.monotonic() - t0
    return report
