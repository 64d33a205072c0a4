"""Failover and relay chains in MySQL flavour (issue 32), against real MySQL 9.7 servers:

- failover from a killed MySQL primary A to its promoted replica B (SOURCE_AUTO_POSITION,
  log_replica_updates on as MySQL's default): the relay moves to B, resumes by its GTID
  set and ends holding B's gtid_executed, every transaction once; a MySQL replica behind
  the relay follows across the failover;
- the same under write load, and with B behind the relay when A dies (the divergence
  policy: "stop" names what B lacks, "wait" resumes once B took it from the relay);
- relay -> relay: a relay whose upstream is another relay holds the same GTID set, and a
  MySQL replica behind the second relay converges to the primary, also after a kill -9
  of either relay under load.

The servers come from a Debian root (scripts/build-roots); without one the module is
skipped, and under CI it fails instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from relay.binlog.gtid import GtidSet, MysqlGtid
from relay.config import Source
from relay.testing.builds import ServerBuild
from relay.testing.certs import Certs
from relay.testing.mariadb import MariaDB, free_port
from relay.upstream.runner import Divergence, DivergenceKind, check_continues, missing_from
from tests.conftest import RelayProcess, required_build, wait_until
from tests.integration.common import listening
from tests.integration.test_mysql import (
    checksums,
    mixed_workload,
    mysqlbinlog_rows,
    replica_has_all,
    serving_relay,
    source_url,
    tls_toml,
)

pytestmark = pytest.mark.integration

# Fast detection and failover, as the MariaDB failover tests use.
FAST = {"heartbeat_period": "1s", "read_timeout": "3s", "connect_timeout": "2s",
        "failover_after": "1s", "retry_initial": "0.1s", "retry_max": "0.5s"}


def _mysql() -> ServerBuild:
    return required_build("mysql-9.7")


@pytest.fixture
def mysql_factory(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[..., MariaDB]]:
    """Starts MySQL 9.7 servers, each cleaned up after the test."""
    made: list[MariaDB] = []

    def make(server_id: int, **options: str) -> MariaDB:
        server = MariaDB(build=_mysql(), server_id=server_id, options=dict(options),
                         base_dir=str(tmp_path_factory.mktemp(f"mysql-{server_id}")))
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.cleanup()


def gtid_set(text: str) -> GtidSet:
    return GtidSet.parse(text)


def relay_set(relay: RelayProcess) -> GtidSet | None:
    """The relay's GTID set as /status shows it (None while it is not answering)."""
    pos = relay.status().get("relay_log", {}).get("gtid_pos")
    return None if pos is None else gtid_set(str(pos))


def holds(relay: RelayProcess, server: MariaDB) -> Callable[[], bool]:
    return lambda: relay_set(relay) == gtid_set(server.gtid_binlog_pos())


def applied(replica: MariaDB, wanted: GtidSet) -> bool:
    """The replica holds every transaction of `wanted` (and its applier has not
    stopped)."""
    status = replica.slave_status()
    assert not status.get("Last_SQL_Errno"), status.get("Last_SQL_Error")
    return gtid_set(replica.gtid_binlog_pos()).covers(wanted)


def upstream(relay: RelayProcess) -> dict[str, Any]:
    return dict(relay.status().get("upstream", {}))


def gtid_lines(rows: list[str]) -> list[str]:
    return [line for line in rows if line.startswith("SET @@SESSION.GTID_NEXT")]


def once_each(rows: list[str]) -> GtidSet:
    """The GTIDs of mysqlbinlog's output, which must each come once: as a set."""
    gtids = [line.split("'")[1] for line in gtid_lines(rows)]
    assert len(gtids) == len(set(gtids)), "a transaction twice"
    out = GtidSet()
    out.update_all(MysqlGtid.parse(g) for g in gtids)
    return out


def create_tables(server: MariaDB, db: str) -> None:
    server.execute_many([
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40), j JSON, d DECIMAL(12,2), "
        f"ts DATETIME(3), vec VECTOR(2))"])


