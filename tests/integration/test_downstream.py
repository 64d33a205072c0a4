"""Real MariaDB replicas (and mysqlbinlog) replicate through the relay."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import time

import pymysql
import pytest

from relay.testing.mariadb import MariaDB, find_binary, free_port
from tests.conftest import (
    group_events,
    replicate_through,
    slave_status,
    wait_until,
)
from tests.integration import workload

pytestmark = pytest.mark.integration

TABLES = ("shop.items", "shop.log")


def start_relay(relay_factory, primary: MariaDB, **extra: dict[str, object]):  # type: ignore[no-untyped-def]
    settings: dict[str, dict[str, object]] = {
        "downstream": {"listen": f"127.0.0.1:{free_port()}", "write_timeout": "5s",
                       "handshake_timeout": "2s", "catchup_wait": "3s"},
        "users": {"repl": "relaypass"},
    }
    for k, v in extra.items():
        settings.setdefault(k, {}).update(v)
    relay = relay_factory(primary.url, **settings).start()

    def listening() -> bool:
        if relay.proc is not None and relay.proc.poll() is not None:
            raise AssertionError(f"the relay exited ({relay.proc.returncode}) before "
                                 f"listening:\n{relay.output()[-3000:]}")
        return _listening(relay.port)
    wait_until(listening, 30, "the relay to listen")
    return relay


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def converged(primary: MariaDB, replica: MariaDB) -> bool:
    st = slave_status(replica)
    assert st.get("Last_IO_Error") == "" and st.get("Last_SQL_Error") == "", st
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == primary.gtid_binlog_pos()


def assert_same_data(primary: MariaDB, replica: MariaDB) -> None:
    for table in TABLES:
        assert replica.query(f"CHECKSUM TABLE {table}")[0] == primary.query(
            f"CHECKSUM TABLE {table}")[0], table


def relay_client(port: int, password: str = "relaypass") -> pymysql.Connection:  # type: ignore[type-arg]
    return pymysql.connect(host="127.0.0.1", port=port, user="repl", password=password,
                           connect_timeout=5)


def test_gtid_and_file_position_replicas_converge(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    by_gtid = mariadb_factory(server_id=11, options={"gtid_strict_mode": "1"})
    by_pos = mariadb_factory(server_id=12)
    replicate_through(by_gtid, relay.port, gtid=True)
    replicate_through(by_pos, relay.port, gtid=False)
    workload.mixed(primary, rounds=2)
    workload.large(primary)  # a 100 MB transaction and a row event over 16 MiB
    for replica in (by_gtid, by_pos):
        wait_until(lambda r=replica: converged(primary, r), 120, "replica convergence")
        assert_same_data(primary, replica)
        assert replica.query("CHECKSUM TABLE big.t")[0] == primary.query(
            "CHECKSUM TABLE big.t")[0]
        st = slave_status(replica)
        assert st["Slave_IO_Running"] == "Yes" and st["Slave_SQL_Running"] == "Yes"
        assert str(st["Master_Log_File"]).startswith("relay-bin.")
    # The relay looks like a primary to an admin client.
    with relay_client(relay.port) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        assert cur.fetchone()[0] == primary.gtid_binlog_pos()
        cur.execute("SELECT @@version")
        assert "MariaDB" in cur.fetchone()[0]
        cur.execute("SHOW MASTER STATUS")
        name, pos = cur.fetchone()[:2]
        assert name == os.path.basename(relay.segments()[-1])
        assert int(pos) == os.path.getsize(relay.segments()[-1])
        cur.execute("SHOW BINARY LOGS")
        assert [r[0] for r in cur.fetchall()] == [os.path.basename(s) for s in relay.segments()]
        cur.execute("SHOW SLAVE HOSTS")
        assert sorted(int(r[0]) for r in cur.fetchall()) == [11, 12]
        cur.execute(f"SELECT BINLOG_GTID_POS('{name}', {pos})")
        assert cur.fetchone()[0] == primary.gtid_binlog_pos()
        with pytest.raises(pymysql.err.MySQLError) as info:
            cur.execute("DELETE FROM shop.items")
        assert info.value.args[0] == 1235 and "SHOW MASTER STATUS" in info.value.args[1]


@pytest.mark.parametrize("checksum", ["CRC32", "NONE"])
def test_mysqlbinlog_reads_from_the_relay(mariadb_factory, relay_factory, tmp_path,  # type: ignore[no-untyped-def]
                                          checksum: str) -> None:
    primary = mariadb_factory(options={"binlog_checksum": checksum})
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=2)
    from tests.integration.test_mirror import _caught_up

    wait_until(lambda: _caught_up(relay, primary), 60, "relay catch-up")
    out = str(tmp_path) + "/"
    res = subprocess.run(
        [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server", "--raw",
         "--to-last-log", "--host=127.0.0.1", f"--port={relay.port}", "--user=repl",
         "--password=relaypass", f"--result-file={out}", "relay-bin.000001"],
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    fetched = sorted(os.path.join(out, f) for f in os.listdir(out))
    assert [os.path.basename(f) for f in fetched] == [os.path.basename(s)
                                                      for s in relay.segments()]
    assert group_events(fetched) == group_events(relay.segments())
    if checksum == "CRC32":  # a checksum-aware client gets the stored bytes, CRCs and all
        with open(fetched[0], "rb") as f, open(relay.segments()[0], "rb") as g:
            assert f.read() == g.read()
    # And by GTID with --start-position as a GTID list, text output.
    res = subprocess.run(
        [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
         "--host=127.0.0.1", f"--port={relay.port}", "--user=repl", "--password=relaypass",
         "--to-last-log", "relay-bin.000001"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "CREATE TABLE" in res.stdout and "COMMIT" in res.stdout


def test_replica_stop_start_and_relay_restart(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    a = mariadb_factory(server_id=21)
    b = mariadb_factory(server_id=22)
    replicate_through(a, relay.port, gtid=True)
    replicate_through(b, relay.port, gtid=False)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, a) and converged(primary, b), 60, "first sync")
    a.execute_many(["STOP SLAVE"])
    workload.mixed(primary, rounds=1)
    a.execute_many(["START SLAVE"])
    wait_until(lambda: converged(primary, a), 60, "stopped replica catches up")
    with workload.Background(primary) as bg:
        time.sleep(1.5)
        assert relay.stop() == 0
        time.sleep(1.0)
        relay.start()
        time.sleep(2.0)
    assert bg.error is None
    for r in (a, b):
        wait_until(lambda r=r: converged(primary, r), 90, "convergence after relay restart")
        assert r.query("CHECKSUM TABLE bg.t")[0] == primary.query("CHECKSUM TABLE bg.t")[0]
        assert_same_data(primary, r)


@pytest.mark.slow
def test_frozen_replica_does_not_slow_the_other(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    live = mariadb_factory(server_id=31)
    frozen = mariadb_factory(server_id=32)
    replicate_through(live, relay.port)
    replicate_through(frozen, relay.port)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, live) and converged(primary, frozen), 60, "sync")
    assert frozen.process is not None
    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        received = []  # the live replica's IO-thread position (what the relay delivered)
        with workload.Background(primary) as bg:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(3)
                io_pos = str(slave_status(live)["Gtid_IO_Pos"])
                received.append(int(io_pos.rsplit("-", 1)[1]))
        assert bg.error is None and bg.count > 200
        # It kept receiving the whole time one replica was frozen ...
        assert all(b > a for a, b in itertools.pairwise(received)), received
        # ... and is current right after the workload, while the other is still frozen.
        wait_until(lambda: converged(primary, live), 15, "live replica after the workload")
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    wait_until(lambda: converged(primary, frozen), 120, "frozen replica catches up")
    assert frozen.query("CHECKSUM TABLE bg.t")[0] == primary.query("CHECKSUM TABLE bg.t")[0]


def test_idle_relay_keeps_replicas_connected(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    replica = mariadb_factory(server_id=41, options={"slave_net_timeout": "3"})
    replicate_through(replica, relay.port, heartbeat=1.0)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "sync")
    dumps_before = relay.output().count("server_id=41: dump")
    time.sleep(10)  # over three slave_net_timeouts of silence from the primary
    st = slave_status(replica)
    assert st["Slave_IO_Running"] == "Yes" and st["Last_IO_Error"] == ""
    assert st["Seconds_Behind_Master"] == 0
    assert relay.output().count("server_id=41: dump") == dumps_before  # no reconnects
    with replica.root() as conn, conn.cursor() as cur:
        cur.execute("SHOW STATUS LIKE 'Slave_received_heartbeats'")
        assert int(cur.fetchone()[1]) >= 5


def test_bad_clients_are_dropped_alone(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    replica = mariadb_factory(server_id=51)
    replicate_through(replica, relay.port)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "sync")
    with pytest.raises(pymysql.err.OperationalError) as info:
        relay_client(relay.port, password="wrong")
    assert info.value.args[0] == 1045
    garbage = socket.create_connection(("127.0.0.1", relay.port))
    garbage.recv(1024)
    garbage.sendall(os.urandom(4096))
    silent = socket.create_connection(("127.0.0.1", relay.port))
    silent.recv(1024)  # greeting, then nothing
    mid = socket.create_connection(("127.0.0.1", relay.port))
    mid.recv(1024)
    mid.sendall(b"\xff\xff\xff\x01" + b"a" * 100)  # claims a 16 MiB packet, sends 100 bytes
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "replication during the abuse")

    def ended() -> dict[str, int]:
        return dict(relay.status().get("downstream", {}).get("ended", {}))
    # garbage: a protocol error; the silent one and the cut packet: past handshake_timeout
    wait_until(lambda: ended().get("protocol error", 0) + ended().get("timeout", 0) >= 3,
               30, "the three bad clients to be dropped")
    for s in (garbage, silent, mid):
        s.settimeout(5)
        assert s.recv(4096) == b""  # the relay closed it
        s.close()
    assert_same_data(primary, replica)
    assert ended().get("refused") == 1 and "error" not in ended()  # the wrong password


def test_unknown_gtid_gets_1236(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)
    replica = mariadb_factory(server_id=61)
    replica.execute_many(["SET GLOBAL gtid_slave_pos = '0-1-99999'"])
    replicate_through(replica, relay.port)
    wait_until(lambda: slave_status(replica).get("Last_IO_Errno") == 1236, 30, "error 1236")
    assert "not in the master's binlog" in str(slave_status(replica)["Last_IO_Error"])


def test_replica_waits_for_a_relay_that_has_no_log_yet(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    """A replica connected before the relay has anything waits instead of getting the
    fatal 1236, and replicates once the primary appears."""
    primary = mariadb_factory()
    primary.stop()  # the relay starts with its primary down
    relay = start_relay(relay_factory, primary, downstream={"catchup_wait": "60s"})
    replica = mariadb_factory(server_id=62)
    replicate_through(replica, relay.port)
    wait_until(lambda: "waiting up to" in relay.output(), 30, "the dump to wait")
    primary.start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 90, "replication once the log exists")
    assert slave_status(replica)["Last_IO_Errno"] == 0
    assert_same_data(primary, replica)
