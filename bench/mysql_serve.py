#!/usr/bin/env python3
"""What serving a MySQL replica's GTID set costs: MySQL's mysqlbinlog 9.7 fetching a relay
log by COM_BINLOG_DUMP_GTID (--raw --to-last-log) through the relay, from a MySQL 9.7
primary in its Debian root (scripts/build-roots), three ways, interleaved, best of --runs:

  file      COM_BINLOG_DUMP from the first segment (no GTID set): the pass-through path
  empty     an empty set: nothing to skip, the pass-through path from the first segment
  known     the first half of the primary's transactions: skipped, then the pass-through
            path once past the log's end at the start (every source of the set is known)
  unknown   the same half plus a source the relay never saw: every event is looked at to
            the end (as a MySQL primary does), the per-event path

Prints the relay process's CPU seconds and the wall time of each fetch.

    python bench/mysql_serve.py [--rows 100000] [--per 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.downstream_fanout import cpu_seconds
from bench.ingest_revisions import write_config
from relay.binlog.gtid import GtidSet
from relay.testing.builds import build
from relay.testing.mariadb import MariaDB, free_port

USER, PASSWORD = "repl", "relaypass"
STRANGER = "00000000-0000-0000-0000-0000000000aa:1-5"


def fill(primary: MariaDB, rows: int, per: int) -> None:
    """`rows` rows in transactions of `per` rows (small ones: many events to look at)."""
    primary.execute_many(["CREATE DATABASE b", "CREATE TABLE b.t (id INT PRIMARY KEY, "
                          "v VARCHAR(100), n BIGINT)"])
    statements = []
    for start in range(0, rows, per):
        values = ",".join(f"({i}, REPEAT('x', 80), {i})" for i in range(start, start + per))
        statements.append(f"INSERT INTO b.t VALUES {values}")
    primary.execute_many(statements)


def start_relay(primary: MariaDB, work: str) -> tuple[subprocess.Popen[bytes], int, int]:
    port, metrics = free_port(), free_port()
    os.makedirs(work, exist_ok=True)
    cfg = write_config(work, primary, sync="off", listen=port, metrics=metrics,
                       users=((USER, PASSWORD),), plugin="mysql_native_password",
                       source_query="?get-server-public-key=true",
                       downstream="generate_certificate = false\n")
    proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port, metrics


def relay_gtids(metrics: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/status", timeout=5) as r:
            return str(json.load(r)["relay_log"]["gtid_pos"])
    except OSError:
        return ""


def fetch(primary: MariaDB, port: int, exclude: str | None) -> float:
    b = primary.build
    assert b is not None
    out = b.host_path("/srv/relay-tests/bench-raw")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    t0 = time.perf_counter()
    subprocess.run(b.command(
        b.tool("mysqlbinlog"), "--read-from-remote-source=BINLOG-DUMP-GTIDS", "--raw",
        "--to-last-log", "--result-file=/srv/relay-tests/bench-raw/", "--host=127.0.0.1",
        f"--port={port}", f"--user={USER}", f"--password={PASSWORD}",
        *([] if exclude is None else ["--read-from-remote-source=BINLOG-DUMP-NON-GTIDS"]
          if exclude == "-" else [f"--exclude-gtids={exclude}"] if exclude else []),
        "relay-bin.000001"),
        check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--per", type=int, default=1, help="rows per transaction")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-mysql-")
    primary = MariaDB(build=build("mysql-9.7"), base_dir=os.path.join(work, "primary"))
    primary.start()
    proc = None
    try:
        fill(primary, args.rows, args.per)
        executed = GtidSet.parse(primary.gtid_binlog_pos())
        (sid, _), intervals = next(iter(executed.intervals()))
        half = f"{sid}:1-{intervals[-1][1] // 2}"
        proc, port, metrics = start_relay(primary, os.path.join(work, "relay"))
        deadline = time.monotonic() + 300
        while relay_gtids(metrics) != str(executed):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the relay did not catch up with the primary")
            time.sleep(0.2)
        size = sum(int(str(r[1])) for r in primary.query("SHOW BINARY LOGS"))
        print(f"binlog {size / 1e6:.0f} MB, {intervals[-1][1]} transactions")
        ways = {"file": "-", "empty": "", "known": half, "unknown": f"{half},{STRANGER}"}
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.runs):
            for name, exclude in ways.items():
                cpu0 = cpu_seconds(proc.pid)
                wall = fetch(primary, port, exclude)
                cpu = cpu_seconds(proc.pid) - cpu0
                print(f"  {name:8s} {wall:6.2f} s wall, relay CPU {cpu:5.2f} s")
                if name not in best or cpu < best[name][1]:
                    best[name] = (wall, cpu)
        print("\nbest        wall    relay CPU")
        for name, (wall, cpu) in best.items():
            print(f"{name:8s} {wall:7.2f} s {cpu:7.2f} s")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        primary.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
