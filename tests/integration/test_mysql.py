"""The relay follows a real MySQL 9.7 primary (issue 32): by GTID set, with heartbeats,
resuming after a restart and a kill -9 with nothing lost or repeated; its segments are
binlog files MySQL's own mysqlbinlog 9.7 reads, with the primary's transactions.

The server comes from a Debian root (scripts/build-roots; relay/testing/builds.py); without
one the module is skipped, and under CI it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest

from relay.binlog.gtid import GtidSet, MysqlGtid
from relay.testing.builds import ServerBuild
from relay.testing.certs import Certs
from relay.testing.mariadb import MariaDB, free_port
from relay.wire.handshake import Greeting, parse_greeting
from relay.wire.packets import PacketReader
from tests.conftest import RelayProcess, required_build, wait_until
from tests.integration.common import listening

pytestmark = pytest.mark.integration


def _mysql() -> ServerBuild:
    return required_build("mysql-9.7")


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("mysql-primary")))
    server.start()
    server.execute_many([f"GRANT REFERENCES ON *.* TO '{server.repl_user}'@'%'"])
    yield server
    server.cleanup()


def source_url(server: MariaDB) -> str:
    # caching_sha2_password's full authentication over plain text takes the server's key
    return f"{server.url}?get-server-public-key=true"


def relay_state(relay: RelayProcess) -> str:
    return str(relay.status().get("relay_log", {}).get("gtid_pos", ""))


def caught_up(relay: RelayProcess, primary: MariaDB) -> Callable[[], bool]:
    return lambda: relay_state(relay) == primary.gtid_binlog_pos()


def workload(primary: MariaDB, rounds: int, start: int = 0) -> None:
    statements = []
    for i in range(start, start + rounds):
        statements += [f"INSERT INTO app.t VALUES ({i}, 'v{i}', '{{\"n\": {i}}}')",
                       f"UPDATE app.t SET v = 'u{i}' WHERE id = {i}"]
        if i % 5 == 0:
            statements.append(f"DELETE FROM app.t WHERE id = {i}")
    primary.execute_many(statements)


def mysqlbinlog_rows(build_: ServerBuild, paths: list[str]) -> list[str]:
    """The transactions of binlog files as MySQL's mysqlbinlog decodes them: each GTID and
    each row change (positions, timestamps and server ids left out)."""
    stage = build_.host_path("/srv/relay-tests/mysqlbinlog")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    inside = []
    for i, path in enumerate(paths):
        shutil.copy(path, os.path.join(stage, f"{i:03d}.bin"))
        inside.append(f"/srv/relay-tests/mysqlbinlog/{i:03d}.bin")
    out = subprocess.run(build_.command(build_.tool("mysqlbinlog"), "-v",
                                        "--base64-output=decode-rows",
                                        "--verify-binlog-checksum", *inside),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    keep = re.compile(r"^(SET @@SESSION.GTID_NEXT= '[^A]|### )")
    return [line for line in out.stdout.splitlines() if keep.match(line)]


def test_the_relay_mirrors_a_mysql_primary_and_resumes_by_gtid_set(
        primary: MariaDB, relay_factory: Callable[..., RelayProcess]) -> None:
    primary.execute_many(["CREATE DATABASE app",
                          "CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(40), j JSON)"])
    workload(primary, 20)
    relay = relay_factory(source_url(primary),
                          upstream={"heartbeat_period": "1s", "read_timeout": "4s"})
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    status = relay.status()
    assert status["upstream"]["primary_version"].startswith("9.7")
    # Idle past read_timeout: the primary's heartbeats keep the one connection alive.
    wait_until(lambda: relay.status()["upstream"]["reconnects"] == 0 and
               float(relay.status()["upstream"]["active_since"]) < _now() - 6, 30,
               "six idle seconds on one connection")
    assert relay.status()["upstream"]["reconnects"] == 0
    # A restart resumes by the relay's own GTID set; a kill -9 too.
    relay.stop()
    workload(primary, 10, 100)
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to resume after a restart")
    workload(primary, 200, 200)
    # Tagged GTIDs (8.3+) and compressed transactions (TRANSACTION_PAYLOAD) among them.
    tagged = primary.root()
    try:
        with tagged.cursor() as cur:
            cur.execute("SET SESSION binlog_transaction_compression = ON")
            cur.execute("INSERT INTO app.t VALUES (5000, 'compressed', NULL)")
            cur.execute("SET gtid_next = 'AUTOMATIC:nightly'")
            cur.execute("INSERT INTO app.t VALUES (5001, 'tagged', NULL)")
            cur.execute("SET gtid_next = 'AUTOMATIC'")
            cur.execute("SET SESSION binlog_transaction_compression = OFF")
    finally:
        tagged.close()
    wait_until(caught_up(relay, primary), 60, "the relay to hold tagged and compressed ones")
    relay.kill9()
    workload(primary, 10, 1000)
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to resume after kill -9")
    # Every transaction once, as MySQL's mysqlbinlog reads the primary's files.
    segments = relay.segments()
    primary_files = [primary.binlog_path(n) for n in primary.binlog_files()]
    ours = mysqlbinlog_rows(primary.build, segments)   # type: ignore[arg-type]
    theirs = mysqlbinlog_rows(primary.build, primary_files)   # type: ignore[arg-type]
    assert ours == theirs
    gtids = [line for line in ours if line.startswith("SET @@SESSION.GTID_NEXT")]
    assert len(gtids) == len(set(gtids)) > 200


def _now() -> float:
    import time

    return time.time()


def test_status_names_the_flavour(primary: MariaDB,
                                  relay_factory: Callable[..., RelayProcess]) -> None:
    relay = relay_factory(source_url(primary))
    relay.start()
    # (connected comes first; the first transaction is in the log a moment later)
    wait_until(lambda: bool(relay.status().get("upstream", {}).get("connected"))
               and bool(relay.status()["relay_log"]["gtid_pos"]), 60,
               "the relay to follow its primary")
    status: dict[str, Any] = relay.status()
    assert status["relay_log"]["flavour"] == "mysql"
    assert ":" in status["relay_log"]["gtid_pos"]   # a MySQL GTID set


# --- MySQL replicas of the relay --------------------------------------------------------

@pytest.fixture
def mysql_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(build=_mysql(), server_id=2,
                     base_dir=str(tmp_path_factory.mktemp("mysql-replica")))
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(str(tmp_path_factory.mktemp("certs")), "relay")


def tls_toml(certs: Certs) -> str:
    return f'[downstream.tls]\ncert = "{certs.cert}"\nkey = "{certs.key}"\n'


def serving_relay(relay_factory: Callable[..., RelayProcess], primary: MariaDB,
                  extra_toml: str = "", **sections: dict[str, object]) -> RelayProcess:
    settings: dict[str, dict[str, object]] = {
        "downstream": {"listen": f"127.0.0.1:{free_port()}", "write_timeout": "5s",
                       "catchup_wait": "10s"},
        "users": {"repl": "relaypass"}}
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    relay = relay_factory(source_url(primary), extra_toml, **settings).start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    return relay


def executed_of(server: MariaDB, sources: GtidSet) -> GtidSet:
    """A server's executed transactions of the sources in `sources` (a replica also has
    transactions of its own)."""
    mine = GtidSet()
    for (sid, tag), intervals in GtidSet.parse(server.gtid_binlog_pos()).intervals():
        if any(sid == other for (other, _), _ in sources.intervals()):
            for start, end in intervals:
                mine.add_interval(sid, start, end, tag)
    return mine


def replica_has_all(replica: MariaDB, primary: MariaDB) -> Callable[[], bool]:
    def check() -> bool:
        status = replica.slave_status()
        # (a reconnect in progress shows its error while the IO thread still runs)
        if status.get("Last_SQL_Errno") or (status.get("Last_IO_Errno") and
                                            status.get("Replica_IO_Running") == "No"):
            raise AssertionError(f"the replica stopped: {status.get('Last_IO_Error')} "
                                 f"{status.get('Last_SQL_Error')}")
        wanted = GtidSet.parse(primary.gtid_binlog_pos())
        return executed_of(replica, wanted) == wanted
    return check


def checksums(server: MariaDB, tables: list[str]) -> list[object]:
    return [server.query(f"CHECKSUM TABLE {t}")[0][1] for t in tables]


def mixed_workload(primary: MariaDB, db: str, start: int, rounds: int) -> None:
    """Rows of many types, DDL, a compressed and a tagged transaction."""
    statements = []
    for i in range(start, start + rounds):
        statements += [
            f"INSERT INTO {db}.t (id, v, j, d, ts, vec) VALUES ({i}, 'v{i}', '{{\"n\": {i}}}', {i}.25, "
            f"'2026-12-06 10:00:{i % 60:02d}.123', STRING_TO_VECTOR('[{i}, 0.5]'))",
            f"UPDATE {db}.t SET v = 'u{i}', j = JSON_SET(j, '$.m', {i}) WHERE id = {i}"]
        if i % 7 == 0:
            statements.append(f"DELETE FROM {db}.t WHERE id = {i}")
    primary.execute_many(statements)
    conn = primary.root()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION binlog_transaction_compression = ON")
            cur.execute(f"UPDATE {db}.t SET v = CONCAT(v, '+') WHERE id % 3 = 0")
            cur.execute("SET SESSION binlog_transaction_compression = OFF")
            cur.execute("SET gtid_next = 'AUTOMATIC:batch'")
            cur.execute(f"INSERT INTO {db}.t (id, v) VALUES ({start + 100000}, 'tagged')")
            cur.execute("SET gtid_next = 'AUTOMATIC'")
    finally:
        conn.close()


def test_a_mysql_replica_follows_the_relay_by_auto_position(
        primary: MariaDB, mysql_replica: MariaDB, certs: Certs,
        relay_factory: Callable[..., RelayProcess]) -> None:
    db = "autopos"
    primary.execute_many([
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40), j JSON, d DECIMAL(12,2), "
        f"ts DATETIME(3), vec VECTOR(2))",
        f"CREATE TABLE {db}.big (id INT PRIMARY KEY, b LONGBLOB)"])
    mixed_workload(primary, db, 0, 30)
    relay = serving_relay(relay_factory, primary, tls_toml(certs))
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    # MySQL 9.7's replicas apply in parallel by default (four workers, commit order kept).
    assert mysql_replica.query("SELECT @@replica_parallel_workers, "
                               "@@replica_preserve_commit_order")[0] == (4, 1)
    mysql_replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass",
                                 ssl_ca=certs.ca)
    wait_until(replica_has_all(mysql_replica, primary), 90, "the replica to catch up")
    # A transaction over 16 MiB (an event split over packets), DDL, more rows.
    primary.execute_many([f"INSERT INTO {db}.big VALUES (1, REPEAT('x', 17 << 20))",
                          f"ALTER TABLE {db}.t ADD COLUMN extra INT DEFAULT 7"])
    mixed_workload(primary, db, 1000, 30)
    wait_until(replica_has_all(mysql_replica, primary), 90, "the replica to follow")
    tables = [f"{db}.t", f"{db}.big"]
    assert checksums(mysql_replica, tables) == checksums(primary, tables)
    status: dict[str, Any] = relay.status()
    assert any(c.get("server_id") == mysql_replica.server_id
               and c["tls"] for c in status["clients"])
    # kill -9 of the relay under load: the replica reconnects by its GTID set and ends
    # with every transaction exactly once.
    writer = threading.Thread(target=mixed_workload, args=(primary, db, 2000, 200))
    writer.start()
    relay.kill9()
    relay.start()
    writer.join()
    wait_until(replica_has_all(mysql_replica, primary), 120, "the replica to resume")
    assert checksums(mysql_replica, tables) == checksums(primary, tables)
    assert mysql_replica.slave_status()["Replica_IO_Running"] == "Yes"


def test_a_semi_sync_mysql_replica_behind_a_semi_sync_relay(
        mysql_replica: MariaDB, relay_factory: Callable[..., RelayProcess],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """MySQL's own semi-sync plugins on both ends: the primary waits for the relay, and
    the relay acknowledges a transaction only once the MySQL replica has."""
    primary = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("semi-primary")),
                      options={"plugin_load_add": "semisync_source.so",
                               "rpl_semi_sync_source_enabled": "ON",
                               "rpl_semi_sync_source_timeout": "20000",
                               # (the set-up commits before the relay is there go on)
                               "rpl_semi_sync_source_wait_no_replica": "OFF"})
    primary.start()
    try:
        primary.execute_many([
            f"GRANT REFERENCES ON *.* TO '{primary.repl_user}'@'%'",
            "CREATE DATABASE semi", "CREATE TABLE semi.t (id INT PRIMARY KEY, v INT)"])
        relay = serving_relay(relay_factory, primary,
                              upstream={"semi_sync": True, "semi_sync_wait_for_replicas": 1},
                              downstream={"semi_sync": True})
        wait_until(lambda: status_of(primary, "Rpl_semi_sync_source_clients") == "1", 30,
                   "the relay to register as a semi-sync replica")
        mysql_replica.execute_many([
            "INSTALL PLUGIN rpl_semi_sync_replica SONAME 'semisync_replica.so'",
            "SET GLOBAL rpl_semi_sync_replica_enabled = ON"])
        mysql_replica.replicate_from("127.0.0.1", relay.port, user="repl",
                                     password="relaypass")
        wait_until(lambda: status_of(mysql_replica, "Rpl_semi_sync_replica_status") == "ON",
                   30, "the replica's semi-sync to be on")
        wait_until(lambda: status_of(relay_sql(relay), "Rpl_semi_sync_source_clients") == "1",
                   30, "the relay to count its semi-sync replica")
        yes_before = int(status_of(primary, "Rpl_semi_sync_source_yes_tx"))
        no_before = status_of(primary, "Rpl_semi_sync_source_no_tx")
        for i in range(40):
            primary.execute_many([f"INSERT INTO semi.t VALUES ({i}, {i})"])
        # Every commit waited for the relay, which waited for the replica: none timed out.
        assert int(status_of(primary, "Rpl_semi_sync_source_yes_tx")) - yes_before == 40
        assert status_of(primary, "Rpl_semi_sync_source_no_tx") == no_before
        assert int(status_of(relay_sql(relay), "Rpl_semi_sync_source_yes_tx")) >= 40
        wait_until(replica_has_all(mysql_replica, primary), 60, "the replica to apply")
        assert checksums(mysql_replica, ["semi.t"]) == checksums(primary, ["semi.t"])
    finally:
        primary.cleanup()


def status_of(server: MariaDB | Callable[[str], list[tuple[object, ...]]], name: str) -> str:
    query = server.query if isinstance(server, MariaDB) else server
    rows = query(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return str(rows[0][1]) if rows else ""


def relay_sql(relay: RelayProcess) -> Callable[[str], list[tuple[object, ...]]]:
    def query(sql: str) -> list[tuple[object, ...]]:
        conn = pymysql.connect(host="127.0.0.1", port=relay.port, user="repl",
                               password="relaypass", connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()
    return query


def remote_rows(build_: ServerBuild, port: int, user: str, password: str, first: str,
                *options: str) -> list[str]:
    """MySQL's mysqlbinlog reading a server (or the relay) as a replica does
    (--read-from-remote-source=BINLOG-DUMP-GTIDS): each GTID and row change it prints."""
    out = subprocess.run(build_.command(
        build_.tool("mysqlbinlog"), "--read-from-remote-source=BINLOG-DUMP-GTIDS",
        "--host=127.0.0.1", f"--port={port}", f"--user={user}", f"--password={password}",
        "--get-server-public-key", "-v", "--base64-output=decode-rows", *options, first),
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    keep = re.compile(r"^(SET @@SESSION.GTID_NEXT= '[^A]|### )")
    return [line for line in out.stdout.splitlines() if keep.match(line)]


@pytest.fixture
def own_primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """A primary of the test's own (python-mysql-replication 1.0.x reads neither tagged
    GTID sets nor MySQL 9's VECTOR table maps, which the module's primary has)."""
    server = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("own-primary")))
    server.start()
    server.execute_many([f"GRANT REFERENCES ON *.* TO '{server.repl_user}'@'%'"])
    yield server
    server.cleanup()


def test_mysql_clients_read_the_relay_as_they_read_the_primary(
        own_primary: MariaDB, relay_factory: Callable[..., RelayProcess]) -> None:
    """MySQL's mysqlbinlog (by GTID, with --exclude-gtids and --raw) and
    python-mysql-replication in MySQL mode get the primary's transactions from the relay."""
    primary = own_primary
    primary.execute_many(["CREATE DATABASE tools",
                          "CREATE TABLE tools.t (id INT PRIMARY KEY, v VARCHAR(40))"])
    primary.execute_many([f"INSERT INTO tools.t VALUES ({i}, 'v{i}')" for i in range(40)])
    primary.execute_many(["FLUSH BINARY LOGS"])   # a second file (and segment)
    primary.execute_many([f"INSERT INTO tools.t VALUES ({i}, 'v{i}')" for i in range(40, 60)])
    relay = serving_relay(relay_factory, primary)
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    b = primary.build
    assert b is not None
    first_file, first_segment = primary.binlog_files()[0], relay.segments()[0]
    theirs = remote_rows(b, primary.port, primary.repl_user, primary.repl_password,
                         first_file)
    ours = remote_rows(b, relay.port, "repl", "relaypass", os.path.basename(first_segment))
    assert ours == theirs and len(ours) > 80
    # --exclude-gtids: what the set names is not sent (COM_BINLOG_DUMP_GTID's set).
    executed = GtidSet.parse(primary.gtid_binlog_pos())
    (sid, _), intervals = next(iter(executed.intervals()))
    half = f"{sid}:1-{intervals[-1][1] // 2}"
    theirs = remote_rows(b, primary.port, primary.repl_user, primary.repl_password,
                         first_file, f"--exclude-gtids={half}")
    ours = remote_rows(b, relay.port, "repl", "relaypass", os.path.basename(first_segment),
                       f"--exclude-gtids={half}")
    assert ours == theirs and f"{sid}:1'" not in "".join(ours)
    # A file named with the set: the dump starts at that file, as on a MySQL primary.
    second_file, second_segment = primary.binlog_files()[1], relay.segments()[1]
    some = f"{sid}:1-{intervals[-1][1] - 10}"
    theirs = remote_rows(b, primary.port, primary.repl_user, primary.repl_password,
                         second_file, f"--exclude-gtids={some}")
    ours = remote_rows(b, relay.port, "repl", "relaypass", os.path.basename(second_segment),
                       f"--exclude-gtids={some}")
    assert ours == theirs and len([x for x in ours if x.startswith("SET")]) == 10
    # --raw: the files mysqlbinlog writes from the relay hold the primary's transactions.
    stage = b.host_path("/srv/relay-tests/raw-from-relay")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    out = subprocess.run(b.command(
        b.tool("mysqlbinlog"), "--read-from-remote-source=BINLOG-DUMP-GTIDS", "--raw",
        "--to-last-log", "--result-file=/srv/relay-tests/raw-from-relay/", "--host=127.0.0.1",
        f"--port={relay.port}", "--user=repl", "--password=relaypass",
        "--get-server-public-key", os.path.basename(first_segment)),
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    raw = sorted(os.path.join(stage, n) for n in os.listdir(stage))
    assert [os.path.basename(p) for p in raw] == \
        [os.path.basename(p) for p in relay.segments()]
    assert mysqlbinlog_rows(b, raw) == mysqlbinlog_rows(b, relay.segments())
    # --stop-never: it waits at the end, as on a primary, and prints what comes next.
    follow = subprocess.Popen(b.command(
        b.tool("mysqlbinlog"), "--read-from-remote-source=BINLOG-DUMP-GTIDS", "--stop-never",
        "--host=127.0.0.1", f"--port={relay.port}", "--user=repl", "--password=relaypass",
        "--get-server-public-key", "-v", "--base64-output=decode-rows",
        f"--exclude-gtids={primary.gtid_binlog_pos()}", os.path.basename(first_segment)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout or ()), daemon=True)
    reader.start()
    try:
        primary.execute_many(["INSERT INTO tools.t VALUES (777, 'after the end')"])
        wait_until(lambda: any("'after the end'" in line for line in list(seen)), 30,
                   "mysqlbinlog --stop-never to print the new row")
        assert follow.poll() is None   # still following
    finally:
        follow.kill()
        follow.wait(10)
        reader.join(10)
    # python-mysql-replication, MySQL mode, auto-positioned at the excluded half.
    known = GtidSet.parse(half)
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import GtidEvent

    def gtids(port: int, user: str, password: str) -> list[str]:
        stream = BinLogStreamReader(
            connection_settings={"host": "127.0.0.1", "port": port, "user": user,
                                 "password": password},
            server_id=4545, is_mariadb=False, blocking=False, auto_position=str(known),
            only_events=[GtidEvent])
        try:
            return [event.gtid for event in stream]
        finally:
            stream.close()

    from_primary = gtids(primary.port, primary.repl_user, primary.repl_password)
    assert gtids(relay.port, "repl", "relaypass") == from_primary
    assert len(from_primary) > 10 and not any(known.contains(MysqlGtid.parse(g))
                                              for g in from_primary)


def greeting_of(port: int) -> Greeting:
    """The first packet the relay's SQL port sends, decoded."""
    packets = PacketReader()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        while (payload := packets.next_payload()) is None:
            data = raw.recv(4096)
            assert data, "the relay closed the connection before its greeting"
            packets.feed(data)
    return parse_greeting(payload)


def test_a_mysql_replica_at_its_defaults_by_file_and_position(
        primary: MariaDB, mysql_replica: MariaDB,
        relay_factory: Callable[..., RelayProcess]) -> None:
    """A replica left at its TLS defaults (MySQL 9.7 asks for TLS and verifies nothing)
    and a relay at its own (no [downstream.tls]: a certificate made at start)."""
    primary.execute_many(["CREATE DATABASE filepos",
                          "CREATE TABLE filepos.t (id INT PRIMARY KEY, v VARCHAR(40))"])
    primary.execute_many([f"INSERT INTO filepos.t VALUES ({i}, 'v{i}')" for i in range(50)])
    relay = serving_relay(relay_factory, primary)
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    mysql_replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass",
                                 gtid=False)
    wait_until(replica_has_all(mysql_replica, primary), 60, "the replica to catch up")
    # Its IO thread stopped and started again resumes at its file and position.
    mysql_replica.execute_many(["STOP REPLICA IO_THREAD"])
    primary.execute_many([f"UPDATE filepos.t SET v = 'u{i}' WHERE id = {i}"
                          for i in range(50)])
    mysql_replica.execute_many(["START REPLICA IO_THREAD"])
    wait_until(replica_has_all(mysql_replica, primary), 60, "the replica to resume")
    assert checksums(mysql_replica, ["filepos.t"]) == checksums(primary, ["filepos.t"])
    status = mysql_replica.slave_status()
    assert status["Auto_Position"] == 0
    assert status["Source_Log_File"] == os.path.basename(relay.segments()[-1])
    assert any(c.get("server_id") == mysql_replica.server_id and c["tls"]
               for c in relay.status()["clients"])
    # A MySQL relay names caching_sha2_password first, as MySQL 8+ does, and the users
    # configured without a plugin (repl here) log in with it.
    assert greeting_of(relay.port).auth_plugin == "caching_sha2_password"


