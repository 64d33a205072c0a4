"""Bad input gets a clear error and loses nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

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

# max_retries = 2: the first attempt and two more, then exit status 4 (README). One to two
# seconds between attempts, so that /status, polled while the relay retries, shows each
# count of failed attempts.
FEW_RETRIES = {"max_retries": 2, "retry_initial": "2s", "retry_max": "2s",
               "connect_timeout": "2s"}


def upstream_until_exit(relay: RelayProcess, timeout: float) -> list[dict[str, Any]]:
    """/status's upstream section, each time it answered, until the relay exited."""
    seen: list[dict[str, Any]] = []

    def exited() -> bool:
        status = relay.status()
        if status:
            seen.append(status["upstream"])
        return relay.proc is not None and relay.proc.poll() is not None

    wait_until(exited, timeout, "the relay to give up", interval=0.05)
    return seen


def cli_error(out: str) -> str:
    """The error `relay run` printed on stderr as it exited ("relay: ..."; the log's lines
    start with a timestamp)."""
    lines = [ln for ln in out.splitlines() if ln.startswith("relay: ")]
    assert lines, out[-3000:]
    return lines[-1]


def assert_gave_up_after_three_attempts(seen: list[dict[str, Any]], kind: str) -> None:
    """While the relay retried, /status counted each failed attempt under `kind` (the
    upstream reconnect reason); it exited at the third (which /status may show for the
    moment between counting it and exiting)."""
    failed = [up for up in seen if up["reconnects"]]
    assert failed and not any(up["connected"] for up in seen), seen
    assert max(up["reconnects"] for up in seen) in (2, 3), seen
    # ... for a moment only: a relay that went on to a fourth attempt would show 3 for the
    # whole retry wait (retry_max), some 20 polls of 50 ms
    assert sum(up["reconnects"] == 3 for up in seen) <= 3, seen
    assert all(up["reconnect_reasons"] == {kind: up["reconnects"]} for up in failed), failed


def access_denied_errors(primary: MariaDB) -> int:
    return int(str(primary.query("SHOW GLOBAL STATUS LIKE 'Access_denied_errors'")[0][1]))


def test_wrong_password_is_clear_and_retried(mariadb_factory: Callable[..., MariaDB],
                                             relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    url = primary.url.replace(primary.repl_password, "not-the-password")
    denied = access_denied_errors(primary)
    relay = relay_factory(url, upstream=FEW_RETRIES).start()
    seen = upstream_until_exit(relay, 60)
    assert relay.wait_exit(10) == 4
    # The primary refused the first attempt and max_retries = 2 more; /status called them
    # "fatal" (access denied) while the relay retried.
    assert access_denied_errors(primary) - denied == 3
    assert_gave_up_after_three_attempts(seen, "fatal")
    # Its exit message gives the reason /status gave, which names the source.
    message = cli_error(relay.output())
    assert message.endswith(seen[-1]["last_error"]), (message, seen[-1])
    assert f"repl@127.0.0.1:{primary.port}" in seen[-1]["last_error"]
    # An absence: the log is where a leaked password would show.
    assert "not-the-password" not in relay.output()


def test_unreachable_primary_is_clear_and_retried(
        relay_factory: Callable[..., RelayProcess]) -> None:
    port = free_port()
    relay = relay_factory(f"mysql://repl:x@127.0.0.1:{port}", upstream=FEW_RETRIES).start()
    seen = upstream_until_exit(relay, 60)
    assert relay.wait_exit(10) == 4
    # Each refused connection was a retriable failure ("upstream"), three in all.
    assert_gave_up_after_three_attempts(seen, "upstream")
    message = cli_error(relay.output())
    assert message.endswith(seen[-1]["last_error"]), (message, seen[-1])
    assert seen[-1]["source"] == f"127.0.0.1:{port}"
    assert f"repl@127.0.0.1:{port}" in seen[-1]["last_error"]


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
    error = scan_segment(seg).error
    assert error is not None and error.offset == target  # the damaged event's start
    relay.start()
    assert relay.wait_exit(30) == 3  # README: a corrupt relay log is exit status 3
    # Its exit message (stderr, the README's "reported with the file and offset") names
    # the file and the damaged event's offset.
    message = cli_error(relay.output())
    assert seg in message and re.search(rf"\b{target}\b", message.replace(seg, "")), message
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
