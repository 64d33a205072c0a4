"""kill -9 at random moments: no lost, torn or duplicated transaction."""

from __future__ import annotations

import random
import time

import pytest

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from tests.conftest import gtids_in, mysqlbinlog_reads, primary_binlogs, wait_until
from tests.integration import workload

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["transaction", "off"])
def test_kill9_loop_loses_and_duplicates_nothing(mariadb_factory, relay_factory,  # type: ignore[no-untyped-def]
                                                 sync: str) -> None:
    primary = mariadb_factory(options={"max_binlog_size": "1M"})  # rotations during the loop
    relay = relay_factory(primary.url, relaylog={"sync": sync, "segment_size": "256KiB"})
    rng = random.Random(20261122)
    with workload.Background(primary) as bg:
        for i in range(20):
            streaming = relay.output().count("streaming from")
            relay.start()
            if i % 5 != 4:  # most kills hit a relay in mid-stream ...
                wait_until(lambda n=streaming: relay.output().count("streaming from") > n, 30,
                           "the relay to stream")
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
    assert relay.stop() == 0

    expected = gtids_in(primary_binlogs(primary))
    got = gtids_in(relay.segments())
    assert len(got) == len(set(got)), "a transaction was stored twice"
    assert got == expected
    for seg in relay.segments():
        scan = scan_segment(seg)
        assert scan.error is None, scan.error
        mysqlbinlog_reads(seg)
    assert relay.output().count("streaming from") >= 17