@pytest.mark.parametrize("rules", ["pass-through", "send-mask"])
def test_a_mysql_replica_is_told_where_the_transactions_it_holds_end(
        primary: MariaDB, mysql_replica: MariaDB,
        relay_factory: Callable[..., RelayProcess], rules: str) -> None:
    """A replica that already holds the log's last transaction (a DBA skipped it with an
    empty one) skips it when it resumes by auto-position, and the heartbeat MySQL sends
    after skipped transactions moves its Read_Source_Log_Pos past it, through send rules
    too. Without periodic heartbeats (period 0), nothing else would."""
    db = "skips_" + rules.replace("-", "_")
    primary.execute_many([f"CREATE DATABASE {db}",
                          f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40))"])
    masked = (f'[[rules]]\nname = "mask"\nat = "send"\n[[rules.mask]]\n'
              f'column = "{db}.t.v"\nwith = "null"\n') if rules == "send-mask" else ""
    relay = serving_relay(relay_factory, primary, masked)
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    mysql_replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass",
                                 heartbeat=0)
    wait_until(replica_has_all(mysql_replica, primary), 60, "the replica to catch up")
    mysql_replica.execute_many(["STOP REPLICA"])
    primary.execute_many([f"INSERT INTO {db}.t VALUES ({i}, 'v{i}')" for i in range(10)])
    last = GtidSet.parse(primary.gtid_binlog_pos())
    (source, _), intervals = next(iter(last.intervals()))
    mysql_replica.execute_many([f"SET gtid_next = '{source}:{intervals[-1][1]}'", "BEGIN",
                                "COMMIT", "SET gtid_next = 'AUTOMATIC'"])
    wait_until(caught_up(relay, primary), 60, "the relay to hold the new transactions")
    mysql_replica.execute_many(["START REPLICA"])
    wait_until(replica_has_all(mysql_replica, primary), 60, "the replica to resume")
    assert mysql_replica.query(f"SELECT COUNT(*) FROM {db}.t")[0][0] == 9  # one skipped
    if rules == "send-mask":
        assert mysql_replica.query(f"SELECT COUNT(v) FROM {db}.t")[0][0] == 0

    def told() -> bool:
        status, log = mysql_replica.slave_status(), relay.status()["relay_log"]
        return (status["Source_Log_File"], status["Read_Source_Log_Pos"]) == \
            (log["file"], log["position"])
    wait_until(told, 30, "the replica's position to move past the skipped transaction")