def test_failover_from_a_killed_mysql_primary_to_its_promoted_replica(
        mysql_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    a = mysql_factory(1)
    b = mysql_factory(2)
    # B: a MySQL replica of A by auto-position (log_replica_updates is on by default),
    # read-only as a standby is.
    assert str(b.query("SELECT @@log_replica_updates")[0][0]) == "1"
    b.execute_many(["SET GLOBAL super_read_only = ON"])
    a.execute_many([f"GRANT REFERENCES ON *.* TO '{a.repl_user}'@'%'"])
    b.replicate_from("127.0.0.1", a.port, user=a.repl_user, password=a.repl_password)
    db = "fo"
    create_tables(a, db)
    mixed_workload(a, db, 0, 20)
    relay = serving_relay(relay_factory, a, upstream={
        "sources": [source_url(a), source_url(b)], **FAST})
    replica = mysql_factory(3)
    replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    mixed_workload(a, db, 100, 20)
    wait_until(holds(relay, a), 60, "the relay to hold A's transactions")
    wait_until(replica_has_all(b, a), 60, "B to hold A's transactions")
    wait_until(replica_has_all(replica, a), 60, "the replica to hold A's transactions")
    up = upstream(relay)
    assert up["source"] == f"127.0.0.1:{a.port}" and up["failovers"] == 0, up
    before = gtid_set(a.gtid_binlog_pos())

    a.kill()   # kill -9: the link resets
    wait_until(lambda: upstream(relay).get("source") == f"127.0.0.1:{b.port}"
               and upstream(relay).get("connected") is True, 30,
               "the relay to stream from B")
    # B promoted: it stops replicating and takes writes (its own server_uuid's GTIDs).
    b.execute_many(["STOP REPLICA", "RESET REPLICA ALL",
                    "SET GLOBAL super_read_only = OFF", "SET GLOBAL read_only = OFF"])
    mixed_workload(b, db, 1000, 20)
    b.execute_many([f"ALTER TABLE {db}.t ADD COLUMN extra INT DEFAULT 7"])
    mixed_workload(b, db, 2000, 10)
    after = gtid_set(b.gtid_binlog_pos())
    assert after.covers(before) and after != before
    wait_until(holds(relay, b), 60, "the relay to hold B's gtid_executed")
    wait_until(replica_has_all(replica, b), 60, "the replica, through the relay, on B")
    assert checksums(replica, [f"{db}.t"]) == checksums(b, [f"{db}.t"])

    up = upstream(relay)
    assert up["source"] == f"127.0.0.1:{b.port}" and up["connected"] is True, up
    assert up["failovers"] == 1, up
    assert str(up["last_failover"]).startswith(f"to repl@127.0.0.1:{b.port}:"), up
    assert up["streams"] >= 2, up   # one on A, then one on B
    assert not up.get("stopped") and not up.get("waiting_for_source"), up
    assert relay.status()["relay_log"]["flavour"] == "mysql"

    # Every transaction exactly once, as MySQL's mysqlbinlog reads the relay's segments:
    # A's history, then B's own, as B's binlog has them.
    assert relay.stop() == 0
    ours = mysqlbinlog_rows(_mysql(), relay.segments())
    theirs = mysqlbinlog_rows(_mysql(), [b.binlog_path(n) for n in b.binlog_files()])
    assert once_each(ours) == gtid_set(b.gtid_binlog_pos())
    assert len(gtid_lines(ours)) > 80
    assert ours == theirs


def test_failover_under_load(mysql_factory: Callable[..., MariaDB],
                             relay_factory: Callable[..., RelayProcess]) -> None:
    """A is killed -9 while it takes writes (small transactions and 2 MiB ones, so the
    kill may land inside one the relay is receiving): whichever of B and the relay got
    further, B takes what it lacks from the relay, is promoted, and the relay, B and a
    replica behind the relay end with the same transactions, each once."""
    a = mysql_factory(1)
    b = mysql_factory(2)
    a.execute_many([f"GRANT REFERENCES ON *.* TO '{a.repl_user}'@'%'"])
    b.replicate_from("127.0.0.1", a.port, user=a.repl_user, password=a.repl_password)
    db = "underload"
    a.execute_many([f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v LONGTEXT)"])
    relay = serving_relay(relay_factory, a, upstream={
        "sources": [source_url(a), source_url(b)], "on_divergence": "wait", **FAST})
    replica = mysql_factory(3)
    replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    written: list[int] = []

    def write() -> None:
        conn = a.root()
        try:
            with conn.cursor() as cur:
                for i in range(100000):
                    size = 2 << 20 if i % 10 == 9 else 10
                    cur.execute(f"INSERT INTO {db}.t VALUES ({i}, REPEAT('x', {size}))")
                    written.append(i)
        except pymysql.err.Error:   # A killed under the writer: its last statement fails
            pass
        finally:
            conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    wait_until(lambda: len(written) >= 60, 60, "writes on A")
    a.kill()
    writer.join(30)
    # B takes what it lacks from the relay (a no-op when it has everything), then is
    # promoted; the relay, waiting or not, ends up streaming from B.
    b.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")

    def b_has_the_relays() -> bool:
        ours = relay_set(relay)
        return ours is not None and applied(b, ours) and \
            upstream(relay).get("source") == f"127.0.0.1:{b.port}"
    wait_until(b_has_the_relays, 30, "B to hold every transaction the relay holds")
    b.execute_many(["STOP REPLICA", "RESET REPLICA ALL"])
    b.execute_many([f"INSERT INTO {db}.t VALUES ({200000 + i}, 'on B')" for i in range(10)])
    wait_until(holds(relay, b), 60, "the relay to hold B's gtid_executed")
    wait_until(replica_has_all(replica, b), 60, "the replica, through the relay, on B")
    assert checksums(replica, [f"{db}.t"]) == checksums(b, [f"{db}.t"])
    up = upstream(relay)
    assert up["connected"] is True and up["failovers"] >= 1, up
    assert not up.get("stopped") and not up.get("waiting_for_source"), up
    assert relay.stop() == 0
    ours = mysqlbinlog_rows(_mysql(), relay.segments())
    assert once_each(ours) == gtid_set(b.gtid_binlog_pos())
    assert len(gtid_lines(ours)) > 60
    theirs = mysqlbinlog_rows(_mysql(), [b.binlog_path(n) for n in b.binlog_files()])
    assert sorted(gtid_lines(theirs)) == sorted(gtid_lines(ours))


def test_a_mysql_replica_behind_a_relay_behind_a_relay(
        mysql_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess], tmp_path: Path) -> None:
    primary = mysql_factory(1)
    primary.execute_many([f"GRANT REFERENCES ON *.* TO '{primary.repl_user}'@'%'"])
    db = "chain"
    create_tables(primary, db)
    mixed_workload(primary, db, 0, 20)
    certs = Certs(str(tmp_path), "relay")
    first = serving_relay(relay_factory, primary, tls_toml(certs))
    wait_until(holds(first, primary), 60, "the first relay to hold the primary's set")
    # The second relay's upstream is the first relay, named as a MySQL primary is: the
    # replication user (caching_sha2_password, the MySQL-flavour default) over verified
    # TLS.
    second = relay_factory(
        f"mysql://repl:relaypass@127.0.0.1:{first.port}"
        f"?ssl-mode=VERIFY_IDENTITY&ssl-ca={certs.ca}",
        relay={"server_id": 4243},
        upstream=FAST,
        downstream={"listen": f"127.0.0.1:{free_port()}", "write_timeout": "5s",
                    "catchup_wait": "10s"},
        users={"repl": "relaypass"}).start()
    wait_until(lambda: listening(second.port), 30, "the second relay to listen")
    wait_until(holds(second, primary), 60, "the second relay to hold the primary's set")
    replica = mysql_factory(3)
    replica.replicate_from("127.0.0.1", second.port, user="repl", password="relaypass")
    wait_until(replica_has_all(replica, primary), 60, "the replica to catch up")
    # Live: more rows, DDL, a compressed and a tagged transaction flow down the chain;
    # under load the first relay is killed -9 and restarted (the second resumes from it
    # by its GTID set), then the second one (the replica resumes from it by its own).
    primary.execute_many([f"ALTER TABLE {db}.t ADD COLUMN extra INT DEFAULT 7"])
    writer = threading.Thread(target=mixed_workload, args=(primary, db, 1000, 60))
    writer.start()
    first.kill9()
    first.start()
    writer.join()
    wait_until(holds(second, primary), 60, "the second relay to resume from the first")
    writer = threading.Thread(target=mixed_workload, args=(primary, db, 2000, 60))
    writer.start()
    second.kill9()
    second.start()
    writer.join()
    wait_until(holds(first, primary), 60, "the first relay to follow")
    wait_until(holds(second, primary), 60, "the second relay to follow")
    wait_until(replica_has_all(replica, primary), 60, "the replica to follow")
    assert checksums(replica, [f"{db}.t"]) == checksums(primary, [f"{db}.t"])
    assert relay_set(second) == relay_set(first) == gtid_set(primary.gtid_binlog_pos())
    status: dict[str, Any] = second.status()
    assert status["relay_log"]["flavour"] == "mysql"
    assert status["upstream"]["source"] == f"127.0.0.1:{first.port}"
    assert status["upstream"]["connected"] is True and status["upstream"]["streams"] >= 1
    assert any(c.get("server_id") == replica.server_id for c in status["clients"])
    assert any(c.get("server_id") == 4243 and c["tls"] for c in first.status()["clients"])
    # Both relays' segments hold the primary's transactions, each once.
    primary_rows = mysqlbinlog_rows(
        _mysql(), [primary.binlog_path(n) for n in primary.binlog_files()])
    assert once_each(primary_rows) == gtid_set(primary.gtid_binlog_pos())
    assert len(gtid_lines(primary_rows)) > 80
    for relay in (first, second):
        assert mysqlbinlog_rows(_mysql(), relay.segments()) == primary_rows


@pytest.mark.parametrize("policy", ["stop", "wait"])
def test_a_promoted_replica_behind_the_relay(
        mysql_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess], policy: str) -> None:
    """B stopped replicating before A died, so the relay holds transactions of A that B
    lacks: the divergence policy decides. "stop": the upstream stops naming them, and
    the relay keeps what it has. "wait": the relay waits; B takes what it lacks from the
    relay itself (by auto-position), is promoted, and the relay resumes on it."""
    a = mysql_factory(1)
    b = mysql_factory(2)
    a.execute_many([f"GRANT REFERENCES ON *.* TO '{a.repl_user}'@'%'"])
    b.replicate_from("127.0.0.1", a.port, user=a.repl_user, password=a.repl_password)
    db = "behind"
    create_tables(a, db)
    mixed_workload(a, db, 0, 10)
    relay = serving_relay(relay_factory, a, upstream={
        "sources": [source_url(a), source_url(b)], "on_divergence": policy, **FAST})
    wait_until(replica_has_all(b, a), 60, "B to hold A's transactions")
    b.execute_many(["STOP REPLICA"])   # B falls behind
    b_had = gtid_set(b.gtid_binlog_pos())
    a.execute_many([f"INSERT INTO {db}.t (id, v) VALUES ({i}, 'late')" for i in range(500, 503)])
    target = gtid_set(a.gtid_binlog_pos())
    wait_until(holds(relay, a), 60, "the relay to hold A's last writes")
    a.kill()
    # The three transactions only A and the relay hold.
    (sid, _), intervals = next(iter(target.intervals()))
    last = intervals[-1][1]
    missing = f"{sid}:{last - 2}-{last}"
    assert not b_had.covers(gtid_set(missing))
    if policy == "stop":
        wait_until(lambda: bool(upstream(relay).get("stopped")), 30, "the upstream to stop")
        stopped = str(upstream(relay)["stopped"])
        assert f"127.0.0.1:{b.port}" in stopped and missing in stopped, stopped
        assert relay.http("/readyz")[0] == 503
        assert relay_set(relay) == target   # nothing skipped, nothing of B's taken
        return
    wait_until(lambda: bool(upstream(relay).get("waiting_for_source")), 30,
               "the relay to wait for B")
    assert missing in str(upstream(relay)["waiting_for_source"])
    # B takes what it lacks from the relay (A is gone for good), then is promoted.
    b.execute_many(["RESET REPLICA ALL"])
    b.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    wait_until(lambda: applied(b, target), 60, "B to catch up from the relay")
    b.execute_many(["STOP REPLICA", "RESET REPLICA ALL"])
    wait_until(lambda: upstream(relay).get("connected") is True
               and upstream(relay).get("source") == f"127.0.0.1:{b.port}"
               and not upstream(relay).get("waiting_for_source"), 30,
               "the relay to resume on B")
    mixed_workload(b, db, 1000, 10)
    wait_until(holds(relay, b), 60, "the relay to hold B's gtid_executed")
    replica = mysql_factory(3)
    replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    wait_until(replica_has_all(replica, b), 60, "a replica behind the relay")
    assert checksums(replica, [f"{db}.t"]) == checksums(b, [f"{db}.t"])
    assert not upstream(relay).get("stopped")
    assert relay.stop() == 0
    held = once_each(mysqlbinlog_rows(_mysql(), relay.segments()))
    assert held == gtid_set(b.gtid_binlog_pos()) and held.covers(target)


def test_the_missing_transactions_are_named() -> None:
    """What a source lacks of the relay's MySQL GTID set is named as a set (what the
    stop and wait messages above show), tags and other sources included."""
    u, v = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "4e11fa47-71ca-11e1-9e33-c80aa9429562"
    ours = gtid_set(f"{u}:1-12:x:1-3,{v}:1-2")
    assert str(missing_from(gtid_set(f"{u}:3-5:8-9:x:2"), ours)) == \
        f"{u}:1-2:6-7:10-12:x:1:3,{v}:1-2"
    assert not len(missing_from(gtid_set(f"{u}:1-20:x:1-3,{v}:1-2"), ours))
    source = Source.parse("mysql://repl:pw@127.0.0.1:3307")
    with pytest.raises(Divergence) as err:
        check_continues(source, ours, gtid_set(f"{u}:1-12:x:1-3"))
    assert err.value.kind is DivergenceKind.BEHIND
    assert f"lacks transactions the relay already holds: {v}:1-2 (" in str(err.value)
    check_continues(source, ours, gtid_set(f"{u}:1-13:x:1-3,{v}:1-2:y:1"))
