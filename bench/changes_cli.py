#!/usr/bin/env python3
"""`relay changes` as a user runs it against python-mysql-replication doing the same job:
JSON lines of every row change of a binlog into a file.

    pip install mysql-replication     # the contender (not a relay dependency)
    python bench/changes_cli.py [--size 60] [--rev WORKTREE --rev PURE --rev <commit>]
    python bench/changes_cli.py --server mysql-9.7 [--rows 100000] [--rev ...]

Builds a binlog of --size MB on a sandbox MariaDB primary (relay_throughput.py's workload:
one-row transactions, bulk inserts of a wide table, updates, deletes), or with --server a
binlog of row_decode.py's families on that build (MySQL 9.7: its JSON documents too),
--rows rows each, then in rounds:

  relay <rev>   `python -m relay.cli changes FILE > out.jsonl` of each revision's tree
                (WORKTREE: this one; PURE: this one on the pure-Python kernels)
  pymysqlrepl   python-mysql-replication's BinLogStreamReader over the replica protocol
                from the same primary, every row as json.dumps(..., default=str) into a
                file (its documented way to print events)

and prints per contestant the median wall time, the rows written and the ratio.
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

from bench.ingest_revisions import checkout, tree_env
from bench.relay_throughput import build_binlog
from bench.row_decode import fill
from relay.testing.builds import build
from relay.testing.mariadb import MariaDB, machine_build

_PYMYSQLREPL = r"""
import json, sys
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import RotateEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
port, user, password, log_file, end, out = sys.argv[1:7]  # then the flavour
stream = BinLogStreamReader(
    connection_settings={"host": "127.0.0.1", "port": int(port), "user": user,
                         "password": password},
    server_id=77002, blocking=True, resume_stream=True, log_file=log_file, log_pos=4,
    only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, RotateEvent],
    freeze_schema=True, enable_logging=False, is_mariadb=sys.argv[7] == "mariadb")
mysql = sys.argv[7] == "mysql"


def keys_as_text(v):  # (its JSON documents come with bytes keys, which json.dumps refuses)
    if isinstance(v, dict):
        return {(k.decode() if isinstance(k, bytes) else k): keys_as_text(x)
                for k, x in v.items()}
    if isinstance(v, list):
        return [keys_as_text(x) for x in v]
    return v


n = 0
with open(out, "w") as f:
    for ev in stream:
        if isinstance(ev, RotateEvent):  # the file's closing ROTATE ends the job
            if ev.packet.log_pos >= int(end):
                break
            continue
        for row in ev.rows:
            line = {"schema": ev.schema, "table": ev.table, "timestamp": ev.timestamp,
                    "pos": ev.packet.log_pos}
            if isinstance(ev, UpdateRowsEvent):
                line["op"], line["before"], line["after"] = ("update", row["before_values"],
                                                             row["after_values"])
            elif isinstance(ev, WriteRowsEvent):
                line["op"], line["before"], line["after"] = "insert", None, row["values"]
            else:
                line["op"], line["before"], line["after"] = "delete", row["values"], None
            if mysql:
                line = keys_as_text(line)
            f.write(json.dumps(line, default=str, ensure_ascii=False) + "\n")
            n += 1
stream.close()
print(n)
"""


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=60, help="binlog size to build, MB")
    ap.add_argument("--rev", action="append", default=[],
                    help="a git revision, WORKTREE or PURE (repeatable; default WORKTREE)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--server", default=None,
                    help="a server build (relay/testing/builds.py): mysql-9.7, mariadb-11.8")
    ap.add_argument("--no-peer", action="store_true", help="leave python-mysql-replication out")
    ap.add_argument("--rows", type=int, default=100_000,
                    help="with --server: rows of each of row_decode.py's families")
    args = ap.parse_args()
    revs = args.rev or ["WORKTREE"]
    work = tempfile.mkdtemp(prefix="relay-bench-changes-")
    server = MariaDB(base_dir=os.path.join(work, "primary"),
                     options={"max_binlog_size": "1G", "binlog_row_metadata": "FULL"},
                     build=machine_build() if args.server is None else build(args.server))
    try:
        trees = {rev: checkout(rev, work) for rev in revs}
        server.start()
        server.execute_many(["FLUSH BINARY LOGS"])
        log_file = server.binlog_files()[-1]
        if args.server is None:
            print(f"building a {args.size} MB binlog ...", flush=True)
            build_binlog(server, args.size)
            server.execute_many(["FLUSH BINARY LOGS"])
        else:
            server.execute_many([f"GRANT SELECT ON *.* TO '{server.repl_user}'@'%'"])
            log_file = fill(server, args.rows)
            server.execute_many(["FLUSH BINARY LOGS"])
        path = server.binlog_path(log_file)
        end = os.path.getsize(path)
        print(f"{log_file}: {end / 1e6:.0f} MB", flush=True)
        out = os.path.join(work, "out.jsonl")
        times: dict[str, list[float]] = {name: [] for name in [*revs, "pymysqlrepl"]}
        rows: dict[str, int] = {}
        for i in range(args.repeat):
            for rev in revs:
                t0 = time.perf_counter()
                with open(out, "wb") as f:
                    subprocess.run([sys.executable, "-m", "relay.cli", "changes", path],
                                   cwd=trees[rev], env=tree_env(rev, trees[rev]), stdout=f,
                                   check=True)
                times[rev].append(time.perf_counter() - t0)
                rows[rev] = count_lines(out)
                print(f"  round {i + 1}: relay {rev:10s} {times[rev][-1]:6.2f} s, "
                      f"{rows[rev]:,} lines", flush=True)
            if args.no_peer:
                continue
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", _PYMYSQLREPL, str(server.port),
                                  server.repl_user, server.repl_password, log_file, str(end),
                                  out, "mysql" if server.mysql else "mariadb"],
                                 capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(f"python-mysql-replication failed:\n{res.stderr[-3000:]}")
            times["pymysqlrepl"].append(time.perf_counter() - t0)
            rows["pymysqlrepl"] = int(res.stdout.split()[-1])
            print(f"  round {i + 1}: pymysqlrepl       {times['pymysqlrepl'][-1]:6.2f} s, "
                  f"{rows['pymysqlrepl']:,} rows", flush=True)
        peer = statistics.median(times["pymysqlrepl"]) if times["pymysqlrepl"] else 0.0
        print(f"\n{'':18s}{'median':>9s}{'rows/s':>12s}{'vs pymysqlrepl':>16s}")
        for name, ts in times.items():
            if not ts:
                continue
            med = statistics.median(ts)
            label = name if name == "pymysqlrepl" else f"relay {name}"
            print(f"{label:18s}{med:8.2f}s{rows[name] / med:12,.0f}{peer / med:15.2f}x")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
