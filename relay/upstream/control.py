"""Control queries to a primary (relay.mysql's client): what the primary is and where its
binlog stands, and the real types of columns the binlog cannot tell apart. The dump stream
never goes here, nor anything a client sent (metadata look-ups: relay/mysql/metadata.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relay.binlog.flavour import Flavour
from relay.binlog.gtid import GtidPosition, GtidSet, GtidState
from relay.config import Source, StartMode
from relay.errors import FatalUpstreamError, ServerError, UpstreamError
from relay.mysql.client import PrimaryConnection
from relay.mysql.errors import BINLOG_NOT_ENABLED, CLIENT_ERRORS, LOGIN_REFUSED
from relay.mysql.grants import readable


@dataclass(frozen=True)
class PrimaryInfo:
    """What a connect needs to know before it asks for the dump."""

    version: str
    server_id: int
    binlog_checksum: str
    gtid_binlog_pos: GtidPosition      # the transactions in its binlog (MySQL: executed)
    earliest: GtidPosition             # where its oldest binlog starts (MySQL: purged)
    binlog_files: list[str]
    gtid_strict_mode: bool
    flavour: Flavour = Flavour.MARIADB
    # What the upstream account can SELECT beyond metadata (mysql/grants.py): replication
    # needs none of it.
    account_reads: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PrimarySettings:
    """The primary's variables and status, as downstream clients see them (read once the
    dump runs: a thousand rows or more, not worth delaying the stream for)."""

    variables: dict[str, str] = field(default_factory=dict)       # SHOW GLOBAL VARIABLES
    variable_types: dict[str, str] = field(default_factory=dict)  # information_schema
    status: dict[str, str] = field(default_factory=dict)          # SHOW GLOBAL STATUS


def start_position(info: PrimaryInfo, mode: StartMode,
                   position: GtidPosition | None = None) -> GtidPosition:
    """Where a reader with no position of its own starts on this primary."""
    if mode is StartMode.CURRENT:
        return info.gtid_binlog_pos
    if mode is StartMode.EARLIEST:
        return info.earliest
    if position is None:
        return info.flavour.empty()
    if Flavour.of_position(position) is not info.flavour:
        raise FatalUpstreamError(info.flavour.mismatch(
            Flavour.of_position(position), f"[upstream] start = {position}"))
    return position


async def inspect_primary(source: Source, *, timeout: float,
                          limit: float | None = None) -> PrimaryInfo:
    """The primary's version, ids, GTID positions, files, variables and status. Bounded as
    a whole by 3 x `timeout` (connect, then a handful of queries), or by `limit` when that
    is shorter: a frozen primary accepts TCP connections (the kernel does) but never sends
    its handshake, which the client's connect_timeout does not cover."""
    bound = timeout * 3 if limit is None else min(timeout * 3, limit)
    return await _within(bound, source, _inspect(source, timeout))


T = TypeVar("T")


async def _within(bound: float, source: Source, work: Awaitable[T], doing: str = "") -> T:
    """`work`, or UpstreamError after `bound` seconds."""
    try:
        async with asyncio.timeout(bound):
            return await work
    except TimeoutError:
        raise UpstreamError(f"{source}: no answer within {bound:g}s{doing}: the primary is "
                            "frozen or unreachable") from None


async def _inspect(source: Source, timeout: float) -> PrimaryInfo:
    try:
        conn = await PrimaryConnection.open(source, timeout=timeout)
    except ServerError as exc:
        if exc.errno in LOGIN_REFUSED:
            raise FatalUpstreamError(
                f"{source}: login refused ({exc.errno}: {exc.message}); check the user, its "
                "password and account (locked, expired, allowed hosts) in [upstream] sources, "
                "and that the user has REPLICATION SLAVE and REPLICATION CLIENT",
                server_error=exc) from exc
        raise UpstreamError(f"{source}: cannot connect ({exc.errno}: {exc.message})",
                            server_error=exc) from exc
    try:
        async with conn:
            (version,), = await conn.rows("SELECT @@version")
            if Flavour.of_version(_text(version)) is Flavour.MYSQL:
                return await _inspect_mysql(source, conn)
            (version, server_id, checksum, pos, strict), = await conn.rows(
                "SELECT @@version, @@server_id, @@binlog_checksum, @@gtid_binlog_pos, "
                "@@gtid_strict_mode")
            files = [str(r[0]) for r in await conn.rows("SHOW BINARY LOGS")]
            earliest = GtidState()
            if files:
                (first,), = await conn.rows(f"SELECT BINLOG_GTID_POS('{files[0]}', 4)")
                earliest = GtidState.parse(first or "")
            reads = await account_reads(conn)
    except ServerError as exc:
        if exc.errno in LOGIN_REFUSED or exc.errno == BINLOG_NOT_ENABLED:
            raise FatalUpstreamError(
                f"{source}: cannot read the binlog state ({exc}); the relay needs a MariaDB "
                "primary with log_bin=ON and a user with REPLICATION SLAVE, "
                "REPLICATION CLIENT", server_error=exc) from exc
        raise UpstreamError(f"{source}: control query failed: {exc}", server_error=exc) \
            from exc
    return PrimaryInfo(str(version), int(server_id), str(checksum),
                       GtidState.parse(str(pos or "")), earliest, files, bool(strict),
                       flavour=Flavour.MARIADB, account_reads=reads)


