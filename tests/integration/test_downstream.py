"""Real MariaDB replicas (and mysqlbinlog) replicate through the relay."""

from __future__ import annotations

import functools
import glob
import os
import pathlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from relay.binlog.constants import EventType
from relay.testing.mariadb import MariaDB, find_binary
from tests.conftest import (
    RelayProcess,
    group_events,
    primary_binlogs,
    read_binlog,
    replicate_through,
    slave_status,
    wait_until,
)
from tests.integration import workload
from tests.integration.common import (
    assert_same_data,
    caught_up,
    converged,
    fetch_one,
    relay_client,
    start_relay,
)

pytestmark = pytest.mark.integration


def _count_type(paths: list[str], event_type: int) -> int:
    return sum(data[4] == event_type for path in paths for data in read_binlog(path))


@pytest.mark.builds("machine", "mariadb-11.8")
def test_a_diverged_replica_is_refused_as_the_primary_refuses_it(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """A replica whose GTID (here of another server id) is not in the binlog, though the
    binlog's domain is past its number, has diverged: the primary and the relay both
    refuse it with error 1236 naming that GTID (failover tools read the message)."""
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)",
                          *[f"INSERT INTO d.t VALUES ({i})" for i in range(5)]])
    relay = start_relay(relay_factory, primary)
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
    replica = mariadb_factory(server_id=13)
    errors = []
    for port in (primary.port, relay.port):
        replica.execute_many(["STOP SLAVE", "RESET SLAVE ALL",
                              "SET GLOBAL gtid_slave_pos = '0-2-3'"])
        replica.replicate_from("127.0.0.1", port, user="repl",
                               password="replpass" if port == primary.port else "relaypass")

        def refused() -> bool:
            return slave_status(replica).get("Last_IO_Errno") == 1236
        wait_until(refused, 30, "the replica to be refused")
        errors.append(str(slave_status(replica)["Last_IO_Error"]))
        assert slave_status(replica)["Slave_IO_Running"] == "No"  # a fatal error
    assert "GTID 0-2-3, which is not in the master's binlog" in errors[0], errors
    assert "diverged" in errors[0]
    assert errors[1] == errors[0]
    assert replica.query("SELECT COUNT(*) FROM information_schema.tables "
                         "WHERE table_schema = 'd'")[0][0] == 0  # nothing applied


@pytest.mark.builds("machine", "mariadb-11.8")
def test_gtid_and_file_position_replicas_converge(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    # a parallel applier (optimistic, four workers) on one of them; the other logs what it
    # applies, so it asks for ANNOTATE_ROWS (the first does not: its relay log is kept)
    by_gtid = mariadb_factory(server_id=11, options={"gtid_strict_mode": "1",
                                                     "slave_parallel_threads": "4",
                                                     "relay_log_purge": "OFF"})
    by_pos = mariadb_factory(server_id=12, options={"log_slave_updates": "ON"})
    replicate_through(by_gtid, relay.port, gtid=True)
    replicate_through(by_pos, relay.port, gtid=False)
    workload.mixed(primary, rounds=2)
    workload.large(primary)  # a 100 MB transaction and a row event over 16 MiB
    for replica in (by_gtid, by_pos):
        wait_until(functools.partial(converged, primary, replica), 120, "replica convergence")
        assert_same_data(primary, replica)
        assert replica.query("CHECKSUM TABLE big.t")[0] == primary.query(
            "CHECKSUM TABLE big.t")[0]
        st = slave_status(replica)
        assert st["Slave_IO_Running"] == "Yes" and st["Slave_SQL_Running"] == "Yes"
        assert str(st["Master_Log_File"]).startswith("relay-bin.")
    assert by_gtid.query("SELECT @@slave_parallel_threads, @@slave_parallel_mode")[0] == \
        (4, "optimistic")
    # ANNOTATE_ROWS as the primary sends them: to the replica that asked, every one (it
    # logs them as the primary did); none to the one that did not (a hole, as from a
    # MariaDB primary), while the relay keeps them all.
    annotations = _count_type(primary_binlogs(primary), EventType.ANNOTATE_ROWS)
    assert annotations > 0
    assert _count_type(relay.segments(), EventType.ANNOTATE_ROWS) == annotations
    assert _count_type(primary_binlogs(by_pos), EventType.ANNOTATE_ROWS) == annotations
    relay_logs = sorted(glob.glob(os.path.join(by_gtid.datadir, "*relay-bin.[0-9]*")))
    assert _count_type(relay_logs, EventType.WRITE_ROWS_V1) > 0
    assert _count_type(relay_logs, EventType.ANNOTATE_ROWS) == 0
    # The relay looks like a primary to an admin client.
    with relay_client(relay.port) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        assert fetch_one(cur)[0] == primary.gtid_binlog_pos()
        cur.execute("SELECT @@version")
        assert "MariaDB" in fetch_one(cur)[0]
        cur.execute("SHOW MASTER STATUS")
        name, pos = fetch_one(cur)[:2]
        assert name == os.path.basename(relay.segments()[-1])
        assert int(pos) == os.path.getsize(relay.segments()[-1])
        cur.execute("SHOW BINARY LOGS")
        assert [r[0] for r in cur.fetchall()] == [os.path.basename(s) for s in relay.segments()]
        cur.execute("SHOW SLAVE HOSTS")
        assert sorted(int(r[0]) for r in cur.fetchall()) == [11, 12]
        cur.execute(f"SELECT BINLOG_GTID_POS('{name}', {pos})")
        assert fetch_one(cur)[0] == primary.gtid_binlog_pos()
        with pytest.raises(pymysql.err.MySQLError) as info:
            cur.execute("DELETE FROM shop.items")
        assert info.value.args[0] == 1235 and "SHOW MASTER STATUS" in info.value.args[1]


@pytest.mark.parametrize("checksum", ["CRC32", "NONE"])
def test_mysqlbinlog_reads_from_the_relay(mariadb_factory: Callable[..., MariaDB],
                                          relay_factory: Callable[..., RelayProcess],
                                          tmp_path: pathlib.Path, checksum: str) -> None:
    primary = mariadb_factory(options={"binlog_checksum": checksum})
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=2)
    wait_until(lambda: caught_up(relay, primary), 60, "relay catch-up")
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


