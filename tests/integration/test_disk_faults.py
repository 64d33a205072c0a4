"""A full disk and a failing disk under a real workload.

Full: the relay log on a tmpfs of its own, filled during a workload. Ingest pauses at the
last durable transaction (nothing torn on disk or visible), /readyz says why, a replica
behind the relay keeps being served, and ingest resumes by itself when space returns (a
file removed, PURGE BINARY LOGS): the log ends with the primary's transactions, no gap,
no duplicate, the same event bodies.

Failing: EIO injected at the relay log's write and fsync seam (RELAY_FAULT): ingest stops
with the file and errno named, readers see only what was durable, and a restart without
the fault recovers and catches up.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator

import pymysql
import pytest

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import (
    RelayProcess,
    group_events,
    gtids_in,
    primary_binlogs,
    replicate_through,
    wait_until,
)
from tests.integration.common import caught_up, listening, relay_client, start_relay
from tests.integration.test_retention import write_mb

pytestmark = pytest.mark.integration

ADMIN_USER = '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\nadmin = true\n'


@contextlib.contextmanager
def small_filesystem(path: str, size: str) -> Iterator[str]:
    """A tmpfs of `size` mounted at `path` (root only, as CI runs: there, not being root
    fails the test instead of skipping it)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            raise AssertionError("the full-disk test mounts a tmpfs and needs root; CI "
                                 "(.ci/run) runs as root")
        pytest.skip("mounting a small file system for the relay log needs root")
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def readyz(relay: RelayProcess) -> tuple[int, str]:
    return relay.http("/readyz")


def disk_full(relay: RelayProcess) -> str:
    return str(relay.status().get("retention", {}).get("disk_full", ""))


def assert_log_is_the_primarys_tail(relay: RelayProcess, primary: MariaDB) -> None:
    """The relay's segments hold the primary's last transactions, each once, with the same
    event bodies (earlier ones may have been purged)."""
    expected = gtids_in(primary_binlogs(primary))
    got = gtids_in(relay.segments())
    assert got and len(got) == len(set(got)), "a transaction was stored twice"
    assert got == expected[-len(got):], "a gap or a reordering"
    mine = group_events(relay.segments())
    theirs = group_events(primary_binlogs(primary))
    assert mine == theirs[-len(mine):]
    for seg in relay.segments():
        assert scan_segment(seg).error is None


def test_a_full_disk_pauses_ingest_and_space_resumes_it(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    primary = mariadb_factory()
    replica = mariadb_factory(server_id=41)
    relay = relay_factory(primary.url, ADMIN_USER, relaylog={"segment_size": "1MiB"},
                          downstream={"listen": f"127.0.0.1:{free_port()}"})
    with small_filesystem(relay.data_dir, "10m"):
        ballast = os.path.join(relay.data_dir, "ballast")
        with open(ballast, "wb") as f:
            f.write(b"\0" * (3 << 20))
        relay.start()
        try:
            wait_until(lambda: listening(relay.port), 30, "the relay to listen")
            replicate_through(replica, relay.port)
            done = threading.Event()
            errors: list[BaseException] = []

            def workload() -> None:
                try:
                    write_mb(primary, 16, 0)
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    done.set()
            writer = threading.Thread(target=workload, daemon=True)
            writer.start()
            wait_until(lambda: bool(disk_full(relay)), 120, "the disk to fill up")
            code, body = readyz(relay)
            assert code == 503 and "disk full" in body, body
            # Paused at a whole transaction: the last segment ends where one ends, and a
            # replica is served everything the relay holds.
            last = relay.segments()[-1]
            scan = scan_segment(last)
            assert scan.error is None and scan.committed == os.path.getsize(last)
            held = GtidState.parse(relay.status()["relay_log"]["gtid_pos"])
            wait_until(lambda: GtidState.parse(str(replica.query(
                "SELECT @@gtid_slave_pos")[0][0])) == held, 60,
                "the replica to get what the relay holds while paused")
            # Space returns: the operator's file first, then PURGE, as often as needed.
            os.unlink(ballast)
            def purge_while_full() -> bool:
                """PURGE as often as the disk is full (a replica still reading an old
                segment refuses it until it moves on); done once the workload ended and
                the relay holds all of it."""
                if not disk_full(relay):
                    return done.is_set() and caught_up(relay, primary)
                names = [os.path.basename(p) for p in relay.segments()]
                with contextlib.closing(relay_client(relay.port)) as conn, \
                        conn.cursor() as cur, contextlib.suppress(pymysql.Error):
                    cur.execute(f"PURGE BINARY LOGS TO '{names[-1]}'")
                return False
            wait_until(purge_while_full, 300, "the relay to hold the whole workload",
                       interval=0.5)
            assert not errors, errors
            wait_until(lambda: readyz(relay)[0] == 200, 30, "the relay to be ready again")
            assert relay.status()["retention"]["disk_full_pauses"] >= 1
            assert_log_is_the_primarys_tail(relay, primary)
            wait_until(lambda: str(replica.query("SELECT @@gtid_slave_pos")[0][0])
                       == primary.gtid_binlog_pos(), 60, "the replica to converge")
            assert replica.query("CHECKSUM TABLE r.t") == primary.query("CHECKSUM TABLE r.t")
        finally:
            relay.stop()


@pytest.mark.parametrize("fault", ["write:EIO:after=1500000", "fsync:EIO:after=5"])
def test_an_io_error_stops_ingest_and_a_restart_recovers(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        fault: str) -> None:
    primary = mariadb_factory()
    replica = mariadb_factory(server_id=42)
    relay = start_relay(relay_factory, primary)
    relay.stop()
    relay.env = {"RELAY_FAULT": fault}
    relay.start()
    wait_until(lambda: relay.status().get("ready") is not None, 30, "the relay")
    replicate_through(replica, relay.port)
    def stopped() -> bool:
        return bool(relay.status().get("upstream", {}).get("stopped"))
    next_id = 0
    while not stopped() and next_id < 40 * 32:  # group commit: syncs are fewer than commits
        next_id = write_mb(primary, 1, next_id)
    wait_until(stopped, 60, "ingest to stop on the injected EIO")
    reason = str(relay.status()["upstream"]["stopped"])
    assert "errno 5" in reason and relay.data_dir in reason, reason
    code, body = readyz(relay)
    assert code == 503 and "errno 5" in body
    visible = GtidState.parse(relay.status()["relay_log"]["gtid_pos"])
    wait_until(lambda: GtidState.parse(str(replica.query(
        "SELECT @@gtid_slave_pos")[0][0])) == visible, 60, "the replica to get what is durable")
    assert visible != GtidState.parse(primary.gtid_binlog_pos())
    # The replica never got more than what was durable when the fault hit.
    assert GtidState.parse(str(replica.query("SELECT @@gtid_slave_pos")[0][0])) == visible
    relay.stop()
    relay.env = {}
    relay.start()
    wait_until(lambda: caught_up(relay, primary), 60, "the restarted relay to catch up")
    expected = gtids_in(primary_binlogs(primary))
    assert gtids_in(relay.segments()) == expected
    wait_until(lambda: str(replica.query("SELECT @@gtid_slave_pos")[0][0])
               == primary.gtid_binlog_pos(), 60, "the replica to converge")