async def _inspect_mysql(source: Source, conn: PrimaryConnection) -> PrimaryInfo:
    """A MySQL primary: its GTIDs must be on (the relay follows by GTID set); the
    transactions in its binlog are @@gtid_executed, its oldest binlog begins after
    @@gtid_purged."""
    (version, server_id, checksum, mode, executed, purged), = await conn.rows(
        "SELECT @@version, @@server_id, @@binlog_checksum, @@gtid_mode, "
        "@@GLOBAL.gtid_executed, @@GLOBAL.gtid_purged")
    if _text(mode).upper() != "ON":
        raise FatalUpstreamError(
            f"{source} is MySQL {_text(version)} with gtid_mode = {_text(mode)}: the relay "
            "follows MySQL primaries by GTID; set gtid_mode = ON and "
            "enforce_gtid_consistency = ON on the primary")
    files = [_text(r[0]) for r in await conn.rows("SHOW BINARY LOGS")]
    reads = await account_reads(conn)
    return PrimaryInfo(_text(version), int(server_id), _text(checksum),
                       GtidSet.parse(_text(executed)), GtidSet.parse(_text(purged)), files,
                       False, flavour=Flavour.MYSQL, account_reads=reads)


async def account_reads(conn: PrimaryConnection) -> list[str]:
    """What the connection's account can SELECT beyond metadata (mysql/grants.py); [] when
    the server does not say (another relay answers no SHOW GRANTS)."""
    try:
        return readable([_text(r[0]) for r in await conn.rows("SHOW GRANTS")])
    except ServerError as exc:
        if exc.errno >= CLIENT_ERRORS:  # the connection itself failed
            raise
        return []


async def read_settings(source: Source, *, timeout: float) -> PrimarySettings:
    """The primary's global variables, their types and its global status. Raises
    ServerError (2013 when the primary does not answer in time)."""
    try:
        async with asyncio.timeout(timeout * 3):
            conn = await PrimaryConnection.open(source, timeout=timeout)
            async with conn:
                variables = {str(k).lower(): _text(v) for k, v in
                             await conn.rows("SHOW GLOBAL VARIABLES")}
                status = {str(k): _text(v) for k, v in
                          await conn.rows("SHOW GLOBAL STATUS")}
                types: dict[str, str] = {}
                # MariaDB's catalogue of variable types (for result set column types)
                with contextlib.suppress(ServerError):
                    types = {str(k).lower(): str(t) for k, t in await conn.rows(
                        "SELECT VARIABLE_NAME, VARIABLE_TYPE FROM "
                        "information_schema.SYSTEM_VARIABLES")}
    except TimeoutError:
        raise ServerError(2013, "HY000", f"{source}: no answer within {timeout * 3:g}s") \
            from None
    return PrimarySettings(variables, types, status)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_SYSTEM_SCHEMAS = "('mysql', 'sys', 'information_schema', 'performance_schema')"
_JSON_CHECK = re.compile(r"^\s*json_valid\(`((?:[^`]|``)+)`\)\s*$", re.IGNORECASE)


async def fetch_type_hints(source: Source, *, timeout: float) -> dict[tuple[str, str, str], str]:
    """Real types of columns the binlog cannot tell apart, from the primary's
    information_schema: MariaDB's UUID / INET4 / INET6, JSON (LONGTEXT with a json_valid
    check) and pre-10.1.2 temporal columns with fractional seconds. The user sees only the
    tables it has privileges on; none found is not an error. Bounded as a whole by 3 x
    `timeout`, as inspect_primary is (a frozen primary never sends its handshake)."""
    return await _within(timeout * 3, source, _type_hints(source, timeout),
                         " reading column types")


async def _type_hints(source: Source, timeout: float) -> dict[tuple[str, str, str], str]:
    hints: dict[tuple[str, str, str], str] = {}
    try:
        conn = await PrimaryConnection.open(source, timeout=timeout)
    except ServerError as exc:
        raise UpstreamError(f"{source}: cannot connect to read column types ({exc})",
                            server_error=exc) from exc
    try:
        async with conn:
            for schema, table, column, data_type, fsp in await conn.rows(
                    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, "
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
                rows = await conn.rows("SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CHECK_CLAUSE "
                                       "FROM information_schema.CHECK_CONSTRAINTS WHERE "
                                       f"CONSTRAINT_SCHEMA NOT IN {_SYSTEM_SCHEMAS}")
            except ServerError:
                rows = []  # servers without CHECK_CONSTRAINTS (MySQL < 8.0.16)
            for schema, table, clause in rows:
                m = _JSON_CHECK.match(str(clause))
                if m:
                    hints[(str(schema), str(table), m.group(1).replace("``", "`"))] = "json"
    except ServerError as exc:
        raise UpstreamError(f"{source}: reading column types failed: {exc}",
                            server_error=exc) from exc
    return hints
