"""Upstream liveness and failover between real primaries: A is the primary, B replicates
from A with GTID and log_slave_updates, a replica follows the relay.

- a frozen A (SIGSTOP: silence, no reset) is detected by the read timeout and the relay
  moves to B; when A thaws, the relay stays on B (no flapping) unless prefer_first, and
  then only once A holds everything the relay holds;
- B behind A when A dies: on_divergence = "stop" stops with the missing GTIDs named,
  "wait" resumes once B has caught up.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import assert_same_data, converged, start_relay

pytestmark = pytest.mark.integration

FAST = {"heartbeat_period": "1s", "read_timeout": "3s", "connect_timeout": "2s",
        "failover_after": "1s", "retry_initial": "0.1s", "retry_max": "0.5s"}


def status(relay: RelayProcess) -> dict[str, Any]:
    """/status's upstream section ({} while the relay is not answering)."""
    return dict(relay.status().get("upstream", {}))


def upstream_heartbeats(relay: RelayProcess) -> float:
    """Heartbeats the relay received from its source (one a second on an idle link)."""
    for line in relay.http("/metrics")[1].splitlines():
        if line.startswith("relay_upstream_heartbeats_total "):
            return float(line.split()[-1])
    return 0.0


def repl_connections(server: MariaDB) -> int:
    """Connections the server accepted from its `repl` user since it started (it runs with
    userstat on): the relay's sessions and its prefer_first looks."""
    rows = server.query("SELECT TOTAL_CONNECTIONS FROM information_schema.USER_STATISTICS "
                        "WHERE USER = %s", (server.repl_user,))
    return int(str(rows[0][0])) if rows else 0


@pytest.fixture
def pair(mariadb_factory: Callable[..., MariaDB]) -> Iterator[tuple[MariaDB, MariaDB]]:
    a = mariadb_factory(server_id=1, options={"log_slave_updates": "ON",  # may rejoin
                                              "userstat": "ON"})  # counts the relay's looks
    b = mariadb_factory(server_id=2, options={"log_slave_updates": "ON"})
    b.replicate_from("127.0.0.1", a.port, user=a.repl_user, password=a.repl_password)
    yield a, b
    if a.process is not None:  # a frozen server takes no SIGTERM
        os.kill(a.process.pid, signal.SIGCONT)


def test_frozen_primary_detected_and_no_flapping(
        pair: tuple[MariaDB, MariaDB], mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    a, b = pair
    # prefer_first is off (the default): prefer_check must not matter
    relay = start_relay(relay_factory, a, upstream={"sources": [a.url, b.url],
                                                    "prefer_check": "1s", **FAST})
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)
    workload.mixed(a, rounds=1)
    wait_until(lambda: converged(a, replica) and converged(a, b), 60, "everyone in sync")

    assert a.process is not None
    os.kill(a.process.pid, signal.SIGSTOP)  # silence: no FIN, no RST
    frozen_at = time.monotonic()
    wait_until(lambda: status(relay).get("source") == f"127.0.0.1:{b.port}"
               and status(relay).get("connected") is True, 30, "the relay to move to B")
    moved_after = time.monotonic() - frozen_at
    # the bound: read_timeout 3 s + failover_after 1 s + 1 s (measured: 4.1 s)
    assert moved_after < 3 + 1 + 1, moved_after
    b.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])  # B promoted
    workload.mixed(b, rounds=1)
    wait_until(lambda: converged(b, replica), 60, "the replica, through the relay, on B")
    assert_same_data(b, replica)
    up = status(relay)
    assert up["failovers"] == 1 and "failed for 1s" in str(up["last_failover"])

    os.kill(a.process.pid, signal.SIGCONT)  # A is back (behind B now): stay on B
    workload.mixed(b, rounds=1)
    wait_until(lambda: converged(b, replica), 60, "the replica after A came back")
    # Over three prefer_check periods (counted in B's heartbeats, one a second) nothing
    # moves: the relay keeps its one stream from B and does not even look at A.
    up, looks, beats = status(relay), repl_connections(a), upstream_heartbeats(relay)
    wait_until(lambda: upstream_heartbeats(relay) >= beats + 3, 30, "three heartbeats from B")
    after = status(relay)
    assert after["source"] == f"127.0.0.1:{b.port}" and after["connected"] is True, after
    assert after["failovers"] == 1 and after["streams"] == up["streams"], (up, after)
    assert repl_connections(a) == looks


