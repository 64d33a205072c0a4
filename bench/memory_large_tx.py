#!/usr/bin/env python3
"""Peak RSS of the relay while one huge transaction passes (default 1 GB).

Builds the transaction on a sandbox primary, runs `relay run` as a subprocess mirroring
it, and prints the relay's peak resident memory (VmHWM) and its RSS sampled during the
copy. The relay never holds a transaction in memory, so this stays flat.

    python bench/memory_large_tx.py [--mb 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relay.binlog.gtid import GtidState
from relay.relaylog.naming import read_index
from relay.relaylog.recovery import scan_segment
from relay.testing.mariadb import MariaDB


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="transaction size in MB")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-mem-")
    server = MariaDB(base_dir=os.path.join(work, "primary"),
                     options={"max_binlog_cache_size": "4G", "max_binlog_size": "1G"})
    try:
        server.start()
        print(f"building one {args.mb} MB transaction ...", flush=True)
        server.execute_many([
            "CREATE DATABASE m", "CREATE TABLE m.t (id INT PRIMARY KEY, v LONGBLOB)",
        ])
        rows = args.mb
        with server.root() as conn, conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO m.t SELECT seq, REPEAT('x', 1048576) "
                        f"FROM mysql.seq_1_to_{rows}")
            cur.execute("COMMIT")
        target = GtidState.parse(server.gtid_binlog_pos())
        data = os.path.join(work, "relay")
        cfg = os.path.join(work, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'[relay]\ndata_dir = "{data}"\n[upstream]\nsources = ["{server.url}"]\n'
                    f'start = "earliest"\n[relaylog]\nsync = "off"\nsegment_size = "2GiB"\n')
        proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples = []
        t0 = time.monotonic()
        while True:
            time.sleep(0.1)
            samples.append(status_kb(proc.pid, "VmRSS"))
            names = read_index(data, "relay-bin") if os.path.isdir(data) else []
            if names and scan_segment(os.path.join(data, names[-1])).state == target:
                break
            if time.monotonic() - t0 > 600:
                raise SystemExit("timed out")
        elapsed = time.monotonic() - t0
        peak = status_kb(proc.pid, "VmHWM")
        proc.terminate()
        proc.wait(30)
        size = sum(os.path.getsize(os.path.join(data, n)) for n in read_index(data, "relay-bin"))
        print(f"relay log: {size / 1e6:.0f} MB in {elapsed:.1f} s (incl. start-up and polling)")
        print(f"relay RSS while copying: min {min(samples) / 1024:.0f} MB, "
              f"max {max(samples) / 1024:.0f} MB; peak (VmHWM) {peak / 1024:.0f} MB "
              "(target < 150 MB)")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
