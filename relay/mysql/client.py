"""PrimaryConnection: queries to a primary over aiomysql (a design-card package), with
streaming reads, the full column metadata of a result, and errors as the relay's.

aiomysql's public cursor API gives only the DB-API description (name, type, sizes); the
forwarder answers clients with a server's exact column definitions (charset, flags, table
names), which pymysql keeps in the result's fields. `_FieldsCursor` takes them where
aiomysql's own DictCursor does: in its `_do_get_result` hook, from the cursor's own result.
Time bounds are the caller's (asyncio.timeout around whole operations); `connect_timeout`
bounds the TCP connect only, as aiomysql does.

aiomysql connects under `asyncio.wait_for`, which on Python 3.11 drops the caller's
cancellation when the connect attempt ends at the same moment (it returns the attempt's
result instead; fixed in 3.12). Against a primary that refuses connections that happens
to most cancels, and a relay told to stop went on retrying for ever. `open` therefore
raises the cancellation the task was asked for, whatever the attempt gave.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiomysql
import pymysql
from pymysql.constants import CLIENT

from relay.config import Source
from relay.errors import ConfigError, ServerError
from relay.mysql.errors import server_error
from relay.tls import client_context, tls_failure
from relay.wire import ed25519
from relay.wire.auth import CLIENT_ED25519, REQUEST_PUBLIC_KEY
from relay.wire.handshake import CLIENT_SSL
from relay.wire.login_policy import LoginPolicy, raised_as
from relay.wire.replies import ColumnDef

Row = tuple[Any, ...]


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _FieldsCursor(aiomysql.Cursor):  # type: ignore[misc]
    """A buffered cursor that keeps the result's column definitions."""

    fields: list[ColumnDef] = []

    async def _do_get_result(self) -> None:
        await super()._do_get_result()
        self.fields = _columns(self._result)


class _Connection(aiomysql.Connection):  # type: ignore[misc]
    """aiomysql's connection, held to the relay's login policy (relay/wire/login_policy.py)
    and speaking MariaDB's ed25519, through aiomysql's own hooks: `_request_authentication`
    (the greeting, nothing sent yet), `_process_auth` (an auth switch),
    `caching_sha2_password_auth` with `write_packet` (its full authentication's key
    request)."""

    policy = LoginPolicy()
    _in_sha2 = False

    async def open(self) -> None:
        await self._connect()

    async def _request_authentication(self) -> None:
        with raised_as(pymysql.err.OperationalError):
            self.policy.greeted(offers_tls=bool(self.server_capabilities & CLIENT_SSL),
                                secure=bool(self._ssl_context) and bool(
                                    self.server_capabilities & CLIENT_SSL),
                                method=self._server_auth_plugin,
                                has_password=bool(self._password))
        await super()._request_authentication()

    async def _process_auth(self, plugin_name: bytes, auth_packet: Any) -> None:
        with raised_as(pymysql.err.OperationalError):
            self.policy.switched(plugin_name.decode("utf-8", "replace"), secure=self._secure,
                                 has_password=bool(self._password))
        if plugin_name != CLIENT_ED25519.encode():
            await super()._process_auth(plugin_name, auth_packet)
            return
        self.write_packet(ed25519.sign(self._password.encode(), auth_packet.read_all()))
        (await self._read_packet()).check_error()
        self._auth_plugin_used = CLIENT_ED25519

    async def caching_sha2_password_auth(self, pkt: Any) -> Any:
        self._in_sha2 = True
        try:
            return await super().caching_sha2_password_auth(pkt)
        finally:
            self._in_sha2 = False

    def write_packet(self, payload: bytes) -> None:
        if self._in_sha2 and payload == bytes((REQUEST_PUBLIC_KEY,)):
            with raised_as(pymysql.err.OperationalError):
                self.policy.full_authentication(secure=self._secure)
        super().write_packet(payload)


class _StreamingCursor(aiomysql.SSCursor):  # type: ignore[misc]
    """An unbuffered cursor: rows are read from the socket as they are fetched."""


def _columns(result: Any) -> list[ColumnDef]:
    fields = getattr(result, "fields", None)  # an OK packet's result has none
    if not fields:
        return []
    return [ColumnDef(_text(f.name), f.type_code, f.charsetnr, f.length, f.flags, f.scale,
                      _text(f.table_name), _text(f.org_table), _text(f.db), _text(f.org_name))
            for f in fields]


