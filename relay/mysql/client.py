"""PrimaryConnection: queries to a primary over aiomysql (a design-card package), with
streaming reads, the full column metadata of a result, and errors as the relay's.

aiomysql's public cursor API gives only the DB-API description (name, type, sizes); the
forwarder answers clients with a server's exact column definitions (charset, flags, table
names), which pymysql keeps in the result's fields. `_FieldsCursor` takes them where
aiomysql's own DictCursor does: in its `_do_get_result` hook, from the cursor's own result.
Time bounds are the caller's (asyncio.timeout around whole operations); `connect_timeout`
bounds the TCP connect only, as aiomysql does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiomysql
import pymysql

from relay.config import Source
from relay.errors import ServerError
from relay.mysql.errors import server_error
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
        try:
            conn = await aiomysql.connect(host=source.host, port=source.port,
                                          user=source.user, password=source.password,
                                          connect_timeout=timeout, autocommit=True,
                                          charset=charset, **options)
        except pymysql.err.MySQLError as exc:
            raise server_error(exc) from exc
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
