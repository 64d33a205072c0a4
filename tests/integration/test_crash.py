"""kill -9 at random moments: no lost, torn or duplicated transaction."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from relay.testing.kill_drill import run_kill_drill
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

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["transaction", "off"])
def test_kill9_loop_loses_and_duplicates_nothing(mariadb_factory: Callable[..., MariaDB],
                                                 relay_factory: Callable[..., RelayProcess],
                                                 sync: str) -> None:
    primary = mariadb_factory(options={"max_binlog_size": "1M"})  # rotations during the loop
    relay = relay_factory(primary.url, relaylog={"sync": sync, "segment_size": "256KiB"})
    rng = random.Random(20261122)
    with workload.Background(primary) as bg:
        for i in range(8):  # (a hundred with replicas attached: bench/kill9_loop.py)
            relay.start()
            if i % 5 != 4:  # most kills hit a relay in mid-stream ...
                wait_until(lambda: streams(relay) >= 1, 30, "the relay to stream")
                time.sleep(rng.uniform(0.05, 1.0))
            else:  # ... some during start-up and recovery
                time.sleep(rng.uniform(0.05, 0.6))
            relay.kill9()
            assert bg.error is None, bg.error
        assert bg.count > 100
    relay.start()
    target = GtidState.parse(primary.gtid_binlog_pos())
    # it recovers and streams again after the last kill; the segments alone may already
    # hold the target (sync = "off" leaves the writes in the page cache through kill -9)
    wait_until(lambda: streams(relay) >= 1, 30, "the relay to stream after the last kill")
    wait_until(lambda: bool(relay.segments())
               and scan_segment(relay.segments()[-1]).state == target, 60, "final catch-up")
    assert relay.stop() == 0

    expected = gtids_in(primary_binlogs(primary))
    got = gtids_in(relay.segments())
    assert len(got) == len(set(got)), "a transaction was stored twice"
    assert got == expected
    for seg in relay.segments():
        scan = scan_segment(seg)
        assert scan.error is None, scan.error
        mysqlbinlog_reads(seg)


def streams(relay: RelayProcess) -> int:
    """Dump streams the running relay process has started (0 while it is not answering)."""
    return int(relay.status().get("upstream", {}).get("streams", 0))


@pytest.mark.slow
def test_kill9_loop_with_replicas_and_mysqlbinlog_attached(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    """Ten kill -9 cycles (bench/kill9_loop.py runs a hundred) under a steady workload
    with two GTID-strict replicas and mysqlbinlog --stop-never reading through the relay."""
    primary = mariadb_factory(options={"max_binlog_size": "1M"})
    relay = relay_factory(primary.url, users={"repl": "relaypass"},
                          relaylog={"segment_size": "512KiB"},
                          downstream={"listen": f"127.0.0.1:{free_port()}"})
    relay.start()
    wait_until(lambda: streams(relay) >= 1, 30, "the relay to stream")
    replicas = [mariadb_factory(server_id=60 + i, options={"gtid_strict_mode": "ON"})
                for i in range(2)]
    for replica in replicas:
        replicate_through(replica, relay.port)
    relay.kill9()
    report = run_kill_drill(
        primary, replicas, start_relay=relay.start, kill_relay=relay.kill9,
        relay_segments=relay.segments, metrics_port=relay.metrics_port,
        relay_port=relay.port, user="repl", password="relaypass",
        work_dir=str(tmp_path), cycles=10)
    assert report.cycles == 10 and report.kills_streaming >= 8
    assert report.transactions > 50
    assert len(report.checks) == 3, report.checks
    for seg in relay.segments():
        assert scan_segment(seg).error is None
