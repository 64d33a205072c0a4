#!/usr/bin/env python3
"""The suite's snapshot test at the issue's bench size: a table of --rows rows keyed by
BIGINT UNSIGNED values near 2^64, snapshotted with `snapshot = "initial"` into Parquet on
`local[2]` while a workload updates, deletes and inserts rows of it (the chunk being read
included), then streamed to the end; the records reduced per key (relay.tap.spark.
latest_per_key, as a mirror table would merge them) must equal the primary's table, row
for row and value for value. Prints the rows, the workload's changes, the time of each
phase and the outcome; exits 1 on a difference.

    python bench/snapshot_mirror.py [--rows 2000000] [--chunk-rows 65536] [--rate 300]

The comparison streams both sides in key order (the mirror sorted by Spark, the table
read with an unbuffered cursor), so it holds no side in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pymysql
import pymysql.cursors

from bench.tap_spark import local_spark, snapshot_primary, start_tap_relay, wait_tap_holds
from relay.binlog.jsonvalue import datetime_text, jsonable
from relay.testing.mariadb import MariaDB

TOP = (1 << 64) - 1


def fill(primary: MariaDB, rows: int) -> None:
    """snap.big: every third key small, the others TOP - 7 i (near 2^64)."""
    primary.execute_many([
        "CREATE DATABASE snap",
        "CREATE TABLE snap.big (id BIGINT UNSIGNED PRIMARY KEY, v INT, s VARCHAR(40), "
        "d DECIMAL(65,30), t DATETIME(6))"])
    step = 100_000
    for lo in range(0, rows, step):
        hi = min(rows, lo + step) - 1
        primary.execute_many([
            f"INSERT INTO snap.big SELECT IF(seq % 3, {TOP} - seq * 7, seq), seq, "
            f"CONCAT('row ', seq), seq + 0.000000000000000000000000000001, "
            f"TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000 "
            f"MICROSECOND FROM snap.seq_{lo}_to_{hi}"])


class Workload(threading.Thread):
    """Updates, deletes and inserts of random keys at about `rate` a second."""

    def __init__(self, primary: MariaDB, rows: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.primary, self.rows, self.pause = primary, rows, 1.0 / rate
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(11)
        try:
            with contextlib.closing(self.primary.root()) as conn, conn.cursor() as cur:
                while not self.stop.is_set():
                    i = rnd.randrange(self.rows)
                    key = TOP - i * 7 if i % 3 else i
                    kind = rnd.randrange(4)
                    if kind == 0:
                        cur.execute("DELETE FROM snap.big WHERE id = %s", (key,))
                    elif kind == 1:
                        cur.execute("INSERT IGNORE INTO snap.big VALUES (%s, -1, 'new', 1.5, "
                                    "NOW(6))", (TOP - rnd.randrange(self.rows * 7),))
                    else:
                        cur.execute("UPDATE snap.big SET v = v + 1, s = CONCAT('u', s) "
                                    "WHERE id = %s", (key,))
                    self.done += 1
                    time.sleep(self.pause)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def primary_rows(primary: MariaDB) -> Iterator[tuple[int, dict[str, Any]]]:
    """The table in key order, each row as the JSON images print it."""
    with contextlib.closing(primary.root()) as conn, \
            conn.cursor(pymysql.cursors.SSDictCursor) as cur:
        cur.execute("SELECT * FROM snap.big ORDER BY id")
        fsp = {str(d[0]): int(d[5] or 0) for d in cur.description}
        for row in cur:
            yield int(row["id"]), {k: datetime_text(v, fsp[k]) if isinstance(v, datetime)
                                   else jsonable(v) for k, v in row.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--chunk-rows", type=int, default=65536)
    ap.add_argument("--rate", type=float, default=300.0, help="workload changes a second")
    args = ap.parse_args()
    with snapshot_primary("relay-bench-snapmirror-") as (work, primary):
        return run(args, work, primary)


def run(args: argparse.Namespace, work: str, primary: MariaDB) -> int:
    relay = None
    try:
        t0 = time.perf_counter()
        fill(primary, args.rows)
        print(f"{args.rows:,} rows written in {time.perf_counter() - t0:.1f}s", flush=True)
        relay, endpoint = start_tap_relay(work, primary, start="current")
        primary.execute_many(["CREATE TABLE snap.mark (id INT PRIMARY KEY)"])
        wait_tap_holds(endpoint, primary.gtid_binlog_pos())
        spark = local_spark()
        out, ck = os.path.join(work, "out"), os.path.join(work, "ck")
        source = f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:{primary.port}"

        def stream() -> None:
            q = (spark.readStream.format("relay").option("endpoint", endpoint)
                 .option("table", "snap.big").option("images", "json")
                 .option("snapshot", "initial").option("snapshotSource", source)
                 .option("snapshotChunkRows", args.chunk_rows)
                 .option("name", "bench-snapshot-mirror").load()
                 .writeStream.format("parquet").option("checkpointLocation", ck)
                 .trigger(availableNow=True).start(out))
            q.awaitTermination()
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))

        load = Workload(primary, args.rows, args.rate)
        load.start()
        t0 = time.perf_counter()
        try:
            stream()
        finally:
            load.stop.set()
            load.join(30)
        if load.error is not None:
            raise load.error
        snap_wall = time.perf_counter() - t0
        wait_tap_holds(endpoint, primary.gtid_binlog_pos())
        t0 = time.perf_counter()
        stream()  # the changes the workload made after the snapshot's batches
        tail_wall = time.perf_counter() - t0
        from relay.tap.spark import latest_per_key

        records = spark.read.parquet(out)
        snapshot_rows = records.where("op = 'snapshot'").count()
        changes = records.where("op IN ('insert', 'update', 'delete')").count()
        print(f"snapshot with the workload: {snap_wall:.1f}s, {snapshot_rows:,} snapshot rows "
              f"({snapshot_rows / snap_wall:,.0f} rows/s), {load.done:,} changes made during "
              f"it; the rest of the stream: {tail_wall:.1f}s; {changes:,} change records")
        t0 = time.perf_counter()
        latest = (latest_per_key(records, ["id"]).where("op = 'upsert'")
                  .selectExpr("CAST(id AS DECIMAL(20,0)) AS id", "image").orderBy("id"))
        mirror = ((int(r["id"]), json.loads(r["image"])) for r in latest.toLocalIterator())
        compared, differ, examples = 0, 0, []
        for want, got in itertools.zip_longest(primary_rows(primary), mirror):
            compared += 1
            if want != got:  # (a missing row shifts the pairs after it: all differ)
                differ += 1
                if len(examples) < 5:
                    examples.append((want, got))
        print(f"compared {compared:,} rows in {time.perf_counter() - t0:.1f}s: "
              f"{differ} differ")
        for want, got in examples:
            print(f"  primary {want}\n  mirror  {got}")
        spark.stop()
        return 1 if differ else 0
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)


if __name__ == "__main__":
    sys.exit(main())
