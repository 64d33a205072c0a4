"""Control queries on a short-lived aiomysql connection: what the primary is and where
its binlog stands. The dump stream itself never goes through aiomysql."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

import aiomysql
import pymysql

from relay.binlog.gtid import GtidState
from relay.errors import FatalUpstreamError, UpstreamError
from relay.upstream.source import Source
from relay.wire.replies import ColumnDef

ACCESS_DENIED = {1045, 1044, 1227, 1698}


@dataclass(frozen=True)
class PrimaryInfo:
    version: str
    server_id: int
    binlog_checksum: str
    gtid_binlog_pos: GtidState
    earliest: GtidState
    binlog_files: list[str]
    gtid_strict_mode: bool
    variables: dict[str, str] = field(default_factory=dict)       # SHOW GLOBAL VARIABLES
    variable_types: dict[str, str] = field(default_factory=dict)  # information_schema
    status: dict[str, str] = field(default_factory=dict)          # SHOW GLOBAL STATUS


async def _query(cur: Any, sql: str) -> list[tuple[Any, ...]]:
    await cur.execute(sql)
    return list(await cur.fetchall())


async def inspect_primary(source: Source, *, timeout: float,
                          limit: float | None = None) -> PrimaryInfo:
    """The primary's version, ids, GTID positions, files, variables and status. Bounded as
    a whole by 3 x `timeout` (connect, then a handful of queries), or by `limit` when that
    is shorter: a frozen primary accepts TCP connections (the kernel does) but never sends
    its handshake, which aiomysql's connect_timeout does not cover."""
    bound = timeout * 3 if limit is None else min(timeout * 3, limit)
    try:
        async with asyncio.timeout(bound):
            return await _inspect(source, timeout)
    except TimeoutError:
        raise UpstreamError(f"{source}: no answer within {bound:g}s: the primary is frozen "
                            "or unreachable") from None


async def _inspect(source: Source, timeout: float) -> PrimaryInfo:
    try:
        conn = await aiomysql.connect(host=source.host, port=source.port, user=source.user,
                                      password=source.password, connect_timeout=timeout,
                                      autocommit=True)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else 0
        msg = exc.args[1] if len(exc.args) > 1 else str(exc)
        if code in ACCESS_DENIED:
            raise FatalUpstreamError(
                f"{source}: access denied ({code}: {msg}); check the user and password in "
                "[upstream] sources, and that the user has REPLICATION SLAVE and "
                "REPLICATION CLIENT") from exc
        raise UpstreamError(f"{source}: cannot connect ({code}: {msg})") from exc
    except OSError as exc:
        raise UpstreamError(f"{source}: cannot connect ({exc})") from exc
    try:
        async with conn.cursor() as cur:
            (version,), = await _query(cur, "SELECT @@version")
            if "mariadb" not in str(version).lower():
                raise FatalUpstreamError(
                    f"{source} is MySQL {version}; relay replicates from MariaDB primaries "
                    "so far (MySQL 8 upstreams are planned)")
            (version, server_id, checksum, pos, strict), = await _query(
                cur, "SELECT @@version, @@server_id, @@binlog_checksum, @@gtid_binlog_pos, "
                     "@@gtid_strict_mode")
            files = [r[0] for r in await _query(cur, "SHOW BINARY LOGS")]
            earliest = GtidState()
            if files:
                (first,), = await _query(cur, f"SELECT BINLOG_GTID_POS('{files[0]}', 4)")
                earliest = GtidState.parse(first or "")
            variables = {str(k).lower(): _text(v) for k, v in
                         await _query(cur, "SHOW GLOBAL VARIABLES")}
            status = {str(k): _text(v) for k, v in await _query(cur, "SHOW GLOBAL STATUS")}
            types: dict[str, str] = {}
            # MariaDB's catalogue of variable types (for result set column types)
            with contextlib.suppress(pymysql.err.MySQLError):
                types = {str(k).lower(): str(t) for k, t in await _query(
                    cur, "SELECT VARIABLE_NAME, VARIABLE_TYPE FROM "
                         "information_schema.SYSTEM_VARIABLES")}
        return PrimaryInfo(str(version), int(server_id), str(checksum),
                           GtidState.parse(str(pos or "")), earliest, files, bool(strict),
                           variables, types, status)
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else 0
        if code in ACCESS_DENIED or code == 1381:
            raise FatalUpstreamError(
                f"{source}: cannot read the binlog state ({exc}); the relay needs a MariaDB "
                "primary with log_bin=ON and a user with REPLICATION SLAVE, "
                "REPLICATION CLIENT") from exc
        raise UpstreamError(f"{source}: control query failed: {exc}") from exc
    finally:
        conn.close()


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@dataclass(frozen=True)
class ForwardedResult:
    columns: list[ColumnDef]
    rows: list[list[bytes | None]]


