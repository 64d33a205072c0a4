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
        for _ in range(20):
            relay.start()
            time.sleep(rng.uniform(0.5, 2.0))
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
    out = relay.output()
    # Most kills hit a relay that had recovered its log and was streaming (some land
    # while the interpreter is still starting, which is a fine moment to die too).
    assert out.count("streaming from") >= 15