def test_prefer_first_returns_once_caught_up(pair: tuple[MariaDB, MariaDB],
                                             mariadb_factory: Callable[..., MariaDB],
                                             relay_factory: Callable[..., RelayProcess]) -> None:
    a, b = pair
    relay = start_relay(relay_factory, a, upstream={
        "sources": [a.url, b.url], "prefer_first": True, "prefer_check": "1s", **FAST})
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)
    workload.mixed(a, rounds=1)
    wait_until(lambda: converged(a, replica) and converged(a, b), 60, "everyone in sync")
    a.stop()
    wait_until(lambda: status(relay).get("source") == f"127.0.0.1:{b.port}", 30,
               "the relay to move to B")
    b.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])
    workload.mixed(b, rounds=1)  # B is ahead now: A lacks these
    wait_until(lambda: converged(b, replica), 60, "the replica on B")
    up = status(relay)
    a.start()
    # A answers but has not caught up: the relay looks at it each prefer_check (counted on
    # A) and stays on B, on the same stream.
    wait_until(lambda: repl_connections(a) >= 2, 30, "two prefer_check looks at A")
    after = status(relay)
    assert after["source"] == f"127.0.0.1:{b.port}" and after["connected"] is True, after
    assert after["failovers"] == up["failovers"] and after["streams"] == up["streams"], \
        (up, after)
    a.execute_many(["SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos"])  # A rejoins under B
    a.replicate_from("127.0.0.1", b.port, user=b.repl_user, password=b.repl_password)
    wait_until(lambda: converged(b, a), 60, "A to catch up with B")
    wait_until(lambda: status(relay).get("source") == f"127.0.0.1:{a.port}", 30,
               "the relay back on A")
    assert "prefer_first" in str(status(relay)["last_failover"])
    a.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])
    workload.mixed(a, rounds=1)
    wait_until(lambda: converged(a, replica), 60, "the replica, back on A")
    assert_same_data(a, replica)


def relay_ahead_of_b(relay_factory: Callable[..., RelayProcess], a: MariaDB, b: MariaDB,
                     policy: str) -> tuple[RelayProcess, str, str]:
    """A relay on [A, B] that holds A's work while B stopped replicating part-way:
    (relay, B's position, A's position)."""
    relay = start_relay(relay_factory, a, upstream={
        "sources": [a.url, b.url], "on_divergence": policy, **FAST})
    workload.mixed(a, rounds=1)
    wait_until(lambda: converged(a, b), 60, "B in sync")
    b.execute_many(["STOP SLAVE"])  # B falls behind
    before = b.gtid_binlog_pos()
    workload.mixed(a, rounds=1)
    target = a.gtid_binlog_pos()
    wait_until(lambda: status(relay).get("connected") is True and
               f"gtid_pos\": \"{target}\"" in relay.http("/status")[1], 30,
               "the relay to hold A's work")
    return relay, before, target


@pytest.mark.parametrize("policy", ["stop", "wait"])
def test_passive_primary_behind(pair: tuple[MariaDB, MariaDB],
                                mariadb_factory: Callable[..., MariaDB],
                                relay_factory: Callable[..., RelayProcess], policy: str) -> None:
    a, b = pair
    relay, before, target = relay_ahead_of_b(relay_factory, a, b, policy)
    a.kill()
    if policy == "stop":
        wait_until(lambda: bool(status(relay).get("stopped")), 30, "the upstream to stop")
        stopped = str(status(relay)["stopped"])
        seq_b = int(before.split("-")[2])
        seq_a = int(target.split("-")[2])
        assert f"domain 0 seq {seq_b + 1}..{seq_a}" in stopped, stopped
        assert "lacks transactions the relay already holds" in stopped, stopped
        code, _ = relay.http("/readyz")
        assert code == 503
        assert f"gtid_pos\": \"{target}\"" in relay.http("/status")[1]  # nothing skipped
    else:
        wait_until(lambda: bool(status(relay).get("waiting_for_source")), 30,
                   "the relay to wait for B")
        a.start()  # A comes back; B catches up from it
        b.execute_many(["START SLAVE"])
        wait_until(lambda: converged(a, b), 60, "B to catch up")
        wait_until(lambda: status(relay).get("connected") is True
                   and not status(relay).get("waiting_for_source"), 30,
                   "the relay to resume on B")
        b.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])
        workload.mixed(b, rounds=1)
        replica = mariadb_factory(server_id=3)
        replicate_through(replica, relay.port)
        wait_until(lambda: converged(b, replica), 90, "a replica behind the relay")
        assert_same_data(b, replica)