class ForwardError(Exception):
    def __init__(self, code: int, message: str, sqlstate: str = "HY000") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.sqlstate = sqlstate


async def forward_query(source: Source, sql: str, *, timeout: float,
                        charset: str = "utf8mb4") -> ForwardedResult:
    """Run a read-only metadata statement on the primary in the client's character set and
    return its result as it gave it: column definitions (types, charsets, flags) and the
    values' bytes."""
    try:
        async with asyncio.timeout(timeout):
            conn = await aiomysql.connect(host=source.host, port=source.port,
                                          user=source.user, password=source.password,
                                          connect_timeout=timeout, autocommit=True,
                                          charset=charset, use_unicode=False,
                                          conv={})  # values as the server's bytes
            try:
                async with conn.cursor() as cur:
                    await cur.execute("SET SESSION TRANSACTION READ ONLY")
                    await cur.execute(sql)
                    fields = cur._result.fields if cur._result is not None else []
                    rows = list(await cur.fetchall()) if cur.description else []
            finally:
                conn.close()
    except TimeoutError:
        raise ForwardError(2013, f"relay: the primary {source.address} did not answer within "
                                 f"{timeout:g}s") from None
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 2013
        msg = exc.args[1] if len(exc.args) > 1 else str(exc)
        if code >= 2000:  # client-side: the primary is down or unreachable
            msg = f"relay: cannot reach the primary {source.address} ({msg})"
        raise ForwardError(code, str(msg)) from None
    except OSError as exc:
        raise ForwardError(2013, f"relay: cannot reach the primary {source.address} "
                                 f"({exc})") from None
    columns = [ColumnDef(_text(f.name), f.type_code, f.charsetnr, f.length, f.flags,
                         f.scale, _text(f.table_name), _text(f.org_table), _text(f.db),
                         _text(f.org_name)) for f in fields]
    return ForwardedResult(columns, [[None if v is None else _raw(v) for v in row]
                                     for row in rows])


_SYSTEM_SCHEMAS = "('mysql', 'sys', 'information_schema', 'performance_schema')"
_JSON_CHECK = re.compile(r"^\s*json_valid\(`((?:[^`]|``)+)`\)\s*$", re.IGNORECASE)


async def fetch_type_hints(source: Source, *, timeout: float) -> dict[tuple[str, str, str], str]:
    """Real types of columns the binlog cannot tell apart, from the primary's
    information_schema: MariaDB's UUID / INET4 / INET6, JSON (LONGTEXT with a json_valid
    check) and pre-10.1.2 temporal columns with fractional seconds. The user sees only the
    tables it has privileges on; none found is not an error."""
    hints: dict[tuple[str, str, str], str] = {}
    try:
        conn = await aiomysql.connect(host=source.host, port=source.port, user=source.user,
                                      password=source.password, connect_timeout=timeout,
                                      autocommit=True)
    except (pymysql.err.MySQLError, OSError) as exc:
        raise UpstreamError(f"{source}: cannot connect to read column types ({exc})") from exc
    try:
        async with conn.cursor() as cur:
            for schema, table, column, data_type, fsp in await _query(
                    cur, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, "
                         "DATETIME_PRECISION FROM information_schema.COLUMNS "
                         f"WHERE TABLE_SCHEMA NOT IN {_SYSTEM_SCHEMAS} AND "
                         "(DATA_TYPE IN ('uuid', 'inet4', 'inet6') "
                         "OR COLUMN_TYPE LIKE '%mariadb-5.3%')"):
                data_type = str(data_type).lower()
                if data_type in ("uuid", "inet4", "inet6"):
                    hints[(str(schema), str(table), str(column))] = data_type
                elif data_type in ("datetime", "time", "timestamp") and fsp:
                    hints[(str(schema), str(table), str(column))] = f"{data_type}({int(fsp)})"
            try:
                rows = await _query(cur, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CHECK_CLAUSE "
                                         "FROM information_schema.CHECK_CONSTRAINTS WHERE "
                                         f"CONSTRAINT_SCHEMA NOT IN {_SYSTEM_SCHEMAS}")
            except pymysql.err.MySQLError:
                rows = []  # servers without CHECK_CONSTRAINTS (MySQL < 8.0.16)
            for schema, table, clause in rows:
                m = _JSON_CHECK.match(str(clause))
                if m:
                    hints[(str(schema), str(table), m.group(1).replace("``", "`"))] = "json"
    except pymysql.err.MySQLError as exc:
        raise UpstreamError(f"{source}: reading column types failed: {exc}") from exc
    finally:
        conn.close()
    return hints
