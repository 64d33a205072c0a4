"""The tap's snapshot, read side: the Spark driver plans chunks of the tables, executors
read them from the primary (or a replica) and place their rows in the change stream.
Blocking, with PyMySQL (the library under aiomysql): executors run no event loop.

How a snapshot fits the stream (the watermark approach of DBLog, with exact marks):

- The stream part starts at S0, the tap's end when the snapshot began; every change from
  S0 on is delivered as usual.
- A table is cut into chunks of about `chunk_rows` rows by key. The boundaries are keys
  the server returns in its own order (`ORDER BY key LIMIT 1 OFFSET n` after the previous
  boundary), and a chunk is selected with `key > lo AND key <= hi` written as SQL. So keys
  are only ever compared by the server, in the column's collation: case- and
  accent-insensitive keys, trailing spaces and BIGINT UNSIGNED up to 2^64-1 need nothing
  special here. The last chunk ends at the table's largest key when planned; a row
  inserted past it later comes from the stream.
- A chunk is read in its own short transaction started WITH CONSISTENT SNAPSHOT. MariaDB
  reports the binlog position of that read view (Binlog_snapshot_file/_position) and
  BINLOG_GTID_POS turns it into the GTID state G the rows reflect; without a binlog on
  the source, G is bracketed by @@gtid_current_pos before and after the transaction
  start. The tap turns G into positions of its log (`watermark`): low, the start of the
  first transaction G lacks, and high, the end of the last one G holds (equal when the
  log has G's transactions in order, the usual case).
- Rows whose key a transaction in (low, high] changed are dropped (the stream carries
  those changes); every other row goes out as op "snapshot" at position `high`, change
  SNAPSHOT_CHANGE (after every change of the transaction that ends there). Ordering a
  key's records by (position, change) and keeping the last gives the table: a change
  the read saw sorts before the row, one it did not see sorts after.

No lock, no write and no long transaction on the source: one short read-only transaction
per chunk.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import struct
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from functools import cache, partial
from json.encoder import encode_basestring
from typing import Any, cast
from urllib.parse import parse_qs, unquote

import pymysql
import pymysql.converters
from pymysql.constants import CLIENT, COMMAND

from relay.binlog import describe as information
from relay.binlog.jsonb import JSON_NULL
from relay.binlog.jsonvalue import datetime_text, jsonable, time_text
from relay.binlog.jsonwriter import compile_json_writer, json_value
from relay.binlog.plans import json_keys
from relay.binlog.tablemap import TableMap, TypeHints
from relay.binlog.values import InvalidTemporal
from relay.config import ClientTls, TlsMode, parse_client_tls, redact_url, split_url
from relay.errors import RelayError
from relay.kernels.protocol import TextStep
from relay.tap.textresult import MalformedResult, TextResult
from relay.tls import client_context
from relay.wire.login_policy import LoginPolicy, raised_as

SNAPSHOT_CHANGE = (1 << 31) - 1
# After a snapshot's last chunk, one record per table at the stream start: a mirror's row
# older than it that the snapshot did not deliver is gone (deleted while unobserved).
SNAPSHOT_END_OP = "snapshot_end"


class SnapshotMode(Enum):
    NEVER = "never"              # changes only (from `start`)
    INITIAL = "initial"          # every row first, then the changes from that point
    WHEN_NEEDED = "when_needed"  # a snapshot only when `start` is gone from the log


class SnapshotError(RelayError):
    code = "snapshot"


# --- the source ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    """Where snapshot reads go: the primary, or a replica (snapshotSource).

    The password never crosses a plain-text connection, in any form a listener could
    use: on a connection without TLS, a server asking for `mysql_clear_password` (or the
    dialog plugin) is refused, and so is fetching an RSA key for caching_sha2_password's
    full authentication or sha256_password (a man in the middle would answer with its
    own key), unless the URL says `get-server-public-key=true`, as the mysql client's
    option. The relay's own primary link (relay/mysql/client.py) has the same guards."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    tls: ClientTls | None = None   # None: `tls_default` (no ssl-* in the URL)
    # The mode without ssl-*: REQUIRED when the relay's own links use TLS (the tap's
    # connection, or the relay's source: TapOptions says so), else PREFERRED.
    tls_default: TlsMode = TlsMode.PREFERRED
    allow_key_request: bool = False   # get-server-public-key=true

    @classmethod
    def parse(cls, url: str | None, *, default_address: str | None, user: str | None,
              password: str | None, password_env: str | None,
              tls_default: TlsMode = TlsMode.PREFERRED) -> SourceSpec:
        host, port, url_user, url_password = "", 3306, "", None
        tls: ClientTls | None = None
        key_request = False
        if url:
            full = url if "://" in url else "mysql://" + url
            try:
                parts = split_url(full, "snapshotSource")
            except ValueError as exc:
                raise SnapshotError(str(exc)) from None
            if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
                raise SnapshotError("snapshotSource: mysql://user@host:port, not "
                                    f"{redact_url(url)!r}")
            try:
                host, port = parts.hostname, parts.port or 3306
            except ValueError:
                raise SnapshotError(f"snapshotSource {redact_url(url)!r} has a bad port"
                                    ) from None
            url_user = unquote(parts.username or "")
            url_password = unquote(parts.password) if parts.password is not None else None
            params = parse_qs(parts.query, keep_blank_values=True)
            try:
                tls = parse_client_tls(params, "snapshotSource") if params else None
            except ValueError as exc:
                raise SnapshotError(str(exc)) from None
            key_request = params.get("get-server-public-key", ["0"])[-1].lower() in \
                ("1", "true", "on", "yes")
            if tls is not None and not any(k.startswith("ssl-") for k in params):
                tls = None   # only get-server-public-key: the mode stays the default
        elif default_address:
            h, _, p = default_address.rpartition(":")
            host, port = h.strip("[]"), int(p) if p.isdigit() else 3306
        else:
            raise SnapshotError("a snapshot needs .option(\"snapshotSource\", "
                                "\"mysql://user@host:port\"): the tap does not say which "
                                "primary it follows")
        if password is None and password_env:
            password = os.environ.get(password_env)
            if password is None:
                raise SnapshotError(f"environment variable {password_env} (the snapshot "
                                    "source's password) is not set")
        name = user or url_user
        if not name:
            raise SnapshotError("a snapshot needs a user for its source: snapshotUser, or "
                                "the user in snapshotSource")
        return cls(host, port, name, password if password is not None else url_password or "",
                   tls, tls_default, key_request)

    def connect(self, timeout: float = 30.0) -> pymysql.connections.Connection[Any]:
        # No ssl-mode: the default, PREFERRED or REQUIRED (above). PREFERRED is PyMySQL's
        # own (TLS when the greeting offers it, in the one connection: a second login
        # after a refused one would count as an aborted connection on the source), with
        # the relay's shared context: PyMySQL would load the system's CAs, which
        # PREFERRED never checks against, for each connection (43 ms, one per chunk).
        tls = self.tls or ClientTls(self.tls_default)
        try:
            if tls.mode is TlsMode.DISABLED:
                return self._connect(timeout, {"ssl_disabled": True})
            if tls.mode is TlsMode.PREFERRED:
                return self._connect(timeout, {"preferred": _context(tls)})
            return self._connect(timeout, {"ssl": _context(tls)})  # PyMySQL: TLS or nothing
        except pymysql.err.MySQLError as exc:
            raise SnapshotError(f"snapshot source {self.host}:{self.port}: "
                                f"{self._explain(exc, tls)}") from None

    def _explain(self, exc: pymysql.err.MySQLError, tls: ClientTls) -> str:
        """PyMySQL's error, and for a refused TLS the option that decides it."""
        if isinstance(exc, pymysql.err.OperationalError) and _offers_no_tls(exc):
            why = (f"ssl-mode={tls.mode.value} in snapshotSource" if self.tls is not None
                   else "TLS is the default for snapshot reads when the relay's own links "
                        "use it (the tap's connection or the relay's source)")
            return (f"{exc}; the server offers no TLS, and {why}: turn TLS on at the "
                    "source, or accept plain text with snapshotSource "
                    "mysql://user@host:port?ssl-mode=PREFERRED (the password never crosses "
                    "it in clear: clear-text and RSA-key logins are refused)")
        return str(exc)

    def _connect(self, timeout: float, tls: dict[str, Any],
                 ) -> pymysql.connections.Connection[Any]:
        conn = _GuardedConnection(
            host=self.host, port=self.port, user=self.user, **tls, password=self.password,
            autocommit=True, charset="utf8mb4", connect_timeout=timeout,
            read_timeout=max(timeout, 600.0), use_unicode=False, conv=_ENCODERS,
            init_command="SET time_zone = '+00:00'", defer_connect=True)
        conn.policy = LoginPolicy(allow_key_request=self.allow_key_request, hint=SNAPSHOT_HINT)
        conn.connect()
        return cast("pymysql.connections.Connection[Any]", conn)


