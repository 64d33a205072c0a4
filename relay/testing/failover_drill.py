"""Failovers back and forth between two real primaries, for the test suite and the bench.

X and Y run with log_slave_updates; one is the primary, the other replicates from it by
GTID. Each round: writes on the primary, the standby catches up, the primary is killed
-9, the relay moves to the standby, the standby is promoted and written to, and the old
primary restarts and rejoins as the new primary's replica. The roles swap every round.
Timings per round: fault -> the relay streaming from the standby, and fault -> the
standby's first write at the relay and at a replica behind it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from relay.testing.mariadb import MariaDB


@dataclass
class Round:
    switched: float      # fault -> the relay connected to the standby
    at_relay: float      # fault -> the standby's first write in the relay log
    at_replica: float    # fault -> that write at the replica behind the relay


def relay_status(metrics_port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status",
                                    timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except OSError as exc:
        if hasattr(exc, "read"):  # 503 while not ready still has the body
            return dict(json.loads(exc.read()))
        return {}


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _synced(primary: MariaDB, replica: MariaDB) -> bool:
    st = replica.slave_status()
    if st.get("Last_IO_Error") or st.get("Last_SQL_Error"):
        raise AssertionError(f"replication error: {st}")
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == primary.gtid_binlog_pos()


def _streaming_from(metrics_port: int, server: MariaDB) -> bool:
    up = relay_status(metrics_port).get("upstream")
    return isinstance(up, dict) and up.get("source") == f"127.0.0.1:{server.port}" \
        and up.get("connected") is True


def _relay_at(metrics_port: int, gtid_pos: str) -> bool:
    rl = relay_status(metrics_port).get("relay_log")
    return isinstance(rl, dict) and rl.get("gtid_pos") == gtid_pos


def run_drill(x: MariaDB, y: MariaDB, replica: MariaDB, metrics_port: int, rounds: int,
              writes: int = 20, fault: str = "kill") -> list[Round]:
    """X is the primary, Y its replica, the relay's sources [X, Y], `replica` behind the
    relay. Both primaries need a table d.t (id INT PRIMARY KEY). `fault` is "kill" (kill
    -9: the link resets) or "freeze" (SIGSTOP: silence until read_timeout, no reset)."""
    if fault not in ("kill", "freeze"):
        raise ValueError(f"fault must be 'kill' or 'freeze', not {fault!r}")
    primary, standby = x, y
    done: list[Round] = []
    next_id = 0
    for _ in range(rounds):
        for _ in range(writes):
            primary.execute_many([f"INSERT INTO d.t VALUES ({next_id})"])
            next_id += 1
        _wait(functools.partial(_synced, primary, standby), 60, "the standby to catch up")
        _wait(functools.partial(_synced, primary, replica), 60, "the replica to catch up")
        if fault == "kill":
            primary.kill()
        else:
            assert primary.process is not None
            os.kill(primary.process.pid, signal.SIGSTOP)
        killed = time.monotonic()
        _wait(functools.partial(_streaming_from, metrics_port, standby), 60,
              "the relay on the standby")
        switched = time.monotonic() - killed
        standby.execute_many(["STOP SLAVE", "RESET SLAVE ALL",
                              f"INSERT INTO d.t VALUES ({next_id})"])
        next_id += 1
        target = standby.gtid_binlog_pos()
        _wait(functools.partial(_relay_at, metrics_port, target), 60,
              "the standby's write at the relay")
        at_relay = time.monotonic() - killed
        _wait(functools.partial(_synced, standby, replica), 60,
              "the standby's write at the replica")
        at_replica = time.monotonic() - killed
        done.append(Round(switched, at_relay, at_replica))
        primary.kill()  # a frozen one too: SIGKILL ends a stopped process
        primary.start()  # the old primary rejoins under the new one
        primary.execute_many(["SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos"])
        primary.replicate_from("127.0.0.1", standby.port, user=standby.repl_user,
                               password=standby.repl_password)
        _wait(functools.partial(_synced, standby, primary), 60, "the old primary to rejoin")
        primary, standby = standby, primary
    return done


def relay_settings(x: MariaDB, y: MariaDB) -> dict[str, object]:
    """[upstream] settings for a drill: fast detection and failover."""
    return {"sources": [x.url, y.url], "heartbeat_period": "1s", "read_timeout": "3s",
            "connect_timeout": "2s", "failover_after": "1s", "retry_initial": "0.1s",
            "retry_max": "0.3s"}
