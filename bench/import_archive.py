#!/usr/bin/env python3
"""`relay import` of an archive, and a replay of it, against the usual tools.

Builds --size MB of binlog on a sandbox MariaDB primary (relay_throughput.py's workload,
files of --file-mb), then times, on the same files:
  - `cp` of the files (the floor: reading and writing the bytes);
  - `relay import` with sync = "off" and "transaction";
  - replaying the archive into a fresh server with `mariadb-binlog FILES | mariadb` (the
    common point-in-time recovery pipe: one thread);
  - the same replay by a fresh replica (4 parallel workers, optimistic) from a relay that
    serves the imported log, to the primary's last GTID.

    PYTHONPATH=. python bench/import_archive.py [--size 100] [--file-mb 32]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.relay_throughput import build_binlog
from relay.testing.mariadb import MariaDB, find_binary, free_port


def timed(cmd: list[str], **kw: object) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - start


def wait_for(server: MariaDB, gtid: str, timeout: float = 1800) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if str(server.query("SELECT @@gtid_slave_pos")[0][0]) == gtid:
            return time.perf_counter() - start
        time.sleep(0.05)
    raise TimeoutError(f"the replica did not reach {gtid}")


@contextlib.contextmanager
def sandbox_archive(size_mb: int, file_mb: int,
                    ) -> Iterator[tuple[MariaDB, list[str], str]]:
    """A sandbox primary with `size_mb` of binlog in files of `file_mb`, its files, and a
    scratch directory (all removed after)."""
    work = tempfile.mkdtemp(prefix="relay-import-bench-")
    primary = MariaDB(options={"max_binlog_size": str(file_mb << 20)})
    primary.start()
    try:
        build_binlog(primary, size_mb)
        yield primary, [primary.binlog_path(n) for n in primary.binlog_files()], work
    finally:
        primary.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=100, help="MB of binlog")
    ap.add_argument("--file-mb", type=int, default=32, help="max_binlog_size in MB")
    args = ap.parse_args()
    with sandbox_archive(args.size, args.file_mb) as (primary, files, work):
        total = sum(map(os.path.getsize, files))
        gtid = primary.gtid_binlog_pos()
        print(f"archive: {len(files)} files, {total / 1e6:.0f} MB, up to {gtid}")
        results: list[tuple[str, float]] = []
        copy_dir = os.path.join(work, "copy")
        os.makedirs(copy_dir)
        results.append(("cp", timed(["cp", *files, copy_dir])))
        for sync in ("off", "transaction"):
            log_dir = os.path.join(work, f"log-{sync}")
            results.append((f"relay import, sync = {sync}", timed(
                [sys.executable, "-m", "relay.cli", "import", "--quiet", "--sync", sync,
                 "--data-dir", log_dir, *files], capture_output=True)))
        # mariadb-binlog | mariadb into a fresh server
        target = MariaDB(server_id=7)
        target.start()
        try:
            pipe = (f"{find_binary('mariadb-binlog')} --no-defaults {' '.join(files)} | "
                    f"{find_binary('mariadb')} --no-defaults -uroot "
                    f"--socket={target.socket_path}")
            results.append(("mariadb-binlog FILES | mariadb", timed(["bash", "-c", pipe])))
        finally:
            target.cleanup()
        # a replica (4 workers) from a relay serving the imported log
        log_dir = os.path.join(work, "log-transaction")
        relay_port, metrics_port = free_port(), free_port()
        config = os.path.join(work, "relay.toml")
        with open(config, "w") as f:
            f.write(f'[relay]\nserver_id = 4242\ndata_dir = "{log_dir}"\n'
                    f'[relaylog]\nbasename = "{os.path.basename(files[0]).rsplit(".", 1)[0]}"\n'
                    f'[upstream]\nsources = ["{primary.url}"]\n'
                    f'[downstream]\nlisten = "127.0.0.1:{relay_port}"\n'
                    f'[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                    f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
        os.chmod(config, 0o600)
        relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "-c", config],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        replica = MariaDB(server_id=8, options={"slave_parallel_threads": "4",
                                                "slave_parallel_mode": "optimistic"})
        replica.start()
        try:
            time.sleep(1.0)  # the relay opens its log (its recovery reads the segments)
            start = time.perf_counter()
            replica.replicate_from("127.0.0.1", relay_port, user="repl", password="relaypass")
            wait_for(replica, gtid)
            results.append(("a replica (4 workers) replaying it through the relay",
                            time.perf_counter() - start))
        finally:
            replica.cleanup()
            relay.terminate()
            relay.wait(30)
        print(f"{'what':<55} {'seconds':>8} {'MB/s':>8}")
        for what, seconds in results:
            print(f"{what:<55} {seconds:8.2f} {total / 1e6 / seconds:8.0f}")


if __name__ == "__main__":
    main()