# PyMySQL's connection, held to the relay's login policy (relay/wire/login_policy.py,
# which the relay's own clients follow too) through PyMySQL's own hooks (as
# relay/mysql/client.py does for aiomysql's): `_request_authentication` (the greeting:
# sha256_password as the server's first method), `_process_auth` (an auth switch),
# `write_packet` (caching_sha2_password's key request, during login only). TLS itself is
# PyMySQL's: "TLS or nothing" for the modes that require it.
_PyMySQLConnection: Any = pymysql.connections.Connection
_KEY_REQUEST = bytes((2,))   # caching_sha2_password: "send me your public key"
SNAPSHOT_HINT = ("; for snapshot reads: snapshotSource ?ssl-mode=REQUIRED (or VERIFY_CA / "
                 "VERIFY_IDENTITY) against a source with TLS, or trust the network with "
                 "?get-server-public-key=true")


class _GuardedConnection(_PyMySQLConnection):  # type: ignore[misc]
    policy = LoginPolicy(hint=SNAPSHOT_HINT)
    _authenticating = False

    def __init__(self, *args: Any, preferred: ssl.SSLContext | None = None,
                 **kwargs: Any) -> None:
        # `preferred`: PyMySQL's PREFERRED mode (no ssl arguments) with this context.
        self._preferred = preferred
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if self._preferred is not None and not sslp:
            return self._preferred
        return cast("ssl.SSLContext", super()._create_ssl_ctx(sslp))

    def _request_authentication(self) -> None:
        with raised_as(pymysql.err.OperationalError):
            self.policy.greeted(
                offers_tls=bool(self.server_capabilities & CLIENT.SSL),
                secure=bool(self.ssl and self.server_capabilities
                            & CLIENT.SSL),
                method=self._auth_plugin_name or "", has_password=bool(self.password))
        self._authenticating = True
        try:
            super()._request_authentication()
        finally:
            self._authenticating = False

    def _process_auth(self, plugin_name: bytes, auth_packet: Any, handler: Any = None) -> Any:
        with raised_as(pymysql.err.OperationalError):
            self.policy.switched(plugin_name.decode("utf-8", "replace"), secure=self._secure,
                                 has_password=bool(self.password))
        return super()._process_auth(plugin_name, auth_packet, handler)

    def write_packet(self, payload: bytes) -> None:
        if self._authenticating and payload == _KEY_REQUEST:
            with raised_as(pymysql.err.OperationalError):
                self.policy.full_authentication(secure=self._secure)
        super().write_packet(payload)

    def text_result(self, sql: str, args: Sequence[Any], label: str) -> TextResult:
        """Send a SELECT and read its column definitions; its rows are the TextResult's to
        read (all of them, before the next command: TextResult.drain)."""
        if self.client_flag & CLIENT.DEPRECATE_EOF:
            raise SnapshotError("this PyMySQL ends result sets without an EOF packet, which "
                                "the snapshot's row reader does not follow")
        self._execute_command(COMMAND.COM_QUERY,
                              sql % tuple(self.escape(a) for a in args) if args else sql)
        first = self._read_packet()  # (PyMySQL's: raises the server's error)
        if first.is_ok_packet():
            raise SnapshotError(f"{label}: the query returned no result set")
        ncols = first.read_length_encoded_integer()
        if not isinstance(ncols, int) or ncols < 1:
            raise SnapshotError(f"{label}: a result set of {ncols} columns")
        for _ in range(ncols):
            self._read_packet()  # the column definitions: the plan has the columns
        if not self._read_packet().is_eof_packet():
            raise SnapshotError(f"{label}: no EOF packet after the column definitions")
        return TextResult(self._read_rows, _server_error, ncols, label)

    def _read_rows(self, size: int) -> bytes:
        """Up to `size` bytes of the socket, at least one (PyMySQL's errors as its own
        `_read_bytes` raises them)."""
        try:
            data: bytes = self._rfile.read1(size)
        except OSError as exc:
            self._force_close()
            raise pymysql.err.OperationalError(
                2013, f"Lost connection to MySQL server during query ({exc})") from None
        if not data:
            self._force_close()
            raise pymysql.err.OperationalError(
                2013, "Lost connection to MySQL server during query")
        return data


