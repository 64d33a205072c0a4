"""Answers to the statements replicas, CDC tools and admin clients send, as the primary
would give them: a statement in, a reply out (OK, an error, a result set, or what the
session must do: a metadata look-up on the primary, kill a connection, or run a
blocking listing in a thread). Nothing here waits on a socket or reads a file: what reads
the relay log (SHOW BINLOG EVENTS, BINLOG_GTID_POS()) comes back `Deferred`, for the
session to run off the event loop (but @@gtid_purged, the oldest segment's header, read
once per oldest segment and cached).

This module holds what the relay knows (its variables and status, its connections, the
primary's snapshot); statements.py parses each statement (sqlglot) and answers it from
here. Variables come from the primary's own
`SHOW GLOBAL VARIABLES` (read at every upstream connect) with the relay's own values where
they differ; a variable the primary does not have is unknown here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relay.binlog.events import decode_fde
from relay.binlog.flavour import Flavour, relay_server_uuid
from relay.config import AuthPlugin
from relay.downstream.replies import (
    NOT_NULL,
    T_DOUBLE,
    T_LONG,
    UNSIGNED,
    Process,
    Replica,
    Reply,
    Rows,
    SessionDirectory,
    number_col,
    text_col,
)
from relay.downstream.semisync import SemiSyncPrimary
from relay.downstream.sessionvars import SessionVars
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import PositionError, segment_header
from relay.rules.runtime import Rules
from relay.wire.replies import ColumnDef

if TYPE_CHECKING:
    from relay.downstream.statements import Statements

_PROCESSLIST_DEFS = [number_col("Id", NOT_NULL), text_col("User", NOT_NULL),
                     text_col("Host", NOT_NULL), text_col("db"), text_col("Command", NOT_NULL),
                     number_col("Time", NOT_NULL, T_LONG, 7), text_col("State"),
                     text_col("Info"), number_col("Progress", NOT_NULL, T_DOUBLE, 7)]


@dataclass
class PrimarySnapshot:
    """What the relay knows of its primary (read at every connect)."""

    variables: dict[str, str] = field(default_factory=dict)        # lower-case names
    variable_types: dict[str, str] = field(default_factory=dict)   # "BIGINT UNSIGNED", ...
    status: dict[str, str] = field(default_factory=dict)           # SHOW GLOBAL STATUS


class _NoSessions:
    def replicas(self) -> list[Replica]:
        return []

    def processes(self) -> list[Process]:
        return []


class Answers:
    def __init__(self, log: RelayLog, *, server_id: int,
                 sessions: SessionDirectory | None = None,
                 primary: Callable[[], PrimarySnapshot | None] = lambda: None,
                 port: int = 0, hostname: str = "relay", forward_metadata: bool = True,
                 metadata_max_rows: int = 10_000,
                 started: float | None = None,
                 semi_sync: SemiSyncPrimary | None = None,
                 rules: Rules | None = None) -> None:
        self.log = log
        self.server_id = server_id
        self.sessions: SessionDirectory = sessions if sessions is not None else _NoSessions()
        self.upstream = primary
        self.port = port
        self.hostname = hostname
        self.forward_metadata = forward_metadata
        self.metadata_max_rows = metadata_max_rows
        self.started = started if started is not None else time.time()
        self.semi_sync = semi_sync if semi_sync is not None else SemiSyncPrimary()
        self.rules = rules if rules is not None else Rules()  # (SHOW BINLOG EVENTS)
        self._statements: Statements | None = None

    def checksum_name(self) -> str:
        return "CRC32" if self.log.checksum else "NONE"

    def version(self) -> str:
        """The primary's version, so replicas see the flavour they expect."""
        if self.log.fde is not None:
            return decode_fde(self.log.fde).server_version
        up = self.upstream()
        known = up.variables.get("version", "") if up is not None else ""
        return known.removeprefix("5.5.5-") or "10.11.0-MariaDB-relay"

    def default_plugin(self) -> AuthPlugin:
        """The authentication method the relay's port names first, as a server of its
        flavour does (and users configured without one log in with)."""
        return AuthPlugin.CACHING_SHA2 if self.log.flavour is Flavour.MYSQL \
            else AuthPlugin.NATIVE

    def greeting_version(self) -> str:
        v = self.version()
        # MariaDB servers prefix 5.5.5- for old clients; MariaDB clients strip it again.
        return f"5.5.5-{v}" if "mariadb" in v.lower() else v

    # --- variables -------------------------------------------------------------------------

    def relay_owned(self) -> dict[str, str]:
        """The variables whose values are the relay's, not the primary's."""
        if self.log.flavour is Flavour.MYSQL:
            return self._mysql_owned()
        state = str(self.log.visible_state)  # what a client asking next can be served
        base = f"{self.log.directory}/{self.log.basename}"
        return {
            "server_id": str(self.server_id), "port": str(self.port),
            "hostname": self.hostname, "gtid_binlog_pos": state, "gtid_current_pos": state,
            "gtid_binlog_state": state, "gtid_slave_pos": "",
            "binlog_checksum": self.checksum_name(), "log_bin_basename": base,
            "log_bin_index": f"{base}.index", "read_only": "ON",
            # The relay is a semi-sync primary of its own (never the upstream's setting: a
            # replica that believed it would expect 0xEF headers the relay did not send).
            "rpl_semi_sync_master_enabled": "ON" if self.semi_sync.enabled else "OFF",
            "rpl_semi_sync_master_wait_point": "AFTER_SYNC",  # asked once durable here
            "rpl_semi_sync_master_wait_no_slave": "ON",
            "rpl_semi_sync_master_timeout": "10000",  # MariaDB's defaults: the relay's
            "rpl_semi_sync_master_trace_level": "32",  # commits wait for no replica
        }

    def _mysql_owned(self) -> dict[str, str]:
        """A MySQL-flavour relay's own: its GTID sets, its UUID, GTID mode, and the
        semi-sync source variables under both plugins' names."""
        base = f"{self.log.directory}/{self.log.basename}"
        semi = "ON" if self.semi_sync.enabled else "OFF"
        out = {
            "server_id": str(self.server_id), "port": str(self.port),
            "hostname": self.hostname, "server_uuid": relay_server_uuid(self.server_id),
            "gtid_executed": str(self.log.visible_state), "gtid_purged": self._purged(),
            "gtid_mode": "ON", "enforce_gtid_consistency": "ON",
            "binlog_checksum": self.checksum_name(), "log_bin_basename": base,
            "log_bin_index": f"{base}.index", "read_only": "ON", "super_read_only": "ON",
        }
        # (8.0.26+'s source plugin names, and the old master plugin's)
        for prefix, replica in (("rpl_semi_sync_source_", "replica"),
                                ("rpl_semi_sync_master_", "slave")):
            out.update({f"{prefix}enabled": semi, f"{prefix}wait_point": "AFTER_SYNC",
                        f"{prefix}wait_for_{replica}_count": "1",
                        f"{prefix}wait_no_{replica}": "ON",
                        f"{prefix}timeout": "10000", f"{prefix}trace_level": "32"})
        return out

    def _purged(self) -> str:
        """@@gtid_purged: the transactions before the relay's oldest segment."""
        names = self.log.segments.names
        if not names:
            return ""
        try:
            return str(segment_header(self.log, names[0]).state)
        except PositionError:  # purged meanwhile: the next call sees the new oldest
            return ""

    def variables(self) -> dict[str, str]:
        up = self.upstream()
        if up is not None and up.variables:
            out = {k: v for k, v in up.variables.items()
                   if not k.startswith(("rpl_semi_sync_master_", "rpl_semi_sync_source_"))}
        else:  # never connected yet: what a replica needs to start
            out = {
                "version": self.version(), "version_comment": "relay",
                "gtid_domain_id": "0", "gtid_strict_mode": "OFF", "log_bin": "ON",
                "binlog_format": "ROW", "max_allowed_packet": str(1 << 30),
                "system_time_zone": "UTC", "time_zone": "SYSTEM",
                "character_set_server": "utf8mb4", "collation_server": "utf8mb4_general_ci",
                "lower_case_table_names": "0", "autocommit": "ON", "sql_mode": "",
                "wait_timeout": "28800", "net_write_timeout": "60",
                "transaction_isolation": "REPEATABLE-READ", "tx_isolation": "REPEATABLE-READ",
                "binlog_row_metadata": "FULL", "binlog_row_image": "FULL",
            }
        out.update(self.relay_owned())
        return out

    def status(self) -> dict[str, str]:
        up = self.upstream()
        out = dict(up.status) if up is not None else {}
        out = {k: v for k, v in out.items()
               if not k.startswith(("Rpl_semi_sync_master_", "Rpl_semi_sync_source_"))}
        out.update(self.semi_sync.status())
        out["Uptime"] = str(int(time.time() - self.started))
        out["Slaves_connected"] = str(len(self.sessions.replicas()))
        return out

    def var_type(self, name: str) -> str:
        up = self.upstream()
        return (up.variable_types.get(name, "") if up is not None else "").upper()

    def var_def(self, column: str, name: str) -> ColumnDef:
        kind = self.var_type(name)
        if kind.startswith(("BIGINT", "INT", "BOOLEAN")):
            return number_col(column, UNSIGNED if "UNSIGNED" in kind else 0)
        return text_col(column)

    # --- entry -----------------------------------------------------------------------------

    def answer(self, sql: str, session: SessionVars) -> Reply:
        """The reply to one statement (statements.py parses and answers it)."""
        return self._statement_answers().answer(sql, session)

    def split_statements(self, sql: str) -> list[str]:
        """The statements of one COM_QUERY (multi-statements), as written."""
        from relay.downstream.statements import split_statements

        return split_statements(sql)

    def _statement_answers(self) -> Statements:
        if self._statements is None:
            # imported on the first statement: sqlglot is not loaded at start
            from relay.downstream.statements import Statements

            self._statements = Statements(self)
        return self._statements

    def master_status(self) -> Rows:
        cols = ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"]
        defs = [text_col("File", NOT_NULL),
                number_col("Position", NOT_NULL | UNSIGNED, length=20),
                text_col("Binlog_Do_DB", NOT_NULL),
                text_col("Binlog_Ignore_DB", NOT_NULL)]
        if not self.log.segments:
            return Rows(cols, [], defs)
        name = self.log.segments.last
        return Rows(cols, [[name, str(self.log.visible_size(name)), "", ""]], defs)

    def processlist(self, session: SessionVars, text: str) -> Rows:
        rows: list[list[str | None]] = []
        for p in sorted(self.sessions.processes(), key=lambda p: p.id):
            if not session.admin and p.user != session.user:
                continue  # a server shows others' threads only to PROCESS
            asking = p.id == session.connection_id
            rows.append([str(p.id), p.user, p.host, p.db, "Query" if asking else p.command,
                         "0" if asking else str(p.seconds), "starting" if asking else p.state,
                         text if asking else None, "0.000"])
        return Rows([c.name for c in _PROCESSLIST_DEFS], rows, _PROCESSLIST_DEFS)

    def replica_hosts(self) -> Rows:
        if self.log.flavour is Flavour.MYSQL:  # SHOW REPLICAS as MySQL 8.4 prints it
            return Rows(["Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"],
                        [[str(r.server_id), r.host, str(r.port), str(self.server_id), r.uuid]
                         for r in self.sessions.replicas()],
                        [number_col("Server_Id", NOT_NULL | UNSIGNED, length=10),
                         text_col("Host", NOT_NULL),
                         number_col("Port", NOT_NULL | UNSIGNED, length=10),
                         number_col("Source_Id", NOT_NULL | UNSIGNED, length=10),
                         text_col("Replica_UUID", NOT_NULL)])
        return Rows(["Server_id", "Host", "Port", "Master_id"],
                    [[str(r.server_id), r.host, str(r.port), str(self.server_id)]
                     for r in self.sessions.replicas()],
                    [number_col("Server_id", NOT_NULL | UNSIGNED, length=10),
                     text_col("Host", NOT_NULL),
                     number_col("Port", NOT_NULL | UNSIGNED, length=10),
                     number_col("Master_id", NOT_NULL | UNSIGNED, length=10)])
