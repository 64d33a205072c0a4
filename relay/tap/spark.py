"""The relay tap as a PySpark data source ("relay"), batch and Structured Streaming.

    from relay.tap.spark import register
    register(spark)
    df = (spark.read.format("relay").option("endpoint", "relay-host:4000")
          .option("tables", "shop.%").load())
    q = (spark.readStream.format("relay").option("endpoint", "relay-host:4000")
         .option("maxRowsPerBatch", 100000).load()
         .writeStream.format("parquet").option("checkpointLocation", ck).start(out))

How it works: the driver asks the tap for positions and plans partitions at transaction
boundaries from the tap's index (row counts per transaction); each executor fetches the
raw transactions of its range (self-contained with their table maps) and decodes them with
relay's row codec into Arrow record batches. The relay only reads and sends bytes.

Offsets are {"v": 2, "epoch": <the relay log's identity>, "pos": <a tap position at a
transaction boundary>, "gtid": <the GTID state before it: a MariaDB GTID position or a
MySQL GTID set, for people and progress reports; not read back>}. A restarted query
resumes from its checkpoint: Spark replays an unfinished batch with the same (start, end),
and the tap serves the same rows for it. A rebuilt relay log (another epoch) is refused
loudly. `commit` (one batch late, and never for the last batch: see docs) only
acknowledges the position to the tap as a retention hint.

Options (case-insensitive): relay/tap/options.py, rendered as
docs/reference/tap-options.md. An unknown option is refused, naming the closest known one.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import logging
import math
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from relay.binlog.changes import RowsStatement
from relay.binlog.decoder import StreamDecoder
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.config import TlsMode, is_loopback
from relay.tap.arrow import FORMS, BatchBuilder, schema_ddl
from relay.tap.client import TapClient
from relay.tap.evolution import SchemaEvolution, union
from relay.tap.frames import RawFrames
from relay.tap.options import DEFAULTS, KNOWN_OPTIONS
from relay.tap.protocol import TapError
from relay.tap.snapshot import (
    SNAPSHOT_CHANGE,
    SNAPSHOT_END_OP,
    Chunk,
    ChunkReader,
    SnapshotError,
    SnapshotMode,
    SourceSpec,
    TableSpec,
    describe,
    json_row_writer,
    json_text_plan,
    key_of,
    match_tables,
    plan_chunks,
    plan_is_stale,
    table_map_now,
)
from relay.tap.snapshots import STALE

try:  # admission control and Trigger.AvailableNow for Python sources: pyspark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older pyspark: batch reads only
    raise ImportError("relay.tap.spark needs pyspark >= 4.2 (pip install 'pyspark>=4.2')"
                      ) from None

OFFSET_VERSION = 2
MAX_PROGRESS_TABLES = 64   # tables a snapshot's offset reports progress for


# The (FORMAT_DESCRIPTION, TABLE_MAP) events of a typed table's maps, oldest first.
Versions = list[tuple[bytes, bytes]]
# What Spark itself passes to every source (not ours to check).
_SPARK_OPTIONS = {"path", "paths", "queryname", "checkpointlocation"}
log = logging.getLogger("relay.tap.spark")


def _check_known(options: dict[str, str]) -> None:
    known = {k.lower(): k for k in KNOWN_OPTIONS}
    for key in options:
        low = key.lower()
        if low in known or low in _SPARK_OPTIONS:
            continue
        close = difflib.get_close_matches(low, list(known), n=1, cutoff=0.6)
        hint = f"; did you mean {known[close[0]]!r}?" if close else \
            f"; the relay data source knows {', '.join(KNOWN_OPTIONS)}"
        raise ValueError(f"unknown option {key!r} for format(\"relay\"){hint}")


class TapOptions:
    """The data source options, checked once; plain attributes (pickled to executors)."""

    def __init__(self, options: dict[str, str]) -> None:
        _check_known(options)
        o = {k.lower(): v for k, v in options.items()}
        if not o.get("endpoint"):
            raise ValueError("the relay data source needs .option(\"endpoint\", "
                             "\"host:port\") (the relay's [tap] listen address)")
        self.endpoint = o["endpoint"]
        self.user = o.get("user", "")
        self.password = o.get("password")
        self.password_env = o.get("passwordenv")
        self.table = o.get("table") or None
        if self.table is not None and self.table.count(".") != 1:
            raise ValueError(f"table: \"schema.table\", not {self.table!r}")
        tables = o.get("tables")
        self.tables = [t.strip() for t in tables.split(",") if t.strip()] if tables else None
        if self.table is not None:
            self.tables = [_literal_pattern(self.table)]
        self.form = o.get("images", "typed" if self.table else "json").lower()
        if self.form not in FORMS:
            raise ValueError(f"images: one of {', '.join(FORMS)}, not {self.form!r}")
        if self.form == "typed" and self.table is None:
            raise ValueError("images = typed needs .option(\"table\", \"schema.table\")")
        self.start = o.get("start", DEFAULTS["start"])
        self.end = o.get("end", DEFAULTS["end"])
        self.max_rows_per_batch = _positive(o, "maxrowsperbatch")
        self.max_rows_per_partition = _counted(o, "maxrowsperpartition")
        self.num_partitions = _positive(o, "numpartitions")
        self.name = o.get("name") or default_name(o)
        try:
            self.evolution = SchemaEvolution(
                o.get("schemaevolution", DEFAULTS["schemaevolution"]).lower())
        except ValueError:
            raise ValueError("schemaEvolution: fail, add_columns or json, not "
                             f"{o.get('schemaevolution')!r}") from None
        self.types = [t.strip() for t in o.get("types", "").split(",") if t.strip()]
        TypeHints.parse(self.types)  # wrong hints fail here, on the driver
        self.batch_rows = _counted(o, "batchrows")
        self.timeout = float(o.get("timeout", DEFAULTS["timeout"]))
        self.tls = o.get("tls", DEFAULTS["tls"]).lower() in ("true", "1", "yes") or \
            bool(o.get("tlsca"))
        self.tls_ca = o.get("tlsca") or None
        try:
            self.tls_verify = TlsMode(o.get("tlsverify", DEFAULTS["tlsverify"]).upper())
            if not self.tls_verify.required:
                raise ValueError
        except ValueError:
            raise ValueError("tlsVerify: VERIFY_IDENTITY (the default), VERIFY_CA or "
                             f"REQUIRED, not {o.get('tlsverify')!r}") from None
        try:
            self.snapshot = SnapshotMode(o.get("snapshot", DEFAULTS["snapshot"]).lower())
        except ValueError:
            raise ValueError("snapshot: never, initial or when_needed, not "
                             f"{o.get('snapshot')!r}") from None
        self.snapshot_source = o.get("snapshotsource")
        self.snapshot_user = o.get("snapshotuser")
        self.snapshot_password = o.get("snapshotpassword")
        self.snapshot_password_env = o.get("snapshotpasswordenv")
        self.snapshot_chunk_rows = _counted(o, "snapshotchunkrows")
        self.snapshot_chunks_per_batch = _counted(o, "snapshotchunksperbatch")
        # at most this many chunks of one table in a batch (read at once): 0, no bound
        self.snapshot_chunks_per_table = _positive(o, "snapshotchunkspertable") or 0
        # Tables to copy again while the stream goes on, once per resnapshotId (a query
        # restarted with the same options does not copy them again).
        self.resnapshot = [t.strip() for t in o.get("resnapshot", "").split(",") if t.strip()]
        self.resnapshot_id = o.get("resnapshotid") or ",".join(self.resnapshot)
        self.snapshot_timeout = float(o.get("snapshottimeout", DEFAULTS["snapshottimeout"]))
        self.snapshot_keys = _key_columns(o.get("snapshotkeycolumns"), self.table)
        if self.snapshot is not SnapshotMode.NEVER:
            if not self.tables:
                raise ValueError("a snapshot needs the tables it copies: .option(\"table\", "
                                 "\"schema.table\") or .option(\"tables\", \"shop.%\")")
            if "start" in o:
                raise ValueError(f"snapshot = {self.snapshot.value} starts the stream where "
                                 "the snapshot is taken: leave start out")
        # Without snapshotSource: the primary the relay follows (the tap says which).
        self.source_default: str | None = None
        # The tap's status says the relay's source uses TLS (None: not asked yet, or a
        # relay whose status does not say).
        self.source_tls: bool | None = None
        if self.snapshot is not SnapshotMode.NEVER and self.snapshot_source:
            self.source()  # a wrong URL or an unset variable fails on the driver

    @property
    def links_tls(self) -> bool:
        """Whether the relay's own links use TLS: this tap connection, or (its status
        says) the relay's source. Snapshot reads then require TLS unless snapshotSource
        names an ssl-mode."""
        return self.tls or bool(self.source_tls)

    def source(self) -> SourceSpec:
        return SourceSpec.parse(self.snapshot_source, default_address=self.source_default,
                                user=self.snapshot_user, password=self.snapshot_password,
                                password_env=self.snapshot_password_env,
                                tls_default=TlsMode.REQUIRED if self.links_tls
                                else TlsMode.PREFERRED)

    def learn_source(self, tap: TapClient) -> None:
        """Where snapshot reads go without snapshotSource (the relay's current primary),
        and whether the relay's source uses TLS, from the tap's status. An address learned
        over a plain-text tap connection beyond loopback is not trusted with the snapshot
        password: anyone on the path could name a server of theirs."""
        if self.snapshot is SnapshotMode.NEVER or self.source_tls is not None:
            return
        status = tap.status()
        self.source_tls = bool(status.get("source_tls"))
        if self.snapshot_source:
            return
        host = self.endpoint.rpartition(":")[0] or self.endpoint
        if not self.tls and not is_loopback(host):
            raise SnapshotError(
                "snapshot reads need .option(\"snapshotSource\", \"mysql://user@host:port\") "
                f"here: the tap at {self.endpoint} is reached in plain text, and the address "
                "its status names for the snapshot's login could have been changed on the "
                "way (to a server that collects the password). Name the source yourself, or "
                "reach the tap over TLS (.option(\"tls\", \"true\"), [tap.tls])")
        self.source_default = str(status.get("source") or "") or None

    def client(self) -> TapClient:
        return TapClient(self.endpoint, self.user, self.password,
                         password_env=self.password_env, timeout=self.timeout, tls=self.tls,
                         tls_ca=self.tls_ca, tls_verify=self.tls_verify).connect()

    def hints(self) -> TypeHints:
        return TypeHints.parse(self.types) if self.types else NO_HINTS

    @staticmethod
    def position(value: str) -> int | str:
        return int(value) if value.isdigit() else value


# The options that make one stream differ from another (not credentials, not sizes).
_STREAM_OPTIONS = ("endpoint", "table", "tables", "images", "types", "start", "snapshot")


def default_name(options: dict[str, str]) -> str:
    """The subscriber name of a query that gives none: Spark does not tell a Python source
    its queryName or checkpoint (pyspark 4.3 passes neither), so queries reading
    different streams get different names from what they read; two that read the same
    one should each be given a `name`."""
    ident = json.dumps({k: options.get(k) for k in _STREAM_OPTIONS}, sort_keys=True)
    return "spark-" + hashlib.sha256(ident.encode()).hexdigest()[:12]


def _key_columns(text: str | None, table: str | None) -> dict[str, list[str]]:
    """snapshotKeyColumns: "col1,col2" (with `table`) or "s.t=col1,col2;s.u=c"."""
    if not text:
        return {}
    out: dict[str, list[str]] = {}
    for part in text.split(";"):
        name, eq, cols = part.rpartition("=")
        if not eq:
            if table is None:
                raise ValueError("snapshotKeyColumns: \"schema.table=col1,col2;...\" (or "
                                 "\"col1,col2\" with the table option)")
            name, cols = table, part
        out[name.strip()] = [c.strip() for c in cols.split(",") if c.strip()]
    return out


def _counted(o: dict[str, str], key: str) -> int:
    """A positive count, or its documented default (relay/tap/options.py)."""
    return _positive(o, key) or int(DEFAULTS[key])


def _positive(o: dict[str, str], key: str) -> int | None:
    if key not in o or o[key] in ("", None):
        return None
    try:
        n = int(o[key])
    except ValueError:
        raise ValueError(f"{key}: a positive integer, not {o[key]!r}") from None
    if n < 1:
        raise ValueError(f"{key}: a positive integer, not {n}")
    return n


def _literal_pattern(name: str) -> str:
    """A table name as a do_tables pattern matching only itself."""
    return name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")


class _Partition(InputPartition):
    """What every partition carries to its executor (pickled): the options and, for
    typed images, the table's map."""

    def __init__(self, index: int, options: TapOptions,
                 table: Versions | None) -> None:
        super().__init__(index)
        self.options = options
        self.table = table

    def builder(self) -> BatchBuilder:
        o = self.options
        table = typed_table(self.table, o) if self.table is not None else None
        return BatchBuilder(o.form, table, o.batch_rows, o.evolution)


class TapPartition(_Partition):
    """Everything an executor needs to read [start, end) (pickled to it)."""

    def __init__(self, index: int, start: int, end: int, rows: int, epoch: str,
                 options: TapOptions, table: Versions | None) -> None:
        super().__init__(index, options, table)
        self.start = start
        self.end = end
        self.rows = rows
        self.epoch = epoch


def decode_table(raw: tuple[bytes, bytes], hints: TypeHints) -> TableMap:
    fde, event = raw
    decoder = StreamDecoder(hints)
    decoder.format_description(fde)
    return decoder.table_map(event)


def typed_table(versions: Versions, o: TapOptions) -> TableMap:
    """The typed query's table: its newest map, or with schemaEvolution=add_columns the
    union of every map the log holds (relay/tap/evolution.py)."""
    hints = o.hints()
    if o.evolution is SchemaEvolution.ADD_COLUMNS:
        return union([decode_table(v, hints) for v in versions])
    return decode_table(versions[-1], hints)


def read_partition(part: TapPartition) -> Iterator[Any]:
    """Executor side: fetch the raw range, decode it, yield Arrow record batches."""
    o = part.options
    hints = o.hints()
    builder = part.builder()
    with o.client() as tap:
        frames = RawFrames(tap.fetch_frames(part.start, part.end, tables=o.tables,
                                            epoch=part.epoch), hints=hints)
        seen = 0
        for item in frames:
            seen += 1
            yield from builder.add_transaction(item)
        end = frames.end
        if end is None or end.get("transactions") != seen:
            raise TapError("internal", f"range {part.start}..{part.end}: the tap announced "
                                       f"{end and end.get('transactions')} transactions, "
                                       f"{seen} arrived")
    if len(builder):
        yield builder.flush()


class SnapshotPartition(_Partition):
    """Chunks of one table of a snapshot, read in turn by one task (pickled to an
    executor): each chunk is still its own transaction, watermark and progress report."""

    def __init__(self, index: int, chunks: list[Chunk], spec: TableSpec,
                 snap_id: str | None, epoch: str, options: TapOptions,
                 table: Versions | None) -> None:
        super().__init__(index, options, table)
        self.chunks = chunks
        self.spec = spec
        self.snap_id = snap_id
        self.epoch = epoch


def snapshot_partitions(chunks: Sequence[Chunk], specs: Sequence[TableSpec],
                        snap_id: str | None, epoch: str, o: TapOptions,
                        table: Versions | None) -> list[SnapshotPartition]:
    """The chunks as tasks: runs of one table's chunks of about maxRowsPerPartition rows
    (or numPartitions tasks, and at least one per table). A task costs Spark some 100 ms
    of CPU beyond its rows (the JVM's and the Python worker's), so a task per chunk of
    8,192 rows spent more on tasks than on rows."""
    if o.num_partitions:
        per_task = max(1, math.ceil(len(chunks) / o.num_partitions))
    else:
        per_task = max(1, o.max_rows_per_partition // o.snapshot_chunk_rows)
    groups: list[list[Chunk]] = []
    for _, run in itertools.groupby(chunks, key=lambda c: c.table):
        same = list(run)
        groups += [same[i : i + per_task] for i in range(0, len(same), per_task)]
    return [SnapshotPartition(i, group, specs[group[0].table], snap_id, epoch, o, table)
            for i, group in enumerate(groups)]


class SnapshotEndPartition(_Partition):
    """The end of a snapshot: one "snapshot_end" record per table at the stream start."""

    def __init__(self, index: int, start: int, tables: list[tuple[str, str]],
                 options: TapOptions, table: Versions | None) -> None:
        super().__init__(index, options, table)
        self.start = start
        self.tables = tables


def read_snapshot_end(part: SnapshotEndPartition) -> Iterator[Any]:
    """A record per table saying: every row of it that is current was delivered at this
    position or later, so an older row of a mirror is one the snapshot did not find
    (deleted while the log did not hold the changes, for when_needed) and goes."""
    builder = part.builder()
    for schema, name in part.tables:
        yield from builder.add_marker(schema, name, SNAPSHOT_END_OP, part.start)
    if len(builder):
        yield builder.flush()


def _read(partition: InputPartition) -> Iterator[Any]:
    if isinstance(partition, SnapshotPartition):
        return read_snapshot_partition(partition)
    if isinstance(partition, SnapshotEndPartition):
        return read_snapshot_end(partition)
    if isinstance(partition, TapPartition):
        return read_partition(partition)
    # A reader that planned no partition (an empty range) gets one placeholder from
    # Spark all the same: it reads nothing.
    return iter(())


def read_snapshot_partition(part: SnapshotPartition) -> Iterator[Any]:
    """Executor side: read the task's chunks in turn over one connection to the source,
    each as `_read_chunk` does; yield batches (which may hold rows of several chunks)."""
    o = part.options
    builder = part.builder()
    conn = o.source().connect(o.timeout)
    views: dict[tuple[str, int], str] = {}  # (the connection's server: one task's)
    try:
        # One connection to the tap for the task's chunks, as to the source: two per
        # chunk (its watermark, its progress) cost a login each.
        with o.client() as tap:
            for chunk in part.chunks:
                rows = yield from _read_chunk(part, chunk, conn, tap, builder, views)
                if part.snap_id is not None:  # progress only (before the last yield:
                    # Spark may not resume a reader after its last batch)
                    tap.snapshot_done(part.snap_id, chunk.index, rows)
    finally:
        conn.close()
    if len(builder):
        yield builder.flush()


def _read_chunk(part: SnapshotPartition, chunk: Chunk, conn: Any, tap: TapClient,
                builder: BatchBuilder, views: dict[tuple[str, int], str],
                ) -> Generator[Any, None, int]:
    """Read one chunk in a consistent-snapshot transaction, place it in the log
    (watermark), drop the keys the window changed, add its rows to `builder` (yielding
    the batches that fill): the rows added, or STALE for a chunk of a table whose columns
    changed since the plan."""
    o = part.options
    spec = part.spec
    names = [c.name for c in spec.columns]
    reader = ChunkReader(conn, spec, chunk)
    read = reader.begin(views)
    low, high = tap.watermark(read.gtid, o.snapshot_timeout)
    if not read.exact:
        low = min(low, tap.watermark(read.gtid_low, o.snapshot_timeout)[0])
    changed = _changed_keys(tap, part, low, high) if low < high else set()
    # (A typed read makes the table's map from them: it needs the exact collations.)
    columns = reader.columns_now(collation_ids=builder.check is not None)
    if plan_is_stale(spec, columns):
        # An ALTER TABLE since the plan: nothing of this plan's columns, the table is
        # copied again as it is now (and gets no snapshot_end from this snapshot).
        reader.end()
        if part.snap_id is None:
            raise SnapshotError(f"{spec.qualified} changed its columns while the "
                                "snapshot read it: read it again")
        tap.resnapshot(o.name, [_literal_pattern(spec.qualified)])
        return STALE
    shape = None
    if builder.check is not None:  # typed: the table as read, judged as a change's map
        shape = builder.check.shape(table_map_now(conn, spec, o.hints(), columns),
                                    f"where the snapshot read it (chunk {chunk.index})")
    rows = 0
    text_plan = json_text_plan(spec) if o.form == "json" and not changed else None
    if text_plan is not None:  # the hot path: the server's rows to JSON by a kernel
        result = reader.result()
        plan, keys = text_plan
        slow = json_row_writer(spec)  # (the rows the kernel gives back)
        rows = yield from builder.add_snapshot_json(
            spec.schema, spec.table, high, SNAPSHOT_CHANGE,
            lambda images, room: result.json_into(images, plan, keys, slow, room))
        reader.finish(result)
        return rows
    # json (with keys to drop), typed (cast by Arrow where it can), map
    write = json_row_writer(spec) if o.form == "json" else None
    fsp = [c.fsp for c in spec.columns]
    for raw in reader.raw_rows():
        keep = [r for r in raw if reader.convert_key(r) not in changed] if changed else raw
        rows += len(keep)
        if write is not None:
            yield from builder.add_snapshot_images(spec.schema, spec.table, map(write, keep),
                                                   high, SNAPSHOT_CHANGE)
        elif shape is not None:
            yield from builder.add_snapshot_text(spec.schema, spec.table, names, keep, high,
                                                 SNAPSHOT_CHANGE, fsp, shape,
                                                 reader.convert_row)
        else:
            yield from builder.add_snapshot_rows(spec.schema, spec.table, names,
                                                 map(reader.convert_row, keep), high,
                                                 SNAPSHOT_CHANGE, fsp)
    return rows


def _changed_keys(tap: TapClient, part: SnapshotPartition, low: int, high: int,
                  ) -> set[tuple[Any, ...]]:
    """Keys of the chunk's table that the transactions in (low, high] changed."""
    spec = part.spec
    out: set[tuple[Any, ...]] = set()
    frames = RawFrames(tap.fetch_frames(low, high, tables=[_literal_pattern(spec.qualified)],
                                        epoch=part.epoch), hints=part.options.hints())
    for item in frames:
        for st in item.tx.statements():
            if not isinstance(st, RowsStatement) or st.table.schema != spec.schema or \
                    st.table.table != spec.table:
                continue
            for ch in st.changes():
                for image in (ch.before, ch.after):
                    if image is not None:
                        values = dict(zip(image.columns, image, strict=True))
                        out.add(key_of([values.get(k) for k in spec.keys]))
    return out


def plan_snapshot(o: TapOptions, tables: list[str] | None = None,
                  ) -> tuple[list[TableSpec], list[Chunk]]:
    """Driver side: the tables the snapshot copies (`tables` or the query's) and their
    chunks, from the source."""
    patterns = tables or o.tables
    if not patterns:
        raise ValueError("a snapshot needs the tables it copies: .option(\"tables\", ...)")
    conn = o.source().connect(o.timeout)
    try:
        names = match_tables(conn, patterns)
        if tables:  # a re-snapshot: of the query's tables only, and maybe of none now
            chosen = set(match_tables(conn, o.tables or []))
            names = [n for n in names if n in chosen]
            if not names:
                log.warning("relay source: re-snapshot of %s: no table of the query matches "
                            "(dropped, renamed or misspelt): nothing to copy",
                            ", ".join(tables))
                return [], []
        elif not names:
            raise ValueError(f"no table on the snapshot source matches {', '.join(patterns)}")
        specs = [describe(conn, sch, tbl, o.snapshot_keys.get(f"{sch}.{tbl}"))
                 for sch, tbl in names]
        per_table = [plan_chunks(conn, spec, i, o.snapshot_chunk_rows)
                     for i, spec in enumerate(specs)]
    finally:
        conn.close()
    return specs, interleave(per_table)


def interleave(per_table: list[list[Chunk]]) -> list[Chunk]:
    """The tables' chunks taken in turn (numbered in that order), so that a batch of
    consecutive chunks reads several tables at once, not one table's chunks only."""
    order = [c for group in itertools.zip_longest(*per_table) for c in group if c is not None]
    return [replace(c, index=i) for i, c in enumerate(order)]


def next_chunks(chunks: list[Chunk], start: int, per_batch: int, per_table: int) -> int:
    """The end of the next batch of chunks from `start`: at most `per_batch` of them and
    (with `per_table`) at most that many of one table, but at least one."""
    end = min(len(chunks), start + per_batch)
    if not per_table:
        return end
    taken: dict[int, int] = {}
    for i in range(start, end):
        table = chunks[i].table
        if taken.get(table, 0) >= per_table:
            return max(i, start + 1)
        taken[table] = taken.get(table, 0) + 1
    return end


def _partitions(tap: TapClient, o: TapOptions, start: int, end: int, epoch: str,
                table: Versions | None) -> list[TapPartition]:
    split = o.max_rows_per_partition
    if o.num_partitions:
        total = tap.plan(start, end, epoch=epoch)["rows"]
        split = max(1, math.ceil(total / o.num_partitions))
    plan = tap.plan(start, end, split_rows=split, epoch=epoch)
    return [TapPartition(i, a, b, rows, epoch, o, table)
            for i, (a, b, rows) in enumerate(plan["parts"])]


class RelayDataSource(DataSource):
    """format("relay"): row changes from a relay's tap."""

    @classmethod
    def name(cls) -> str:
        return "relay"

    def _options(self) -> TapOptions:
        return TapOptions(dict(self.options))

    def _table(self, o: TapOptions) -> Versions | None:
        if o.form != "typed":
            return None
        assert o.table is not None
        with o.client() as tap:
            if o.evolution is SchemaEvolution.ADD_COLUMNS:
                return tap.schema_versions(o.table)
            return [tap.schema(o.table)]

    def schema(self) -> str:
        o = self._options()
        raw = self._table(o)
        return schema_ddl(o.form, typed_table(raw, o) if raw else None, o.evolution)

    def reader(self, schema: Any) -> DataSourceReader:
        return RelayBatchReader(self._options(), self._table(self._options()))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return RelayStreamReader(self._options(), self._table(self._options()))


class RelayBatchReader(DataSourceReader):
    def __init__(self, options: TapOptions, table: Versions | None) -> None:
        self.o = options
        self.table = table
        self.specs: list[TableSpec] = []
        self.chunks: list[Chunk] = []
        with options.client() as tap:  # resolved once: the DataFrame reads a fixed range
            self.epoch = tap.epoch
            options.learn_source(tap)
            snapshot = options.snapshot is SnapshotMode.INITIAL
            if options.snapshot is SnapshotMode.WHEN_NEEDED:
                snapshot = not _in_log(tap, options.position(options.start))
            if snapshot:  # the stream part from here, the rows read after it
                self.start = tap.resolve("latest")
                self.specs, self.chunks = plan_snapshot(options)
                # The relay keeps no batch read's plan, but judges its tables as a
                # stream's: one the user's tap rules hide or mask is refused ("denied",
                # a TapError that fails the read with the relay's reason).
                tap.snapshot_save(options.name, self.start,
                                  [t.to_wire() for t in self.specs], [])
            else:
                self.start = tap.resolve(options.position(options.start))
            self.end = tap.resolve(options.position(options.end))
        if self.end < self.start:
            raise ValueError(f"end {options.end} ({self.end}) is before start "
                             f"{options.start} ({self.start})")

    def partitions(self) -> list[InputPartition]:
        parts: list[InputPartition] = list(snapshot_partitions(
            self.chunks, self.specs, None, self.epoch, self.o, self.table))
        if self.chunks:
            parts.append(SnapshotEndPartition(len(parts), self.start,
                                              [(t.schema, t.table) for t in self.specs],
                                              self.o, self.table))
        with self.o.client() as tap:
            for p in _partitions(tap, self.o, self.start, self.end, self.epoch, self.table):
                p.value = len(parts)
                parts.append(p)
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)


def _in_log(tap: TapClient, at: int | str) -> bool:
    """Whether the log still holds position `at` (a position, a GTID, "earliest"): what
    when_needed decides by."""
    try:
        tap.resolve(at)
    except TapError as exc:
        if exc.code == "not_in_log":
            return False
        raise
    return True


class RelayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {"v": 2, "epoch", "pos", "gtid"} in the stream ("gtid": the GTID state of
    the transactions before `pos`, for people and the query's progress reports; not read
    back, and left out by a relay that does not tell it); while a snapshot runs, also
    "snapshot": {"id", "next", "chunks", "ended", "progress"}: the chunks before `next`
    were delivered, then (a batch of its own) the snapshot_end records ("ended"); the
    stream part starts at `pos` after that. "progress" is for the query's progress
    reports only. (v1 offsets, without snapshots, and snapshot offsets without "ended",
    whose last chunks came with the end records, are read as they are.)"""

    def __init__(self, options: TapOptions, table: Versions | None) -> None:
        self.o = options
        self.table = table
        self.target: int | None = None   # the end of an availableNow run
        self.epoch: str | None = None
        self._plans: dict[str, tuple[list[TableSpec], list[Chunk]]] = {}
        self._initial: dict[str, Any] | None = None
        self._replanned: dict[int, dict[str, Any]] = {}
        self._resnapshot_asked = False
        self._gtids: dict[int, str | None] = {}   # the GTID state at recent positions

    def _offset(self, tap: TapClient, pos: int, snapshot: dict[str, Any] | None = None,
                ) -> dict[str, Any]:
        out: dict[str, Any] = {"v": OFFSET_VERSION, "epoch": self.epoch, "pos": pos}
        if pos not in self._gtids:
            if len(self._gtids) > 16:
                self._gtids.clear()
            try:
                self._gtids[pos] = tap.gtid_at(pos)
            except TapError as exc:  # (purged meanwhile: the offset goes without it)
                if exc.code != "not_in_log":
                    raise
                self._gtids[pos] = None
        if self._gtids[pos] is not None:
            out["gtid"] = self._gtids[pos]
        if snapshot is not None:
            out["snapshot"] = snapshot
        return out

    def _check(self, tap: TapClient, offset: dict[str, Any]) -> int:
        self.epoch = tap.epoch
        if offset.get("v") not in (1, OFFSET_VERSION) or "pos" not in offset:
            raise ValueError(f"offset {offset} is not a relay tap offset (v{OFFSET_VERSION})")
        if offset.get("epoch") != tap.epoch:
            raise TapError("epoch", f"the checkpoint holds positions of relay log "
                                    f"{offset.get('epoch')}, the tap at {self.o.endpoint} "
                                    f"serves relay log {tap.epoch} (rebuilt or replaced): "
                                    "nothing is read twice or skipped silently; start the "
                                    "query with a new checkpoint to read the new log")
        return int(offset["pos"])

    @staticmethod
    def _running(offset: dict[str, Any]) -> dict[str, Any] | None:
        """The snapshot an offset is inside: chunks left, or (offsets with "ended") its
        end records not yet given. (Offsets written before "ended" gave them with the
        last chunks.)"""
        snap = offset.get("snapshot")
        if isinstance(snap, dict) and (int(snap["next"]) < int(snap["chunks"])
                                       or snap.get("ended") is False):
            return snap
        return None

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:  # Spark may ask more than once: one snapshot
            self._initial = self._first_offset()
        return self._initial

    def _first_offset(self) -> dict[str, Any]:
        o = self.o
        with o.client() as tap:
            self.epoch = tap.epoch
            snapshot = o.snapshot is SnapshotMode.INITIAL
            if o.snapshot is SnapshotMode.WHEN_NEEDED:
                snapshot = not _in_log(tap, o.position(o.start))
            if not snapshot:
                return self._offset(tap, tap.resolve(o.position(o.start)))
            # A new query's snapshot copies the tables anyway: the resnapshot option's
            # request is taken with it (saved as honoured, then marked planned).
            self._ask_resnapshot(tap)
            return self._new_snapshot(tap)

    def _new_snapshot(self, tap: TapClient, start: int | None = None,
                      requested: list[str] | None = None) -> dict[str, Any]:
        """Plan a snapshot (kept by the relay); the offset before its first chunk. The
        stream part starts at `start` (default: the log's end, taken before planning: a
        later row comes from there), the tables are `requested` or the query's."""
        o = self.o
        o.learn_source(tap)
        if start is None:
            start = tap.resolve("latest")
        specs, chunks = plan_snapshot(o, requested)
        snap_id = tap.snapshot_save(o.name, start, [t.to_wire() for t in specs],
                                    [c.to_wire() for c in chunks], requested or o.resnapshot)
        if snap_id is None:  # nothing to copy
            return self._offset(tap, start)
        self._plans[snap_id] = (specs, chunks)
        return self._snapshot_offset(tap, start, snap_id, 0, specs, chunks)

    def _snapshot_offset(self, tap: TapClient, pos: int, snap_id: str, nxt: int,
                         specs: list[TableSpec], chunks: list[Chunk], ended: bool = False,
                         ) -> dict[str, Any]:
        """The offset with the snapshot's chunks before `nxt` delivered (and with `ended`,
        its snapshot_end records); "progress" (chunks done and planned per table, derived
        from `nxt`; up to MAX_PROGRESS_TABLES tables) is for the query's progress reports
        (StreamingQueryProgress.sources[].endOffset), not read back."""
        done = [0] * len(specs)
        total = [0] * len(specs)
        for c in chunks:
            total[c.table] += 1
            if c.index < nxt:
                done[c.table] += 1
        snapshot: dict[str, Any] = {"id": snap_id, "next": nxt, "chunks": len(chunks),
                                    "ended": ended}
        if len(specs) <= MAX_PROGRESS_TABLES:
            snapshot["progress"] = {spec.qualified: [d, t] for spec, d, t in zip(
                specs, done, total, strict=True)}
        return self._offset(tap, pos, snapshot)

    def _ask_resnapshot(self, tap: TapClient) -> None:
        """The resnapshot option, once per reader (the relay honours its id once)."""
        if self.o.resnapshot and not self._resnapshot_asked:
            self._resnapshot_asked = True
            if tap.resnapshot(self.o.name, self.o.resnapshot, self.o.resnapshot_id):
                log.info("relay source: re-snapshot of %s asked for (id %r)",
                         ", ".join(self.o.resnapshot), self.o.resnapshot_id)

    def _plan(self, tap: TapClient, snap_id: str) -> tuple[list[TableSpec], list[Chunk]]:
        plan = self._plans.get(snap_id)
        if plan is None:
            saved = tap.snapshot_load(snap_id)
            plan = ([TableSpec.from_wire(t) for t in saved["tables"]],
                    [Chunk.from_wire(c) for c in saved["chunks"]])
            self._plans[snap_id] = plan
        return plan

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.o.max_rows_per_batch:
            return ReadMaxRows(self.o.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self.o.client() as tap:
            self.target = tap.resolve("latest")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        with self.o.client() as tap:
            pos = self._check(tap, start)
            self._ask_resnapshot(tap)
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            snap = self._running(start)
            if snap is None and self.o.snapshot is SnapshotMode.WHEN_NEEDED and \
                    not _in_log(tap, pos):
                # The checkpoint's position left the log (purged): a new snapshot, then
                # the stream from where it starts.
                if pos not in self._replanned:  # once, though Spark may ask again
                    self._replanned[pos] = self._new_snapshot(tap)
                start = self._replanned[pos]
                snap = start.get("snapshot")
                if snap is None:  # nothing to copy: the stream from now
                    return start
                pos = int(start["pos"])
            if snap is None and "snapshot" not in start and pos in self._replanned:
                # asked again for the same batch: the snapshot already planned for it
                start = self._replanned[pos]
                snap = start.get("snapshot")
            if snap is None:  # a re-snapshot asked for (tap resnapshot): from here on
                requested = tap.snapshot_requested(self.o.name)
                if requested:
                    start = self._replanned[pos] = self._new_snapshot(tap, pos, requested)
                    snap = start.get("snapshot")
            if snap is not None:  # the next chunks, as many as the limits take
                per_batch = self.o.snapshot_chunks_per_batch
                if max_rows is not None:
                    per_batch = max(1, max_rows // self.o.snapshot_chunk_rows)
                specs, chunks = self._plan(tap, str(snap["id"]))
                if int(snap["next"]) >= len(chunks):  # every chunk delivered: the end
                    return self._snapshot_offset(tap, pos, str(snap["id"]), len(chunks),
                                                 specs, chunks, ended=True)
                nxt = next_chunks(chunks, int(snap["next"]), per_batch,
                                  self.o.snapshot_chunks_per_table)
                return self._snapshot_offset(tap, pos, str(snap["id"]), nxt, specs,
                                             chunks)
            # An availableNow run's target may precede a snapshot's stream start (taken
            # after it): then there is nothing more in this run.
            end: int | str = max(self.target, pos) if self.target is not None else "latest"
            plan = tap.plan(pos, end, max_rows=max_rows, epoch=self.epoch)
            if plan["end"] == pos:
                return start
            return self._offset(tap, plan["end"])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        with self.o.client() as tap:
            a, b = self._check(tap, start), self._check(tap, end)
            snap = self._running(start)
            ends_in = end.get("snapshot")
            if isinstance(ends_in, dict) and (start.get("snapshot") or {}).get("id") != \
                    ends_in["id"]:  # when_needed began a snapshot in this batch
                snap = {**ends_in, "next": 0}
            if snap is not None:
                self.o.learn_source(tap)  # a restarted driver learns it again
                snap_id = str(snap["id"])
                specs, chunks = self._plan(tap, snap_id)
                ending = end["snapshot"]
                stop = int(ending["next"])
                parts: list[InputPartition] = list(snapshot_partitions(
                    chunks[int(snap["next"]):stop], specs, snap_id, tap.epoch, self.o,
                    self.table))
                if ending.get("ended") is True:
                    # A batch of its own, after every chunk reported: a table a chunk
                    # found changed is copied again, and ends with that copy.
                    stale = set(tap.snapshot_load(snap_id).get("stale", []))
                    tables = [(t.schema, t.table) for t in specs if t.qualified not in stale]
                    if tables:
                        parts.append(SnapshotEndPartition(len(parts), b, tables, self.o,
                                                          self.table))
                elif "ended" not in ending and stop == len(chunks):
                    # (an offset written before "ended": the end with the last chunks)
                    parts.append(SnapshotEndPartition(len(parts), b,
                                                      [(t.schema, t.table) for t in specs],
                                                      self.o, self.table))
                return parts
            return list(_partitions(tap, self.o, a, b, tap.epoch, self.table))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        # One batch late and never for the last batch: a retention hint, not a receipt.
        with self.o.client() as tap:
            try:
                tap.ack(self.o.name, self._check(tap, end))
            except TapError as exc:  # a position purged meanwhile: a later batch acks
                if exc.code != "not_in_log":
                    raise

    def stop(self) -> None:
        pass


def change_records(changes: Any, keys: list[str]) -> Any:
    """A DataFrame of this source's records as one record per key and change: schema,
    table, the key columns, op "upsert" (with the row, `image`) or "delete", position,
    change and commit_ts. An update that changes the key deletes the old key and upserts
    the new one (at the same position and change). Snapshot ends are left out. `keys`
    are the key column names; images may be json, map or typed."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as PT

    image_type = changes.schema["after"].dataType

    def field(image: Any, name: str) -> Any:
        if isinstance(image_type, PT.StructType):
            return image.getField(name)
        if isinstance(image_type, PT.MapType):
            return F.element_at(image, F.lit(name))
        return F.get_json_object(image, "$." + json_path_name(name))

    def key(image: Any) -> Any:
        return F.struct(*[field(image, k).alias(k) for k in keys])

    before, after = key(F.col("before")), key(F.col("after"))
    upsert = F.struct(F.lit("upsert").alias("op"), after.alias("key"), F.col("after").alias(
        "image"))
    delete = F.struct(F.lit("delete").alias("op"), before.alias("key"),
                      F.lit(None).cast(image_type).alias("image"))
    records = F.when(F.col("op") == "delete", F.array(delete)).when(
        (F.col("op") == "update") & (before != after), F.array(delete, upsert)).otherwise(
        F.array(upsert))
    rows = changes.where(F.col("op") != SNAPSHOT_END_OP)
    exploded = rows.select("schema", "table", "position", "change", "commit_ts",
                           F.explode(records).alias("r"))
    return exploded.select("schema", "table", *[F.col("r.key").getField(k).alias(k)
                                                for k in keys],
                           F.col("r.op").alias("op"), F.col("r.image").alias("image"),
                           "position", "change", "commit_ts")


def latest_per_key(changes: Any, keys: list[str]) -> Any:
    """Reduce a DataFrame of this source's records to what a mirror table needs: per
    (schema, table, key), the last record by (position, change) of `change_records`, as
    op "upsert" with its row (`image`) or op "delete". A snapshot's "snapshot_end" record
    drops the keys of its table whose last record precedes the snapshot (rows the
    snapshot no longer found). The result holds one record per key; merging it, skip a
    record older than the mirror's row (by (position, change)): a change a snapshot row
    already holds. relay.tap.mirror does both."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    records = change_records(changes, keys)
    key_columns = [F.col("`" + k.replace("`", "``") + "`") for k in keys]
    order = Window.partitionBy("schema", "table", *key_columns).orderBy(
        F.col("position").desc(), F.col("change").desc())
    latest = (records.withColumn("_n", F.row_number().over(order)).where("_n = 1")
              .select("schema", "table", *key_columns, "op", "image", "position", "change"))
    # A snapshot's end: rows older than its start that it did not deliver are gone.
    ends = (changes.where(F.col("op") == SNAPSHOT_END_OP).groupBy("schema", "table")
            .agg(F.max("position").alias("_reset")))
    return (latest.join(ends, ["schema", "table"], "left")
            .where(F.col("_reset").isNull() | (F.col("position") >= F.col("_reset")))
            .drop("_reset"))


def json_path_name(name: str) -> str:
    """A column name in a get_json_object path."""
    return name if name.isidentifier() else "['" + name.replace("'", "\\'") + "']"


def register(spark: Any) -> None:
    """Make format("relay") known to a SparkSession."""
    spark.dataSource.register(RelayDataSource)
