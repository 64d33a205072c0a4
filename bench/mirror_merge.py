#!/usr/bin/env python3
"""What a `relay mirror` batch costs: rows rewritten per change and seconds per merge,
by key buckets, for batches of several sizes.

    python bench/mirror_merge.py [--rows 300000] [--batches 10,100,1000,10000]
                                 [--buckets 1,auto,64]

Fills a sandbox primary with --rows rows (bench/tap_spark.py's table), starts a relay
with the tap, snapshots the table into a Delta mirror per bucket setting (in one Spark
session on local[2], through relay.tap.mirror as `relay mirror` runs it), then for each
batch size updates that many random rows and lets each mirror catch up (one batch),
printing the rows the merge rewrote (copied unchanged into new files) per change and the
time of the run (a query's start included). delta-rs writes no deletion vectors: a merge
rewrites every file holding one of its keys, so with random keys the cost per change
falls with more buckets until a batch touches every bucket.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.tap_spark import fill, local_spark, snapshot_primary, tap_relay, wait_tap_holds
from relay.tap.mirror import BatchReport, MirrorJob, MirrorSettings
from relay.testing.mariadb import MariaDB


def catch_up(spark: object, settings: MirrorSettings) -> list[BatchReport]:
    job = MirrorJob(spark, settings)
    assert job.run(progress_every=3600) == 0
    return [r for w in job.writers.values() for r in w.reports]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batches", default="10,100,1000,10000")
    ap.add_argument("--buckets", default="1,auto,64")
    args = ap.parse_args()
    with snapshot_primary("relay-bench-mirror-") as (work, primary):
        print(f"filling the primary with {args.rows} rows ...", flush=True)
        fill(primary, args.rows)
        with tap_relay(work, primary, start="current") as endpoint:
            primary.execute_many(["INSERT INTO bench.orders VALUES (0, 0, 'mark', 0, NOW())"])
            wait_tap_holds(endpoint, primary.gtid_binlog_pos())
            measure(args, work, primary, endpoint)


def measure(args: argparse.Namespace, work: str, primary: MariaDB, endpoint: str) -> None:
    spark = local_spark()
    source = f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:{primary.port}"
    settings = {}
    for b in args.buckets.split(","):
        settings[b] = MirrorSettings(
            endpoint=endpoint, tables=("bench.orders",), target=os.path.join(work, f"delta-{b}"),
            checkpoint=os.path.join(work, f"ck-{b}"), source=source,
            buckets=0 if b == "auto" else int(b), chunk_rows=65_536)
        t0 = time.perf_counter()
        reports = catch_up(spark, settings[b])
        print(f"buckets {b}: snapshot into Delta in {time.perf_counter() - t0:.1f} s "
              f"({sum(r.upserts for r in reports):,} rows)", flush=True)
    rnd = random.Random(3)
    print("\nbatch      buckets  rewritten rows  per change  run s")
    for size in (int(n) for n in args.batches.split(",")):
        ids = rnd.sample(range(1, args.rows + 1), size)
        for i in range(0, size, 1000):
            primary.execute_many(["UPDATE bench.orders SET k = k + 1 WHERE id IN ("
                                  + ",".join(map(str, ids[i:i + 1000])) + ")"])
        wait_tap_holds(endpoint, primary.gtid_binlog_pos())
        for b, s in settings.items():
            t0 = time.perf_counter()
            reports = [r for r in catch_up(spark, s) if r.changes]
            took = time.perf_counter() - t0
            rewritten = sum(r.rewritten for r in reports)
            changes = sum(r.changes for r in reports)
            print(f"{size:>6,}  {b:>9}  {rewritten:>14,}  {rewritten / changes:>10,.1f}"
                  f"  {took:>7.1f}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