def test_relay_changes_decodes_partial_json_vector_and_compressed_rows(
        relay_factory: Callable[..., RelayProcess],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A primary with binlog_row_value_options=PARTIAL_JSON and MINIMAL row metadata: the
    row changes `relay changes` decodes from the relay log (partial JSON diffs applied,
    VECTOR values, rows inside compressed transactions) rebuild the table as SELECT
    gives it."""
    primary = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("partial")),
                      options={"binlog_row_value_options": "PARTIAL_JSON",
                               "binlog_row_metadata": "MINIMAL"})
    primary.start()
    try:
        primary.execute_many([
            f"GRANT REFERENCES ON *.* TO '{primary.repl_user}'@'%'",
            "CREATE DATABASE pj",
            "CREATE TABLE pj.t (id INT PRIMARY KEY, j JSON, vec VECTOR(3))"])
        statements = []
        for i in range(30):
            statements += [
                f"INSERT INTO pj.t VALUES ({i}, '{{\"a\": {i}, \"b\": [1, 2, 3], "
                f"\"c\": \"{'x' * 60}\"}}', STRING_TO_VECTOR('[{i}, 1.5, -2]'))",
                f"UPDATE pj.t SET j = JSON_SET(j, '$.a', {i * 10}, '$.b[1]', 'two') "
                f"WHERE id = {i}",
                f"UPDATE pj.t SET j = JSON_REMOVE(j, '$.c') WHERE id = {i} AND {i} % 2 = 0"]
        primary.execute_many(statements)
        conn = primary.root()
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION binlog_transaction_compression = ON")
                cur.execute("UPDATE pj.t SET j = JSON_REPLACE(j, '$.a', -1) WHERE id < 5")
                cur.execute("DELETE FROM pj.t WHERE id = 29")
        finally:
            conn.close()
        partial = primary.query("SHOW BINLOG EVENTS")
        assert any("Update_rows_partial" in str(row[2]) for row in partial)
        relay = relay_factory(source_url(primary))
        relay.start()
        wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's changes")
        out = subprocess.run(
            [sys.executable, "-m", "relay.cli", "changes", f"relay://{relay.data_dir}",
             "--table", "pj.t", "--types-from", source_url(primary)],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        general = subprocess.run(  # the line kernel's bytes are the general path's
            [sys.executable, "-m", "relay.cli", "changes", f"relay://{relay.data_dir}",
             "--table", "pj.t", "--types-from", source_url(primary)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "RELAY_LINE_KERNEL": "0"})
        assert general.returncode == 0 and general.stdout == out.stdout, general.stderr
        # MINIMAL metadata: the binlog names no columns, so the relay names them @1, @2...
        table: dict[int, tuple[object, object]] = {}
        for line in out.stdout.splitlines():
            change = json.loads(line)
            if change["op"] == "delete":
                table.pop(change["before"]["@1"])
            else:
                after = change["after"]
                table[after["@1"]] = (after["@2"], after["@3"])
        expected = {int(str(i)): (json.loads(str(j)), json.loads(str(v)))
                    for i, j, v in primary.query(
                        "SELECT id, j, VECTOR_TO_STRING(vec) FROM pj.t")}
        assert table == expected and len(table) == 29
    finally:
        primary.cleanup()
