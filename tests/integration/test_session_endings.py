"""How a dump ends, with real clients: KILL on the relay's SQL port, a newer dump with the
same server_id, the client vanishing (kill -9) and the relay's shutdown. Each is counted in
/status and listed there once (downstream.recent_endings: which session, which server_id,
how), and leaves no failed task behind (the relay fixture's teardown fails on "Task
exception was never retrieved" or a traceback)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from collections.abc import Callable

import pytest

from relay.testing.mariadb import MariaDB, find_binary
from tests.conftest import RelayProcess, check_output, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import converged, relay_client, start_relay

pytestmark = pytest.mark.integration


def _ended(relay: RelayProcess, how: str) -> int:
    return int(relay.status().get("downstream", {}).get("ended", {}).get(how, 0))


def _dumps(relay: RelayProcess, server_id: int) -> list[dict[str, object]]:
    return [c for c in relay.status().get("clients", [])
            if c["server_id"] == server_id and c["file"] is not None]


def _endings(relay: RelayProcess, server_id: int) -> list[tuple[object, str]]:
    """(session id, how it ended) of each of `server_id`'s sessions that ended."""
    return [(e["id"], e["reason"])
            for e in relay.status().get("downstream", {}).get("recent_endings", [])
            if e["server_id"] == server_id]


def _lines(relay: RelayProcess, server_id: int, how: str) -> list[str]:
    return [line for line in relay.output().splitlines()
            if f"server_id={server_id}: dump ended: {how}" in line]


def _binlog_client(relay: RelayProcess, server_id: int) -> subprocess.Popen[bytes]:
    """mariadb-binlog following the relay forever, as replica `server_id`."""
    return subprocess.Popen(
        [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server", "--raw",
         "--stop-never", f"--stop-never-slave-server-id={server_id}", "--host=127.0.0.1",
         f"--port={relay.port}", "--user=repl", "--password=relaypass",
         f"--result-file={relay.workdir}/fetched-{server_id}-", "relay-bin.000001"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def test_kill_replacing_dump_and_vanished_client_each_end_one_dump(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)
    replica = mariadb_factory(server_id=61)
    replicate_through(replica, relay.port)
    wait_until(lambda: converged(primary, replica), 60, "the replica to catch up")

    # KILL the replica's dump: it ends once, and the replica reconnects by itself.
    dump = _dumps(relay, 61)[0]
    with relay_client(relay.port) as conn, conn.cursor() as cur:
        cur.execute(f"KILL {dump['id']}")
    wait_until(lambda: _ended(relay, "killed") == 1, 20, "the killed dump to end")
    assert _endings(relay, 61) == [(dump["id"], "killed")]
    wait_until(lambda: bool(_dumps(relay, 61)), 30, "the replica to dump again")
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "the replica after KILL")

    # A newer dump with the same server_id replaces the older one.
    first = _binlog_client(relay, 77)
    second = None
    try:
        wait_until(lambda: len(_dumps(relay, 77)) == 1, 20, "the first client's dump")
        older = _dumps(relay, 77)[0]["id"]
        second = _binlog_client(relay, 77)
        wait_until(lambda: _ended(relay, "replaced") == 1, 20, "the older dump replaced")
        assert first.wait(10) != 0  # the relay ended its stream
        assert _endings(relay, 77) == [(older, "replaced")]
        # The client vanishes (kill -9): its dump ends when the socket says so.
        wait_until(lambda: len(_dumps(relay, 77)) == 1, 20, "the second client's dump")
        newer = _dumps(relay, 77)[0]["id"]
        assert newer != older
        second.send_signal(signal.SIGKILL)
        second.wait(10)
        wait_until(lambda: not _dumps(relay, 77), 20, "the vanished client's dump to end")
        assert _endings(relay, 77) == [(older, "replaced"), (newer, "client gone")]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert _ended(relay, "client gone") >= 1 and _ended(relay, "error") == 0
    assert _endings(relay, 61) == [(dump["id"], "killed")]  # its reconnect still dumps


def test_shutdown_ends_each_dump_once(mariadb_factory: Callable[..., MariaDB],
                                      relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)
    replicas = [mariadb_factory(server_id=sid) for sid in (81, 82)]
    for r in replicas:
        replicate_through(r, relay.port)
    for r in replicas:
        wait_until(functools.partial(converged, primary, r), 60, "the replicas to catch up")
    assert _endings(relay, 81) == [] and _endings(relay, 82) == []
    assert relay.stop() == 0
    # Each replica saw its stream end: its I/O thread is reconnecting.
    for r in replicas:
        wait_until(functools.partial(_io_not_running, r), 30, "the replica to lose its dump")
    # How each dump ended, and that it ended once, is left only in the log: the relay has
    # exited (and its /status with it), and a replica cannot tell a shutdown from any other
    # end of its stream. So this reads the session's one log line about its end.
    for sid in (81, 82):
        assert len(_lines(relay, sid, "shutdown")) == 1, relay.output()[-3000:]
    check_output(relay)  # no unowned task, no traceback (also at teardown)


def _io_not_running(replica: MariaDB) -> bool:
    return replica.slave_status().get("Slave_IO_Running") != "Yes"
