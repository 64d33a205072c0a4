#!/usr/bin/env python3
"""Serving a relay log at several git revisions: `mariadb-binlog --read-from-remote-server
--raw --to-last-log` reading the whole log through a relay of each revision, alternating
in one run.

Builds a binlog of --size MB on a sandbox MariaDB primary (relay_throughput.py's workload),
starts one relay per revision (sync = "off", one segment) and lets each mirror all of it,
then in rounds has mariadb-binlog fetch each relay's log; prints per revision the median
and minimum wall time and the median CPU time the relay process spent serving (from
/proc). The dump's fast path (no rules, checksums kept) is what this measures.

    python bench/serve_revisions.py --rev 5b46194 --rev WORKTREE [--size 140] [--repeat 7]
        [--primary]    # and the primary serving the same copy itself (its mariadbd's CPU)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.downstream_fanout import cpu_seconds, relay_state
from bench.ingest_revisions import checkout, tree_env, write_config
from bench.relay_throughput import build_binlog
from relay.testing.mariadb import MariaDB, find_binary, free_port

USER, PASSWORD = "repl", "relaypass"  # what relay_state logs in as


def start_relay(rev: str, tree: str, server: MariaDB,
                work: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cfg = write_config(work, server, sync="off", listen=port, metrics=free_port(),
                       users=((USER, PASSWORD),))
    proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                            cwd=tree, env=tree_env(rev, tree),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def fetch(port: int, out: str, user: str = USER, password: str = PASSWORD,
          first: str = "relay-bin.000001") -> float:
    """Seconds for mariadb-binlog to copy a server's whole log (the relay's by default)."""
    os.makedirs(out)
    cmd = [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
           "--raw", "--to-last-log", "--host=127.0.0.1", f"--port={port}", f"--user={user}",
           f"--password={password}", f"--result-file={out}/", first]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    elapsed = time.perf_counter() - t0
    shutil.rmtree(out)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", action="append", default=[],
                    help="a git revision, WORKTREE, or PURE (the work tree on the "
                    "pure-Python kernels) (repeatable)")
    ap.add_argument("--size", type=int, default=140, help="binlog size to build, MB")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--primary", action="store_true",
                    help="also copy the log from the primary itself, timing its mariadbd's CPU")
    args = ap.parse_args()
    revs = args.rev or ["HEAD", "WORKTREE"]
    work = tempfile.mkdtemp(prefix="relay-bench-serve-")
    server = MariaDB(base_dir=os.path.join(work, "primary"),
                     options={"max_binlog_size": "256M"})
    relays: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        trees = {rev: checkout(rev, work) for rev in revs}
        server.start()
        print(f"building a {args.size} MB binlog ...", flush=True)
        build_binlog(server, args.size)
        target = server.gtid_binlog_pos()
        for rev, tree in trees.items():
            d = os.path.join(work, f"relay-{rev}")
            os.makedirs(d)
            relays[rev] = start_relay(rev, tree, server, d)
        deadline = time.monotonic() + 600
        for rev, (proc, port) in relays.items():
            while relay_state(port) != target:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the relay of {rev} did not mirror the binlog")
                time.sleep(0.2)
        print(f"each relay holds the primary's binlog up to {target}", flush=True)
        names = [*revs, "primary"] if args.primary else revs
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for i in range(args.repeat):
            if args.primary:
                assert server.process is not None
                before = cpu_seconds(server.process.pid)
                wall = fetch(server.port, os.path.join(work, "out"), server.repl_user,
                             server.repl_password, server.binlog_files()[0])
                cpu = cpu_seconds(server.process.pid) - before
                runs["primary"].append((wall, cpu))
                print(f"  round {i + 1}: {'primary':12s} {wall:5.2f} s wall, "
                      f"mariadbd CPU {cpu:5.2f} s", flush=True)
            for rev, (proc, port) in relays.items():
                before = cpu_seconds(proc.pid)
                wall = fetch(port, os.path.join(work, "out"))
                cpu = cpu_seconds(proc.pid) - before
                runs[rev].append((wall, cpu))
                print(f"  round {i + 1}: {rev:12s} {wall:5.2f} s wall, relay CPU {cpu:5.2f} s",
                      flush=True)
        print(f"\n{'':12s} {'wall median':>12s} {'wall min':>9s} {'CPU median':>11s}")
        for rev in names:
            walls = [r[0] for r in runs[rev]]
            print(f"{rev:12s} {statistics.median(walls):11.2f}s {min(walls):8.2f}s "
                  f"{statistics.median(r[1] for r in runs[rev]):10.2f}s")
    finally:
        for proc, _ in relays.values():
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:  # 5b46194 can miss a SIGTERM (lost cancel)
                proc.kill()
                proc.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
