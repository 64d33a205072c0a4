"""The relay mirrors a real primary's binlog: same transactions, same bytes (but log_pos and
checksums), readable by mysqlbinlog, in both checksum modes, with rotations."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from relay.testing.mariadb import MariaDB
from tests.conftest import (
    RelayProcess,
    group_events,
    gtids_in,
    mysqlbinlog_reads,
    primary_binlogs,
    wait_until,
)
from tests.integration import workload
from tests.integration.common import caught_up

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("checksum", ["CRC32", "NONE"])
def test_mirror_mixed_workload(mariadb_factory: Callable[..., MariaDB],
                               relay_factory: Callable[..., RelayProcess], checksum: str) -> None:
    primary = mariadb_factory(options={"binlog_checksum": checksum})
    # A small segment size makes the relay rotate on its own as well as with the primary.
    relay = relay_factory(primary.url, relaylog={"segment_size": "64KiB"}).start()
    workload.mixed(primary, rounds=3)
    wait_until(lambda: caught_up(relay, primary), 60, "relay to catch up")
    assert relay.stop() == 0

    expected = group_events(primary_binlogs(primary))
    got = group_events(relay.segments())
    assert len(expected) > 500
    assert got == expected
    assert gtids_in(relay.segments()) == gtids_in(primary_binlogs(primary))
    assert len(relay.segments()) > len(primary.binlog_files())  # own rotations happened
    for seg in relay.segments():
        mysqlbinlog_reads(seg)
    out = relay.output()  # the operator's log names the source, never its password
    assert "streaming from repl@127.0.0.1" in out and "replpass" not in out


def test_restart_resumes_without_gap_or_duplicate(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url).start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "first catch-up")
    assert relay.stop() == 0
    workload.mixed(primary, rounds=2)  # written while the relay is down
    relay.start()
    wait_until(lambda: caught_up(relay, primary), 60, "catch-up after restart")
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "live catch-up")
    assert relay.stop() == 0
    assert gtids_in(relay.segments()) == gtids_in(primary_binlogs(primary))
    assert group_events(relay.segments()) == group_events(primary_binlogs(primary))


def test_start_current_skips_history(mariadb_factory: Callable[..., MariaDB],
                                     relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    workload.mixed(primary, rounds=1)
    before = primary.gtid_binlog_pos()
    relay = relay_factory(primary.url, upstream={"start": "current"}).start()
    wait_until(lambda: bool(relay.segments()), 30, "first segment")
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "catch-up")
    assert relay.stop() == 0
    all_gtids = gtids_in(primary_binlogs(primary))
    start = GtidState.parse(before)
    assert gtids_in(relay.segments()) == [g for g in all_gtids if not start.contains(g)]
    first = scan_segment(relay.segments()[0])
    assert first.error is None
    for seg in relay.segments():
        mysqlbinlog_reads(seg)


@pytest.mark.slow
def test_large_transaction_and_16mib_event(mariadb_factory: Callable[..., MariaDB],
                                           relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url, relaylog={"sync": "off"}).start()
    workload.large(primary)
    wait_until(lambda: caught_up(relay, primary), 120, "large transactions")
    assert relay.stop() == 0
    sizes = [len(e.body) for e in group_events(relay.segments())]
    assert max(sizes) > 16 * 1048576  # one event crossed the 16 MiB packet limit
    assert sum(os.path.getsize(s) for s in relay.segments()) > 100 * 1048576
    assert group_events(relay.segments()) == group_events(primary_binlogs(primary))
    for seg in relay.segments():
        mysqlbinlog_reads(seg)