def test_replica_stop_start_and_relay_restart(mariadb_factory: Callable[..., MariaDB],
                                              relay_factory: Callable[..., RelayProcess]) -> None:
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
    before = transactions(relay)
    with workload.Background(primary) as bg:
        # The relay stops in mid-stream, the primary writes on while it is down, and the
        # relay comes back under load.
        wait_until(lambda: transactions(relay) >= before + 50, 60,
                   "the relay to stream the background load")
        assert relay.stop() == 0
        written = bg.count
        wait_until(lambda: bg.count >= written + 50, 60, "writes while the relay is down")
        relay.start()
        wait_until(lambda: streams(relay) >= 1 and transactions(relay) >= 50, 60,
                   "the restarted relay to stream the background load")
        wait_until(lambda: dumping(relay) >= {21, 22} and all(map(io_ok, (a, b))), 60,
                   "both replicas to dump from the restarted relay")
    assert bg.error is None
    for r in (a, b):
        wait_until(functools.partial(converged, primary, r), 90,
                   "convergence after relay restart")
        assert r.query("CHECKSUM TABLE bg.t")[0] == primary.query("CHECKSUM TABLE bg.t")[0]
        assert_same_data(primary, r)


@pytest.mark.slow
def test_frozen_replica_does_not_slow_the_other(mariadb_factory: Callable[..., MariaDB],
                                                relay_factory: Callable[..., RelayProcess]) -> None:
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

    def io_seq() -> int:  # the live replica's IO-thread position (what the relay delivered)
        return int(str(slave_status(live)["Gtid_IO_Pos"]).rsplit("-", 1)[1])

    def received_more(than: int) -> bool:
        return io_seq() > than

    def frozen_dropped() -> bool:
        """The relay gave up on the frozen replica: its socket stayed full for the whole
        write_timeout (5 s), during which the relay had events it could not send it."""
        return "timeout" in ended(relay.status())

    try:
        received = [io_seq()]
        after = 0  # samples taken since the relay dropped the frozen replica
        with workload.Background(primary) as bg:
            deadline = time.monotonic() + 120
            while after < 5 or bg.count <= 200:
                assert time.monotonic() < deadline, \
                    f"the frozen replica was never dropped ({bg.count} transactions)"
                # It keeps receiving (no pause of 3 s) the whole time one replica is
                # frozen, before, while and after the relay waits on that one ...
                wait_until(functools.partial(received_more, received[-1]), 3,
                           "the live replica to receive more")
                received.append(io_seq())
                if after or frozen_dropped():
                    after += 1
        assert bg.error is None
        # ... and is current right after the workload, while the other is still frozen.
        wait_until(lambda: converged(primary, live), 15, "live replica after the workload")
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    wait_until(lambda: converged(primary, frozen), 120, "frozen replica catches up")
    assert frozen.query("CHECKSUM TABLE bg.t")[0] == primary.query("CHECKSUM TABLE bg.t")[0]


