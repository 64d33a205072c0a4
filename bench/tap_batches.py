#!/usr/bin/env python3
"""What a Spark executor's Python does for the tap, without Spark: the raw frames of a
range fetched from a relay, decoded into transactions, then built into Arrow record
batches (`BatchBuilder`, the typed and JSON forms), timed in one process, for the
executors' kernels (`decode_columns`, `json_images`) and for the row codec they fall back
to (`--codec`, or both side by side: the default).

    python bench/tap_batches.py [--rows 300000] [--runs 3]

Fills a sandbox primary with the OLTP table of bench/tap_spark.py (INT, INT, a latin1
VARCHAR(40), DECIMAL(12,2), DATETIME; transactions of 1,000 rows), lets a relay with the
tap mirror it, then reads the whole range (best of --runs): "frames" only fetches them,
"decode" walks every row change through the row codec, "batches" builds the record
batches of each form.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from tap_spark import filled_tap, read_options

from relay.binlog.changes import RowsStatement
from relay.tap.arrow import BatchBuilder
from relay.tap.frames import RawFrames
from relay.tap.spark import RelayDataSource, TapPartition


def best(runs: int, read: Callable[[], int]) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        n = read()
        times.append(time.perf_counter() - t0)
    return min(times), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--codec", action="store_true", help="only the row codec's way")
    args = ap.parse_args()
    with filled_tap(args.rows, "relay-bench-batches-") as (_work, _relay, endpoint):
        for form in ("typed", "json"):
            opts = read_options(endpoint, form, args.rows)
            parts = [p for p in RelayDataSource(opts).reader(None).partitions()
                     if isinstance(p, TapPartition)]

            def read(stage: str, columnar: bool = True) -> int:
                n = 0
                for p in parts:  # noqa: B023
                    o = p.options
                    with o.client() as tap:
                        raw = tap.fetch_frames(p.start, p.end, tables=o.tables, epoch=p.epoch)
                        if stage == "frames":
                            n += sum(1 for _ in raw)
                            continue
                        frames = RawFrames(raw, hints=o.hints())
                        if stage == "decode":
                            n += sum(1 for item in frames for st in item.tx.statements()
                                     if isinstance(st, RowsStatement) for _ in st.changes())
                            continue
                        builder: Any = p.builder()
                        builder = BatchBuilder(o.form, builder.table, o.batch_rows,
                                               o.evolution, columnar=columnar)
                        for item in frames:
                            n += sum(b.num_rows for b in builder.add_transaction(item))
                        n += builder.flush().num_rows
                return n

            stages: list[tuple[str, Callable[[], int]]] = [
                ("frames", lambda: read("frames")),
                ("decode (row codec)", lambda: read("decode"))]
            if not args.codec:
                stages.append(("batches, kernels", lambda: read("batches", True)))
            stages.append(("batches, row codec", lambda: read("batches", False)))
            for label, run in stages:
                seconds, n = best(args.runs, run)
                rate = f"{args.rows / seconds:,.0f} rows/s" if n >= args.rows else f"{n} frames"
                print(f"  {form:5} {label:28} {seconds:6.2f} s  {rate}", flush=True)

if __name__ == "__main__":
    main()
