#!/usr/bin/env python3
"""Row changes from a relay's tap into Parquet with Spark Structured Streaming, exactly
once: a job to copy.

    python examples/spark_tap_to_parquet.py --endpoint relay-host:4000 \\
        --out /data/changes --checkpoint /data/changes-checkpoint [--tables 'shop.%'] \\
        [--trigger available-now | --trigger 10s] [--max-rows-per-batch 200000] \\
        [--master spark://spark-master:7077]

Stop it, kill it (even with kill -9) and start it again with the same --checkpoint: it
goes on from the last batch Spark committed; the batch a crash cut is read again with the
same range, and Spark's file sink lists only complete batches in <out>/_spark_metadata.
Read the output through Spark (spark.read.parquet(out)), not by listing the directory: a
crash can leave part files of an unfinished batch there, which Spark ignores.

The relay needs [tap] listen = "0.0.0.0:4000" with [tap.tls] and [[tap.users]] (beyond
loopback the relay refuses a tap without them, unless [tap] allow_insecure = true): pass
--user and set RELAY_TAP_PASSWORD on the driver and every executor. Executors connect to
the tap themselves and need relay installed (pip install 'binlog-relay[spark]') or shipped with
--py-files.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True, help="the relay's tap, host:port")
    p.add_argument("--out", required=True, help="the Parquet output directory")
    p.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    p.add_argument("--tables", help="schema.table patterns, comma-separated ('shop.%%')")
    p.add_argument("--start", default="earliest",
                   help="where a new query starts: earliest, latest, a GTID or a position")
    p.add_argument("--trigger", default="available-now",
                   help="available-now (read what is there, then stop) or an interval "
                        "like 10s (run until stopped)")
    p.add_argument("--max-rows-per-batch", type=int, default=200_000)
    p.add_argument("--max-rows-per-partition", type=int, default=100_000)
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    p.add_argument("--user", default="")
    p.add_argument("--partition-by", help="output columns to partition by (e.g. table)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable), e.g. spark.executor.memory=2g")
    args = p.parse_args()

    # Workers must run this interpreter (with relay and pyarrow), not whatever python3 is
    # first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from relay.tap.spark import register

    builder = (SparkSession.builder.master(args.master).appName("relay-tap-to-parquet")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    for setting in args.conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    reader = (spark.readStream.format("relay").option("endpoint", args.endpoint)
              .option("start", args.start)
              .option("maxRowsPerBatch", args.max_rows_per_batch)
              .option("maxRowsPerPartition", args.max_rows_per_partition))
    if args.tables:
        reader = reader.option("tables", args.tables)
    if args.user:
        reader = reader.option("user", args.user).option("passwordEnv", "RELAY_TAP_PASSWORD")
    writer = (reader.load().writeStream.format("parquet")
              .option("checkpointLocation", args.checkpoint))
    if args.partition_by:
        writer = writer.partitionBy(*args.partition_by.split(","))
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    query = writer.start(args.out)
    print(f"streaming {args.endpoint} into {args.out} (query {query.id})", flush=True)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
