"""Answers to the statements replicas and admin clients send, computed from the relay's
state. Sans-I/O: a statement in, a reply (OK, error, or a result set) out."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.relaylog.log import RelayLog
from relay.relaylog.positions import binlog_gtid_pos, segment_size


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
    rows: list[list[str | None]]


Reply = Ok | Err | Rows

SUPPORTED = ("SHOW MASTER STATUS, SHOW BINARY LOGS, SHOW SLAVE HOSTS, SHOW VARIABLES LIKE, "
             "SELECT @@gtid_binlog_pos / @@gtid_current_pos / @@version / @@server_id, "
             "SELECT BINLOG_GTID_POS(file, pos), SELECT UNIX_TIMESTAMP(), and the SET "
             "statements replicas send")


@dataclass
class Replica:
    server_id: int
    host: str
    port: int
    user: str


@dataclass
class SessionVars:
    """What one client SET in its session."""

    user_vars: dict[str, str | None] = field(default_factory=dict)

    @property
    def checksum(self) -> str | None:
        return self.user_vars.get("master_binlog_checksum") or self.user_vars.get(
            "source_binlog_checksum")

    @property
    def heartbeat_ns(self) -> int:
        raw = self.user_vars.get("master_heartbeat_period") or self.user_vars.get(
            "source_heartbeat_period") or "0"
        try:
            return int(float(raw))
        except ValueError:
            return 0

    @property
    def capability(self) -> int:
        try:
            return int(self.user_vars.get("mariadb_slave_capability") or 0)
        except ValueError:
            return 0


_WS = re.compile(r"\s+")
_ASSIGN = re.compile(r"""\s*(?:(?P<scope>@@(?:global\.|session\.)?|@)?(?P<name>[\w.$]+))\s*:?=\s*
                        (?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,]+?)\s*(?:,|$)""",
                     re.X | re.S)
_AS = re.compile(r"\s+as\s+[`\w]+\s*$", re.I)
_GTID_POS = re.compile(r"^binlog_gtid_pos\(\s*'([^']*)'\s*,\s*(\d+)\s*\)$", re.I)


def split_top_level(text: str) -> list[str]:
    """Split on commas outside quotes and parentheses."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item.strip()]


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("\\'", "'").replace('\\"', '"')
    return value


