"""The relay data source's options: name, default and meaning of each, as data. The data
source (relay/tap/spark.py) refuses any other option, and scripts/reference.py renders
this table as docs/reference/tap-options.md, so the two cannot drift. Plain data, no
PySpark: the reference is made without it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TapOption:
    name: str                # as documented; Spark's options are case-insensitive
    default: str             # "" when there is none
    meaning: str
    mode: str = ""           # "batch" or "stream" when only that kind of read uses it


OPTIONS: tuple[TapOption, ...] = (
    TapOption("endpoint", "", "host:port of the relay's tap ([tap] listen). Required."),
    TapOption("user", "", "The tap user ([[tap.users]])."),
    TapOption("password", "", "Its password (or passwordEnv)."),
    TapOption("passwordEnv", "", "The environment variable holding the password, on the "
              "driver and on every executor."),
    TapOption("tables", "every table", "Comma-separated schema.table patterns (% and _ "
              "wildcards), applied on the relay."),
    TapOption("table", "", "One table, \"schema.table\": its images become typed STRUCTs "
              "of its columns."),
    TapOption("images", "typed with table, else json", "How row images are given: json "
              "(JSON text), map (MAP<STRING,STRING>) or typed (needs table)."),
    TapOption("start", "earliest", "Where reading starts: earliest, latest, a GTID "
              "position or set, or a tap position."),
    TapOption("end", "latest", "Where a batch read ends (resolved once per DataFrame): "
              "latest, or as start.", "batch"),
    TapOption("maxRowsPerBatch", "no bound", "Admission control: rows per micro-batch (a "
              "target: a transaction is never split).", "stream"),
    TapOption("maxRowsPerPartition", "200000", "Rows per task, of the log's range and of "
              "a snapshot (a task reads a run of one table's chunks in turn)."),
    TapOption("numPartitions", "", "The number of tasks of a batch (overrides "
              "maxRowsPerPartition)."),
    TapOption("name", "\"spark-\" and a hash of what the query reads", "The subscriber "
              "name the query's acknowledgements (retention holds) go under."),
    TapOption("types", "", "Column types the binlog does not carry, \"schema.table.column="
              "uuid,...\" (uuid, inet4, inet6, json, datetime(N)/time(N)/timestamp(N): as "
              "`relay changes --type`)."),
    TapOption("batchRows", "8192", "Rows per Arrow batch an executor hands Spark (a rows "
              "event is never split)."),
    TapOption("timeout", "120", "Seconds a tap request (and a snapshot source's connect) "
              "may take."),
    TapOption("tls", "false", "TLS to the tap ([tap.tls]); true when tlsCa is set."),
    TapOption("tlsCa", "the system's CAs", "A PEM file of the CA that signed the tap's "
              "certificate."),
    TapOption("tlsVerify", "VERIFY_IDENTITY", "VERIFY_IDENTITY, VERIFY_CA or REQUIRED "
              "(encrypted, certificate not checked)."),
    TapOption("snapshot", "never", "never, initial (copy the tables, then stream from the "
              "copy's position) or when_needed (copy again when the checkpoint left the "
              "log)."),
    TapOption("snapshotSource", "the primary the relay follows", "mysql://user[:password]"
              "@host:port the snapshot reads (needs SELECT), with the mysql client's "
              "ssl-mode, ssl-ca, ... and get-server-public-key as parameters. Required "
              "when the tap is reached in plain text beyond loopback. Without an ssl-mode: "
              "REQUIRED when the tap connection (or the relay's source) uses TLS, else "
              "PREFERRED; on plain text the password never goes in clear."),
    TapOption("snapshotUser", "", "The snapshot's login, when not in snapshotSource."),
    TapOption("snapshotPassword", "", "Its password, when not in snapshotSource."),
    TapOption("snapshotPasswordEnv", "", "The environment variable holding it."),
    TapOption("snapshotChunkRows", "8192", "Rows per chunk: a chunk is one short "
              "read-only transaction on the source, its watermark and its progress "
              "report."),
    TapOption("snapshotChunksPerBatch", "16", "Chunks per micro-batch, read at once "
              "(maxRowsPerBatch overrides): the bound on the source's load.", "stream"),
    TapOption("snapshotChunksPerTable", "no bound", "At most this many chunks of one "
              "table per micro-batch; tables' chunks are planned in turn.", "stream"),
    TapOption("snapshotKeyColumns", "the primary or a non-null unique key", "\"col1,col2\" "
              "(with table) or \"s.t=col1,col2;s.u=c\": the chunk key of tables without "
              "one (then at least once)."),
    TapOption("snapshotTimeout", "120", "Seconds a chunk waits for the relay to hold its "
              "read view."),
    TapOption("schemaEvolution", "fail", "Typed images of a table whose columns change: "
              "fail (stop, naming the columns), add_columns (the schema is the union of the "
              "table's versions; a column added mid-query stops it to be restarted with it) "
              "or json (other values go to __rescued)."),
    TapOption("resnapshot", "", "\"schema.table,...\" to copy again while the stream goes "
              "on, once per resnapshotId.", "stream"),
    TapOption("resnapshotId", "resnapshot's text", "Copies are made once per id, even "
              "across restarts of the query with the same options.", "stream"),
)
KNOWN_OPTIONS = tuple(o.name for o in OPTIONS)
# By lower-cased name (as the data source reads them): the defaults the data source takes
# from here, so that the reference cannot give another (a default in words, "no bound",
# is the data source's own).
DEFAULTS = {o.name.lower(): o.default for o in OPTIONS}
# A mirror's (relay/tap/mirror.py, `relay mirror --restarts`): a failed table query's
# restarts in a row, 1, 2, 4, 8 and 16 s apart (about 30 s of the tap or the source away).
MIRROR_RESTARTS = 5