def _server_error(payload: bytes) -> Exception:
    """An error packet as PyMySQL raises it (one too short to hold an error code: ours)."""
    try:
        pymysql.err.raise_mysql_exception(payload)
    except pymysql.err.MySQLError as exc:
        return exc
    except Exception:  # (struct.error, IndexError: a packet cut short)
        pass
    return MalformedResult(f"an error packet of {len(payload)} bytes holds no error")


def _offers_no_tls(exc: pymysql.err.OperationalError) -> bool:
    """PyMySQL's refusal of a server that offers no TLS when TLS is required."""
    return bool(exc.args) and exc.args[0] == 2026 and "support" in str(exc.args[-1])


def _context(tls: ClientTls) -> ssl.SSLContext | None:
    """The TLS context of `tls`; one per process for those that name no files (a CA or a
    certificate read once would miss its renewal; the system's CAs are read once)."""
    if tls.ca is None and tls.cert is None:
        return _shared_context(tls.mode)
    return client_context(tls)


@cache
def _shared_context(mode: TlsMode) -> ssl.SSLContext | None:
    return client_context(ClientTls(mode))


# Values go to the server as PyMySQL escapes them; they come back as the server's bytes
# (`converter` turns them into the row codec's values).
_ENCODERS = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}


# --- tables and their keys -----------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    kind: str          # information_schema DATA_TYPE: "bigint", "varchar", ...
    binary: bool       # bytes, not text
    fsp: int | None = None   # DATETIME_PRECISION: a temporal's fraction digits (None:
                             # not a temporal, or a plan saved before it was kept)


