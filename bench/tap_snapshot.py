#!/usr/bin/env python3
"""The tap's snapshot: rows/s from a primary's table into Parquet on local[2], with the
primary's CPU and queries per second while it runs (the mirror's merges:
bench/mirror_merge.py).

    python bench/tap_snapshot.py [--rows 2000000] [--chunk-rows 8192] [--runs 3]
                                 [--images json|typed]

Fills a sandbox primary with --rows rows of an OLTP-like table (the same as
bench/tap_spark.py's), starts a relay with the tap from the primary's current position
(so the relay log holds none of those rows: they come from the snapshot), warms Spark up,
then times batch reads with snapshot = initial into Parquet (the best of --runs). The
primary's CPU is mariadbd's user + system time from /proc; its queries are the Questions
counter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.tap_spark import (
    cpu_seconds,
    fill,
    local_spark,
    snapshot_primary,
    start_tap_relay,
    wait_tap_holds,
)
from relay.testing.mariadb import MariaDB


def questions(primary: MariaDB) -> int:
    return int(str(primary.query("SHOW GLOBAL STATUS LIKE 'Questions'")[0][1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--chunk-rows", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=3,
                    help="timed reads of the whole snapshot; the best is reported (Spark's "
                         "JVM keeps getting faster over the first reads of a session)")
    ap.add_argument("--images", choices=("json", "typed"), default="json")
    args = ap.parse_args()
    with snapshot_primary("relay-bench-snapshot-") as (work, primary):
        run(args, work, primary)


def run(args: argparse.Namespace, work: str, primary: MariaDB) -> None:
    relay = None
    try:
        print(f"filling the primary with {args.rows} rows ...", flush=True)
        fill(primary, args.rows)
        relay, endpoint = start_tap_relay(work, primary, start="current")
        primary.execute_many(["CREATE TABLE bench.mark (id INT PRIMARY KEY)",
                              "INSERT INTO bench.mark VALUES (1)"])
        wait_tap_holds(endpoint, primary.gtid_binlog_pos())
        spark = local_spark()
        source = f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:{primary.port}"
        opts = {"endpoint": endpoint, "tables": "bench.orders", "images": args.images,
                "snapshot": "initial", "snapshotSource": source,
                "snapshotChunkRows": str(args.chunk_rows)}
        if args.images == "typed":
            opts["table"] = opts.pop("tables")
        spark.read.format("relay").options(**{
            "endpoint": endpoint, "tables": "bench.mark", "snapshot": "initial",
            "snapshotSource": source}).load() \
            .write.format("noop").mode("overwrite").save()  # warm-up: JVM, workers
        out = os.path.join(work, "snapshot")
        pid = primary.process.pid if primary.process else 0
        best = None
        for run in range(args.runs):
            cpu0, q0 = cpu_seconds(pid), questions(primary)
            t0 = time.perf_counter()
            spark.read.format("relay").options(**opts).load().write.mode("overwrite") \
                .parquet(out)
            wall = time.perf_counter() - t0
            cpu, q = cpu_seconds(pid) - cpu0, questions(primary) - q0
            n = spark.read.parquet(out).where("op = 'snapshot'").count()
            assert n == args.rows, (n, args.rows)
            print(f"  read {run + 1}: {wall:.1f}s = {n / wall:,.0f} rows/s", flush=True)
            if best is None or wall < best[0]:
                best = (wall, cpu, q)
        assert best is not None
        wall, cpu, q = best
        print(f"\nsnapshot of {args.rows:,} rows ({args.images}) -> Spark local[2] -> Parquet, "
              f"best of {args.runs}: {wall:.1f}s = {args.rows / wall:,.0f} rows/s (chunks of "
              f"{args.chunk_rows})")
        print(f"primary during it: {cpu / wall * 100:.0f}% of a core, {q / wall:,.1f} "
              f"queries/s ({q} queries)")
        spark.stop()
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)


if __name__ == "__main__":
    main()