class Answers:
    def __init__(self, log: RelayLog, *, server_id: int, version: Callable[[], str],
                 replicas: Callable[[], list[Replica]]) -> None:
        self.log = log
        self.server_id = server_id
        self.version = version
        self.replicas = replicas

    def checksum_name(self) -> str:
        return "CRC32" if self.log.checksum else "NONE"

    def variables(self) -> dict[str, str]:
        state = str(self.log.state)
        return {
            "server_id": str(self.server_id), "version": self.version(),
            "version_comment": "relay (MySQL/MariaDB replication relay)",
            "gtid_binlog_pos": state, "gtid_current_pos": state, "gtid_slave_pos": "",
            "gtid_binlog_state": state, "gtid_domain_id": "0", "gtid_strict_mode": "0",
            "binlog_checksum": self.checksum_name(), "log_bin": "ON", "binlog_format": "ROW",
            "server_uuid": "", "gtid_mode": "OFF", "hostname": "relay",
            "max_allowed_packet": str(1 << 30), "system_time_zone": "UTC", "time_zone": "SYSTEM",
            "character_set_server": "utf8mb4", "collation_server": "utf8mb4_general_ci",
            "lower_case_table_names": "0", "read_only": "ON", "autocommit": "1",
            "sql_mode": "", "wait_timeout": "28800", "net_write_timeout": "60",
            "transaction_isolation": "REPEATABLE-READ", "tx_isolation": "REPEATABLE-READ",
        }

    def answer(self, sql: str, session: SessionVars) -> Reply:
        text = _WS.sub(" ", sql.strip().rstrip(";")).strip()
        low = text.lower()
        if low.startswith("set "):
            return self._set(text[4:], session)
        if low.startswith("select "):
            return self._select(text[7:], session)
        if low.startswith("show "):
            return self._show(low[5:].strip(), text[5:].strip())
        if low in ("begin", "commit", "rollback", "start transaction") or low.startswith("use "):
            return Ok()
        return Err(1235, f"relay does not support this statement: {text[:100]!r}. It answers "
                         f"{SUPPORTED}.", "42000")

    # --- SET ---------------------------------------------------------------------------

    def _set(self, rest: str, session: SessionVars) -> Reply:
        low = rest.lower()
        if low.startswith(("names ", "character set ", "session transaction", "transaction")):
            return Ok()
        pos = 0
        while pos < len(rest):
            m = _ASSIGN.match(rest, pos)
            if not m:
                return Ok()  # an unknown form: OK, since an error here is fatal to a replica
            if m.group("scope") == "@":
                value = m.group("value").strip()
                if value.lower() in ("@@global.binlog_checksum", "@@binlog_checksum"):
                    resolved: str | None = self.checksum_name()
                elif value.lower() == "null":
                    resolved = None
                else:
                    resolved = _unquote(value)
                session.user_vars[m.group("name").lower()] = resolved
            pos = m.end()
        return Ok()

    # --- SELECT --------------------------------------------------------------------------

    def _select(self, rest: str, session: SessionVars) -> Reply:
        rest = re.split(r"\s+limit\s+", rest, flags=re.I)[0]
        items = [_AS.sub("", item).strip() for item in split_top_level(rest)]
        values = []
        for expr in items:
            value = self._expr(expr, session)
            if isinstance(value, Err):
                return value
            values.append(value)
        return Rows(items, [values])

    def _expr(self, expr: str, session: SessionVars) -> str | Err | None:
        low = expr.lower().replace("`", "")
        if low in ("unix_timestamp()", "unix_timestamp(now())"):
            return str(int(time.time()))
        if low in ("version()", "@@version"):
            return self.version()
        if low in ("database()", "user()", "current_user()"):
            return None if low == "database()" else "repl@relay"
        if low in ("now()", "current_timestamp()", "sysdate()"):
            return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        if low.isdigit():
            return low
        if low.startswith("@@"):
            name = low[2:].removeprefix("global.").removeprefix("session.")
            if name == "rpl_semi_sync_master_enabled" or name == "rpl_semi_sync_source_enabled":
                return "OFF"
            value = self.variables().get(name)
            if value is None:
                return Err(1193, f"Unknown system variable '{name}'")
            return value
        if low.startswith("@"):
            name = low[1:]
            if name in ("master_binlog_checksum", "source_binlog_checksum"):
                return session.checksum or "NONE"  # never NULL: a replica stops on NULL
            return session.user_vars.get(name)
        m = _GTID_POS.match(expr)
        if m:
            state = binlog_gtid_pos(self.log, m.group(1), int(m.group(2)))
            return None if state is None else str(state)
        return Err(1235, f"relay cannot evaluate {expr[:80]!r}. It answers {SUPPORTED}.",
                   "42000")

    # --- SHOW ----------------------------------------------------------------------------

    def _show(self, low: str, orig: str) -> Reply:
        if low in ("master status", "binary log status"):
            if not self.log.segments:
                return Rows(["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"], [])
            name = self.log.segments[-1]
            return Rows(["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"],
                        [[name, str(segment_size(self.log, name)), "", ""]])
        if low in ("binary logs", "master logs"):
            return Rows(["Log_name", "File_size"],
                        [[n, str(segment_size(self.log, n))] for n in self.log.segments])
        if low in ("slave hosts", "replicas"):
            return Rows(["Server_id", "Host", "Port", "Master_id"],
                        [[str(r.server_id), r.host, str(r.port), str(self.server_id)]
                         for r in self.replicas()])
        m = re.match(r"^(?:global |session )?variables(?: like '([^']*)')?$", low)
        if m:
            pattern = m.group(1)
            names = sorted(self.variables().items())
            if pattern is not None:
                rx = re.compile("^" + re.escape(pattern).replace("%", ".*").replace("_", ".")
                                + "$", re.I)
                names = [(k, v) for k, v in names if rx.match(k)]
            return Rows(["Variable_name", "Value"], [[k, v] for k, v in names])
        if low.startswith(("warnings", "errors")):
            return Rows(["Level", "Code", "Message"], [])
        return Err(1235, f"relay does not support SHOW {orig[:80]}. It answers {SUPPORTED}.",
                   "42000")
