"""What the relay answers a downstream client with, before it is put on the wire: OK, an
error, a result set (with MariaDB's column types and flags), or what the session must do
instead (a metadata look-up on the primary, kill a connection, run a blocking listing off
the event loop); and the views of the relay's own connections SHOW commands list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from relay.wire.replies import ColumnDef

T_LONG = 0x03
T_DOUBLE = 0x05
T_LONGLONG = 0x08
T_LONG_BLOB = 0xFB
T_VAR_STRING = 0xFD

# Column flags as MariaDB sets them on the same answers (the mariadb client prints them).
NOT_NULL = 0x01
UNSIGNED = 0x20
BINARY_FLAG = 0x80
NO_DEFAULT = 0x1000


def text_col(name: str, flags: int = 0, type_code: int = T_VAR_STRING) -> ColumnDef:
    """A text column; its collation becomes the client's connection collation when sent."""
    return ColumnDef(name, type_code, flags=flags)


def number_col(name: str, flags: int = 0, type_code: int = T_LONGLONG,
               length: int = 21) -> ColumnDef:
    return ColumnDef(name, type_code, charset=63, length=length, flags=flags | BINARY_FLAG)


@dataclass(frozen=True)
class Ok:
    pass


@dataclass(frozen=True)
class Err:
    code: int
    message: str
    sqlstate: str = "HY000"


@dataclass(frozen=True)
class Rows:
    columns: list[str]
    rows: Sequence[Sequence[str | bytes | None]]
    defs: list[ColumnDef] | None = None   # column types; None: all VAR_STRING


@dataclass(frozen=True)
class Lookup:
    """A metadata look-up the relay composed (lookups.py; never the client's text): run
    `sql` on the primary as the metadata account and answer with its result, passed
    through `finish` (a SHOW's WHERE, evaluated here) when there is one. With `exists`,
    that look-up must answer a row first, else `missing` is the answer (a SHOW COLUMNS of
    a table that does not exist)."""

    sql: str
    exists: str | None = None
    missing: Err | None = None
    finish: Callable[[list[ColumnDef], list[list[str | bytes | None]]], Rows | Err] | None = None


@dataclass(frozen=True)
class Kill:
    connection_id: int
    query_only: bool


@dataclass(frozen=True)
class Purge:
    """PURGE BINARY LOGS TO `to` / BEFORE `before` (a Unix time): retention removes them."""

    to: str | None = None
    before: float | None = None


@dataclass(frozen=True)
class FlushHosts:
    """FLUSH HOSTS: unblock every address blocked for failed logins."""


@dataclass(frozen=True)
class Deferred:
    """Blocking work (reading the relay log): run it off the event loop."""

    run: Callable[[], Reply]


Reply = Ok | Err | Rows | Lookup | Kill | Purge | FlushHosts | Deferred



@dataclass
class Replica:
    server_id: int
    host: str
    port: int
    user: str
    uuid: str = ""   # a MySQL replica's @replica_uuid (SHOW REPLICAS)


@dataclass(frozen=True)
class Process:
    """One client connection, for SHOW PROCESSLIST."""

    id: int
    user: str
    host: str
    db: str | None
    command: str        # "Sleep", "Binlog Dump"
    seconds: int        # in this command
    state: str | None


class SessionDirectory(Protocol):
    """The relay's own client connections, as SHOW PROCESSLIST / SLAVE HOSTS list them."""

    def replicas(self) -> list[Replica]: ...

    def processes(self) -> list[Process]: ...
