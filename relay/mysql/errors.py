"""MySQL error numbers the relay decides on, and a client library's errors as the relay's."""

from __future__ import annotations

from enum import Enum

import pymysql

from relay.errors import ServerError
from relay.wire.login_policy import CR_AUTH_PLUGIN_CANNOT_LOAD, CR_AUTH_PLUGIN_ERR

ACCESS_DENIED = frozenset({1044, 1045, 1227, 1698})
# A login a reconnect cannot fix, until the account or the settings change: access denied,
# the host not allowed (1130), a password to change or expired (1820, 1862), the account
# locked (MySQL's 3118, MariaDB's 4151) or blocked after failed logins (MySQL's 3955,
# MariaDB's 4150), and the relay's own login policy's refusals of a clear-text password or
# an RSA key request on a plain connection (relay/wire/login_policy.py). Not 2026: a TLS
# handshake cut short (a primary restarting) is one too.
LOGIN_REFUSED = ACCESS_DENIED | frozenset({
    1130, 1820, 1862, 3118, 3955, 4150, 4151, CR_AUTH_PLUGIN_CANNOT_LOAD, CR_AUTH_PLUGIN_ERR})
NO_PRIVILEGE = frozenset({1044, 1142, 1143, 1227})
BINLOG_NOT_ENABLED = 1381
FATAL_BINLOG_READ = 1236      # ER_MASTER_FATAL_ERROR_READING_BINLOG
CLIENT_ERRORS = 2000          # 2000 and up: the client's own (cannot connect, lost, ...)


class BinlogReadFailure(Enum):
    """Why a primary ended a dump with error 1236: the reason MariaDB gives with it."""

    DIVERGED = "diverged"          # the replica's GTID history conflicts with the binlog's
    NOT_IN_BINLOG = "not_in_binlog"  # a GTID the primary has never had
    PURGED = "purged"              # the binlog files the replica needs are gone
    OTHER = "other"


# MariaDB's own words for each reason (sql/sql_repl.cc, the 1236 texts of
# ER_GTID_POSITION_NOT_FOUND_IN_BINLOG, ..._BINLOG2, ER_GTID_START_FROM_BINLOG_HOLE,
# ER_MASTER_HAS_PURGED_REQUIRED_GTIDS and the "Could not find GTID state" message).
_REASONS = (
    (BinlogReadFailure.DIVERGED, ("diverged", "gtid_start_from_binlog_hole",
                                  "not found in the binlog")),
    (BinlogReadFailure.NOT_IN_BINLOG, ("not in the master's binlog",)),
    (BinlogReadFailure.PURGED, ("have been purged", "purged", "could not find gtid state")),
)


def binlog_read_failure(err: ServerError) -> BinlogReadFailure | None:
    """The reason of a 1236 (None for any other error)."""
    if err.errno != FATAL_BINLOG_READ:
        return None
    text = err.message.lower()
    for reason, words in _REASONS:
        if any(w in text for w in words):
            return reason
    return BinlogReadFailure.OTHER


def server_error(exc: pymysql.err.MySQLError) -> ServerError:
    """A client library error as the relay's ServerError (errno, SQL state, message)."""
    args = exc.args
    errno = args[0] if args and isinstance(args[0], int) else CLIENT_ERRORS
    message = str(args[1]) if len(args) > 1 else str(exc)
    return ServerError(errno, "HY000", message)