def test_idle_relay_keeps_replicas_connected(mariadb_factory: Callable[..., MariaDB],
                                             relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    replica = mariadb_factory(server_id=41, options={"slave_net_timeout": "3"})
    replicate_through(replica, relay.port, heartbeat=1.0)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "sync")
    before = relay.status()
    dumps = [c["id"] for c in before["clients"] if c["server_id"] == 41]
    assert len(dumps) == 1

    def heartbeats() -> int:
        return int(str(replica.query("SHOW STATUS LIKE 'Slave_received_heartbeats'")[0][1]))
    # Ten heartbeats (one a second): over three slave_net_timeouts of silence from the
    # primary, which the relay fills with heartbeats.
    beats = heartbeats()
    wait_until(lambda: heartbeats() >= beats + 10, 30, "ten heartbeats from the relay")
    st = slave_status(replica)
    assert st["Slave_IO_Running"] == "Yes" and st["Last_IO_Error"] == ""
    assert st["Seconds_Behind_Master"] == 0
    # no reconnects: the same dump session throughout, and no session ended meanwhile
    after = relay.status()
    assert [c["id"] for c in after["clients"] if c["server_id"] == 41] == dumps
    assert ended(after) == ended(before)


def test_bad_clients_are_dropped_alone(mariadb_factory: Callable[..., MariaDB],
                                       relay_factory: Callable[..., RelayProcess]) -> None:
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

    def ends() -> dict[str, int]:
        return ended(relay.status())
    # garbage: a protocol error; the silent one and the cut packet: past handshake_timeout
    wait_until(lambda: ends().get("protocol error", 0) + ends().get("timeout", 0) >= 3,
               30, "the three bad clients to be dropped")
    for s in (garbage, silent, mid):
        s.settimeout(5)
        assert s.recv(4096) == b""  # the relay closed it
        s.close()
    assert_same_data(primary, replica)
    assert ends().get("refused") == 1 and "error" not in ends()  # the wrong password


def test_unknown_gtid_gets_1236(mariadb_factory: Callable[..., MariaDB],
                                relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)
    replica = mariadb_factory(server_id=61)
    replica.execute_many(["SET GLOBAL gtid_slave_pos = '0-1-99999'"])
    replicate_through(replica, relay.port)
    wait_until(lambda: slave_status(replica).get("Last_IO_Errno") == 1236, 30, "error 1236")
    assert "not in the master's binlog" in str(slave_status(replica)["Last_IO_Error"])


def test_replica_waits_for_a_relay_that_has_no_log_yet(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """A replica connected before the relay has anything waits instead of getting the
    fatal 1236, and replicates once the primary appears."""
    primary = mariadb_factory()
    primary.stop()  # the relay starts with its primary down
    relay = start_relay(relay_factory, primary, downstream={"catchup_wait": "60s"})
    replica = mariadb_factory(server_id=62)
    replicate_through(replica, relay.port)
    wait_until(lambda: any(c["state"] == "waiting for the relay to catch up"
                           for c in relay.status().get("clients", [])), 30, "the dump to wait")
    primary.start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 90, "replication once the log exists")
    assert slave_status(replica)["Last_IO_Errno"] == 0
    assert_same_data(primary, replica)


def transactions(relay: RelayProcess) -> int:
    """Transactions this relay process has written to its log (0 while it is down)."""
    return int(relay.status().get("relay_log", {}).get("transactions", 0))


def streams(relay: RelayProcess) -> int:
    """Dump streams this relay process has started upstream (0 while it is down)."""
    return int(relay.status().get("upstream", {}).get("streams", 0))


def ended(status: dict[str, Any]) -> dict[str, int]:
    """How the downstream sessions ended, by kind, as /status counts them."""
    return dict(status.get("downstream", {}).get("ended", {}))


def dumping(relay: RelayProcess) -> set[int]:
    """The server_ids of the replicas that have a dump open on the relay."""
    return {c["server_id"] for c in relay.status().get("clients", []) if c["file"] is not None}


def io_ok(replica: MariaDB) -> bool:
    """The replica's IO thread is connected, with no error standing."""
    st = slave_status(replica)
    return st.get("Slave_IO_Running") == "Yes" and st.get("Last_IO_Errno") == 0
