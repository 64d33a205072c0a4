"""Typed Delta mirrors of a primary's tables: the tap's snapshot, then its changes, one
exactly-once Structured Streaming query per table, each merged into its Delta table.

    from relay.tap.mirror import MirrorJob, MirrorSettings
    settings = MirrorSettings(endpoint="relay:4000", tables=("shop.%",),
                              target="/data/mirror", checkpoint="/data/mirror-checkpoints",
                              source="mysql://reader@primary:3306")
    MirrorJob(spark, settings).run()            # or `relay mirror ...` (docs/mirror.md)

A table `schema.table` goes to `<target>/schema.table`, its checkpoint to
`<checkpoint>/schema.table`. Its Delta columns are the source's, in the source's order,
with the typed tap images' types (BIGINT UNSIGNED as DECIMAL(20,0), DECIMAL(p,s) up to 38
digits, DATETIME as TIMESTAMP_NTZ, JSON and wider DECIMALs as text, binary as BINARY),
NOT NULL where the source's are, then `_position` and `_change` (where in the relay log
the row's last change is: the merge's order, so a replayed or older record never
overwrites a newer one) and `_bucket` (a hash of the key: the table's partitions, so a
merge rewrites only the files of the buckets its keys fall in). The table's properties
record the source table (`relay.source`), its key (`relay.primaryKey`) and the bucket
count (`relay.buckets`).

Each micro-batch is reduced to the last record per key (`latest_per_key`), then merged
with deltalake (delta-rs): a record replaces a row only when it is newer by (position,
change); deletes delete; a snapshot's end removes the rows older than the snapshot it did
not find. The merge commits with the batch id as a Delta application transaction
("relay-mirror:<table>:<checkpoint hash>"), so a batch Spark replays after a crash is
skipped when the table holds it, and merged again (to the same result) when it does not.

A table's query that fails starts again from its checkpoint after 1, 2, 4, ... seconds
while the others run on, up to `restarts` times in a row (MirrorJob.restart_failed).

The source's columns may change while a mirror runs: with the tap's schemaEvolution
add_columns (a mirror's default) an added column becomes a Delta column (the table's
query stops on the first row that has it and is started again, planned with it; the
merge adds it, NULL in the rows before), a dropped column stays (NULL in the rows changed
after; a NOT NULL one is made nullable), and a column whose type changed stops the query
with what the user can do (SCHEMA_ADVICE).

deltalake writes no deletion vectors, so a merge rewrites every file that holds one of
its keys: rows rewritten per change is about rows per bucket while a batch touches fewer
buckets than it has changes, and the whole table once it touches every bucket. The log
says how many rows each batch rewrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from types import FrameType
from typing import Any

from relay.binlog.gtid import GtidSet, GtidState, parse_position
from relay.binlog.tablemap import TableMap
from relay.errors import RelayError
from relay.tap.evolution import SchemaEvolution
from relay.tap.options import DEFAULTS, MIRROR_RESTARTS
from relay.tap.snapshot import describe, match_tables, query_value

log = logging.getLogger("relay.mirror")

POSITION, CHANGE, BUCKET = "_position", "_change", "_bucket"
# The history table's validity interval: from a version's change to the next change of
# its key (NULL: the version is current), each as (position, change) and commit time.
FROM_POSITION, FROM_CHANGE, FROM_TIME = ("_valid_from_position", "_valid_from_change",
                                         "_valid_from_time")
TO_POSITION, TO_CHANGE, TO_TIME = "_valid_to_position", "_valid_to_change", "_valid_to_time"
HISTORY_SUFFIX = "__history"
KIND_PROPERTY = "relay.mirrorKind"
SOURCE_PROPERTY, KEY_PROPERTY, BUCKETS_PROPERTY = "relay.source", "relay.primaryKey", \
    "relay.buckets"
# What a mirror can do when its source table's columns change in a way its query's schema
# does not follow (logged under the query's error).
SCHEMA_ADVICE = (
    "the Delta table follows added and dropped columns with schemaEvolution=add_columns "
    "(the default: an added column becomes a Delta column, NULL in the rows before; a dropped "
    "one stays, NULL in the rows changed after); a column whose type changed needs a new "
    "target (a new snapshot), mirrored with add_columns or with --option "
    "schemaEvolution=json (values that do not fit then go to its __rescued column)")
RESTART_DELAY_MAX = 30.0   # seconds: a failed query's restarts wait 1, 2, 4, ... s, this at most
ROWS_PER_BUCKET = 25_000   # the automatic bucket count: one per this many rows, a power of 2
MAX_BUCKETS = 256


class MirrorError(RelayError):
    code = "mirror"


class TriggerMode(Enum):
    AVAILABLE_NOW = "available-now"   # catch up with the relay log, then stop
    INTERVAL = "interval"             # a micro-batch every interval, until stopped


@dataclass(frozen=True)
class Trigger:
    mode: TriggerMode
    interval: str = ""

    @classmethod
    def parse(cls, text: str) -> Trigger:
        if text.strip().lower() in ("available-now", "availablenow", "available_now"):
            return cls(TriggerMode.AVAILABLE_NOW)
        number, _, unit = text.strip().partition(" ")
        try:
            float(number)
        except ValueError:
            raise MirrorError(f"trigger: available-now or an interval such as \"10 seconds\", "
                              f"not {text!r}") from None
        return cls(TriggerMode.INTERVAL, f"{number} {unit or 'seconds'}")


@dataclass(frozen=True)
class MirrorSettings:
    endpoint: str                            # the relay's tap, host:port
    tables: tuple[str, ...]                  # schema.table names, or LIKE patterns with %
    target: str                              # a directory: one Delta table per source table
    checkpoint: str                          # a directory: one Spark checkpoint per table
    source: str | None = None                # where snapshot reads go (snapshotSource)
    user: str = ""
    password_env: str | None = "RELAY_TAP_PASSWORD"
    source_password_env: str | None = "SNAPSHOT_PASSWORD"
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per table, when
    # the table has no primary key (or another key is wanted)
    name: str | None = None                  # query names: "<name>:<schema.table>"
    trigger: Trigger = Trigger(TriggerMode.AVAILABLE_NOW)
    buckets: int = 0                         # 0: from the table's size; 1: no partitions
    chunk_rows: int = int(DEFAULTS["snapshotchunkrows"])
    chunks_per_batch: int = int(DEFAULTS["snapshotchunksperbatch"])
    options: Mapping[str, str] = field(default_factory=dict)   # more data source options
    history: bool = False                    # also <table>__history: SCD type 2
    restarts: int = MIRROR_RESTARTS          # a failed query's restarts in a row (0: none)

    @property
    def prefix(self) -> str:
        """The query names' prefix: given, or unique to the target (two mirrors of one
        table into two targets are two subscribers of the tap)."""
        if self.name:
            return self.name
        return "mirror-" + hashlib.sha256(_absolute(self.target).encode()).hexdigest()[:12]

    def reader_options(self, tables: str, *, one_table: bool = False) -> dict[str, str]:
        """The data source's options for `tables` (a table's name, as it is, with
        `one_table`; else names or patterns)."""
        # add_columns: the Delta table follows ADD and DROP COLUMN (a mirror's default;
        # the tap's is fail).
        o = {"endpoint": self.endpoint, "snapshot": "initial",
             "schemaEvolution": SchemaEvolution.ADD_COLUMNS.value,
             "snapshotChunkRows": str(self.chunk_rows),
             "snapshotChunksPerBatch": str(self.chunks_per_batch), **self.options}
        o["table" if one_table or ("%" not in tables and "," not in tables)
          else "tables"] = tables
        if self.user:
            o["user"] = self.user
            if self.password_env and "password" not in self.options:
                o["passwordEnv"] = self.password_env
        if self.source:
            o["snapshotSource"] = self.source
            if self.source_password_env and self.source_password_env in os.environ:
                o["snapshotPasswordEnv"] = self.source_password_env
        return o


@dataclass(frozen=True)
class TableMirror:
    """One table's mirror, as planned: where it goes and what it looks like."""

    table: str                   # schema.table
    keys: tuple[str, ...]
    path: str
    checkpoint: str
    name: str                    # the query's name and the tap subscriber's
    buckets: int
    schema: Any                  # the Delta table's Arrow schema (target_schema)
    evolution: SchemaEvolution
    history: bool = False        # also a history table (SCD type 2) at history_path

    @property
    def app_id(self) -> str:
        """The Delta application id of this table's batches: the checkpoint's path and,
        once Spark wrote it, its query id (a checkpoint made again at the same path
        counts its batches from 0 again: a new id, not batches the table holds)."""
        ck = hashlib.sha256(_absolute(self.checkpoint).encode()).hexdigest()[:16]
        query = _checkpoint_query_id(self.checkpoint)
        return f"relay-mirror:{self.table}:{ck}" + (f":{query[:8]}" if query else "")

    @property
    def history_path(self) -> str:
        return self.path + HISTORY_SUFFIX

    @property
    def history_app_id(self) -> str:
        return self.app_id + HISTORY_SUFFIX

    @property
    def source_columns(self) -> list[str]:
        return [n for n in self.schema.names if n not in (POSITION, CHANGE, BUCKET)]