@dataclass(frozen=True)
class TableSpec:
    schema: str
    table: str
    columns: tuple[ColumnSpec, ...]
    keys: tuple[str, ...]
    unique: bool        # the keys identify a row (a primary or non-null unique key)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def key_index(self) -> tuple[int, ...]:
        names = [c.name for c in self.columns]
        return tuple(names.index(k) for k in self.keys)

    def to_wire(self) -> dict[str, Any]:
        return {"schema": self.schema, "table": self.table, "keys": list(self.keys),
                "unique": self.unique,
                "columns": [[c.name, c.kind, c.binary, c.fsp] for c in self.columns]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TableSpec:
        # (plans saved before fsp have three fields a column)
        return cls(d["schema"], d["table"],
                   tuple(ColumnSpec(str(c[0]), str(c[1]), bool(c[2]),
                                    None if len(c) < 4 or c[3] is None else int(c[3]))
                         for c in d["columns"]),
                   tuple(d["keys"]), bool(d["unique"]))


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)


def _rows(conn: Any, sql: str, args: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def match_tables(conn: Any, patterns: Sequence[str]) -> list[tuple[str, str]]:
    """Base tables whose schema.table matches one of the LIKE patterns, in name order."""
    found: set[tuple[str, str]] = set()
    for pattern in patterns:
        schema, dot, table = pattern.partition(".")
        if not dot:
            raise SnapshotError(f"tables: schema.table patterns, not {pattern!r}")
        for s, t in _rows(conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema."
                                "TABLES WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA "
                                "LIKE %s AND TABLE_NAME LIKE %s", (schema, table)):
            s, t = _text(s), _text(t)
            if s not in ("mysql", "information_schema", "performance_schema", "sys"):
                found.add((s, t))
    return sorted(found)


def describe(conn: Any, schema: str, table: str, key_columns: Sequence[str] | None = None,
             ) -> TableSpec:
    """Columns and chunk key of a table: its primary key, else a unique key of NOT NULL
    columns, else `key_columns` (snapshotKeyColumns; rows are then identified at least
    once, not exactly); refused otherwise, saying which of these to do."""
    cols = current_columns(conn, schema, table)
    if not cols:
        raise SnapshotError(f"{schema}.{table}: no such table on the snapshot source")
    names = [c.name for c in cols]
    if key_columns:
        missing = [k for k in key_columns if k not in names]
        if missing:
            raise SnapshotError(f"snapshotKeyColumns: {schema}.{table} has no column "
                                f"{', '.join(missing)}")
        return TableSpec(schema, table, tuple(cols), tuple(key_columns),
                         unique=_unique_key(conn, schema, table) == tuple(key_columns))
    keys = _unique_key(conn, schema, table)
    if keys is None:
        raise SnapshotError(
            f"{schema}.{table} has no primary key and no unique key of NOT NULL columns, so "
            "its rows cannot be read in key order: add a primary key, or name columns "
            "that order it with .option(\"snapshotKeyColumns\", \"col1,col2\") (their rows "
            "are then delivered at least once, not exactly once), or leave the table out "
            "of the snapshot's tables")
    return TableSpec(schema, table, tuple(cols), keys, unique=True)


def _unique_key(conn: Any, schema: str, table: str) -> tuple[str, ...] | None:
    rows = _rows(conn, "SELECT s.INDEX_NAME, s.COLUMN_NAME, c.IS_NULLABLE FROM "
                       "information_schema.STATISTICS s JOIN information_schema.COLUMNS c "
                       "ON c.TABLE_SCHEMA = s.TABLE_SCHEMA AND c.TABLE_NAME = s.TABLE_NAME "
                       "AND c.COLUMN_NAME = s.COLUMN_NAME WHERE s.TABLE_SCHEMA = %s AND "
                       "s.TABLE_NAME = %s AND s.NON_UNIQUE = 0 ORDER BY s.INDEX_NAME = "
                       "'PRIMARY' DESC, s.INDEX_NAME, s.SEQ_IN_INDEX", (schema, table))
    indexes: dict[str, list[tuple[str, bool]]] = {}
    for index, column, nullable in rows:
        indexes.setdefault(_text(index), []).append((_text(column), _text(nullable) == "YES"))
    for columns in indexes.values():
        if not any(nullable for _, nullable in columns):
            return tuple(c for c, _ in columns)
    return None


# --- chunks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Rows of one table with lo < key <= hi (None: unbounded on that side)."""

    index: int
    table: int                     # index into the plan's tables
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None

    def to_wire(self) -> list[Any]:
        return [self.index, self.table, _pack_key(self.lo), _pack_key(self.hi)]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Chunk:
        return cls(int(w[0]), int(w[1]), _unpack_key(w[2]), _unpack_key(w[3]))


def _after(keys: Sequence[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """SQL for "key > values" in the key's order, compared by the server."""
    terms, args = [], []
    for i, k in enumerate(keys):
        eq = [f"{_q(keys[j])} = %s" for j in range(i)]
        terms.append("(" + " AND ".join([*eq, f"{_q(k)} > %s"]) + ")")
        args.extend([*values[:i], values[i]])
    return "(" + " OR ".join(terms) + ")", args


def _not_after(keys: Sequence[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
    sql, args = _after(keys, values)
    return f"NOT {sql}", args


def chunk_where(spec: TableSpec, chunk: Chunk) -> tuple[str, list[Any]]:
    parts, args = [], []
    if chunk.lo is not None:
        sql, a = _after(spec.keys, chunk.lo)
        parts.append(sql)
        args += a
    if chunk.hi is not None:
        sql, a = _not_after(spec.keys, chunk.hi)
        parts.append(sql)
        args += a
    return (" WHERE " + " AND ".join(parts)) if parts else "", args


def plan_chunks(conn: Any, spec: TableSpec, table_no: int, chunk_rows: int) -> list[Chunk]:
    """Chunks of about `chunk_rows` rows in key order, numbered from 0 (the plan numbers
    them again when it takes the tables in turn); boundaries from the server."""
    keys = ", ".join(_q(k) for k in spec.keys)
    order = [spec.columns[i] for i in spec.key_index]
    convert = [converter(c) for c in order]
    name = f"{_q(spec.schema)}.{_q(spec.table)}"
    last = _rows(conn, f"SELECT {keys} FROM {name} ORDER BY "
                       + ", ".join(f"{_q(k)} DESC" for k in spec.keys) + " LIMIT 1")
    if not last:
        return []
    top = _key(last[0], convert)
    chunks: list[Chunk] = []
    lo: tuple[Any, ...] | None = None
    while True:
        where, args = ("", []) if lo is None else _after(spec.keys, lo)
        rows = _rows(conn, f"SELECT {keys} FROM {name}" + (f" WHERE {where}" if where else "")
                     + f" ORDER BY {keys} LIMIT 1 OFFSET {chunk_rows - 1}", args)
        if not rows:
            chunks.append(Chunk(len(chunks), table_no, lo, top))
            return chunks
        hi = _key(rows[0], convert)
        chunks.append(Chunk(len(chunks), table_no, lo, hi))
        if hi == top:
            return chunks
        lo = hi


def _key(row: Sequence[Any], convert: Sequence[Callable[[Any], Any]]) -> tuple[Any, ...]:
    return tuple(None if v is None else f(v) for f, v in zip(convert, row, strict=True))


# Boundary values travel to the relay (msgpack) and back: tagged where msgpack has no type.
def _pack_key(key: tuple[Any, ...] | None) -> list[Any] | None:
    if key is None:
        return None
    out: list[Any] = []
    for v in key:
        if isinstance(v, Decimal):
            out.append({"dec": str(v)})
        elif isinstance(v, datetime):
            out.append({"dt": v.replace(tzinfo=None).isoformat(), "utc": v.tzinfo is not None})
        elif isinstance(v, date):
            out.append({"date": v.isoformat()})
        elif isinstance(v, timedelta):
            out.append({"us": v // timedelta(microseconds=1)})
        elif isinstance(v, (frozenset, InvalidTemporal)):
            out.append({"text": ",".join(sorted(v)) if isinstance(v, frozenset) else str(v)})
        else:
            out.append(v)
    return out


def _unpack_key(packed: list[Any] | None) -> tuple[Any, ...] | None:
    if packed is None:
        return None
    out: list[Any] = []
    for v in packed:
        if isinstance(v, dict):
            if "dec" in v:
                out.append(Decimal(v["dec"]))
            elif "dt" in v:
                d = datetime.fromisoformat(v["dt"])
                out.append(d.replace(tzinfo=UTC) if v.get("utc") else d)
            elif "date" in v:
                out.append(date.fromisoformat(v["date"]))
            elif "us" in v:
                out.append(timedelta(microseconds=v["us"]))
            else:
                out.append(v["text"])
        else:
            out.append(v)
    return tuple(out)


# --- values: the server's text form -> the row codec's values ------------------------------

_INTS = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"}
_BINARY_KINDS = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_F32 = struct.Struct("<f")


def converter(col: ColumnSpec) -> Callable[[bytes], Any]:
    """The text protocol's bytes of a column as the value the binlog row codec gives for
    it, so a snapshot row and a change of the same row are written alike (JSON, map and
    typed images all start from these values)."""
    k = col.kind
    if k in _INTS:
        return int
    if k == "decimal":
        return lambda b: Decimal(b.decode("ascii"))
    if k == "float":  # the binlog holds a float32: the same rounding
        return lambda b: _F32.unpack(_F32.pack(float(b)))[0]
    if k == "double":
        return float
    if k == "bit":
        return lambda b: int.from_bytes(b, "big")
    if k == "date":
        return _date
    if k == "datetime":
        return lambda b: _datetime(b, "datetime")
    if k == "timestamp":
        return lambda b: _datetime(b, "timestamp")
    if k == "time":
        return _time
    if k == "set":
        return lambda b: frozenset(b.decode("utf-8").split(",")) if b else frozenset()
    if k == "json":  # MySQL's (MariaDB's JSON is a LONGTEXT)
        return _json_document
    if col.binary or k in _BINARY_KINDS or k in ("geometry", "point", "linestring",
                                                   "polygon"):
        return bytes
    return lambda b: b.decode("utf-8")


def _json_document(b: bytes) -> Any:
    """A JSON column's text as the log's binary JSON decodes to: the document's values
    nested (not its text: a change's JSON image holds the document, and a snapshot row
    must be written alike), a top-level null as JSON_NULL (not SQL's NULL). Scalars of
    SQL types JSON has no syntax for (a DECIMAL or DATETIME stored by CAST(... AS
    JSON)) come back as the number or string the server prints, where the log's
    decoding keeps their types."""
    value = json.loads(b)
    return JSON_NULL if value is None else value


def _date(b: bytes) -> date | InvalidTemporal:
    y, m, d = (int(x) for x in b.decode("ascii").split("-"))
    try:
        return date(y, m, d)
    except ValueError:
        return InvalidTemporal("date", y, m, d)


def _datetime(b: bytes, kind: str) -> datetime | InvalidTemporal:
    text = b.decode("ascii")
    day, _, clock = text.partition(" ")
    y, mo, d = (int(x) for x in day.split("-"))
    hms, _, frac = clock.partition(".")
    h, mi, s = (int(x) for x in hms.split(":"))
    us = int(frac.ljust(6, "0")[:6]) if frac else 0
    try:
        value = datetime(y, mo, d, h, mi, s, us)
    except ValueError:
        return InvalidTemporal(kind, y, mo, d, h, mi, s, us, len(frac))
    return value.replace(tzinfo=UTC) if kind == "timestamp" else value


def _time(b: bytes) -> timedelta:
    text = b.decode("ascii")
    neg = text.startswith("-")
    hms, _, frac = text.lstrip("-").partition(".")
    h, m, s = (int(x) for x in hms.split(":"))
    value = timedelta(hours=h, minutes=m, seconds=s,
                      microseconds=int(frac.ljust(6, "0")[:6]) if frac else 0)
    return -value if neg else value


def key_of(values: Sequence[Any]) -> tuple[Any, ...]:
    """A key in a form comparable between a SELECT row and a change's image."""
    return tuple(json.dumps(jsonable(v), sort_keys=True) for v in values)


# --- reading a chunk ---------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkRead:
    gtid: str                 # the GTID state the rows reflect (or the window's top)
    gtid_low: str             # the window's bottom (equal to gtid when exact)
    exact: bool


def described_columns(conn: Any, schema: str, table: str, *, collation_ids: bool = True,
                      ) -> list[information.ColumnDescription]:
    """The table's columns as the server has them now (relay/binlog/describe.py's query,
    the one a TABLE_MAP is made from; `collation_ids=False`: a text column's character
    set's collation, for a look at names and types only)."""
    return [information.ColumnDescription.of_row(r) for r in _rows(
        conn, information.describe_sql(schema, table, collation_ids=collation_ids))]


def column_spec(column: information.ColumnDescription) -> ColumnSpec:
    """What a plan records of a column (binary: no collation, a binary string type)."""
    return ColumnSpec(column.name, column.data_type,
                      column.collation is None and column.data_type in _BINARY_KINDS,
                      column.fsp)


def current_columns(conn: Any, schema: str, table: str) -> list[ColumnSpec]:
    """The table's columns as a plan records them, as the server has them now."""
    return [column_spec(c) for c in described_columns(conn, schema, table)]


def table_map_now(conn: Any, spec: TableSpec, hints: TypeHints,
                  columns: Sequence[information.ColumnDescription]) -> TableMap:
    """The TABLE_MAP the source would write for the table with these `columns` (as
    described now), with the query's type hints: what a typed query judges a chunk's rows
    by, as it judges a change by the map it was written under."""
    key = [information.text(r[0]) for r in _rows(
        conn, information.primary_key_sql(spec.schema, spec.table))]
    made = information.table_map(spec.schema, spec.table, list(columns), key)
    return TableMap.decode(made.encode(), hints=hints)


def plan_is_stale(spec: TableSpec, now: Sequence[information.ColumnDescription]) -> bool:
    """Whether the table's columns, described `now`, are no longer the plan's."""
    return not same_columns(spec.columns, [column_spec(c) for c in now])


def same_columns(planned: Sequence[ColumnSpec], now: Sequence[ColumnSpec]) -> bool:
    """Names, types, binary-ness and precision alike (a plan saved before precision was
    kept compares without it)."""
    return len(planned) == len(now) and all(
        (p.name, p.kind, p.binary) == (n.name, n.kind, n.binary)
        and (p.fsp is None or p.fsp == n.fsp) for p, n in zip(planned, now, strict=True))


class ChunkReader:
    """One chunk's rows, read in a consistent-snapshot transaction; `begin` gives the
    GTID state of the read view before any row is read, `rows` streams them."""

    def __init__(self, conn: Any, spec: TableSpec, chunk: Chunk, batch: int = 4096) -> None:
        self.conn = conn
        self.spec = spec
        self.chunk = chunk
        self.batch = batch
        self.convert = [converter(c) for c in spec.columns]

    def begin(self, views: dict[tuple[str, int], str] | None = None) -> ChunkRead:
        """`views`: the GTID states of binlog positions this connection asked before
        (BINLOG_GTID_POS reads the binlog file up to the position on MariaDB before
        11.4: one call per position is enough)."""
        c = self.conn
        before = _gtid_state(c)
        _rows(c, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        status = dict((_text(k).lower(), _text(v)) for k, v in
                      _rows(c, "SHOW STATUS LIKE 'binlog_snapshot_%'"))
        file, pos = status.get("binlog_snapshot_file", ""), status.get(
            "binlog_snapshot_position", "")
        if file and pos.isdigit():
            known = views if views is not None else {}
            g = known.get((file, int(pos)))
            if g is None:
                g = query_value(c, "SELECT BINLOG_GTID_POS(%s, %s)", (file, int(pos)))
            if g is not None:
                known[(file, int(pos))] = g
                return ChunkRead(g, g, exact=True)
        after = _gtid_state(c)
        return ChunkRead(after or "", before or "", exact=False)

    def columns_now(self, *, collation_ids: bool = True) -> list[information.ColumnDescription]:
        """The table's columns, asked right before the rows are read: opening the table
        takes its metadata lock until the transaction ends, so no ALTER completes between
        this look and the SELECT (and none waits on this chunk while its watermark is
        resolved). The plan is stale when they are not its columns (`same_columns`).
        `collation_ids`: exact collation ids (a TABLE_MAP is made from them), not needed
        for the staleness check alone."""
        spec = self.spec
        _rows(self.conn, f"SELECT 1 FROM {_q(spec.schema)}.{_q(spec.table)} LIMIT 0")
        return described_columns(self.conn, spec.schema, spec.table,
                                 collation_ids=collation_ids)

    def end(self) -> None:
        """End the chunk's transaction without reading it."""
        _rows(self.conn, "ROLLBACK")

    def result(self) -> TextResult:
        """The chunk's rows, unread (read them all, then `finish`)."""
        spec = self.spec
        where, args = chunk_where(spec, self.chunk)
        cols = ", ".join(_q(col.name) for col in spec.columns)
        sql = f"SELECT {cols} FROM {_q(spec.schema)}.{_q(spec.table)}{where}"
        result: TextResult = self.conn.text_result(
            sql, args, f"snapshot of {spec.qualified}, chunk {self.chunk.index}")
        if result.ncols != len(spec.columns):
            result.drain()  # (the connection stays in step)
            raise SnapshotError(f"{spec.qualified}: {result.ncols} columns read, "
                                f"{len(spec.columns)} planned")
        return result

    def finish(self, result: TextResult) -> None:
        """End the chunk's transaction after its rows (read to their end if the reader
        stopped early)."""
        result.drain()
        _rows(self.conn, "COMMIT")

    def raw_rows(self) -> Generator[list[tuple[bytes | None, ...]], None, None]:
        """The chunk's rows as the server's text, in batches (then the transaction ends)."""
        result = self.result()
        try:
            yield from result.rows(self.batch)
        finally:
            if not result.done:  # a reader that stopped early, or an error: rows unread,
                self.conn.close()  # so the connection cannot take another command
        self.finish(result)

    def rows(self) -> Iterator[list[tuple[Any, ...]]]:
        """The chunk's rows as the row codec's values."""
        for raw in self.raw_rows():
            yield list(map(self.convert_row, raw))

    def convert_row(self, row: Sequence[bytes | None]) -> tuple[Any, ...]:
        """A raw row as the row codec's values."""
        return tuple(None if v is None else f(v)
                     for f, v in zip(self.convert, row, strict=True))

    def convert_key(self, row: Sequence[bytes | None]) -> tuple[Any, ...]:
        """key_of a raw row."""
        convert = self.convert
        return key_of([None if row[i] is None else convert[i](row[i])  # type: ignore[arg-type]
                       for i in self.spec.key_index])


def json_row_writer(spec: TableSpec) -> Callable[[Sequence[bytes | None]], str]:
    """A function writing a raw row (the server's text) as the JSON image a change of the
    same row gets (relay/binlog/jsonwriter.py json_writer's text), generated for the
    table's columns: integers and text go from the server's bytes to JSON without a
    Python value in between (about twice as fast as converting and dumping each value;
    json_text_rows writes the same text faster where its plan takes the table)."""
    ns: dict[str, Any] = {"enc": encode_basestring, "gen": json_value, "int": int,
                          "str": str, "b64": base64.b64encode}
    exprs = []
    for i, col in enumerate(spec.columns):
        v = f"a{i}"
        if col.kind in _INTS:
            expr = f"str(int({v}))"   # ZEROFILL and YEAR text are not JSON numbers as is
        elif col.kind in _TEXT_KINDS and not col.binary:
            expr = f"enc({v}.decode('utf-8'))"
        elif col.binary or col.kind in _BINARY_KINDS:
            expr = f"'\"' + b64({v}).decode('ascii') + '\"'"
        elif col.kind in _FAST_TEXT:
            ns[f"c{i}"] = partial(_FAST_TEXT[col.kind], converter(col))
            expr = f"c{i}({v})"
        else:
            ns[f"c{i}"] = converter(col)
            expr = f"gen(c{i}({v}))"
        exprs.append(expr)
    return compile_json_writer([c.name for c in spec.columns], exprs, ns,
                               f"snapshot {spec.qualified}")


def json_text_plan(spec: TableSpec) -> tuple[tuple[int, ...], tuple[bytes, ...]] | None:
    """json_text_rows' plan and keys for the table's rows (json_row_writer's text from
    the server's bytes), or None when a column is one only the writer writes."""
    plan = []
    for col in spec.columns:
        if col.kind in _INTS:
            step = TextStep.INT
        elif col.kind in _TEXT_KINDS and not col.binary:
            step = TextStep.TEXT
        elif col.binary or col.kind in _BINARY_KINDS:
            step = TextStep.BASE64
        elif col.kind in _TEXT_STEPS:
            step = _TEXT_STEPS[col.kind]
        else:
            return None
        plan.append(int(step))
    return tuple(plan), json_keys([c.name for c in spec.columns])


_TEXT_STEPS = {"decimal": TextStep.DECIMAL, "date": TextStep.DATE,
               "datetime": TextStep.DATETIME, "timestamp": TextStep.TIMESTAMP}


def _decimal_json(slow: Callable[[bytes], Any], raw: bytes) -> str:
    """str(Decimal(text)) is the text itself unless |value| < 1e-6 (then scientific)."""
    text = raw.decode("ascii")
    if text.lstrip("-").startswith("0.000000"):
        return json_value(slow(raw))
    return '"' + text + '"'


def _datetime_json(slow: Callable[[bytes], Any], raw: bytes, zone: str = "") -> str:
    """The value as json_writer writes it, from the text: "T" for the space and
    the fraction as the server prints it (the column's precision). Zero, invalid or
    possibly invalid days (past the 28th) take the exact path."""
    text = raw.decode("ascii")
    if text[8:10] > "28" or text.startswith("0000") or text[5:7] == "00" or \
            text[8:10] == "00":
        value = slow(raw)
        if isinstance(value, datetime):
            return '"' + datetime_text(value, len(text) - 20 if len(text) > 19 else 0) + '"'
        return json_value(value)
    return '"' + text[:10] + "T" + text[11:] + zone + '"'


def _time_json(slow: Callable[[bytes], Any], raw: bytes) -> str:
    """A TIME with the fraction digits the server prints (the column's precision)."""
    _, _, frac = raw.partition(b".")
    return '"' + time_text(slow(raw), len(frac)) + '"'


_FAST_TEXT: dict[str, Callable[..., str]] = {
    "decimal": _decimal_json, "datetime": _datetime_json, "time": _time_json,
    "timestamp": partial(_datetime_json, zone="+00:00"),
}


_TEXT_KINDS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"}


def _gtid_state(conn: Any) -> str | None:
    """The source's GTID state: MariaDB's @@gtid_current_pos, or MySQL's @@gtid_executed."""
    try:
        return query_value(conn, "SELECT @@gtid_current_pos")
    except pymysql.err.OperationalError:  # 1193 unknown system variable: MySQL
        return query_value(conn, "SELECT @@GLOBAL.gtid_executed")


def query_value(conn: Any, sql: str, args: Sequence[Any] | None = None) -> str | None:
    """The first column of the first row, as text (None: no row, or NULL)."""
    rows = _rows(conn, sql, args)
    if not rows or rows[0][0] is None:
        return None
    return _text(rows[0][0])
