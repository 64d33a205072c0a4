"""The `mariadb` command-line client asks the primary and the relay the same statements.

The statements are the ones real clients send (captured on the wire with the replication
probes' logging proxy): a MariaDB replica's IO thread, `mariadb-binlog
--read-from-remote-server`, `mariadb-admin`, python-mysql-replication and zongji. For each,
the client's column metadata (name, type, collation, flags) must be the primary's, and so must
the values, except where the README documents the value as the relay's own (its server_id,
binlog file names and positions, GTID positions, read_only ...).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import start_relay

pytestmark = pytest.mark.integration

USER, PASSWORD = "cdc", "cdcpw"

# The variables whose values are the relay's (README, "What the relay answers").
RELAY_OWNED = {"server_id", "port", "hostname", "gtid_binlog_pos", "gtid_current_pos",
               "gtid_binlog_state", "gtid_slave_pos", "log_bin_basename", "log_bin_index",
               "read_only", "rpl_semi_sync_master_enabled", "rpl_semi_sync_master_wait_point",
               "rpl_semi_sync_master_wait_no_slave", "rpl_semi_sync_master_timeout",
               "rpl_semi_sync_master_trace_level"}

SAME, OWNED, VARIABLES, COLUMNS = ("same values", "relay-owned values", "variables",
                                   "the same columns")
# SHOW FULL COLUMNS' Privileges are the metadata account's on the primary (README)
BUT_PRIVILEGES = "same values but Privileges"


@dataclass(frozen=True)
class Statement:
    sql: str
    compare: str = SAME
    client: str = ""


STATEMENTS = [
    # a MariaDB replica's IO thread, in order
    Statement("SELECT UNIX_TIMESTAMP()", OWNED, "replica"),   # the clock moves between the two
    Statement("SHOW VARIABLES LIKE 'SERVER_ID'", OWNED, "replica"),
    Statement("SET @master_heartbeat_period= 30000001024", SAME, "replica"),
    Statement("SET @master_binlog_checksum= @@global.binlog_checksum; "
              "SELECT @master_binlog_checksum", SAME, "replica"),
    Statement("SET @mariadb_slave_capability=4", SAME, "replica"),
    Statement("SELECT @@GLOBAL.gtid_domain_id", SAME, "replica"),
    Statement("SET @slave_connect_state='0-1-1'", SAME, "replica"),
    Statement("SET @slave_gtid_strict_mode=0", SAME, "replica"),
    Statement("SET @slave_gtid_ignore_duplicates=0", SAME, "replica"),
    Statement("SHOW VARIABLES LIKE 'rpl_semi_sync_master_enabled'", SAME, "replica"),
    Statement("SELECT binlog_gtid_pos('{file}', 4)", SAME, "replica"),
    # mariadb-binlog --read-from-remote-server
    Statement("SELECT VERSION()", SAME, "mariadb-binlog"),
    Statement("SET @master_binlog_checksum='NONE'", SAME, "mariadb-binlog"),
    # mariadb-admin variables / extended-status / processlist (ping and status are
    # COM_PING and COM_STATISTICS: test_mariadb_admin)
    Statement("show /*!40003 GLOBAL */ variables", VARIABLES, "mariadb-admin"),
    Statement("show /*!50002 GLOBAL */ status LIKE 'Uptime'", OWNED, "mariadb-admin"),
    Statement("show processlist", COLUMNS, "mariadb-admin"),   # the relay's own connections
    # python-mysql-replication
    Statement("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'", SAME, "python-mysql-replication"),
    Statement("SHOW VARIABLES LIKE 'BINLOG_ROW_METADATA'", SAME, "python-mysql-replication"),
    Statement("SHOW MASTER STATUS", OWNED, "python-mysql-replication"),
    Statement("SET @slave_connect_state = '0-1-3'; SET @slave_gtid_strict_mode=1", SAME,
              "python-mysql-replication"),
    # zongji
    Statement("SELECT VERSION() AS version", SAME, "zongji"),
    Statement("select @@GLOBAL.binlog_checksum as checksum", SAME, "zongji"),
    Statement("set @master_binlog_checksum=@@global.binlog_checksum", SAME, "zongji"),
    Statement("SELECT 1", SAME, "zongji"),
    Statement("SELECT @@GLOBAL.gtid_current_pos AS gtidPos", OWNED, "zongji"),
    Statement("SHOW BINARY LOGS", OWNED, "zongji"),
    Statement("SELECT COLUMN_NAME, COLLATION_NAME, CHARACTER_SET_NAME, COLUMN_COMMENT, "
              "COLUMN_TYPE FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_SCHEMA='s' AND "
              "TABLE_NAME='t' ORDER BY ORDINAL_POSITION", SAME, "zongji"),
    # admin clients and other CDC tools
    Statement("SELECT @@version_comment LIMIT 1", SAME, "mariadb"),
    Statement("SELECT @@GLOBAL.SERVER_ID", OWNED, "mariadb"),
    Statement("SELECT @@max_allowed_packet, @@session.autocommit AS ac", SAME, "mariadb"),
    Statement("SELECT DATABASE(), USER(), CURRENT_USER()", SAME, "mariadb"),
    Statement("SHOW VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
              "'binlog_row_image')", SAME, "debezium"),
    Statement("SHOW GLOBAL VARIABLES LIKE 'gtid%'", VARIABLES, "debezium"),
    Statement("SELECT @@gtid_mode", SAME, "debezium"),  # unknown on MariaDB: the same error
    Statement("SHOW CREATE TABLE s.t", SAME, "debezium"),
    Statement("SHOW FULL COLUMNS FROM t FROM s", BUT_PRIVILEGES, "maxwell"),
    # the look-ups the relay composes from information_schema, and SHOW ... WHERE
    # evaluated by the relay
    Statement("SHOW COLUMNS FROM s.t LIKE 'v'", SAME, "mariadb"),
    Statement("DESCRIBE s.t", SAME, "mariadb"),
    Statement("SHOW INDEX FROM t FROM s", SAME, "mariadb"),
    Statement("SHOW KEYS FROM s.t WHERE Key_name = 'PRIMARY'", SAME, "mariadb"),
    Statement("SHOW COLUMNS FROM s.nope", SAME, "mariadb"),
    Statement("SHOW FULL TABLES FROM s WHERE Table_type = 'BASE TABLE'", SAME, "mariadb"),
    Statement("SHOW DATABASES LIKE 's'", SAME, "mariadb"),
    Statement("SHOW TABLE STATUS FROM s LIKE 't'", COLUMNS, "mariadb"),
    Statement("SELECT SCHEMA_NAME, DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA "
              "WHERE SCHEMA_NAME = 's'", SAME, "maxwell"),
    Statement("SHOW BINLOG EVENTS IN '{file}' LIMIT 3", OWNED, "mariadb"),
    Statement("SET NAMES utf8mb4; SELECT 'ok' AS state", SAME, "mariadb connector/C"),
]


@dataclass
class Answer:
    fields: list[dict[str, str]]     # per column: name, Type, Collation, Flags
    rows: list[str]                  # --batch lines after the header
    error: str                       # the client's ERROR line, without "at line 1"


def ask(port: int, sql: str, file: str = "") -> Answer:
    """The client's answer to `sql`; `file` (the server's binlog file name, which the
    statement may contain) reads as {file} in it, so servers with differently named files
    compare."""
    base = ["mariadb", "-h127.0.0.1", f"-P{port}", f"-u{USER}", f"-p{PASSWORD}"]
    meta = subprocess.run([*base, "--column-type-info", "--table", "-e", sql],
                          capture_output=True, text=True, timeout=30)
    data = subprocess.run([*base, "--batch", "--skip-column-names", "-e", sql],
                          capture_output=True, text=True, timeout=30)
    fields: list[dict[str, str]] = []
    for line in meta.stdout.splitlines():
        m = re.match(r"Field\s+\d+:\s+`(.*)`$", line)
        if m:
            fields.append({"name": m.group(1)})
            continue
        m = re.match(r"(Type|Collation|Flags):\s+(.*?)\s*$", line)
        if m and fields:
            fields[-1][m.group(1)] = m.group(2)
    error = re.sub(r" at line \d+", "", data.stderr.strip())
    answer = Answer(fields, data.stdout.splitlines(), error)
    if file:
        for f in answer.fields:
            f["name"] = f["name"].replace(file, "{file}")
        answer.rows = [r.replace(file, "{file}") for r in answer.rows]
    return answer


@pytest.fixture
def servers(mariadb_factory: Callable[..., MariaDB],
            relay_factory: Callable[..., RelayProcess]) -> tuple[MariaDB, RelayProcess]:
    primary = mariadb_factory()
    primary.execute_many([
        # the relay's look-ups run as repl: metadata only (docs/security.md)
        "GRANT REFERENCES ON *.* TO 'repl'@'%'",
        f"CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{USER}'@'%'",
        "CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY, v VARCHAR(20) COMMENT 'c', "
        "d DECIMAL(10,2), KEY (v)) DEFAULT CHARSET latin1", "INSERT INTO s.t VALUES (1,'a',1.5)"])
    relay = start_relay(relay_factory, primary, users={USER: PASSWORD})
    target = primary.gtid_binlog_pos()
    wait_until(lambda: ask(relay.port, "SELECT @@gtid_binlog_pos").rows == [target], 30,
               "the relay to hold the primary's transactions")
    wait_until(lambda: relay.status()["upstream"]["primary_settings_at"] > 0, 30,
               "the relay to have read the primary's variables")
    return primary, relay


def _first_file(port: int) -> str:
    return ask(port, "SHOW BINARY LOGS").rows[0].split("\t")[0]


def test_each_statement_answers_as_the_primary(servers: tuple[MariaDB, RelayProcess]) -> None:
    primary, relay = servers
    files = {primary.port: _first_file(primary.port), relay.port: _first_file(relay.port)}
    differences = []
    for st in STATEMENTS:
        theirs = ask(primary.port, st.sql.format(file=files[primary.port]), files[primary.port])
        ours = ask(relay.port, st.sql.format(file=files[relay.port]), files[relay.port])
        assert theirs.error == "" or any(e in theirs.error for e in (
            "Unknown system variable", "doesn't exist")), (st, theirs)
        problem = None
        if ours.error != theirs.error:
            problem = f"error {ours.error!r} where the primary says {theirs.error!r}"
        elif ours.fields != theirs.fields:
            problem = f"columns {ours.fields} where the primary has {theirs.fields}"
        elif (st.compare == SAME and ours.rows != theirs.rows) or (
                st.compare == BUT_PRIVILEGES and _but_privileges(ours) != _but_privileges(theirs)):
            problem = f"rows {ours.rows} where the primary has {theirs.rows}"
        elif st.compare == OWNED and len(ours.rows) != len(theirs.rows):
            problem = f"{len(ours.rows)} rows where the primary has {len(theirs.rows)}"
        elif st.compare == VARIABLES:
            mine = dict(r.split("\t", 1) for r in ours.rows)
            primary_vars = dict(r.split("\t", 1) for r in theirs.rows)
            if mine.keys() != primary_vars.keys():
                problem = f"variables differ: {sorted(mine.keys() ^ primary_vars.keys())}"
            else:
                differ = {k for k in mine if mine[k] != primary_vars[k]} - RELAY_OWNED
                if differ:
                    problem = "values differ: " + ", ".join(
                        f"{k}={mine[k]!r} (primary {primary_vars[k]!r})" for k in sorted(differ))
        if problem:
            differences.append(f"{st.client}: {st.sql}: {problem}")
    assert not differences, "\n".join(differences)


def _but_privileges(answer: Answer) -> list[list[str]]:
    at = [f["name"] for f in answer.fields].index("Privileges")
    return [row.split("\t")[:at] + row.split("\t")[at + 1:] for row in answer.rows]


def test_relay_owned_values_are_the_relays(servers: tuple[MariaDB, RelayProcess]) -> None:
    primary, relay = servers
    assert ask(relay.port, "SELECT @@GLOBAL.SERVER_ID").rows == ["4242"]
    status = ask(relay.port, "SHOW MASTER STATUS").rows[0].split("\t")
    assert status[0] == _first_file(relay.port) and status[0].startswith("relay-bin.")
    assert ask(relay.port, "SELECT @@GLOBAL.gtid_current_pos").rows == [primary.gtid_binlog_pos()]
    assert ask(relay.port, "SELECT @@read_only").rows == ["1"]


def test_mariadb_admin(servers: tuple[MariaDB, RelayProcess]) -> None:
    _, relay = servers
    base = ["mariadb-admin", "-h127.0.0.1", f"-P{relay.port}", f"-u{USER}", f"-p{PASSWORD}"]
    ping = subprocess.run([*base, "ping"], capture_output=True, text=True, timeout=30)
    assert ping.returncode == 0 and "mysqld is alive" in ping.stdout, ping
    status = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0 and status.stdout.startswith("Uptime: "), status
    version = subprocess.run([*base, "version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and "Server version" in version.stdout, version
    for command in ("variables", "extended-status", "processlist"):
        out = subprocess.run([*base, command], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.count("\n") > 2, (command, out)