def _checkpoint_query_id(checkpoint: str) -> str | None:
    """The query id Spark keeps in a local checkpoint's metadata file."""
    try:
        with open(os.path.join(checkpoint, "metadata")) as f:
            value = json.loads(f.readline()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def _last_offset(checkpoint: str) -> int | None:
    """The id of the last batch a local checkpoint planned."""
    try:
        ids = [int(n) for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit()]
    except OSError:
        return None
    return max(ids, default=None)


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def bucket_count(rows: int) -> int:
    """Buckets for a table of about `rows` rows: a power of two, ROWS_PER_BUCKET rows
    each, 1 to MAX_BUCKETS."""
    if rows <= ROWS_PER_BUCKET:
        return 1
    return min(MAX_BUCKETS, 1 << math.ceil(math.log2(rows / ROWS_PER_BUCKET)))


def transactions_behind(ours: str | None, latest: str | None) -> int | None:
    """How many transactions `latest` (a GTID position or set) holds beyond `ours`."""
    if not latest:
        return None
    try:
        mine, theirs = parse_position(ours or ""), parse_position(latest)
    except ValueError:
        return None
    if isinstance(mine, GtidState) and isinstance(theirs, GtidState):
        behind = 0
        for gtid in theirs:
            own = mine.get(gtid.domain)
            behind += max(0, gtid.seq - (own.seq if own is not None else 0))
        return behind
    if isinstance(mine, GtidSet) and isinstance(theirs, GtidSet):
        def count(s: GtidSet) -> int:
            return sum(hi - lo + 1 for _, ivs in s.intervals() for lo, hi in ivs)
        return max(0, count(theirs) - count(mine))
    return None


# --- planning -------------------------------------------------------------------------------


def plan(settings: MirrorSettings) -> list[TableMirror]:
    """The tables the settings name, each with its key (the primary key, or the settings'
    keys), its typed columns (from the relay: the table map it last logged, or the
    primary's), its bucket count (the existing table's, else from its size) and names."""
    from relay.tap.spark import TapOptions, typed_table

    if not settings.tables:
        raise MirrorError("no tables to mirror: name schema.table or a pattern (shop.%)")
    patterns = [t if "%" in t else _literal(t) for t in settings.tables]
    o = TapOptions(settings.reader_options(settings.tables[0]))  # the snapshot's login
    with o.client() as tap:
        o.learn_source(tap)
    conn = o.source().connect()
    try:
        found = match_tables(conn, patterns)
        if not found:
            raise MirrorError(f"no table of the snapshot source matches "
                              f"{', '.join(settings.tables)}")
        specs = [describe(conn, s, t, settings.keys.get(f"{s}.{t}")) for s, t in found]
        sizes = {f"{s}.{t}": int(query_value(
            conn, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s", (s, t)) or 0) for s, t in found}
        image = query_value(conn, "SELECT @@binlog_row_image")
    finally:
        conn.close()
    if image is not None and image.upper() != "FULL":
        # A change's image then holds only some columns, and the merge would write the
        # others as NULL.
        raise MirrorError(f"the source logs binlog_row_image = {image}: a mirror needs FULL "
                          "row images (SET GLOBAL binlog_row_image = FULL, and in the "
                          "server's configuration)")
    for spec in specs:
        check_table(spec)
    out = []
    for spec in specs:
        name = spec.qualified
        table_o = TapOptions(settings.reader_options(name, one_table=True))
        with table_o.client() as tap:
            versions = (tap.schema_versions(name)
                        if table_o.evolution is SchemaEvolution.ADD_COLUMNS
                        else [tap.schema(name)])
        table = typed_table(versions, table_o)
        # Columns the source has dropped (add_columns keeps them) hold NULL from then on.
        current = {c.name for c in spec.columns}
        nullable = [c.name for c in table.columns if c.name in spec.keys and c.nullable]
        if nullable:
            raise MirrorError(f"{name}: key column {', '.join(nullable)} may be NULL: a "
                              "mirror's key must be NOT NULL (a NULL key matches no row)")
        path = os.path.join(settings.target, name) if "://" not in settings.target \
            else f"{settings.target.rstrip('/')}/{name}"
        existing = _existing_buckets(path)
        buckets = existing or settings.buckets or bucket_count(sizes[name])
        out.append(TableMirror(
            table=name, keys=spec.keys, path=path,
            checkpoint=os.path.join(settings.checkpoint, name),
            name=f"{settings.prefix}:{name}", buckets=buckets,
            schema=target_schema(table, spec.keys, buckets, table_o.evolution, current),
            evolution=table_o.evolution, history=settings.history))
    return out


# Names the mirror gives columns of its own (and the change records' fields, which a key
# column's name must not repeat).
RECORD_FIELDS = ("schema", "table", "op", "image", "position", "change", "commit_ts")
OWN_COLUMNS = (POSITION, CHANGE, BUCKET, FROM_POSITION, FROM_CHANGE, FROM_TIME, TO_POSITION,
               TO_CHANGE, TO_TIME, "_op", "_kind", "_prev_position", "_prev_change")


def check_table(spec: Any) -> None:
    """Refuse a table the mirror would get wrong: a key that does not identify a row,
    names the mirror uses itself, a name that is no directory name."""
    name = spec.qualified
    if not spec.unique:
        raise MirrorError(f"{name}: the key {', '.join(spec.keys)} is not a primary or NOT "
                          "NULL unique key: rows with equal keys would become one row")
    if "/" in name or name.startswith("."):
        raise MirrorError(f"{name}: a table name the mirror cannot make a directory of")
    taken = [k for k in spec.keys if k in RECORD_FIELDS]
    taken += [c.name for c in spec.columns
              if c.name in OWN_COLUMNS or c.name.startswith("_match_")]
    if taken:
        raise MirrorError(f"{name}: column {', '.join(taken)} has a name the mirror uses "
                          "itself (its own columns start with _; a key column cannot be "
                          f"named {', '.join(RECORD_FIELDS)})")


def _literal(name: str) -> str:
    return name.replace("\\", "\\\\").replace("_", "\\_")


def target_schema(table: TableMap, keys: Sequence[str], buckets: int,
                  evolution: SchemaEvolution, current: Collection[str] | None = None) -> Any:
    """The Delta table's Arrow schema: the typed image's fields (the Arrow types of the
    Spark types the tap reads them as) with the source's nullability (keys NOT NULL;
    columns not among the source's `current` ones, dropped there, nullable), then the
    ordering columns and the bucket."""
    import pyarrow as pa

    from relay.tap.sparktypes import image_struct

    nullable = {c.name: c.name not in keys and (
        c.nullable or (current is not None and c.name not in current))
        for c in table.columns}
    struct = image_struct(table, evolution)
    fields = [struct.field(i).with_nullable(nullable.get(struct.field(i).name, True))
              for i in range(struct.num_fields)]
    fields += [pa.field(POSITION, pa.int64(), nullable=False),
               pa.field(CHANGE, pa.int32(), nullable=False)]
    if buckets > 1:
        fields.append(pa.field(BUCKET, pa.int32(), nullable=False))
    return pa.schema(fields)


def _existing_buckets(path: str) -> int:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        return 0
    value = DeltaTable(path).metadata().configuration.get(BUCKETS_PROPERTY)
    return int(value) if value else 1


# --- the Delta table ------------------------------------------------------------------------


def ensure_table(m: TableMirror, kind: str = "current") -> None:
    """Create the Delta table, or check that the existing one mirrors this table with
    this key and holds every column with its type (columns added at the source are added
    by the merge when schemaEvolution is add_columns)."""
    from deltalake import DeltaTable

    schema = m.schema
    if not DeltaTable.is_deltatable(m.path):
        DeltaTable.create(
            m.path, schema, partition_by=[BUCKET] if m.buckets > 1 else None, name=m.table,
            description=f"relay mirror of {m.table}",
            configuration={SOURCE_PROPERTY: m.table, KEY_PROPERTY: ",".join(m.keys),
                           BUCKETS_PROPERTY: str(m.buckets), KIND_PROPERTY: kind},
            raise_if_key_not_exists=False)
        return
    dt = DeltaTable(m.path)
    config = dt.metadata().configuration
    if config.get(SOURCE_PROPERTY, m.table) != m.table or \
            config.get(KEY_PROPERTY, ",".join(m.keys)) != ",".join(m.keys):
        raise MirrorError(f"{m.path} mirrors {config.get(SOURCE_PROPERTY)} by key "
                          f"{config.get(KEY_PROPERTY)}, not {m.table} by key "
                          f"{','.join(m.keys)}: give the mirror another target")
    import pyarrow as pa

    current = pa.schema(dt.schema().to_arrow())
    have = {name: current.field(name).type for name in current.names}
    for f in map(schema.field, range(len(schema.names))):
        if f.name in have and not _same_type(have[f.name], f.type):
            raise MirrorError(
                f"{m.table}: column {f.name} is {f.type} at the source but {have[f.name]} in "
                f"the Delta table at {m.path}, which cannot take it: mirror into a new "
                "target (a new snapshot), or read the table with schemaEvolution = json "
                "(the changed column's values then go to __rescued as JSON)")
        if f.name not in have and m.evolution is not SchemaEvolution.ADD_COLUMNS:
            raise MirrorError(
                f"{m.table}: column {f.name} is at the source but not in the Delta table at "
                f"{m.path}: mirror with schemaEvolution = add_columns to add it (rows "
                "written before get NULL), or into a new target")
    # NOT NULL Delta columns the plan has nullable, or has not at all (dropped at the
    # source): rows changed from now on hold NULL there. After the checks: a refused
    # start changes nothing.
    planned = {f.name: f for f in map(schema.field, range(len(schema.names)))}
    relax_not_null(m.table, dt, [
        name for name in _not_null(current, m.keys)
        if name not in planned or planned[name].nullable], "is nullable or gone at the source")


def history_schema(m: TableMirror) -> Any:
    """The history table's Arrow schema: the source's columns, the validity interval,
    the bucket."""
    import pyarrow as pa

    from relay.tap.sparktypes import UTC_TS

    fields = [m.schema.field(name) for name in m.source_columns]
    fields += [pa.field(FROM_POSITION, pa.int64(), nullable=False),
               pa.field(FROM_CHANGE, pa.int32(), nullable=False),
               pa.field(FROM_TIME, UTC_TS), pa.field(TO_POSITION, pa.int64()),
               pa.field(TO_CHANGE, pa.int32()), pa.field(TO_TIME, UTC_TS)]
    if m.buckets > 1:
        fields.append(pa.field(BUCKET, pa.int32(), nullable=False))
    return pa.schema(fields)


def ensure_history(m: TableMirror) -> None:
    """Create the history table (checked as the mirror's table is)."""
    ensure_table(TableMirror(**{**m.__dict__, "path": m.history_path,
                                "schema": history_schema(m), "history": False}),
                 kind="history")


def _same_type(a: Any, b: Any) -> bool:
    import pyarrow as pa

    if a == b:
        return True
    text = (pa.string(), pa.large_string(), pa.string_view())
    blob = (pa.binary(), pa.large_binary(), pa.binary_view())
    return (a in text and b in text) or (a in blob and b in blob)


def follow_columns(m: TableMirror, dt: Any, rows: Any, why: str) -> bool:
    """Before a merge into the Delta table `dt`: add the columns of `rows` (upserts) it
    does not have yet (added at the source: nullable, NULL in the rows before), and make
    nullable its NOT NULL columns that `rows` hold a NULL in (dropped at the source while
    the query ran: add_columns keeps them, NULL from then on; with FULL row images nothing
    else leaves a NOT NULL column without a value). Metadata commits only, no file
    rewritten. (The merges do not evolve the schema themselves: delta-rs's merge_schema
    also makes every column as nullable as the merge's source.) True when the table
    changed; `dt` holds the new metadata then (delta-rs updates it in place, as it does
    for delete, update and merge: one load of the table serves a whole batch)."""
    import pyarrow as pa
    from deltalake import Field

    schema = pa.schema(dt.schema().to_arrow())
    added = [m.schema.field(name).with_nullable(True) for name in m.source_columns
             if name in rows.column_names and name not in schema.names]
    if added:
        dt.alter.add_columns([Field.from_arrow(f) for f in added])
        log.info("%s: column %s added to the Delta table at %s (NULL in the rows before)",
                 m.table, ", ".join(f.name for f in added), dt.table_uri)
    dropped = [name for name in _not_null(schema, m.keys)
               if name in rows.column_names and rows.column(name).null_count]
    relax_not_null(m.table, dt, dropped, why)
    return bool(added or dropped)


def _not_null(schema: Any, keys: Sequence[str]) -> list[str]:
    """The NOT NULL columns of a Delta table's Arrow schema that mirror source columns
    other than the key (the ones a column dropped at the source may leave NULL)."""
    return [name for name in schema.names if not schema.field(name).nullable
            and name not in keys and name not in OWN_COLUMNS]


def relax_not_null(table: str, dt: Any, columns: Sequence[str], why: str) -> None:
    """Make NOT NULL columns of the Delta table `dt` nullable (a metadata commit)."""
    for name in columns:
        dt.alter.drop_column_not_null(name)
        log.info("%s: column %s %s: its Delta column at %s is nullable now", table, name,
                 why, dt.table_uri)


# --- one micro-batch ------------------------------------------------------------------------


@dataclass
class BatchReport:
    """What one micro-batch did, for the log and for callers."""

    table: str
    batch_id: int
    records: dict[str, int] = field(default_factory=dict)   # by op
    upserts: int = 0
    deletes: int = 0
    rewritten: int = 0          # target rows copied into new files (not changed by it)
    files_rewritten: int = 0
    lag_seconds: float | None = None
    skipped: bool = False       # a replay of a batch the table already holds

    @property
    def changes(self) -> int:
        return self.upserts + self.deletes

    def line(self) -> str:
        if self.skipped:
            return f"{self.table}: batch {self.batch_id} is in the table already (replayed)"
        ops = ", ".join(f"{n:,} {op}" for op, n in sorted(self.records.items())) or "nothing"
        text = (f"{self.table}: batch {self.batch_id}: {ops}; merged {self.upserts:,} "
                f"upserts, {self.deletes:,} deletes, rewrote {self.rewritten:,} other rows "
                f"in {self.files_rewritten} files")
        if self.changes:
            text += f" ({self.rewritten / self.changes:,.1f} per change)"
        if self.lag_seconds is not None:
            text += f"; newest change {self.lag_seconds:.1f} s old"
        return text


class MirrorWriter:
    """foreachBatch for one table: reduce the batch, merge it once."""

    def __init__(self, mirror: TableMirror) -> None:
        self.mirror = mirror
        self.reports: list[BatchReport] = []

    def __call__(self, batch: Any, batch_id: int) -> None:
        report = self.write(batch, batch_id)
        if report.records or report.skipped:
            log.info("%s", report.line())

    def write(self, batch: Any, batch_id: int) -> BatchReport:
        from pyspark.sql import functions as F

        from relay.tap.snapshot import SNAPSHOT_END_OP
        from relay.tap.spark import latest_per_key

        m = self.mirror
        report = BatchReport(m.table, batch_id)
        current = not _holds(m.path, m.app_id, batch_id)
        history = m.history and not _holds(m.history_path, m.history_app_id, batch_id)
        if not current and not history:
            report.skipped = True
            return report
        # Read once: each action on the batch would read it from the relay again (and a
        # snapshot chunk from the primary again).
        batch = batch.persist()
        try:
            summary = batch.groupBy("op").agg(
                F.count(F.lit(1)).alias("n"), F.max("position").alias("last"),
                F.max("commit_ts").alias("newest")).collect()
            report.records = {r["op"]: int(r["n"]) for r in summary}
            reset = next((r["last"] for r in summary if r["op"] == SNAPSHOT_END_OP), None)
            newest = [r["newest"] for r in summary
                      if r["op"] in ("insert", "update", "delete") and r["newest"]]
            if newest:
                report.lag_seconds = max(0.0, time.time() - max(newest).timestamp())
            values = [F.col(_q(name)) if name in m.keys
                      else F.col("image").getField(name).alias(name)
                      for name in m.source_columns]
            bucket = [F.pmod(F.xxhash64(*[F.col(_q(k)) for k in m.keys]),
                             F.lit(m.buckets)).cast("int").alias(BUCKET)] \
                if m.buckets > 1 else []
            rows = history_rows = None
            if current:
                rows = latest_per_key(batch, list(m.keys)).select(
                    *values, F.col("position").alias(POSITION),
                    F.col("change").alias(CHANGE), *bucket, F.col("op").alias("_op")
                ).toArrow()
            if history:
                history_rows = _history_records(batch, m, values, bucket).toArrow()
        finally:
            batch.unpersist()
        if rows is not None:
            merge_rows(m, rows, batch_id, reset, report)
        if history_rows is not None:
            merge_history(m, history_rows, batch_id, reset)
        self.reports.append(report)
        return report


def _holds(path: str, app_id: str, batch_id: int) -> bool:
    from deltalake import DeltaTable

    done = DeltaTable(path).transaction_version(app_id)
    return done is not None and done >= batch_id


def _history_records(batch: Any, m: TableMirror, values: list[Any], bucket: list[Any]) -> Any:
    """Every change of the batch, one record per key and change, with the next and the
    previous change of its key in the batch (by position, change)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    from relay.tap.spark import change_records

    records = change_records(batch, list(m.keys))
    by_key = Window.partitionBy(*[F.col(_q(k)) for k in m.keys]).orderBy("position", "change")
    return records.select(
        *values, F.col("position").alias(FROM_POSITION), F.col("change").alias(FROM_CHANGE),
        F.col("commit_ts").alias(FROM_TIME),
        F.lead("position").over(by_key).alias(TO_POSITION),
        F.lead("change").over(by_key).alias(TO_CHANGE),
        F.lead("commit_ts").over(by_key).alias(TO_TIME),
        F.lag("position").over(by_key).alias("_prev_position"),
        F.lag("change").over(by_key).alias("_prev_change"), *bucket,
        F.col("op").alias("_op"))


def merge_history(m: TableMirror, records: Any, batch_id: int, reset: int | None) -> None:
    """Merge a batch's change records (`_history_records`' columns) into the history
    table, as application transaction (m.history_app_id, batch_id): each upsert opens a
    version, valid until the next change of its key (in the batch, or a later one); the
    first change of a key in the batch closes the key's open version. A change at or
    before the open version's start (one a snapshot row already holds) is left out.
    `reset`: a snapshot's start; versions still open from before it that it did not
    rewrite are closed there (their rows were deleted while nobody watched)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import CommitProperties, DeltaTable, Transaction

    commit = CommitProperties(app_transactions=[Transaction(app_id=m.history_app_id,
                                                            version=batch_id)])
    schema = history_schema(m)
    keys = list(m.keys)
    dt = DeltaTable(m.history_path)
    if reset is not None:
        dt.update(updates={TO_POSITION: str(int(reset)), TO_CHANGE: "0"},
                  predicate=f"{TO_POSITION} IS NULL AND {FROM_POSITION} < {int(reset)}",
                  commit_properties=None if records.num_rows else commit)
    if not records.num_rows:
        return
    # The open versions of the keys' buckets: a change not after one is left out.
    where = pc.field(TO_POSITION).is_null()
    if m.buckets > 1:
        where = where & pc.field(BUCKET).isin(pc.unique(records.column(BUCKET)))
    opened = dt.to_pyarrow_dataset().to_table(
        filter=where, columns=[*keys, FROM_POSITION, FROM_CHANGE]).rename_columns(
        [*keys, "_open_position", "_open_change"])
    # (Arrow joins take no map columns: the keys alone are joined, in the records' order.)
    order = pa.array(range(records.num_rows), pa.int64())
    found = records.select(keys).append_column("_i", order).join(
        opened, keys, join_type="left outer").sort_by("_i")
    op, oc = found.column("_open_position"), found.column("_open_change")

    def after_open(position: str, change: str) -> Any:
        p, c = records.column(position), records.column(change)
        return pc.or_kleene(pc.is_null(op), pc.or_kleene(
            pc.greater(p, op), pc.and_kleene(pc.equal(p, op), pc.greater(c, oc))))

    keep = after_open(FROM_POSITION, FROM_CHANGE)
    # The first change kept of each key: the one whose previous change was not kept.
    first = pc.and_(keep, pc.or_kleene(pc.is_null(records.column("_prev_position")),
                                       pc.invert(pc.fill_null(
                                           after_open("_prev_position", "_prev_change"),
                                           True))))
    source = pa.schema([schema.field(i).with_nullable(True) for i in range(len(schema.names))])
    versions = records.filter(pc.and_(keep, pc.equal(records.column("_op"), "upsert")))
    versions = versions.select(source.names).cast(source)
    follow_columns(m, dt, versions, "has NULL in a change (dropped at the source?)")
    # A closer: the key, and where its open version ends (the key's first change here).
    closers = records.filter(first)
    ends = {TO_POSITION: FROM_POSITION, TO_CHANGE: FROM_CHANGE, TO_TIME: FROM_TIME}

    def closer_column(name: str) -> Any:
        if name in keys or name == BUCKET:
            return closers.column(name)
        if name in ends:
            return closers.column(ends[name])
        return pa.nulls(closers.num_rows, source.field(name).type)
    closing = pa.table({name: closer_column(name) for name in source.names}).cast(source)
    # Closers match the open version by `_match_<key>`; versions have none and are
    # inserted.
    match = [f"_match_{i}" for i in range(len(keys))]
    for i, k in enumerate(keys):
        closing = closing.append_column(match[i], closing.column(k))
        versions = versions.append_column(match[i], pa.nulls(versions.num_rows,
                                                             versions.schema.field(k).type))
    closing = closing.append_column("_kind", pa.array(["close"] * closing.num_rows))
    versions = versions.append_column("_kind", pa.array(["version"] * versions.num_rows))
    merged = pa.concat_tables([closing, versions])
    on = " AND ".join(f"t.{_q(k)} = s.{match[i]}" for i, k in enumerate(keys))
    on += f" AND t.{TO_POSITION} IS NULL"
    if m.buckets > 1:
        on += f" AND t.{BUCKET} = s.{BUCKET}"
    (dt.merge(merged, on, source_alias="s", target_alias="t",
              commit_properties=commit)
     .when_matched_update(updates={c: f"s.{c}" for c in (TO_POSITION, TO_CHANGE, TO_TIME)},
                          predicate="s._kind = 'close'")
     .when_not_matched_insert(updates={_q(n): f"s.{_q(n)}" for n in source.names},
                              predicate="s._kind = 'version'")
     .execute())


def merge_rows(m: TableMirror, rows: Any, batch_id: int, reset: int | None,
               report: BatchReport) -> None:
    """Merge a reduced batch (Arrow: the table's columns, `_position`, `_change`,
    `_bucket` when bucketed, and `_op` upsert or delete; one record per key) into the
    Delta table, committed as application transaction (m.app_id, batch_id). `reset`: a
    snapshot's start, below which rows the snapshot did not rewrite are deleted."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import CommitProperties, DeltaTable, Transaction

    schema = m.schema
    # The merge's source: the target's types, every column nullable (deletes carry
    # only their key), and the op.
    source_schema = pa.schema([schema.field(i).with_nullable(True)
                               for i in range(len(schema.names))]
                              + [pa.field("_op", pa.string())])
    rows = rows.cast(source_schema)
    upsert = pc.equal(rows.column("_op"), "upsert")
    report.upserts = int(pc.sum(upsert).as_py() or 0)
    report.deletes = rows.num_rows - report.upserts
    commit = CommitProperties(app_transactions=[Transaction(app_id=m.app_id,
                                                            version=batch_id)])
    dt = DeltaTable(m.path)
    follow_columns(m, dt, rows.filter(upsert), "has NULL in a change (dropped at the source?)")
    if reset is not None:
        # Rows older than the snapshot that it did not find are gone from the source.
        # Before the merge: its records are all at or after the snapshot's start.
        dt.delete(f"{POSITION} < {int(reset)}",
                  commit_properties=None if rows.num_rows else commit)
    if not rows.num_rows:
        return
    newer = (f"(s.{POSITION} > t.{POSITION} OR (s.{POSITION} = t.{POSITION} AND "
             f"s.{CHANGE} > t.{CHANGE}))")
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in m.keys)
    if m.buckets > 1:
        on += f" AND t.{BUCKET} = s.{BUCKET}"
    values = {_q(name): f"s.{_q(name)}" for name in schema.names}
    metrics = (dt.merge(
        rows, on, source_alias="s", target_alias="t", commit_properties=commit)
        .when_matched_delete(predicate=f"s._op = 'delete' AND {newer}")
        .when_matched_update(updates=values, predicate=f"s._op = 'upsert' AND {newer}")
        .when_not_matched_insert(updates=values, predicate="s._op = 'upsert'")
        .execute())
    report.rewritten = int(metrics.get("num_target_rows_copied", 0))
    report.files_rewritten = int(metrics.get("num_target_files_removed", 0))


def check_checkpoint(m: TableMirror) -> None:
    """Refuse a checkpoint behind its target (restored or copied from an older state:
    its next batches would reuse ids the table holds, and be skipped), and a history
    table behind its mirror (history asked for after the mirror began)."""
    from deltalake import DeltaTable

    done = DeltaTable(m.path).transaction_version(m.app_id)
    last = _last_offset(m.checkpoint) if "://" not in m.checkpoint else done
    if done is not None and (last is None or done > last):
        raise MirrorError(f"{m.table}: the table at {m.path} holds batch {done} of the "
                          f"checkpoint at {m.checkpoint}, which has planned "
                          f"{'none' if last is None else f'up to {last}'}: a restored or "
                          "copied checkpoint; mirror into a new target with it, or with a "
                          "new checkpoint")
    if m.history:
        kept = DeltaTable(m.history_path).transaction_version(m.history_app_id)
        if done is not None and (kept is None or kept < done - 1):
            raise MirrorError(f"{m.table}: the history at {m.history_path} is behind the "
                              "mirror (history was not kept for every batch): history "
                              "starts with a snapshot, so mirror with it into a new target")


def clear_torn_start(checkpoint: str) -> None:
    """A driver killed while it wrote a new query's first offset leaves only that
    offset's temporary file, and Spark then refuses the checkpoint as not empty (on batch
    0). With no offset written, nothing was read: the file goes. (Local checkpoints;
    other stores do not write the offset through a temporary file.)"""
    offsets = os.path.join(checkpoint, "offsets")
    if "://" in checkpoint or not os.path.isdir(offsets):
        return
    names = os.listdir(offsets)
    if any(not n.startswith(".") for n in names):
        return
    for name in names:
        if name.endswith((".tmp", ".tmp.crc")):
            log.info("%s: removing %s, the first offset a killed driver left half written",
                     checkpoint, name)
            os.unlink(os.path.join(offsets, name))


class NotStarted:
    """In a job's queries, a table's query whose start raised (Spark's data source could
    not reach the tap, a Python worker did not start): a failed query to restart_failed."""

    isActive = False
    lastProgress = None
    status: dict[str, Any] = {}

    def __init__(self, error: Exception) -> None:
        self.error = error

    def exception(self) -> Exception:
        return self.error

    def stop(self) -> None:
        pass


# --- the job --------------------------------------------------------------------------------


class MirrorJob:
    """Every planned table's streaming query in one Spark session, run until caught up
    (trigger available-now) or until stopped (SIGINT, SIGTERM or `stop()`); a query that
    fails starts again from its checkpoint while the others run (`restart_failed`)."""

    def __init__(self, spark: Any, settings: MirrorSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.mirrors: list[TableMirror] = []
        self.writers: dict[str, MirrorWriter] = {}
        self.queries: list[Any] = []
        self.failures: dict[str, int] = {}   # per table: its query's failures (or starts')
        self.restarts: dict[str, int] = {}   # per table: its query started again after one
        self._attempts: dict[int, int] = {}  # per query: failures in a row, restarted
        self._due: dict[int, float] = {}     # per failed query: when it starts again
        self._stop = threading.Event()

    def start(self) -> list[Any]:
        from relay.tap.spark import register

        register(self.spark)
        self.mirrors = plan(self.settings)
        for m in self.mirrors:  # every table checked before any query starts
            ensure_table(m)
            if m.history:
                ensure_history(m)
            check_checkpoint(m)
            clear_torn_start(m.checkpoint)
        try:
            for m in self.mirrors:
                log.info("%s: into %s (key %s, %d buckets), query %s", m.table, m.path,
                         ",".join(m.keys), m.buckets, m.name)
                try:
                    self.queries.append(self._start_query(m))
                except Exception as exc:   # (restart_failed retries it as a failed query)
                    self.queries.append(NotStarted(exc))
        except BaseException:
            for q in self.queries:  # (none left running behind an interrupt)
                q.stop()
            raise
        return self.queries

    def _start_query(self, m: TableMirror) -> Any:
        writer = MirrorWriter(m)
        self.writers[m.table] = writer
        reader = self.spark.readStream.format("relay")
        for k, v in self.settings.reader_options(m.table, one_table=True).items():
            reader = reader.option(k, v)
        stream = (reader.option("images", "typed").option("name", m.name).load()
                  .writeStream.queryName(m.name).foreachBatch(writer)
                  .option("checkpointLocation", m.checkpoint))
        trigger = self.settings.trigger
        if trigger.mode is TriggerMode.AVAILABLE_NOW:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=trigger.interval)
        return stream.start()

    def stop(self) -> None:
        """Ask the queries to stop (from any thread): the batch in flight is abandoned,
        and replayed by the next run."""
        self._stop.set()

    def run(self, progress_every: float = 30.0, stop_wait: float = 60.0) -> int:
        """Start, then wait until every query has ended, one has failed for good (the
        others are then stopped) or a stop is asked for; 0 when none failed, 1 when one
        did (its error logged), or was failed and waiting to start again at the stop. A
        query that fails is started again from its checkpoint (`restart_failed`). A stop
        waits up to `stop_wait` seconds for each query to finish its batch in flight,
        then abandons it (replayed by the next run)."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            last_report = time.monotonic()
            while not self._stop.is_set():
                running, given_up = self.restart_failed()
                if given_up or not running:
                    break
                self._stop.wait(0.5)
                if time.monotonic() - last_report >= progress_every:
                    last_report = time.monotonic()
                    for line in self.progress():
                        log.info("%s", line)
            if self._stop.is_set() or self.failed():
                log.info("stopping %d queries", len(self.queries))
                self._stop_queries(stop_wait)
            failed = self.failed()
            for m, q in zip(self.mirrors, self.queries, strict=False):
                error = q.exception()
                if error is not None:
                    log.error("%s: the query stopped: %s", m.table, _first_line(error))
                    if schema_change_of(error) is not None:
                        log.error("%s: %s", m.table, SCHEMA_ADVICE)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if failed else 0

    def restart_failed(self) -> tuple[bool, bool]:
        """Start the queries that failed again, each from its checkpoint (exactly once, so
        a batch in flight is replayed, never lost nor merged twice):
        - one that stopped because columns were added at the source (under add_columns)
          at once, planned anew: its schema has them, and its merges add them to the
          Delta table (NULL in the rows before);
        - one that failed otherwise (the relay restarted, the tap or Spark's Python
          workers briefly unreachable), or whose new plan could not be made, after 1, 2,
          4, ... seconds, up to `settings.restarts` times in a row (a query that has made
          progress since counts from 0 again); not one whose source table's columns
          changed in a way its schema does not follow (that needs the user:
          SCHEMA_ADVICE).
        The others keep running meanwhile. Each query's state is read once, and judged
        as read: (whether any query runs or waits to start again, whether one failed
        for good: the job then stops)."""
        now = time.monotonic()
        running = given_up = False
        for i, (m, q) in enumerate(zip(self.mirrors, self.queries, strict=True)):
            if self._stop.is_set():
                return running, given_up
            if q.isActive:
                running = True
                if self._attempts.get(i) and q.lastProgress:
                    self._attempts[i] = 0   # it made progress since its last restart
                continue
            error = q.exception()
            if error is None:
                continue   # it ended (available-now)
            change = schema_change_of(error)
            if change == "ColumnsAdded" and m.evolution is SchemaEvolution.ADD_COLUMNS:
                problem = self._restart_with_added_columns(i, m)
                if problem is None:
                    running = True   # (started again: it runs)
                elif not self._schedule_restart(i, m, problem, now):
                    given_up = True
            elif change is not None:
                given_up = True   # the user's decision: the job stops
            elif i not in self._due:
                given_up |= not self._schedule_restart(i, m, _first_line(error), now)
            elif now >= self._due[i]:
                del self._due[i]
                log.info("%s: starting its query again (restart %d of %d)", m.table,
                         self._attempts[i], self.settings.restarts)
                try:
                    self.queries[i] = self._start_query(m)
                    self.restarts[m.table] = self.restarts.get(m.table, 0) + 1
                    running = True
                except Exception as exc:   # (the tap unreachable at the start: a failure)
                    given_up |= not self._schedule_restart(i, m, _first_line(exc), now)
            running |= i in self._due
        return running, given_up

    def _schedule_restart(self, i: int, m: TableMirror, why: str, now: float) -> bool:
        """Query i failed (`why`): its next restart is due after restart_delay, unless it
        has had settings.restarts in a row (False: it stays failed, and the job stops)."""
        self.failures[m.table] = self.failures.get(m.table, 0) + 1
        attempt = self._attempts.get(i, 0) + 1
        if attempt > self.settings.restarts:
            log.error("%s: the query failed %d times in a row", m.table, attempt)
            return False
        self._attempts[i] = attempt
        delay = restart_delay(attempt)
        self._due[i] = now + delay
        log.warning("%s: the query failed (%s): it starts again from its checkpoint in %g s",
                    m.table, why, delay)
        return True

    def _restart_with_added_columns(self, i: int, m: TableMirror) -> str | None:
        """The query of a table whose columns were added at the source, planned anew and
        started again; None when it was, else why not: its new plan has no column the
        query lacked, or the plan or the start failed (the tap or the source
        unreachable, the table changed beyond columns added)."""
        try:
            (fresh,) = plan(replace(self.settings, tables=(m.table,)))
            if set(fresh.source_columns) <= set(m.source_columns):
                # The new plan has no column the query lacked: it would stop again.
                return (f"columns were added at the source, but the table's plan has none "
                        f"the query lacked ({', '.join(fresh.source_columns)})")
            ensure_table(fresh)
            if fresh.history:
                ensure_history(fresh)
            log.info("%s: columns were added at the source: starting its query again "
                     "with %s", m.table, ", ".join(
                         c for c in fresh.source_columns if c not in m.source_columns))
            self.queries[i] = self._start_query(fresh)
            self.mirrors[i] = fresh
            return None
        except Exception as exc:
            return f"starting it again with the added columns failed: {exc}"

    def failed(self) -> bool:
        """A query has failed (and not been started again since)."""
        return any(not q.isActive and q.exception() is not None for q in self.queries)

    def _stop_queries(self, wait: float) -> None:
        """Stop each query when its batch in flight has ended (or it is between batches),
        within `wait` seconds; a query still in its batch then is stopped inside it (its
        writer is cut short, and the batch is replayed by the next run)."""
        # A writer cut short raises through py4j, which logs it with its traceback:
        # expected here, so not shown; nor Spark's warnings about the tasks it cancels.
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
        self.spark.sparkContext.setLogLevel("ERROR")
        deadline = time.monotonic() + wait
        pending = {id(q): (q, _batch_id(q)) for q in self.queries}
        while pending:
            for key, (q, batch) in list(pending.items()):
                if not q.isActive or not q.status.get("isTriggerActive") or \
                        _batch_id(q) != batch or time.monotonic() >= deadline:
                    q.stop()
                    del pending[key]
            time.sleep(0.05)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def progress(self) -> list[str]:
        """A line per table from its query's last progress: batch, rows, the snapshot's
        chunks, the GTID it reached and how far behind the relay's log it is."""
        out = []
        relay_at = self._relay_gtid()
        for m, q in zip(self.mirrors, self.queries, strict=False):
            p = q.lastProgress
            if not p or not p.get("sources"):
                out.append(f"{m.table}: starting")
                continue
            src = p["sources"][0]
            end = _offset(src.get("endOffset"))
            text = f"{m.table}: batch {p.get('batchId')}, {p.get('numInputRows', 0):,} rows"
            snap = end.get("snapshot") or {}
            if snap and int(snap.get("next", 0)) < int(snap.get("chunks", 0)):
                text += f", snapshot chunk {snap['next']} of {snap['chunks']}"
            if end.get("gtid"):
                text += f", at {end['gtid']}"
            behind = transactions_behind(end.get("gtid"), relay_at)
            if behind is not None:
                text += f", {behind:,} transactions behind the relay"
            out.append(text)
        return out

    def _relay_gtid(self) -> str | None:
        """The GTID state of the relay's log (its tap's status), or None when the tap
        does not answer now (the queries say why, if it matters)."""
        from relay.tap.spark import TapOptions

        try:
            with TapOptions(self.settings.reader_options(self.mirrors[0].table)).client() as tap:
                return str(tap.status().get("gtid_state") or "") or None
        except Exception as exc:  # a progress line is not worth stopping for
            log.debug("tap status: %s", exc)
            return None


def restart_delay(attempt: int) -> float:
    """Seconds before a failed query's `attempt`th restart in a row: 1, 2, 4, ... at most
    RESTART_DELAY_MAX."""
    return float(min(2.0 ** (attempt - 1), RESTART_DELAY_MAX))


def _batch_id(query: Any) -> int | None:
    """The id of the query's last finished batch."""
    progress = query.lastProgress
    return int(progress["batchId"]) if progress else None


def _offset(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if value else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _error_text(error: Any) -> str:
    return str(getattr(error, "desc", None) or error)


def schema_change_of(error: Any) -> str | None:
    """The tap's schema error a query stopped on (evolution.ColumnsAdded or SchemaChanged,
    its Python error inside Spark's text), or None."""
    found = re.search(r"relay\.tap\.evolution\.(ColumnsAdded|SchemaChanged): ",
                      _error_text(error))
    return found.group(1) if found else None


def _first_line(error: Any) -> str:
    """The Python error a failed batch raised (`module.Error: message`), else the first
    line of what Spark says."""
    text = _error_text(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Invalid|Interrupt)\w*: ", line) or \
                re.match(r"relay\.[\w.]+: ", line):
            return line
    return lines[0] if lines else text
