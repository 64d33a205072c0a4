"""Point-in-time recovery from an archive (issue 34), against real servers: a primary's
binlog files are imported, the relay serves them, and a fresh replica replays them up to a
chosen GTID (MariaDB's START SLAVE UNTIL master_gtid_pos, answered by the relay as a
primary answers it; MySQL's SQL_BEFORE_GTIDS and SQL_AFTER_GTIDS) or up to a time (the relay's serve_until),
ending with exactly the primary's data as of then, and nothing of the accident after."""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pymysql
import pytest

from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, required_build, wait_until
from tests.integration.common import caught_up, listening, start_relay

pytestmark = pytest.mark.integration


@dataclass
class Before:
    """The primary as of the moment before the accident."""

    gtid: str
    checksum: object
    time: datetime.datetime


def history_with_an_accident(primary: MariaDB, db: str) -> tuple[list[str], Before]:
    primary.execute_many([f"CREATE DATABASE {db}",
                          f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40))",
                          *[f"INSERT INTO {db}.t VALUES ({i}, 'v{i}')" for i in range(300)],
                          "FLUSH BINARY LOGS",
                          *[f"UPDATE {db}.t SET v = 'u{i}' WHERE id = {i}" for i in range(100)]])
    before = Before(primary.gtid_binlog_pos(), primary.query(f"CHECKSUM TABLE {db}.t")[0][1],
                    datetime.datetime.now(datetime.UTC))
    # Binlog times are whole seconds on MariaDB: the accident comes in a later second.
    time.sleep(1.1 - before.time.microsecond / 1e6)
    primary.execute_many([f"DELETE FROM {db}.t WHERE id % 2 = 0",  # the accident
                          f"INSERT INTO {db}.t VALUES (5000, 'after')", "FLUSH BINARY LOGS",
                          f"UPDATE {db}.t SET v = 'later' WHERE id < 50"])
    assert primary.query(f"CHECKSUM TABLE {db}.t")[0][1] != before.checksum
    return [primary.binlog_path(n) for n in primary.binlog_files()], before


