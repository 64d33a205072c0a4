"""MetadataClient: the one connection metadata look-ups run on, for every downstream client
and tap reader at once.

Look-ups are statements the relay composed (relay/downstream/lookups.py, the tap's table
descriptions); they run one at a time on one connection to the primary the relay follows
now, as the metadata account (`[downstream] metadata_user`, else the upstream source's
user). Bounds: `queue` look-ups may wait for the connection (beyond that a client gets
error 1040 at once), each has `timeout` seconds (then the connection is dropped, and the
primary's own max_statement_time ends the statement there too), and an answer of more
than `max_rows` rows is refused. The session is read-only, takes one statement per query,
and reads strings and identifiers as the relay's generator writes them (no ANSI_QUOTES,
no NO_BACKSLASH_ESCAPES). When the connection opens, the account's grants are read: an
account that can SELECT user tables is more than look-ups need, and `reads` says so.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.config import Source
from relay.errors import ServerError
from relay.mysql.client import PrimaryConnection, Result
from relay.mysql.errors import CLIENT_ERRORS
from relay.mysql.grants import readable

log = logging.getLogger("relay.metadata")

_CHARSET = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_SQL_MODE = re.compile(r"^[A-Z0-9_,]*$")
_UNSAFE_MODES = {"ANSI", "ANSI_QUOTES", "NO_BACKSLASH_ESCAPES"}
TOO_MANY = 1040
TOO_BIG = 1104


@dataclass
class MetadataStats:
    lookups: int = 0
    refused_busy: int = 0        # turned away: `queue` look-ups were already waiting
    timeouts: int = 0
    connects: int = 0
    account: str = ""            # user@host:port of the connection, once open
    reads: list[str] = field(default_factory=list)   # what the account can SELECT


class MetadataClient:
    def __init__(self, source: Callable[[], Source | None], *, timeout: float,
                 max_rows: int, queue: int,
                 account: tuple[str, str] | None = None) -> None:
        """`source`: the primary followed now (None: none yet); `account`: (user,
        password) of the metadata account, else the source's own."""
        self._source = source
        self._account = account
        self.timeout = timeout
        self.max_rows = max_rows
        self.queue = queue
        self.stats = MetadataStats()
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._conn: PrimaryConnection | None = None
        self._target: Source | None = None
        self._warned: set[str] = set()

    async def query(self, sql: str, charset: str = "utf8mb4") -> Result:
        """Run one look-up; its answer with the server's column definitions and bytes.
        Raises ServerError: the primary's error, 1040 when too many wait, 1104 when the
        answer has more than max_rows rows, 2013 when it does not answer in time."""
        if not _CHARSET.match(charset):
            raise ServerError(1115, "42000", f"Unknown character set: '{charset}'")
        if self._waiting >= self.queue:
            self.stats.refused_busy += 1
            raise ServerError(TOO_MANY, "08004", f"relay: {self.queue} metadata look-ups are "
                              "already waiting for the primary ([downstream] metadata_queue)"
                              "; try again")
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._run(sql, charset)
        finally:
            self._lock.release()

    async def _run(self, sql: str, charset: str) -> Result:
        self.stats.lookups += 1
        try:
            async with asyncio.timeout(self.timeout):
                conn = await self._connection()
                if conn.charset != charset:
                    await conn.set_charset(charset)
                result = await conn.query(sql)
        except TimeoutError:
            self.stats.timeouts += 1
            self._drop()  # a statement may still run there: never reuse the connection
            where = self._target.address if self._target is not None else "the primary"
            raise ServerError(2013, "HY000", f"relay: the primary {where} did not answer "
                              f"within {self.timeout:g}s") from None
        except ServerError as exc:
            if exc.errno >= CLIENT_ERRORS:  # the connection is gone or unusable
                self._drop()
                raise ServerError(exc.errno, exc.sqlstate, f"relay: cannot reach the "
                                  f"primary ({exc.message})") from None
            raise
        except (UnicodeError, LookupError, AttributeError) as exc:
            # a character set the client library cannot speak (ucs2, utf16, utf32 are no
            # client character sets on a server either), or text it cannot encode in it
            self._drop()
            raise ServerError(1300, "HY000", f"relay: the look-up cannot be sent in "
                              f"character set {charset} ({type(exc).__name__}); SET NAMES "
                              "utf8mb4") from None
        except BaseException:
            # cancelled mid-statement (its client was killed or went away): the statement
            # may still be on the wire, so the next look-up gets a fresh connection
            self._drop()
            raise
        if len(result.rows) > self.max_rows:
            raise ServerError(TOO_BIG, "42000", f"relay: the look-up answers more than "
                              f"{self.max_rows} rows ([downstream] metadata_max_rows); narrow "
                              "it with WHERE or LIMIT")
        return result

    async def _connection(self) -> PrimaryConnection:
        source = self._source()
        if source is None:
            raise ServerError(2013, "HY000", "relay: no primary to ask yet")
        if self._account is not None:
            source = Source(source.host, source.port, self._account[0], self._account[1],
                            source.tls, source.get_server_public_key)
        if self._conn is not None and self._target == source:
            return self._conn
        self._drop()
        conn = await PrimaryConnection.open(source, timeout=self.timeout, raw=True)
        try:
            await self._prepare(conn)
            grants = await self._grants(conn)
        except BaseException:
            conn.close()
            raise
        self._conn, self._target = conn, source
        self.stats.connects += 1
        self.stats.account = str(source)
        self.stats.reads = readable(grants)
        if self.stats.reads and str(source) not in self._warned:
            self._warned.add(str(source))
            log.warning("the metadata account %s can SELECT %s: metadata look-ups need no "
                        "SELECT (GRANT REFERENCES ON *.* shows every table's definition and "
                        "none of its rows); revoke it, or name another account in "
                        "[downstream] metadata_user", source, ", ".join(self.stats.reads))
        return conn

    @staticmethod
    async def _grants(conn: PrimaryConnection) -> list[str]:
        """The account's grant lines; none when the server answers no SHOW GRANTS (the
        upstream is another relay, whose own look-ups are held to the same rules)."""
        try:
            return [_text(r[0]) for r in await conn.rows("SHOW GRANTS")]
        except ServerError as exc:
            if exc.errno >= CLIENT_ERRORS:
                raise
            return []

    async def _prepare(self, conn: PrimaryConnection) -> None:
        """Read-only, bounded statements, and the quoting the relay's generator writes."""
        await conn.query("SET SESSION TRANSACTION READ ONLY")
        try:
            (mode,), = await conn.rows("SELECT @@SESSION.sql_mode")
        except ServerError as exc:
            if exc.errno >= CLIENT_ERRORS:
                raise
            mode = ""  # another relay: it composes its own look-ups
        modes = [m for m in _text(mode).upper().split(",") if m and m not in _UNSAFE_MODES]
        safe = ",".join(modes)
        if _SQL_MODE.match(safe) and safe != _text(mode).upper():
            await conn.query(f"SET SESSION sql_mode = '{safe}'")
        # the primary ends a look-up running past the relay's wait (MariaDB's name, then
        # MySQL's, which bounds SELECTs only)
        for statement in (f"SET SESSION max_statement_time = {self.timeout:g}",
                          f"SET SESSION max_execution_time = {int(self.timeout * 1000)}"):
            try:
                await conn.query(statement)
                break
            except ServerError:
                continue

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._target = None

    def close(self) -> None:
        self._drop()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
