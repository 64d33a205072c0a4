#!/usr/bin/env python3
"""Relay copy throughput vs `mysqlbinlog --read-from-remote-server --raw` on one binlog.

Builds a binlog of --size MB on a sandbox MariaDB primary (small single-row transactions,
bulk inserts, updates, deletes, a few large transactions), then in the same run measures:
  (a) mysqlbinlog --raw copying all of it,
  (b) the relay copying it into its log with sync = "off", and
  (c) the same with sync = "transaction",
and prints MB/s, events/s and the ratios b/a and c/a. --profile adds a cProfile of (b).

    python bench/relay_throughput.py [--size 200] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relay.binlog.gtid import GtidState
from relay.config import Source, StartMode, SyncPolicy
from relay.relaylog.log import RelayLog
from relay.testing.mariadb import MariaDB, find_binary
from relay.upstream.runner import Upstream, UpstreamSettings


def build_binlog(server: MariaDB, target_mb: int) -> None:
    stmts = [
        "CREATE DATABASE IF NOT EXISTS b",
        "CREATE TABLE b.small (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64), n INT)",
        "CREATE TABLE b.wide (id INT PRIMARY KEY, payload VARCHAR(1000), x BIGINT, d DATETIME)",
        """CREATE PROCEDURE b.small_tx(n INT) BEGIN DECLARE i INT DEFAULT 0;
           WHILE i < n DO INSERT INTO b.small (v, n) VALUES (CONCAT('row ', i), i);
           SET i = i + 1; END WHILE; END""",
    ]
    server.execute_many(stmts)
    base = 0
    while True:
        size = sum(os.path.getsize(server.binlog_path(f)) for f in server.binlog_files())
        print(f"  binlog so far: {size / 1e6:.0f} MB", flush=True)
        if size >= target_mb * 1e6:
            return
        server.execute_many([
            "CALL b.small_tx(20000)",  # 20k one-row transactions
            f"INSERT INTO b.wide SELECT seq + {base}, REPEAT('p', 300 + seq % 600), seq, NOW() "
            "FROM mysql.seq_1_to_40000",  # one bulk transaction of ~30 MB
            f"UPDATE b.wide SET x = x + 1 WHERE id > {base} AND id % 4 = 0",
            f"DELETE FROM b.wide WHERE id > {base} AND id % 9 = 0",
            "UPDATE b.small SET n = n + 1 WHERE id % 50 = 0",
        ])
        base += 40000


def total_events(server: MariaDB) -> int:
    count = 0
    for name in server.binlog_files():
        with open(server.binlog_path(name), "rb") as f:
            data = f.read()
        pos = 4
        while pos + 19 <= len(data):
            pos += int.from_bytes(data[pos + 9 : pos + 13], "little")
            count += 1
    return count


def run_mysqlbinlog(server: MariaDB, outdir: str) -> float:
    cmd = [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server", "--raw",
           "--to-last-log", "--host=127.0.0.1", f"--port={server.port}",
           f"--user={server.repl_user}", f"--password={server.repl_password}",
           f"--result-file={outdir}/", server.binlog_files()[0]]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


async def relay_copy(server: MariaDB, data_dir: str, sync: str) -> tuple[float, RelayLog]:
    target = GtidState.parse(server.gtid_binlog_pos())
    log = RelayLog(data_dir, sync=SyncPolicy.parse(sync), segment_size=1 << 30)
    log.open()
    log.start()
    up = Upstream(UpstreamSettings((Source.parse(server.url),), StartMode.EARLIEST, 4242), log)
    t0 = time.perf_counter()
    task = asyncio.create_task(up.run())
    while log.state != target or log.visible[1] < log.appender().committed:
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - t0
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    log.close()
    return elapsed, log


def run_relay(server: MariaDB, data_dir: str, sync: str, profile: bool) -> float:
    import uvloop

    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    elapsed, _ = uvloop.run(relay_copy(server, data_dir, sync))
    if prof:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(out.getvalue())
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=200, help="binlog size to build, MB")
    ap.add_argument("--profile", action="store_true", help="cProfile the sync=off relay run")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each; the best is kept")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-")
    server = MariaDB(base_dir=os.path.join(work, "primary"),
                     options={"max_binlog_size": "256M", "binlog_checksum": "CRC32"})
    try:
        server.start()
        print(f"building a {args.size} MB binlog on MariaDB at 127.0.0.1:{server.port} ...")
        build_binlog(server, args.size)
        size = sum(os.path.getsize(server.binlog_path(f)) for f in server.binlog_files())
        events = total_events(server)
        print(f"binlog: {size / 1e6:.1f} MB, {events} events, {len(server.binlog_files())} "
              f"file(s), avg event {size / events:.0f} bytes\n")
        names = ("mysqlbinlog --raw", "relay sync=off", "relay sync=transaction")
        runs: dict[str, list[float]] = {name: [] for name in names}
        # Interleaved rounds, best of each: page-cache writeback from one run lands on
        # whichever runs next, so a fixed order would favour one side.
        for i in range(args.repeat):
            for name in names:
                d = os.path.join(work, f"run-{i}")
                os.makedirs(d)
                if name.startswith("mysqlbinlog"):
                    t = run_mysqlbinlog(server, d)
                else:
                    sync = name.split("=")[1]
                    t = run_relay(server, d, sync, args.profile and sync == "off" and i == 0)
                shutil.rmtree(d)
                subprocess.run(["sync"], check=False)
                print(f"  round {i + 1}: {name:24s} {t:6.2f} s", flush=True)
                runs[name].append(t)
        print()
        results = {name: min(ts) for name, ts in runs.items()}
        for name in names:
            best = results[name]
            median = statistics.median(runs[name])
            print(f"{name:24s} best {best:5.2f} s  {size / best / 1e6:6.1f} MB/s  "
                  f"{events / best / 1e6:5.2f} M events/s   median {size / median / 1e6:6.1f} "
                  "MB/s", flush=True)
        base = results["mysqlbinlog --raw"]
        med = {name: statistics.median(ts) for name, ts in runs.items()}
        base_med = med["mysqlbinlog --raw"]
        print(f"\nratio of medians: sync=off {base_med / med['relay sync=off']:.2f}x, "
              f"sync=transaction {base_med / med['relay sync=transaction']:.2f}x")
        print(f"ratio relay(sync=off)/mysqlbinlog:         "
              f"{base / results['relay sync=off']:.2f}x (target >= 0.8x)")
        print(f"ratio relay(sync=transaction)/mysqlbinlog: "
              f"{base / results['relay sync=transaction']:.2f}x (target >= 0.5x)")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
