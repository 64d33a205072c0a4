"""Bad input gets a clear error and loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from relay.binlog.constants import EventType
from relay.relaylog.recovery import scan_segment
from relay.testing.faultproxy import FaultProxy
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import (
    RelayProcess,
    group_events,
    gtids_in,
    primary_binlogs,
    read_binlog,
    wait_until,
)
from tests.integration import workload
from tests.integration.common import caught_up

pytestmark = pytest.mark.integration

FAST_FAIL = {"max_retries": 2, "retry_initial": "0.1s", "retry_max": "0.2s",
             "connect_timeout": "2s"}


def test_wrong_password_is_clear_and_retried(mariadb_factory: Callable[..., MariaDB],
                                             relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    url = primary.url.replace(primary.repl_password, "not-the-password")
    relay = relay_factory(url, upstream=FAST_FAIL).start()
    assert relay.wait_exit(60) == 4
    out = relay.output()
    attempts = [ln for ln in out.splitlines() if "relay.upstream:" in ln and "access denied" in ln]
    assert len(attempts) == 3  # the first attempt and max_retries = 2 more
    assert f"repl@127.0.0.1:{primary.port}" in out
    assert "giving up after 2 failed attempts ([upstream] max_retries)" in out
    assert "not-the-password" not in out


def test_unreachable_primary_is_clear_and_retried(
        relay_factory: Callable[..., RelayProcess]) -> None:
    port = free_port()
    relay = relay_factory(f"mysql://repl:x@127.0.0.1:{port}", upstream=FAST_FAIL).start()
    assert relay.wait_exit(60) == 4
    out = relay.output()
    attempts = [ln for ln in out.splitlines()
                if "relay.upstream:" in ln and f"repl@127.0.0.1:{port}: cannot connect" in ln]
    assert len(attempts) == 3
    assert "giving up after 2 failed attempts" in out


def test_relay_survives_primary_restart(mariadb_factory: Callable[..., MariaDB],
                                        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url).start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "catch-up before the restart")
    primary.stop()
    primary.start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "catch-up after primary restart")
    # The relay saw its stream end (how depends on when the primary closed it), came back
    # by itself and streams again.
    up = relay.status()["upstream"]
    assert up["connected"] is True and up["streams"] >= 2, up
    assert up["reconnects"] >= 1 and not {"fatal", "protocol"} & set(up["reconnect_reasons"]), up
    assert relay.stop() == 0
    assert gtids_in(relay.segments()) == gtids_in(primary_binlogs(primary))


def test_corrupt_byte_is_reported_with_file_and_offset(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url).start()
    workload.mixed(primary, rounds=1)
    wait_until(lambda: caught_up(relay, primary), 60, "catch-up")
    assert relay.stop() == 0
    seg = relay.segments()[0]
    # Flip one byte inside a committed rows event in the middle of the segment.
    offset = 4
    victims = []
    for data in read_binlog(seg):
        if data[4] == EventType.WRITE_ROWS_V1:
            victims.append(offset)
        offset += len(data)
    target = victims[len(victims) // 2]
    with open(seg, "r+b") as f:
        f.seek(target + 30)
        b = f.read(1)
        f.seek(target + 30)
        f.write(bytes((b[0] ^ 0x40,)))
    assert scan_segment(seg).error is not None
    relay.start()
    assert relay.wait_exit(30) == 3
    out = relay.output()
    assert f"corrupt relay log {seg} at offset {target}" in out
    res = subprocess.run([sys.executable, "-m", "relay.cli", "inspect-log", relay.data_dir],
                         capture_output=True, text=True)
    assert res.returncode == 1 and f"at offset {target}" in res.stdout
    # Nothing was thrown away: the damaged file is still all there for inspection.
    assert os.path.getsize(seg) > target


def test_link_cut_inside_a_transaction(mariadb_factory: Callable[..., MariaDB],
                                       relay_factory: Callable[..., RelayProcess]) -> None:
    """The upstream link dies while a 60 MB transaction streams: the half-written
    transaction is discarded and fetched again, and the log stays exactly the primary's."""
    primary = mariadb_factory()
    proxy = FaultProxy("127.0.0.1", primary.port).start()
    try:
        url = f"mysql://{primary.repl_user}:{primary.repl_password}@127.0.0.1:{proxy.port}"
        relay = relay_factory(url, relaylog={"sync": "off"}).start()
        workload.mixed(primary, rounds=1)
        wait_until(lambda: caught_up(relay, primary), 60, "first catch-up")
        proxy.cut_after(8 << 20)  # well inside the next transaction
        primary.execute_many([
            "CREATE TABLE shop.bulk (id INT PRIMARY KEY, v LONGBLOB)",
            "INSERT INTO shop.bulk SELECT seq, REPEAT('q', 1048576) FROM mysql.seq_1_to_60"])
        wait_until(lambda: caught_up(relay, primary), 120, "catch-up after the cut")
        # the partial transaction was dropped, then fetched whole again
        assert relay.status()["relay_log"]["discarded_transactions"] >= 1
        assert relay.stop() == 0
        assert proxy.cuts == 1 and proxy.connections >= 2
        assert group_events(relay.segments()) == group_events(primary_binlogs(primary))
        for seg in relay.segments():
            assert scan_segment(seg).error is None
    finally:
        proxy.stop()
