"""The relay as a semi-synchronous replica of a real MariaDB primary (semi-sync built in,
wait point AFTER_SYNC): it acknowledges every transaction, and a transaction the primary
reported committed is in the relay log on disk even when the relay is killed -9 the next
instant."""

from __future__ import annotations

import functools
import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from relay.binlog.gtid import Gtid
from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, gtids_in, replicate_through, wait_until
from tests.integration.common import converged, fetch_one, start_relay

pytestmark = pytest.mark.integration

SEMI_SYNC_PRIMARY = {"rpl_semi_sync_master_enabled": "ON",
                     "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
                     "rpl_semi_sync_master_timeout": "5000"}


def primary_status(primary: MariaDB, name: str) -> str:
    rows = primary.query(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return str(rows[0][1]) if rows else ""


def relay_upstream(relay: RelayProcess) -> dict[str, object]:
    _, body = relay.http("/status")
    return json.loads(body)["upstream"] if body else {}


def test_relay_acknowledges_each_transaction(mariadb_factory: Callable[..., MariaDB],
                                             relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory(options=SEMI_SYNC_PRIMARY)
    relay = start_relay(relay_factory, primary, upstream={"semi_sync": True})
    wait_until(lambda: primary_status(primary, "Rpl_semi_sync_master_clients") == "1", 30,
               "the relay registered as a semi-sync replica")
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    yes_before = int(primary_status(primary, "Rpl_semi_sync_master_yes_tx"))
    for i in range(50):
        primary.execute_many([f"INSERT INTO s.t VALUES ({i})"])
    assert primary_status(primary, "Rpl_semi_sync_master_status") == "ON"
    assert int(primary_status(primary, "Rpl_semi_sync_master_yes_tx")) - yes_before == 50
    assert primary_status(primary, "Rpl_semi_sync_master_no_tx") == "0"
    up = relay_upstream(relay)
    assert up["semi_sync"] == "on" and int(str(up["semi_sync_acks"])) >= 52
    assert "relay_upstream_semisync_acks_total" in relay.http("/metrics")[1]
    assert up["reconnects"] == 0, relay.output()[-2000:]  # one connection throughout


def test_without_semi_sync_on_the_primary_it_replicates_asynchronously(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary, upstream={"semi_sync": True})
    primary.execute_many(["CREATE DATABASE s"])
    target = primary.gtid_binlog_pos()
    wait_until(lambda: f"gtid_pos\": \"{target}\"" in relay.http("/status")[1], 30,
               "the relay to replicate")
    assert "not enabled on the primary" in str(relay_upstream(relay)["semi_sync"])


def test_kill9_never_loses_an_acknowledged_commit(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory(options=SEMI_SYNC_PRIMARY)
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    relay = start_relay(relay_factory, primary, upstream={"semi_sync": True})
    rng = random.Random(7)
    ids = itertools.count()

    def semi_sync_on() -> bool:
        # After a timeout the primary turns semi-sync back on only when a new transaction
        # is acknowledged: write one per look.
        primary.execute_many([f"INSERT INTO s.t VALUES ({next(ids)})"])
        return primary_status(primary, "Rpl_semi_sync_master_status") == "ON"

    def going(committed: list[tuple[float, str]]) -> bool:
        return len(committed) > 10

    for _round in range(3):
        wait_until(lambda: primary_status(primary, "Rpl_semi_sync_master_clients") == "1"
                   and semi_sync_on(), 60, "semi-sync on with the relay as its replica")
        committed: list[tuple[float, str]] = []   # (when the commit returned, its GTID)
        stop = threading.Event()

        def writer(stop: threading.Event, committed: list[tuple[float, str]]) -> None:
            conn = pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                                   autocommit=True)
            with conn, conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute(f"INSERT INTO s.t VALUES ({next(ids)})")
                    cur.execute("SELECT @@last_gtid")
                    committed.append((time.monotonic(), str(fetch_one(cur)[0])))

        thread = threading.Thread(target=writer, args=(stop, committed))
        thread.start()
        # the load gets going, then the kill lands at a random moment of it
        wait_until(functools.partial(going, committed), 30, "the load to get going")
        time.sleep(rng.uniform(0.05, 1.0))
        killed_at = time.monotonic()
        relay.kill9()
        stop.set()
        thread.join(30)
        acknowledged = [Gtid.parse(g) for t, g in committed if t < killed_at]
        assert len(acknowledged) > 10, "the load did not get going"
        on_disk = set(gtids_in(relay.segments()))
        missing = [g for g in acknowledged if g not in on_disk]
        assert not missing, f"committed on the primary but not in the relay log: {missing[:5]}"
        relay.start()
        wait_until(lambda: relay.http("/healthz")[0] == 200, 30, "the relay back")


SEMI_SYNC_REPLICA = {"rpl_semi_sync_slave_enabled": "ON", "gtid_strict_mode": "ON"}


def relay_status(relay: RelayProcess) -> dict[str, Any]:
    _, body = relay.http("/status")
    return dict(json.loads(body)) if body else {}


@pytest.mark.parametrize("ask", [True, False], ids=["acks", "headers-only"])
def test_a_semi_sync_replica_behind_the_relay(mariadb_factory: Callable[..., MariaDB],
                                              relay_factory: Callable[..., RelayProcess],
                                              ask: bool) -> None:
    # The relay answers the semi-sync variables as its own and speaks the semi-sync
    # primary protocol: the replica negotiates 0xEF headers (it stopped at once with
    # "Missing magic number for semi-sync packet" before); with [downstream] semi_sync it
    # is asked to acknowledge each transaction, and its acknowledgements are counted.
    primary = mariadb_factory(options=SEMI_SYNC_PRIMARY)
    relay = start_relay(relay_factory, primary, downstream={"semi_sync": ask})
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    replica = mariadb_factory(server_id=32, options=SEMI_SYNC_REPLICA)
    replicate_through(replica, relay.port)
    for i in range(40):
        primary.execute_many([f"INSERT INTO s.t VALUES ({i})"])
    wait_until(lambda: converged(primary, replica), 60, "the replica to converge")
    assert replica.query("SELECT COUNT(*) FROM s.t")[0][0] == 40
    if ask:
        assert primary_status(replica, "Rpl_semi_sync_slave_status") == "ON"
    with pymysql.connect(host="127.0.0.1", port=relay.port, user="repl",
                         password="relaypass") as conn, conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_%'")
        status = {str(k): str(v) for k, v in cur.fetchall()}
        cur.execute("SELECT @@rpl_semi_sync_master_enabled")
        enabled = str(cur.fetchall()[0][0])
    status_now = relay_status(relay)
    semi = status_now["downstream"]["semi_sync"]
    client = next(c for c in status_now["clients"] if c["file"] is not None)
    if ask:
        assert enabled in ("ON", "1")
        # every transaction acknowledged, counted once (42: the two DDL and 40 inserts)
        wait_until(lambda: relay_status(relay)["downstream"]["semi_sync"]["yes_tx"] >= 42, 30,
                   "the acknowledgements to be counted")
        assert semi["clients"] == 1 and client["semi_sync"]["requested"] >= 42
        assert status["Rpl_semi_sync_master_clients"] == "1"
        assert int(status["Rpl_semi_sync_master_yes_tx"]) >= 42
        assert "relay_downstream_semi_sync_acks_total" in relay.http("/metrics")[1]
    else:
        # As with a primary whose semi-sync is off: the replica still negotiates the
        # headers (it only checks that the variable exists), and is never asked for acks.
        assert enabled in ("OFF", "0") and semi["clients"] == 1
        assert client["semi_sync"]["requested"] == 0 and semi["yes_tx"] == 0
        assert status["Rpl_semi_sync_master_status"] == "OFF"


@pytest.mark.builds("machine", "mariadb-11.8")
def test_end_to_end_a_commit_waits_for_a_replica_behind_the_relay(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # semi_sync_wait_for_replicas = 1: the relay acknowledges to the primary only once a
    # downstream semi-sync replica acknowledged the transaction to the relay; without
    # one, it falls back to durable-only after semi_sync_timeout (counted) and returns
    # to waiting once the replica caught up.
    primary = mariadb_factory(options={**SEMI_SYNC_PRIMARY,
                                       "rpl_semi_sync_master_timeout": "60000"})
    relay = start_relay(relay_factory, primary, downstream={"semi_sync": True},
                        upstream={"semi_sync": True, "semi_sync_wait_for_replicas": 1,
                                  "semi_sync_timeout": "2s"})
    wait_until(lambda: primary_status(primary, "Rpl_semi_sync_master_clients") == "1", 30,
               "the relay registered as a semi-sync replica")
    # (no downstream replica yet: the first commit waits semi_sync_timeout, then falls back)
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    replica = mariadb_factory(server_id=32, options=SEMI_SYNC_REPLICA)
    replicate_through(replica, relay.port)
    wait_until(lambda: converged(primary, replica), 60, "the replica to converge")

    def up() -> dict[str, Any]:
        return dict(relay_status(relay)["upstream"])

    def commit(i: int) -> float:
        began = time.monotonic()
        primary.execute_many([f"INSERT INTO s.t VALUES ({i})"])
        return time.monotonic() - began

    # A fresh relay with no replica yet may have fallen back once: wait until it waits.
    primary.execute_many(["INSERT INTO s.t VALUES (-1)"])
    wait_until(lambda: not up()["semi_sync_fallen_back"], 30, "the relay to wait again")
    fallbacks = up()["semi_sync_fallbacks"]
    yes_before = int(primary_status(primary, "Rpl_semi_sync_master_yes_tx"))
    no_before = primary_status(primary, "Rpl_semi_sync_master_no_tx")
    down_before = relay_status(relay)["downstream"]["semi_sync"]["yes_tx"]
    slow = [commit(i) for i in range(20)]
    assert max(slow) < 2.0  # none waited for the timeout
    assert int(primary_status(primary, "Rpl_semi_sync_master_yes_tx")) - yes_before == 20
    assert primary_status(primary, "Rpl_semi_sync_master_no_tx") == no_before
    # each of them acknowledged by the replica before the relay acknowledged it
    assert relay_status(relay)["downstream"]["semi_sync"]["yes_tx"] - down_before >= 20
    assert up()["semi_sync_fallbacks"] == fallbacks
    # The replica goes away: the next commit waits semi_sync_timeout, then the relay
    # acknowledges on durability alone (the primary, with a longer timeout, stays semi-sync).
    replica.execute_many(["STOP SLAVE"])
    wait_until(lambda: relay_status(relay)["downstream"]["semi_sync"]["clients"] == 0, 30,
               "the replica's dump to end")
    assert commit(100) >= 1.5
    assert up()["semi_sync_fallbacks"] == fallbacks + 1 and up()["semi_sync_fallen_back"]
    assert commit(101) < 1.5  # fallen back: no more waiting
    assert primary_status(primary, "Rpl_semi_sync_master_no_tx") == no_before
    # It comes back and catches up: the relay waits for it again.
    replica.execute_many(["START SLAVE"])
    wait_until(lambda: converged(primary, replica), 60, "the replica to catch up")
    primary.execute_many(["INSERT INTO s.t VALUES (102)"])
    wait_until(lambda: not up()["semi_sync_fallen_back"], 30, "the relay to wait again")
    assert "relay_upstream_semisync_fallbacks_total" in relay.http("/metrics")[1]


def test_kill9_end_to_end_never_loses_a_commit_on_the_relay_or_its_replica(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # semi_sync_wait_for_replicas = 1: a commit the primary reported is on the relay's
    # disk and on the replica behind it, even when the relay is killed -9 under load.
    primary = mariadb_factory(options=SEMI_SYNC_PRIMARY)  # 5 s timeout
    relay = start_relay(relay_factory, primary, downstream={"semi_sync": True},
                        upstream={"semi_sync": True, "semi_sync_wait_for_replicas": 1,
                                  "semi_sync_timeout": "4s"})
    wait_until(lambda: primary_status(primary, "Rpl_semi_sync_master_clients") == "1", 30,
               "the relay registered as a semi-sync replica")
    replica = mariadb_factory(server_id=33, options=SEMI_SYNC_REPLICA)
    replicate_through(replica, relay.port)
    wait_until(lambda: relay_status(relay)["downstream"]["semi_sync"]["clients"] == 1, 30,
               "the replica's semi-sync dump")
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    committed: list[tuple[float, int, str]] = []   # (when it returned, its id, its GTID)
    stop = threading.Event()

    def writer() -> None:
        conn = pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                               autocommit=True)
        with conn, conn.cursor() as cur:
            for i in itertools.count():
                if stop.is_set():
                    return
                cur.execute(f"INSERT INTO s.t VALUES ({i})")
                cur.execute("SELECT @@last_gtid")
                committed.append((time.monotonic(), i, str(fetch_one(cur)[0])))

    thread = threading.Thread(target=writer)
    thread.start()
    wait_until(lambda: len(committed) > 50, 30, "the load to get going")
    time.sleep(random.Random(11).uniform(0.05, 0.5))
    killed_at = time.monotonic()
    relay.kill9()
    stop.set()
    thread.join(30)  # the commit in flight waits out the primary's timeout at worst
    acknowledged = [(i, Gtid.parse(g)) for t, i, g in committed if t < killed_at]
    assert len(acknowledged) > 50, "the load did not get going"
    on_disk = set(gtids_in(relay.segments()))
    missing = [g for _, g in acknowledged if g not in on_disk]
    assert not missing, f"committed on the primary but not in the relay log: {missing[:5]}"
    ids = {i for i, _ in acknowledged}

    def on_replica() -> bool:
        return ids <= {int(str(r[0])) for r in replica.query("SELECT id FROM s.t")}
    wait_until(on_replica, 30, "every acknowledged commit on the replica")
