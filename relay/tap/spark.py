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

Offsets are {"v": 1, "epoch": <the relay log's identity>, "pos": <a tap position at a
transaction boundary>}. A restarted query resumes from its checkpoint: Spark replays an
unfinished batch with the same (start, end), and the tap serves the same rows for it. A
rebuilt relay log (another epoch) is refused loudly. `commit` (one batch late, and never
for the last batch: see docs) only acknowledges the position to the tap as a retention hint.

Options (case-insensitive):
  endpoint             host:port of the tap (required)
  user, password       tap login; or passwordEnv: the variable holding the password on
                       the driver and on every executor
  tables               comma-separated schema.table patterns (% and _ wildcards), applied
                       on the relay
  table                one table "schema.table": images become typed STRUCTs of its columns
  images               json (default) | map | typed (needs table)
  start                earliest (default) | latest | a GTID position | a tap position
  end                  (batch) latest (default, resolved once per DataFrame) | as start
  maxRowsPerBatch      (stream) admission control: rows per micro-batch (a target: a
                       transaction is never split)
  maxRowsPerPartition  rows per task (default 200000); numPartitions overrides it
  name                 the subscriber name acknowledgements go under (default "spark")
  types                type hints "schema.table.column=uuid,..." (see `relay changes`)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from relay.binlog.decoder import StreamDecoder
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.tap.arrow import FORMS, BatchBuilder, schema_ddl
from relay.tap.client import TapClient
from relay.tap.frames import RawFrames
from relay.tap.protocol import TapError

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

OFFSET_VERSION = 1


class TapOptions:
    """The data source options, checked once; plain attributes (pickled to executors)."""

    def __init__(self, options: dict[str, str]) -> None:
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
        self.start = o.get("start", "earliest")
        self.end = o.get("end", "latest")
        self.max_rows_per_batch = _positive(o, "maxrowsperbatch")
        self.max_rows_per_partition = _positive(o, "maxrowsperpartition") or 200_000
        self.num_partitions = _positive(o, "numpartitions")
        self.name = o.get("name", "spark")
        self.types = [t.strip() for t in o.get("types", "").split(",") if t.strip()]
        TypeHints.parse(self.types)  # wrong hints fail here, on the driver
        self.batch_rows = _positive(o, "batchrows") or 8192
        self.timeout = float(o.get("timeout", "120"))

    def client(self) -> TapClient:
        return TapClient(self.endpoint, self.user, self.password,
                         password_env=self.password_env, timeout=self.timeout).connect()

    def hints(self) -> TypeHints:
        return TypeHints.parse(self.types) if self.types else NO_HINTS

    @staticmethod
    def position(value: str) -> int | str:
        return int(value) if value.isdigit() else value


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


class TapPartition(InputPartition):
    """Everything an executor needs to read [start, end) (pickled to it)."""

    def __init__(self, index: int, start: int, end: int, rows: int, epoch: str,
                 options: TapOptions, table: tuple[bytes, bytes] | None) -> None:
        super().__init__(index)
        self.start = start
        self.end = end
        self.rows = rows
        self.epoch = epoch
        self.options = options
        self.table = table


def decode_table(raw: tuple[bytes, bytes], hints: TypeHints) -> TableMap:
    fde, event = raw
    decoder = StreamDecoder(hints)
    decoder.format_description(fde)
    return decoder.table_map(event)


def read_partition(part: TapPartition) -> Iterator[Any]:
    """Executor side: fetch the raw range, decode it, yield Arrow record batches."""
    o = part.options
    hints = o.hints()
    table = decode_table(part.table, hints) if part.table is not None else None
    builder = BatchBuilder(o.form, table, o.batch_rows)
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


def _partitions(tap: TapClient, o: TapOptions, start: int, end: int, epoch: str,
                table: tuple[bytes, bytes] | None) -> list[TapPartition]:
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

    def _table(self, o: TapOptions) -> tuple[bytes, bytes] | None:
        if o.form != "typed":
            return None
        assert o.table is not None
        with o.client() as tap:
            return tap.schema(o.table)

    def schema(self) -> str:
        o = self._options()
        raw = self._table(o)
        return schema_ddl(o.form, decode_table(raw, o.hints()) if raw else None)

    def reader(self, schema: Any) -> DataSourceReader:
        return RelayBatchReader(self._options(), self._table(self._options()))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return RelayStreamReader(self._options(), self._table(self._options()))


class RelayBatchReader(DataSourceReader):
    def __init__(self, options: TapOptions, table: tuple[bytes, bytes] | None) -> None:
        self.o = options
        self.table = table
        with options.client() as tap:  # resolved once: the DataFrame reads a fixed range
            self.epoch = tap.epoch
            self.start = tap.resolve(options.position(options.start))
            self.end = tap.resolve(options.position(options.end))
        if self.end < self.start:
            raise ValueError(f"end {options.end} ({self.end}) is before start "
                             f"{options.start} ({self.start})")

    def partitions(self) -> list[TapPartition]:
        with self.o.client() as tap:
            return _partitions(tap, self.o, self.start, self.end, self.epoch, self.table)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TapPartition)
        return read_partition(partition)


class RelayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: TapOptions, table: tuple[bytes, bytes] | None) -> None:
        self.o = options
        self.table = table
        self.target: int | None = None   # the end of an availableNow run
        self.epoch: str | None = None

    def _offset(self, pos: int) -> dict[str, Any]:
        return {"v": OFFSET_VERSION, "epoch": self.epoch, "pos": pos}

    def _check(self, tap: TapClient, offset: dict[str, Any]) -> int:
        self.epoch = tap.epoch
        if offset.get("v") != OFFSET_VERSION or "pos" not in offset:
            raise ValueError(f"offset {offset} is not a relay tap offset (v{OFFSET_VERSION})")
        if offset.get("epoch") != tap.epoch:
            raise TapError("epoch", f"the checkpoint holds positions of relay log "
                                    f"{offset.get('epoch')}, the tap at {self.o.endpoint} "
                                    f"serves relay log {tap.epoch} (rebuilt or replaced): "
                                    "nothing is read twice or skipped silently; start the "
                                    "query with a new checkpoint to read the new log")
        return int(offset["pos"])

    def initialOffset(self) -> dict[str, Any]:
        with self.o.client() as tap:
            self.epoch = tap.epoch
            return self._offset(tap.resolve(self.o.position(self.o.start)))

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
            end: int | str = self.target if self.target is not None else "latest"
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            plan = tap.plan(pos, end, max_rows=max_rows, epoch=self.epoch)
        return start if plan["end"] == pos else self._offset(plan["end"])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[TapPartition]:
        with self.o.client() as tap:
            a, b = self._check(tap, start), self._check(tap, end)
            return _partitions(tap, self.o, a, b, tap.epoch, self.table)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TapPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        # One batch late and never for the last batch: a retention hint, not a receipt.
        with self.o.client() as tap:
            tap.ack(self.o.name, self._check(tap, end))

    def stop(self) -> None:
        pass


def register(spark: Any) -> None:
    """Make format("relay") known to a SparkSession."""
    spark.dataSource.register(RelayDataSource)
