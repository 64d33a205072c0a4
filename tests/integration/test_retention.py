"""Retention against real servers: a size cap held back by a stalled mysqlbinlog client
and then enforced by the hard cap (the client gets a purged-binlog error); PURGE BINARY
LOGS TO / BEFORE refused while a tap subscriber's persisted hold needs a segment, and
allowed once its subscriber_ttl passed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest

from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.testing.mariadb import MariaDB, find_binary
from tests.conftest import (
    RelayProcess,
    group_events,
    primary_binlogs,
    replicate_through,
    wait_until,
)
from tests.integration.common import caught_up, relay_client, start_relay
from tests.integration.test_operations import samples
from tests.integration.test_tap import caught_up as tap_caught_up
from tests.integration.test_tap import start_tap_relay

pytestmark = pytest.mark.integration

ROW = 32 << 10


def write_mb(primary: MariaDB, megabytes: int, start: int) -> int:
    """Transactions of one 32 KiB row each, `megabytes` of them; the next free id."""
    rows = megabytes * (1 << 20) // ROW
    with contextlib.closing(pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                                            autocommit=True)) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS r")
        cur.execute("CREATE TABLE IF NOT EXISTS r.t (id INT PRIMARY KEY, v MEDIUMBLOB)")
        for i in range(start, start + rows):
            cur.execute("INSERT INTO r.t VALUES (%s, REPEAT('v', %s))", (i, ROW))
    return start + rows


def retention(relay: RelayProcess) -> dict[str, Any]:
    return dict(relay.status().get("retention", {}))


def segment_numbers(relay: RelayProcess) -> list[int]:
    return [int(p.rsplit(".", 1)[1]) for p in relay.segments()]


@contextlib.contextmanager
def stalled_mysqlbinlog(relay: RelayProcess, out_dir: str
                        ) -> Iterator[subprocess.Popen[bytes]]:
    """`mysqlbinlog --read-from-remote-server --stop-never` through the relay from its
    oldest segment, stopped (SIGSTOP) once its dump runs: a reader that stays where the
    socket buffers leave it. Retention may purge that segment just before the client asks
    for it (the client then ends with "purged"): it starts again from the new oldest."""
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(5):
            first = os.path.basename(relay.segments()[0])
            proc = subprocess.Popen(
                [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
                 "--host=127.0.0.1", f"--port={relay.port}", "--user=repl",
                 "--password=relaypass", "--raw", "--stop-never",
                 f"--result-file={out_dir}/", first],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            def started_or_ended(p: subprocess.Popen[bytes] = proc) -> bool:
                return p.poll() is not None or any(
                    c["file"] for c in relay.status().get("clients", []))

            wait_until(started_or_ended, 30, "mysqlbinlog's dump to start")
            if proc.poll() is None:
                break
            proc.wait(10)
        assert proc is not None and proc.poll() is None, "mysqlbinlog could not start"
        proc.send_signal(signal.SIGSTOP)
        yield proc
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        if proc is not None:
            proc.wait(10)


def test_a_stalled_reader_holds_retention_back_until_the_hard_cap(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary,
                        relaylog={"segment_size": "256KiB", "retention_size": "2MiB",
                                  "retention_max_size": "16MiB",
                                  "retention_check_interval": "200ms"},
                        downstream={"write_timeout": "300s"})
    next_id = write_mb(primary, 4, 0)
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
    # The size cap holds: what is left is within 2 MiB and one segment.
    wait_until(lambda: retention(relay).get("purged_segments", 0) > 0
               and relay.status()["relay_log"]["size_bytes"] <= (2 << 20) + (512 << 10), 30,
               "size retention to purge")
    with stalled_mysqlbinlog(relay, str(tmp_path)) as client:
        # Past the socket buffers between them, the client's reader stays put.
        next_id = write_mb(primary, 14, next_id)
        wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")

        def held() -> list[dict[str, Any]]:
            return [h for h in retention(relay).get("held_back", [])
                    if h["reader"].startswith("client 127.0.0.1")]
        wait_until(lambda: bool(held()), 30, "the stalled client to hold retention back")
        pinned = held()[0]["segment"]
        assert segment_numbers(relay)[0] <= pinned
        assert relay.status()["relay_log"]["size_bytes"] > 4 << 20  # over the soft cap
        _, metrics = relay.http("/metrics")
        assert 'relay_retention_reader_held_back_bytes{kind="live",reader="client 127.0.0.1' \
            in metrics
        # The total is the largest reader's hold, in one scrape (/status is another moment).
        held_by = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("relay_retention_reader_held_back_bytes{")]
        assert samples(metrics)["relay_retention_held_back_bytes"] == max(held_by)
        shown = subprocess.run(
            [sys.executable, "-m", "relay.cli", "status", "--url",
             f"http://127.0.0.1:{relay.metrics_port}"], capture_output=True, text=True,
            timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert "held back" in shown.stdout and "client 127.0.0.1" in shown.stdout, shown
        assert "retention" in shown.stdout and "size_bytes 2.0 MiB" in shown.stdout
        # Past the hard cap the reader's segment goes anyway, and the loss is recorded.
        next_id = write_mb(primary, 20, next_id)
        wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
        wait_until(lambda: any(x["segment"] == pinned for x in retention(relay)["losses"]),
                   30, "the hard cap to take the stalled client's segment")
        assert segment_numbers(relay)[0] > pinned
        wait_until(lambda: relay.status()["relay_log"]["size_bytes"] <= (16 << 20) + (256 << 10),
                   30, "the log to shrink under the hard cap")
        _, metrics = relay.http("/metrics")
        assert 'relay_retention_reader_losses_total{kind="live"} 1.0' in metrics
        # Woken up, the client reads what was in flight, then gets the purged-log error.
        client.send_signal(signal.SIGCONT)
        out, _ = client.communicate(timeout=60)
        assert client.returncode != 0
        assert b"purged" in out, out[-2000:]

    # SHOW BINARY LOGS lists the segments on disk (retention may purge one, and the log
    # rotate, between the two looks: they agree once it rests)
    def listed() -> list[str]:
        with contextlib.closing(relay_client(relay.port)) as conn, conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [str(r[0]) for r in cur.fetchall()]
    wait_until(lambda: listed() == [os.path.basename(p) for p in relay.segments()], 30,
               "SHOW BINARY LOGS to list the segments on disk")


def test_purge_binary_logs_respects_a_tap_hold_until_its_ttl(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    ttl = 8.0
    relay, endpoint = start_tap_relay(
        relay_factory, primary, '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
        'admin = true\n[[downstream.users]]\nname = "plain"\npassword = "plainpw"\n',
        relaylog={"segment_size": "64KiB"}, subscriber_ttl=f"{ttl:g}s")
    next_id = write_mb(primary, 1, 0)
    wait_until(tap_caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        early = tap.resolve("0-1-5")
        tap.ack("job", early)  # then the subscriber goes away; its hold is persisted
    write_mb(primary, 1, next_id)
    wait_until(tap_caught_up(endpoint, primary), 60, "the relay to catch up")
    names = [os.path.basename(p) for p in relay.segments()]
    assert len(names) > 10
    # Only an admin user may purge, as a server asks for BINLOG ADMIN.
    with contextlib.closing(relay_client(relay.port, user="plain", password="plainpw")) \
            as conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as no:
        cur.execute(f"PURGE BINARY LOGS TO '{names[-1]}'")
    assert no.value.args[0] == 1227
    with contextlib.closing(relay_client(relay.port)) as conn, conn.cursor() as cur:
        with pytest.raises(pymysql.err.OperationalError) as refused:
            cur.execute(f"PURGE BINARY LOGS TO '{names[-1]}'")
        assert refused.value.args[0] == 1378
        assert "tap/reader/job" in refused.value.args[1]
        cur.execute("SHOW BINARY LOGS")
        left = [str(r[0]) for r in cur.fetchall()]
        held = early >> 32  # tap positions are (segment << 32) | offset
        assert int(left[0].rsplit(".", 1)[1]) == held  # purged up to the hold, no further
        with pytest.raises(pymysql.err.OperationalError) as unknown:
            cur.execute("PURGE BINARY LOGS TO 'relay-bin.999999'")
        assert unknown.value.args[0] == 1373
        # Once the subscriber has not acknowledged for subscriber_ttl, it holds nothing.
        def holding() -> bool:
            return any(r["name"] == "tap/reader/job" for r in relay.status()["relay_log"]["readers"])
        wait_until(lambda: not holding(), 3 * ttl, "the hold to pass subscriber_ttl")
        cur.execute("PURGE BINARY LOGS BEFORE '2999-01-01 00:00:00'")
        cur.execute("SHOW BINARY LOGS")
        assert [str(r[0]) for r in cur.fetchall()] == [names[-1]]
    with TapClient(endpoint, "reader", "s3cret") as tap, pytest.raises(TapError) as gone:
        list(tap.fetch_frames(early, "latest"))
    assert gone.value.code == "not_in_log"
    assert retention(relay)["purged_segments"] == len(names) - 1


def test_compressed_segments_serve_replicas_mysqlbinlog_and_the_tap(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    primary = mariadb_factory()
    relay, endpoint = start_tap_relay(
        relay_factory, primary, '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n',
        relaylog={"segment_size": "64KiB", "compress_after": 1,
                  "retention_check_interval": "200ms"})
    write_mb(primary, 2, 0)
    wait_until(tap_caught_up(endpoint, primary), 60, "the relay to catch up")
    wait_until(lambda: retention(relay).get("compressed_segments", 0)
               >= len(relay.segments()) - 1, 30, "the sealed segments to be compressed")
    stored = [p for p in relay.segments() if os.path.exists(p + ".zst")]
    assert len(stored) == len(relay.segments()) - 1 and len(stored) > 10
    before, after = (retention(relay)["compressed_bytes"][k] for k in ("before", "after"))
    assert after < before / 5  # REPEAT('v', ...) rows compress well
    # A replica from nothing reads every segment, compressed or not.
    replica = mariadb_factory(server_id=91)
    replicate_through(replica, relay.port)
    wait_until(lambda: str(replica.query("SELECT @@gtid_slave_pos")[0][0])
               == primary.gtid_binlog_pos(), 60, "the replica to catch up")
    assert replica.query("CHECKSUM TABLE r.t") == primary.query("CHECKSUM TABLE r.t")
    # mysqlbinlog through the relay gets the primary's events, event for event.
    out = str(tmp_path)
    subprocess.run([find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
                    "--host=127.0.0.1", f"--port={relay.port}", "--user=repl",
                    "--password=relaypass", "--raw", "--to-last-log",
                    f"--result-file={out}/", os.path.basename(relay.segments()[0])],
                   check=True, timeout=60, capture_output=True)
    copies = sorted(os.path.join(out, n) for n in os.listdir(out))
    assert group_events(copies) == group_events(primary_binlogs(primary))
    # The tap reads them too.
    with TapClient(endpoint, "reader", "s3cret") as tap:
        rows = sum(len(m["changes"]) for m in tap.fetch_changes("earliest", "latest"))
    assert rows == 2 * (1 << 20) // ROW
