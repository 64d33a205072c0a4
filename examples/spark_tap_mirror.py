#!/usr/bin/env python3
"""Keep a Delta table equal to a primary's table: the tap's snapshot, then its changes,
merged with deltalake (delta-rs, from PyPI) from Spark Structured Streaming.

    RELAY_TAP_PASSWORD=... SNAPSHOT_PASSWORD=... python examples/spark_tap_mirror.py \\
        --endpoint relay-host:4000 --user spark --table shop.orders --keys id \\
        --source mysql://reader@primary:3306 --delta /data/orders \\
        --checkpoint /data/orders-checkpoint [--trigger "10 seconds"]

Each micro-batch is reduced to the last record per key (relay.tap.spark.latest_per_key:
ordered by position and change, an update of the key split into a delete and an
upsert), then merged: a record replaces the mirror's row only when it is newer than the
row (the mirror keeps `_position` and `_change`), so a change the snapshot's row already
holds is skipped, a replayed batch changes nothing, and deletes delete. Columns are kept
as text (images = "map": strings as they are, other values as JSON text), which holds
every MySQL value exactly; cast in the query that reads the mirror.

Kill it (even with kill -9) and start it again with the same --checkpoint: Spark replays
the unfinished batch, and the merge is idempotent.

With --changes PATH every record of each batch (snapshot rows, changes, snapshot ends) is
also appended to a Delta table at PATH, exactly once: the append commits with the batch's
id as a Delta application transaction (app id "relay-mirror:<table>:<checkpoint hash>":
the table follows one checkpoint), and a batch Spark replays after a crash is skipped
when the table already holds it.

With delta-spark's jars, the same merge is
    MERGE INTO mirror t USING batch s ON t.id = s.id
    WHEN MATCHED AND s.op = 'delete' AND (s.position, s.change) > (t._position, t._change)
      THEN DELETE
    WHEN MATCHED AND s.op = 'upsert' AND (s.position, s.change) > (t._position, t._change)
      THEN UPDATE SET ...
    WHEN NOT MATCHED AND s.op = 'upsert' THEN INSERT ...
and with pyspark 4.3's pipelines, create_auto_cdc_flow(target="mirror", source=...,
keys=["id"], sequence_by=struct("position", "change"), apply_as_deletes="op = 'delete'").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True, help="the relay's tap, host:port")
    p.add_argument("--user", default="", help="tap user (password in RELAY_TAP_PASSWORD)")
    p.add_argument("--table", required=True, help="schema.table to mirror")
    p.add_argument("--keys", required=True, help="its key columns, comma-separated")
    p.add_argument("--source", required=True,
                   help="where snapshot reads go: mysql://user@host:port (password in "
                        "SNAPSHOT_PASSWORD)")
    p.add_argument("--delta", required=True, help="the Delta table's path")
    p.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    p.add_argument("--changes", help="also append every record to a Delta table here, "
                                     "once per batch")
    p.add_argument("--trigger", default="available-now",
                   help="available-now (catch up, then stop) or an interval like \"10 seconds\"")
    p.add_argument("--chunk-rows", type=int, default=8192)
    p.add_argument("--chunks-per-batch", type=int, default=16)
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    args = p.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from relay.tap.spark import register

    spark = (SparkSession.builder.master(args.master).appName("relay-tap-mirror")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()]

    reader = (spark.readStream.format("relay").option("endpoint", args.endpoint)
              .option("table", args.table).option("images", "map")
              .option("snapshot", "initial").option("snapshotSource", args.source)
              .option("snapshotPasswordEnv", "SNAPSHOT_PASSWORD")
              .option("snapshotChunkRows", args.chunk_rows)
              .option("snapshotChunksPerBatch", args.chunks_per_batch)
              .option("name", f"mirror:{args.table}"))
    if args.user:
        reader = reader.option("user", args.user).option("passwordEnv", "RELAY_TAP_PASSWORD")
    writer = (reader.load().writeStream
              .foreachBatch(lambda df, batch_id: write_batch(df, batch_id, keys, args))
              .option("checkpointLocation", args.checkpoint))
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    query = writer.start()
    query.awaitTermination()
    return 0


def write_batch(changes: Any, batch_id: int, keys: list[str], args: Any) -> None:
    # Read once: each action on the batch would read it from the relay again (and a
    # snapshot chunk from the primary again).
    changes = changes.persist()
    try:
        if args.changes:  # batch ids count from 0 again with a new checkpoint
            checkpoint = hashlib.sha256(os.path.abspath(args.checkpoint).encode()).hexdigest()
            append_once(changes, batch_id, f"relay-mirror:{args.table}:{checkpoint[:16]}",
                        args.changes)
        merge_batch(changes, keys, args.delta)
    finally:
        changes.unpersist()


def append_once(changes: Any, batch_id: int, app_id: str, path: str) -> None:
    """Append the batch's records to the Delta table at `path` unless a commit of this
    batch (app transaction `app_id`, version `batch_id`) is already there."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    table: Any = path
    if DeltaTable.is_deltatable(path):
        table = DeltaTable(path)  # checked and written at the same version
        done = table.transaction_version(app_id)
        if done is not None and done >= batch_id:
            return
    write_deltalake(table, changes.toArrow(), mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id=app_id, version=batch_id)]))


def merge_batch(changes: Any, keys: list[str], path: str) -> None:
    """Merge one micro-batch into the Delta table at `path` (created by the first)."""
    from deltalake import DeltaTable

    from relay.tap.spark import latest_per_key

    # A snapshot's end: the mirror's rows older than the snapshot's start that it did not
    # rewrite are rows the snapshot no longer found (deleted while nobody watched).
    reset = changes.where("op = 'snapshot_end'").agg({"position": "max"}).collect()[0][0]
    latest = latest_per_key(changes, keys).toArrow()
    if latest.num_rows:
        _merge(latest, keys, path)
    if reset is not None and DeltaTable.is_deltatable(path):
        DeltaTable(path).delete(f"_position < {int(reset)}")


def _merge(latest: Any, keys: list[str], path: str) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    # The rows as text columns: every column any image of the batch names.
    images = latest.column("image").to_pylist()
    names = sorted({name for image in images if image for name, _ in image})
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for image in images:
        values = dict(image) if image else {}
        for name in names:
            columns[name].append(values.get(name))
    batch = pa.table({**{n: pa.array(v, pa.string()) for n, v in columns.items()},
                      "_op": latest.column("op"), "_position": latest.column("position"),
                      "_change": latest.column("change")})
    for k in keys:  # the key as the images hold it (deletes have no image)
        key = pc.cast(latest.column(k), pa.string())
        i = batch.schema.get_field_index(k)
        batch = batch.set_column(i, k, key) if i >= 0 else batch.append_column(k, key)
    if not DeltaTable.is_deltatable(path):
        rows = batch.filter(pc.equal(batch.column("_op"), "upsert")).drop_columns(["_op"])
        write_deltalake(path, rows, mode="append")
        return
    newer = ("(s._position > t._position OR (s._position = t._position AND "
             "s._change > t._change))")
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    values = {f"`{n}`": f"s.`{n}`" for n in [*names, "_position", "_change"]}
    (DeltaTable(path).merge(batch, on, source_alias="s", target_alias="t")
     .when_matched_delete(predicate=f"s._op = 'delete' AND {newer}")
     .when_matched_update(updates=values, predicate=f"s._op = 'upsert' AND {newer}")
     .when_not_matched_insert(updates=values, predicate="s._op = 'upsert'")
     .execute())


if __name__ == "__main__":
    sys.exit(main())
