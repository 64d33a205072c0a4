#!/usr/bin/env python3
"""The Spark tap end to end: rows/s from the relay log into Parquet on local[2], and the
relay's CPU per million rows served.

    python bench/tap_spark.py [--rows 2000000] [--runs 3] [--images json|typed]

Fills a sandbox primary with --rows row changes of an OLTP-like table (id, k, a 40-byte
string, a DECIMAL, a DATETIME; transactions of 1,000 rows), lets a relay with the tap
mirror them, warms Spark up with a small read, then times batch reads of everything into
Parquet (best of --runs), and reads the relay process's CPU time (user + system, from
/proc) before and after each run: that is what the tap costs the database host. The
index walk (counting rows once per transaction) happens in the first run; later runs
show the steady cost of serving.
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
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relay.tap.client import TapClient
from relay.testing.mariadb import MariaDB, free_port


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def snapshot_primary(prefix: str) -> Iterator[tuple[str, MariaDB]]:
    """A work directory and a sandbox primary whose replication user may also SELECT (the
    snapshot's reads); both go afterwards."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        primary = MariaDB(base_dir=os.path.join(work, "primary")).start()
        try:
            primary.execute_many([f"GRANT SELECT ON *.* TO '{primary.repl_user}'@'%'"])
            yield work, primary
        finally:
            primary.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fill(primary: MariaDB, rows: int) -> None:
    primary.execute_many([
        "CREATE DATABASE bench",
        "CREATE TABLE bench.orders (id INT PRIMARY KEY, k INT, note VARCHAR(40), "
        "amount DECIMAL(12,2), at DATETIME)"])
    done = 0
    while done < rows:
        n = min(100_000, rows - done)
        primary.execute_many([
            f"INSERT INTO bench.orders SELECT seq, seq % 1000, "
            f"CONCAT('order note number ', seq, ' ', REPEAT('x', seq % 10)), seq / 100, "
            f"NOW() FROM bench.seq_{done + i + 1}_to_{done + i + 1000}"
            for i in range(0, n, 1000)])
        done += n
        print(f"  {done} rows written", flush=True)


def start_tap_relay(work: str, primary: MariaDB, start: str = "earliest",
                    ) -> tuple[subprocess.Popen[bytes], str]:
    """A relay of `primary` with its tap on a free port: (process, tap endpoint)."""
    port = free_port()
    cfg = os.path.join(work, "relay.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{work}/relay"\n[upstream]\n'
                f'sources = ["{primary.url}"]\nstart = "{start}"\n'
                f'[relaylog]\nsync = "off"\nsegment_size = "1GiB"\n'
                f'[downstream]\nlisten = "127.0.0.1:{free_port()}"\n'
                f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n'
                f'[tap]\nlisten = "127.0.0.1:{port}"\n')
    with open(os.path.join(work, "relay.log"), "wb") as log:
        relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                                 stdout=subprocess.DEVNULL, stderr=log)
    return relay, f"127.0.0.1:{port}"


@contextlib.contextmanager
def tap_relay(work: str, primary: MariaDB, start: str = "earliest") -> Iterator[str]:
    """start_tap_relay for a `with` block: its tap endpoint; the relay stops after."""
    relay, endpoint = start_tap_relay(work, primary, start)
    try:
        yield endpoint
    finally:
        relay.terminate()
        relay.wait(30)


def wait_tap_holds(endpoint: str, gtid_state: str) -> None:
    """Wait until the tap serves everything up to `gtid_state`."""
    while True:
        try:
            with TapClient(endpoint) as tap:
                if tap.status()["gtid_state"] == gtid_state:
                    return
        except OSError:
            pass
        time.sleep(0.5)


def local_spark() -> Any:
    """A local[2] session with format("relay") registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from relay.tap.spark import register

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@contextlib.contextmanager
def filled_tap(rows: int, prefix: str, keep: bool = False,
               ) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """A sandbox primary filled with `rows` changes of bench.orders and a relay whose tap
    holds them all: (the work directory, the relay process, its tap endpoint). Both stop
    afterwards, and the work directory goes unless `keep`."""
    work = tempfile.mkdtemp(prefix=prefix)
    primary = MariaDB(base_dir=os.path.join(work, "primary")).start()
    relay = None
    try:
        print(f"filling the primary with {rows} rows ...", flush=True)
        fill(primary, rows)
        relay, endpoint = start_tap_relay(work, primary)
        wait_tap_holds(endpoint, primary.gtid_binlog_pos())
        yield work, relay, endpoint
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)
        primary.stop()
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def read_options(endpoint: str, images: str, max_rows: int) -> dict[str, str]:
    """format("relay") options reading bench.orders in `images` form (typed: its table)."""
    opts = {"endpoint": endpoint, "tables": "bench.orders",
            "maxRowsPerPartition": str(max_rows)}
    if images == "typed":
        opts["table"] = "bench.orders"
    else:
        opts["images"] = images
    return opts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", default="json", choices=["json", "map", "typed"])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    with filled_tap(args.rows, "relay-bench-tap-", args.keep) as (work, relay, endpoint):
        spark = local_spark()
        opts = read_options(endpoint, args.images, max(args.rows // 4, 1000))
        cpu0 = cpu_seconds(relay.pid)
        with TapClient(endpoint) as tap:  # the tap's first look walks the log once
            first = tap.resolve("earliest")
            small_end = tap.plan(first, "latest", max_rows=20_000)["end"]
        walk = cpu_seconds(relay.pid) - cpu0
        spark.read.format("relay").options(**opts, end=str(small_end)).load() \
            .write.format("noop").mode("overwrite").save()  # warm-up: JVM, workers
        results = []
        for run in range(1, args.runs + 1):
            out = os.path.join(work, f"out{run}")
            cpu0 = cpu_seconds(relay.pid)
            t0 = time.perf_counter()
            df = spark.read.format("relay").options(**opts).load()
            df.write.parquet(out)
            wall = time.perf_counter() - t0
            cpu = cpu_seconds(relay.pid) - cpu0
            n = spark.read.parquet(out).count()
            assert n == args.rows, (n, args.rows)
            results.append((wall, cpu))
            print(f"  run {run}: {n} rows in {wall:.2f}s = {n / wall:,.0f} rows/s; relay CPU "
                  f"{cpu:.2f}s = {cpu / n * 1e6:.2f} s per million rows", flush=True)
            shutil.rmtree(out)
        best = min(results)
        steady = min(c for _, c in results[1:]) if len(results) > 1 else results[0][1]
        print(f"\nrelay log -> tap -> Spark local[2] -> Parquet ({args.images} images): "
              f"{args.rows / best[0]:,.0f} rows/s (best of {args.runs})")
        print(f"relay CPU per million rows served: {steady / args.rows * 1e6:.2f} s; "
              f"indexing the log once (counting rows): {walk / args.rows * 1e6:.2f} s per "
              "million rows")
        spark.stop()


if __name__ == "__main__":
    main()