@pytest.mark.parametrize("policy", ["stop", "wait"])
def test_passive_primary_catches_up_from_the_relay(pair: tuple[MariaDB, MariaDB],
                                                   mariadb_factory: Callable[..., MariaDB],
                                                   relay_factory: Callable[..., RelayProcess],
                                                   policy: str) -> None:
    """A is lost for good while B is behind: the transactions B lacks exist only in the
    relay. B replicates them from the relay itself (the README's recovery), is promoted,
    and the relay resumes on B (waiting: by itself; stopped: once restarted): nothing
    lost, nothing forked."""
    a, b = pair
    relay, _, target = relay_ahead_of_b(relay_factory, a, b, policy)
    a.kill()  # and A never comes back
    state = "waiting_for_source" if policy == "wait" else "stopped"
    wait_until(lambda: bool(status(relay).get(state)), 30, f"the relay {state}")
    replicate_through(b, relay.port)  # B takes what it lacks from the relay
    wait_until(lambda: b.gtid_binlog_pos() == target, 60, "B to catch up from the relay")
    b.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])  # B promoted
    if policy == "stop":
        relay.stop()
        relay.start()
    wait_until(lambda: status(relay).get("connected") is True
               and status(relay).get("source") == f"127.0.0.1:{b.port}"
               and not status(relay).get("waiting_for_source"), 30,
               "the relay to resume on B")
    workload.mixed(b, rounds=1)
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)
    wait_until(lambda: converged(b, replica), 90, "a replica behind the relay")
    assert_same_data(b, replica)
    assert status(relay).get("stopped") in (None, "")


def test_diverged_passive_primary_stops_the_upstream(
        pair: tuple[MariaDB, MariaDB], relay_factory: Callable[..., RelayProcess]) -> None:
    a, b = pair
    relay = start_relay(relay_factory, a, upstream={"sources": [a.url, b.url], **FAST})
    a.execute_many(["CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)"])
    wait_until(lambda: converged(a, b), 60, "B in sync")
    b.execute_many(["STOP SLAVE"])
    a.execute_many([f"INSERT INTO d.t VALUES ({i})" for i in range(1, 4)])
    # B takes writes of its own in the same domain: a history that is not A's
    b.execute_many([f"INSERT INTO d.t VALUES ({i})" for i in range(100, 110)])
    target = a.gtid_binlog_pos()
    wait_until(lambda: f"gtid_pos\": \"{target}\"" in relay.http("/status")[1], 30,
               "the relay to hold A's writes")
    a.kill()
    wait_until(lambda: bool(status(relay).get("stopped")), 30, "the upstream to stop")
    stopped = str(status(relay)["stopped"])
    assert "conflicts with the relay's" in stopped and "1236" in stopped, stopped
    assert f"gtid_pos\": \"{target}\"" in relay.http("/status")[1]  # nothing of B's taken