@dataclass(frozen=True)
class Result:
    columns: list[ColumnDef]
    rows: list[Row]


async def _open_keeping_cancel(conn: Any) -> None:
    """`conn.open()`, raising CancelledError if the task was cancelled meanwhile, even when
    aiomysql's wait_for returned the attempt's result instead (see the module's notes)."""
    task = asyncio.current_task()
    asked = task.cancelling() if task is not None else 0
    try:
        await conn.open()
    except Exception as exc:
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError from exc
        raise
    if task is not None and task.cancelling() > asked:
        conn.close()
        raise asyncio.CancelledError


class PrimaryConnection:
    """One connection to a primary. Raises ServerError (errno, message) for what the server
    or the client library refuses; `errno` 2000 and up means it could not be reached."""

    def __init__(self, conn: Any, source: Source) -> None:
        self._conn = conn
        self.source = source

    @classmethod
    async def open(cls, source: Source, *, timeout: float, charset: str = "utf8mb4",
                   raw: bool = False) -> PrimaryConnection:
        """`raw`: values as the server's bytes (no conversion), for relaying them."""
        options: dict[str, Any] = {"conv": {}, "use_unicode": False} if raw else {}
        if source.archive:
            raise ServerError(2003, "HY000", f"{source.address} is an archive of binlog "
                              "files: there is no server to ask")
        try:
            context = client_context(source.tls)
        except ConfigError as exc:
            raise ServerError(2026, "HY000", f"{source}: {exc}") from exc
        try:
            conn = _Connection(host=source.host, port=source.port, user=source.user,
                               password=source.password, connect_timeout=timeout,
                               autocommit=True, charset=charset, ssl=context, **options)
            conn.policy = LoginPolicy.of_source(source)
            # The relay sends one statement per query: a server that takes several in one
            # (aiomysql asks for that) would run whatever followed a `;` in a value.
            conn.client_flag &= ~CLIENT.MULTI_STATEMENTS
            await _open_keeping_cancel(conn)
        except pymysql.err.MySQLError as exc:
            if isinstance(exc.__cause__, ssl.SSLError):  # aiomysql says only "can't connect"
                raise ServerError(2026, "HY000", f"{source}: TLS handshake failed (ssl-mode="
                                  f"{source.tls.mode.value}): {tls_failure(exc.__cause__)}") \
                    from exc
            raise server_error(exc) from exc
        except ssl.SSLError as exc:
            raise ServerError(2026, "HY000", f"{source}: TLS handshake failed "
                              f"(ssl-mode={source.tls.mode.value}): {tls_failure(exc)}") \
                from exc
        except OSError as exc:
            raise ServerError(2003, "HY000", f"cannot connect to {source.address}: {exc}") \
                from exc
        return cls(conn, source)

    async def __aenter__(self) -> PrimaryConnection:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    @property
    def charset(self) -> str:
        return str(self._conn.charset)

    async def set_charset(self, charset: str) -> None:
        """SET NAMES `charset` (a name the server knows; the caller checks it is a name)."""
        try:
            await self._conn.set_charset(charset)
        except pymysql.err.MySQLError as exc:
            raise server_error(exc) from exc

    async def query(self, sql: str, args: Sequence[Any] | None = None) -> Result:
        """Run one statement; its whole result, with the server's column definitions."""
        try:
            async with self._conn.cursor(_FieldsCursor) as cur:
                await cur.execute(sql, args)
                rows = list(await cur.fetchall()) if cur.description else []
                return Result(list(cur.fields), rows)
        except pymysql.err.MySQLError as exc:
            raise server_error(exc) from exc

    async def rows(self, sql: str, args: Sequence[Any] | None = None) -> list[Row]:
        return (await self.query(sql, args)).rows

    async def stream(self, sql: str, args: Sequence[Any] | None = None, *,
                     batch: int = 1000) -> AsyncIterator[list[Row]]:
        """The rows of one statement in batches of `batch`, read from the socket as they
        are taken (memory bounded by the batch, not the result)."""
        try:
            async with self._conn.cursor(_StreamingCursor) as cur:
                await cur.execute(sql, args)
                while True:
                    rows = await cur.fetchmany(batch)
                    if not rows:
                        return
                    yield list(rows)
        except pymysql.err.MySQLError as exc:
            raise server_error(exc) from exc
