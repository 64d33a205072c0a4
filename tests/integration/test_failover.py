"""Failover to a passive primary: the relay resumes from its own GTID state on the next
source, and a replica and a tap subscriber behind the relay, connected throughout, see one
continuous stream."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from relay.binlog.changes import RowsStatement
from relay.relaylog.recovery import scan_segment
from relay.sources import open_source
from relay.tap.client import TapClient
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import (
    RelayProcess,
    gtids_in,
    mysqlbinlog_reads,
    primary_binlogs,
    replicate_through,
    wait_until,
)
from tests.integration import workload
from tests.integration.common import assert_same_data, converged, start_relay

pytestmark = pytest.mark.integration


@pytest.mark.builds("machine", "mariadb-11.8")
def test_failover_to_passive_primary(mariadb_factory: Callable[..., MariaDB],
                                     relay_factory: Callable[..., RelayProcess]) -> None:
    active = mariadb_factory(server_id=1)
    passive = mariadb_factory(server_id=2, options={"log_slave_updates": "ON"})
    passive.replicate_from("127.0.0.1", active.port, user=active.repl_user,
                           password=active.repl_password)
    tap_endpoint = f"127.0.0.1:{free_port()}"
    relay = start_relay(relay_factory, active, upstream={
        "sources": [active.url, passive.url], "failover_after": "2s", "retry_max": "0.5s"},
        tap={"listen": tap_endpoint})
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)
    wait_until(lambda: _tap_up(tap_endpoint), 30, "the tap to listen")
    subscriber = TapClient(tap_endpoint, timeout=30).connect()
    seen: list[tuple[str, int]] = []   # (gtid, row changes) of each whole transaction
    stop = threading.Event()

    def follow() -> None:
        changes = 0
        for frame in subscriber.subscribe("earliest"):
            if frame["k"] == "tx":
                changes += len(frame["changes"])
                if frame["last"]:
                    seen.append((frame["gtid"], changes))
                    changes = 0
            if stop.is_set() or frame["k"] == "end":
                return
    follower = threading.Thread(target=follow)
    follower.start()

    workload.mixed(active, rounds=1)
    wait_until(lambda: converged(active, replica) and converged(active, passive), 60,
               "everyone in sync with the active primary")
    active.kill()  # the active primary dies
    passive.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])  # promote the passive one
    workload.mixed(passive, rounds=1)  # new writes: GTIDs 0-2-N continue the domain
    wait_until(lambda: converged(passive, replica), 90, "the replica, through the relay")
    assert_same_data(passive, replica)
    # The subscriber, on one connection from before the failover, saw the passive
    # primary's history (A's transactions, then B's) once each, in order.
    expected = _transactions(passive)
    assert [g for g, _ in expected] == [str(g) for g in gtids_in(primary_binlogs(passive))]
    wait_until(lambda: len(seen) >= len(expected), 60, "the tap subscriber to catch up")
    stop.set()
    follower.join(30)
    subscriber.close()
    assert seen == expected
    # The relay failed over to the passive primary and streams from it.
    up = relay.status()["upstream"]
    assert up["source"] == f"127.0.0.1:{passive.port}" and up["connected"] is True, up
    assert up["failovers"] >= 1, up
    assert str(up["last_failover"]).startswith(f"to repl@127.0.0.1:{passive.port}:"), up
    assert up["streams"] >= 2, up  # the first on the active primary, then the passive one
    # The passive primary's files have other offsets: events were re-positioned.
    metrics = relay.http("/metrics")[1]
    rewritten = [ln for ln in metrics.splitlines()
                 if ln.startswith("relay_relaylog_rewritten_events_total")]
    assert rewritten and float(rewritten[0].split()[-1]) > 0
    assert relay.stop() == 0
    got = gtids_in(relay.segments())
    assert len(got) == len(set(got))
    assert {g.server_id for g in got} == {1, 2}
    for seg in relay.segments():
        assert scan_segment(seg).error is None
        mysqlbinlog_reads(seg)


def _transactions(server: MariaDB) -> list[tuple[str | None, int]]:
    """(gtid, row changes) of each transaction in a server's own binlog, in order."""
    index = "file://" + os.path.join(server.datadir, "mariadb-bin.index")
    return [(tx.gtid, sum(len(list(st.changes())) for st in tx.statements()
                          if isinstance(st, RowsStatement)))
            for tx in open_source(index).transactions()]


def _tap_up(endpoint: str) -> bool:
    try:
        TapClient(endpoint, timeout=5).connect().close()
    except OSError:
        return False
    return True