def test_faulty_link_ends_identical(mariadb_factory: Callable[..., MariaDB],
                                    relay_factory: Callable[..., RelayProcess]) -> None:
    """Between relay and primary, a link that stalls for longer than read_timeout, then
    resets each new stream five times once it carries writes: the relay log ends identical
    to the primary's binlog."""
    import threading

    from relay.testing.faultproxy import FaultProxy
    from tests.conftest import group_events, gtids_in, primary_binlogs

    primary = mariadb_factory()
    proxy = FaultProxy("127.0.0.1", primary.port).start()
    try:
        url = primary.url.replace(f":{primary.port}", f":{proxy.port}")
        relay = start_relay(relay_factory, primary, upstream={"sources": [url], **FAST})
        stop = threading.Event()

        def write() -> None:
            workload.mixed(primary, rounds=1)
            primary.execute_many(["CREATE TABLE shop.ticks (id INT PRIMARY KEY, v TEXT)"])
            i = 0
            while not stop.is_set():
                primary.execute_many([f"INSERT INTO shop.ticks VALUES ({i}, REPEAT('x', {i}))"])
                i += 1

        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: transactions(relay) >= 50, 60, "the relay to stream the writes")
        proxy.stall(True)  # the dump connection goes silent, no reset
        # read_timeout is 3 s: silence must be taken for a dead link
        wait_until(lambda: "(read_timeout)" in str(status(relay).get("last_error")), 15,
                   "the relay to give up on the silent link")
        seen = streams(relay)
        proxy.stall(False)
        for _ in range(5):  # each reset hits a new stream once it carries writes
            wait_until(functools.partial(streams_past, relay, seen), 30,
                       "the relay to stream again")
            wait_until(functools.partial(transactions_past, relay, transactions(relay)), 30,
                       "writes over the new stream")
            seen = streams(relay)
            proxy.reset_all()
        stop.set()
        writer.join(120)
        target = primary.gtid_binlog_pos()
        wait_until(lambda: f"gtid_pos\": \"{target}\"" in relay.http("/status")[1], 60,
                   "the relay to catch up through the faulty link")
        # the first stream, one after the stall and one after each reset
        assert streams(relay) >= 7 and proxy.resets == 5
        assert relay.stop() == 0
        assert gtids_in(relay.segments()) == gtids_in(primary_binlogs(primary))
        assert group_events(relay.segments()) == group_events(primary_binlogs(primary))
    finally:
        proxy.stop()


ROUNDS = 10


def test_ten_failovers_back_and_forth(mariadb_factory: Callable[..., MariaDB],
                                      relay_factory: Callable[..., RelayProcess]) -> None:
    from relay.testing.failover_drill import relay_settings, run_drill

    x = mariadb_factory(server_id=1, options={"log_slave_updates": "ON"})
    y = mariadb_factory(server_id=2, options={"log_slave_updates": "ON"})
    y.replicate_from("127.0.0.1", x.port, user=x.repl_user, password=x.repl_password)
    x.execute_many(["CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)"])
    relay = start_relay(relay_factory, x, upstream=relay_settings(x, y))
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)
    # (bench/failover_time.py --runs N drills longer)
    rounds = run_drill(x, y, replica, relay.metrics_port, rounds=ROUNDS, writes=10)
    assert len(rounds) == ROUNDS
    # kill -9 resets the link: each switch within read_timeout 3 s + failover_after 1 s
    # + 1 s (measured: about 1.2 s)
    assert max(r.switched for r in rounds) < 3 + 1 + 1, [r.switched for r in rounds]
    last = y if len(rounds) % 2 else x   # the primary after the last round
    wait_until(lambda: converged(last, replica), 60, "the replica equal to the last primary")
    assert replica.query("CHECKSUM TABLE d.t") == last.query("CHECKSUM TABLE d.t")
    assert replica.query("SELECT COUNT(*) FROM d.t")[0][0] == ROUNDS * 11
    assert status(relay)["failovers"] == ROUNDS


def transactions(relay: RelayProcess) -> int:
    """Transactions the relay has written to its log (0 while it is not answering)."""
    return int(relay.status().get("relay_log", {}).get("transactions", 0))


def transactions_past(relay: RelayProcess, n: int) -> bool:
    return transactions(relay) > n


def streams(relay: RelayProcess) -> int:
    """Dump streams the relay has started upstream (0 while it is not answering)."""
    return int(status(relay).get("streams", 0))


def streams_past(relay: RelayProcess, n: int) -> bool:
    return streams(relay) > n