def serving_an_import(relay_factory: Callable[..., RelayProcess], primary: MariaDB,
                      files: list[str], basename: str, extra_toml: str = "",
                      serve_until: str | None = None) -> RelayProcess:
    downstream: dict[str, object] = {"listen": f"127.0.0.1:{free_port()}"}
    if serve_until is not None:
        downstream["serve_until"] = serve_until
    relay = relay_factory(primary.url + ("?get-server-public-key=true" if primary.mysql else ""),
                          extra_toml, relaylog={"basename": basename}, downstream=downstream,
                          users={"repl": "relaypass"})
    out = subprocess.run([sys.executable, "-m", "relay.cli", "import", "--data-dir",
                          relay.data_dir, *files], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    return relay


def table_checksum(replica: MariaDB, table: str) -> object:
    try:
        return replica.query(f"CHECKSUM TABLE {table}")[0][1]
    except pymysql.err.MySQLError:
        return None


@pytest.mark.builds("machine", "mariadb-11.8")
def test_a_mariadb_replica_replays_an_archive_until_a_gtid(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    files, before = history_with_an_accident(primary, "pitr")
    relay = serving_an_import(relay_factory, primary, files, "mariadb-bin")
    replica = mariadb_factory(server_id=31)
    replica.execute_many([
        f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={relay.port}, "
        "MASTER_USER='repl', MASTER_PASSWORD='relaypass', MASTER_CONNECT_RETRY=1, "
        "MASTER_USE_GTID=slave_pos, MASTER_SSL=0",
        f"START SLAVE UNTIL master_gtid_pos = '{before.gtid}'"])

    def stopped() -> bool:
        st = replica.slave_status()
        assert not st.get("Last_IO_Errno") and not st.get("Last_SQL_Errno"), st
        return st.get("Slave_IO_Running") == "No" and st.get("Slave_SQL_Running") == "No"
    wait_until(stopped, 60, "the replica to stop at its UNTIL position")
    assert str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == before.gtid
    assert table_checksum(replica, "pitr.t") == before.checksum
    assert replica.slave_status()["Until_Condition"] == "Gtid"


def test_an_until_gtid_of_another_server_behind_the_start_ends_the_dump_at_once(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """The start names server 2 of a domain, the UNTIL GTID server 1's, behind it: a
    MariaDB primary sees the UNTIL GTID among what it passes before the start and ends
    the dump at once, sending nothing. The relay must too (it compared one GTID a domain,
    so it streamed server 2's later groups, and the replica never stopped)."""
    primary = mariadb_factory()
    with contextlib.closing(primary.root()) as conn, conn.cursor() as cur:
        for server_id, names in ((1, ("a1", "a2", "a3")), (2, ("b1", "b2", "b3", "b4"))):
            cur.execute(f"SET SESSION server_id = {server_id}")
            for name in names:
                cur.execute(f"CREATE DATABASE until_{name}")
    assert primary.gtid_binlog_pos() == "0-2-7"
    relay = start_relay(relay_factory, primary)
    wait_until(lambda: caught_up(relay, primary), 30, "the relay to catch up")
    outcomes = []
    for server_id, port, password in ((41, primary.port, primary.repl_password),
                                      (42, relay.port, "relaypass")):
        replica = mariadb_factory(server_id=server_id)
        replica.execute_many([
            "SET GLOBAL gtid_slave_pos = '0-2-5'",  # holds b1: 0-1-1..3 and 0-2-4..5
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port}, "
            f"MASTER_USER='repl', MASTER_PASSWORD='{password}', MASTER_CONNECT_RETRY=1, "
            "MASTER_USE_GTID=slave_pos, MASTER_SSL=0",
            "START SLAVE UNTIL master_gtid_pos = '0-1-2'"])

        def stopped(replica: MariaDB = replica) -> bool:
            st = replica.slave_status()
            assert not st.get("Last_IO_Errno") and not st.get("Last_SQL_Errno"), st
            return st.get("Slave_IO_Running") == "No" and st.get("Slave_SQL_Running") == "No"
        wait_until(stopped, 60, f"the replica of port {port} to stop at once")
        databases = {str(r[0]) for r in replica.query("SHOW DATABASES LIKE 'until%'")}
        outcomes.append((str(replica.query("SELECT @@gtid_slave_pos")[0][0]), databases))
    assert outcomes[0] == ("0-2-5", set()), "the primary's own answer changed"
    assert outcomes[1] == outcomes[0]


def test_a_replica_served_until_a_time_holds_before_the_accident(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    files, before = history_with_an_accident(primary, "bytime")
    until = before.time.isoformat()
    relay = serving_an_import(relay_factory, primary, files, "mariadb-bin", (
        f'[[downstream.users]]\nname = "recover"\npassword = "recoverpass"\n'
        f'serve_until = "{until}"\n'))
    replica = mariadb_factory(server_id=32)
    replica.replicate_from("127.0.0.1", relay.port, user="recover", password="recoverpass")

    def at_the_moment_before() -> bool:
        return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == before.gtid
    wait_until(at_the_moment_before, 60, "the replica to apply everything before the time")
    assert table_checksum(replica, "bytime.t") == before.checksum
    # It holds there, connected, through heartbeats: nothing of the accident comes.
    def heartbeats() -> int:
        return int(str(replica.query(
            "SHOW GLOBAL STATUS LIKE 'Slave_received_heartbeats'")[0][1]))
    seen = heartbeats()
    wait_until(lambda: heartbeats() >= seen + 2, 30, "two heartbeats while it is held")
    st = replica.slave_status()
    assert st["Slave_IO_Running"] == "Yes" and not st["Last_IO_Errno"], st
    assert str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == before.gtid
    assert table_checksum(replica, "bytime.t") == before.checksum
    # Another user of the same relay gets everything.
    other = mariadb_factory(server_id=33)
    other.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    wait_until(lambda: str(other.query("SELECT @@gtid_slave_pos")[0][0])
               == primary.gtid_binlog_pos(), 60, "an unlimited replica to get everything")


@pytest.fixture
def mysql_servers(tmp_path: object) -> Iterator[tuple[MariaDB, MariaDB]]:
    """A MySQL 9.7 primary (its history is the archive) and a fresh replica."""
    build = required_build("mysql-9.7")
    primary = MariaDB(build=build, base_dir=os.path.join(str(tmp_path), "primary"))
    replica = MariaDB(build=build, server_id=2, base_dir=os.path.join(str(tmp_path), "replica"))
    try:
        primary.start()
        replica.start()
        primary.execute_many([f"GRANT REFERENCES ON *.* TO '{primary.repl_user}'@'%'"])
        yield primary, replica
    finally:
        replica.cleanup()
        primary.cleanup()


def test_a_mysql_replica_replays_an_archive_until_a_gtid(
        mysql_servers: tuple[MariaDB, MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary, replica = mysql_servers
    files, before = history_with_an_accident(primary, "mpitr")
    relay = serving_an_import(relay_factory, primary, files, "binlog")
    source, last = before.gtid.rsplit(":", 1)[0], int(before.gtid.rsplit("-", 1)[1])
    accident = f"{source}:{last + 1}"  # the DELETE: the transaction right after

    def stopped() -> bool:
        st = replica.slave_status()
        assert not st.get("Last_SQL_Errno"), st
        return st.get("Replica_SQL_Running") == "No"
    # Up to the transaction before the accident, named by the accident itself.
    replica.execute_many([
        f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT={relay.port}, "
        "SOURCE_USER='repl', SOURCE_PASSWORD='relaypass', SOURCE_AUTO_POSITION=1, "
        "SOURCE_CONNECT_RETRY=1, GET_SOURCE_PUBLIC_KEY=1",
        f"START REPLICA UNTIL SQL_BEFORE_GTIDS = '{accident}'"])
    wait_until(stopped, 60, "the MySQL replica to stop before the accident's GTID")
    assert table_checksum(replica, "mpitr.t") == before.checksum
    # Then on, up to and including the accident (the DELETE, not the INSERT after it).
    replica.execute_many(["STOP REPLICA",
                          f"START REPLICA UNTIL SQL_AFTER_GTIDS = '{accident}'"])
    wait_until(lambda: stopped() and replica.query("SELECT COUNT(*) FROM mpitr.t")[0][0] == 150,
               60, "the MySQL replica to stop after the accident's GTID")
    assert replica.query("SELECT COUNT(*) FROM mpitr.t WHERE id = 5000")[0][0] == 0


def test_a_mysql_replica_served_until_a_time_holds_before_the_accident(
        mysql_servers: tuple[MariaDB, MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # MySQL times a transaction by its immediate_commit_timestamp (microseconds).
    primary, replica = mysql_servers
    files, before = history_with_an_accident(primary, "mtime")
    relay = serving_an_import(relay_factory, primary, files, "binlog",
                              serve_until=before.time.isoformat())
    replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    wait_until(lambda: table_checksum(replica, "mtime.t") == before.checksum, 60,
               "the MySQL replica to apply everything before the time")
    # Held there: two more sends to it (heartbeats; MySQL counts them only in
    # performance_schema, which the test servers leave off, so the relay's /status says)
    def sent() -> int:
        return sum(c["bytes_sent"] for c in relay.status().get("clients", [])
                   if c.get("server_id") == 2)
    def more_than(seen: int) -> Callable[[], bool]:
        return lambda: sent() > seen
    for _ in range(2):
        wait_until(more_than(sent()), 30, "a heartbeat while it is held")
    st = replica.slave_status()
    assert st["Replica_IO_Running"] == "Yes" and not st["Last_IO_Errno"], st
    assert table_checksum(replica, "mtime.t") == before.checksum
