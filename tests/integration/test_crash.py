"""kill -9 at random moments: no lost, torn or duplicated transaction."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, gtids_in, mysqlbinlog_reads, primary_binlogs, wait_until
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
        for i in range(20):
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
    wait_until(lambda: bool(relay.segments())
               and scan_segment(relay.segments()[-1]).state == target, 60, "final catch-up")
    assert streams(relay) >= 1  # it recovered and streamed again after the last kill
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
