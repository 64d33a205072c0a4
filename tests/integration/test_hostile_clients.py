"""Hostile bytes on the relay's ports, against one running relay: packet lengths of
16 MiB - 1 repeated, positions of 2^63 and 2^64 - 1, a client that sends one byte a
second, handshakes that never finish, ten thousand connections at once, and the same on
the tap. Each gets a clear error or is closed; the relay neither crashes nor grows, and
the clients that behave are served throughout."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import time
from collections.abc import Callable, Iterator

import msgpack
import pymysql
import pytest

from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import caught_up, listening, relay_client
from tests.integration.test_tap import USERS

pytestmark = pytest.mark.integration

HANDSHAKE = 2.0


def rss_kib(relay: RelayProcess) -> int:
    assert relay.proc is not None
    with open(f"/proc/{relay.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the peer closes `sock` (reading and dropping what it sends)."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    with contextlib.suppress(ConnectionError):
        while sock.recv(65536):
            pass
    return time.monotonic() - t0


@contextlib.contextmanager
def connected(port: int) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        yield s


def still_serving(relay: RelayProcess, primary: MariaDB) -> None:
    assert relay.proc is not None and relay.proc.poll() is None, relay.output()[-3000:]
    assert relay.http("/healthz")[0] == 200
    with contextlib.closing(relay_client(relay.port)) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        assert cur.fetchone() == (primary.gtid_binlog_pos(),)


def test_hostile_clients_get_errors_and_the_relay_stays_up(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE h", "CREATE TABLE h.t (id INT PRIMARY KEY)",
                          "INSERT INTO h.t VALUES (1), (2)"])
    tap_port = free_port()
    relay = relay_factory(
        primary.url, USERS, users={"repl": "relaypass"},
        downstream={"listen": f"127.0.0.1:{free_port()}", "max_clients": 64,
                    "handshake_timeout": f"{HANDSHAKE:g}s"},
        tap={"listen": f"127.0.0.1:{tap_port}", "handshake_timeout": f"{HANDSHAKE:g}s",
             "max_clients": 16}).start()
    wait_until(lambda: listening(relay.port) and listening(tap_port), 30, "the relay")
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
    still_serving(relay, primary)
    baseline = rss_kib(relay)

    # Packet lengths of 16 MiB - 1, over and over: refused before anything is buffered.
    with connected(relay.port) as s:
        s.recv(4096)  # the greeting
        with contextlib.suppress(OSError):
            for _ in range(64):
                s.sendall(b"\xff\xff\xff\x01" + b"\0" * (1 << 20))
        assert closed_within(s, 10) < 10
    # A handshake that never finishes, and one that comes a byte a second.
    with connected(relay.port) as idle, connected(relay.port) as slow:
        idle.recv(4096)
        slow.recv(4096)
        response = struct.pack("<IIB23x", 0x000FA685, 1 << 24, 33) + b"repl\0\0"
        t0 = time.monotonic()
        with contextlib.suppress(OSError):
            for b in struct.pack("<I", len(response))[:3] + b"\x01" + response:
                slow.send(bytes((b,)))
                time.sleep(0.5)
                if time.monotonic() - t0 > HANDSHAKE + 3:
                    break
        assert time.monotonic() - t0 < HANDSHAKE + 3
        assert closed_within(idle, HANDSHAKE + 3) < HANDSHAKE + 3
    still_serving(relay, primary)

    # Positions of 2^63 and 2^64 - 1 on the SQL port: errors, not crashes.
    with contextlib.closing(relay_client(relay.port)) as conn, conn.cursor() as cur:
        for statement in ("SHOW BINLOG EVENTS IN 'relay-bin.000001' FROM 9223372036854775808",
                          "SHOW BINLOG EVENTS IN 'relay-bin.000001' FROM 18446744073709551615",
                          "SHOW BINLOG EVENTS IN 'relay-bin.000001' FROM 4 LIMIT "
                          "9223372036854775807, 9223372036854775807",
                          "SELECT BINLOG_GTID_POS('relay-bin.000001', 9223372036854775808)",
                          "SELECT BINLOG_GTID_POS('relay-bin.999999', 18446744073709551615)",
                          "SET @slave_connect_state = '0-1-18446744073709551616'"):
            with contextlib.suppress(pymysql.err.MySQLError):
                cur.execute(statement)
                cur.fetchall()
    # A replica asking from GTID seq 2^64 - 1: refused once the catch-up wait is over.
    with contextlib.closing(relay_client(relay.port)) as conn, conn.cursor() as cur:
        cur.execute("SET @slave_connect_state = '0-1-18446744073709551615'")
        cur.execute("SET @master_binlog_checksum = 'CRC32'")
    still_serving(relay, primary)

    # The tap: a 4 GiB frame length, garbage, positions out of range, no login in time.
    with connected(tap_port) as s:
        s.recv(4096)
        s.sendall(b"\xff\xff\xff\xff" + b"\x81" * 4096)
        assert closed_within(s, 10) < 10
    with connected(tap_port) as s:
        s.recv(4096)
        assert closed_within(s, HANDSHAKE + 3) < HANDSHAKE + 3
    with TapClient(f"127.0.0.1:{tap_port}", "reader", "s3cret") as tap:
        for at in (2**63, 2**64 - 1, -1):
            with pytest.raises(TapError):
                tap.resolve(at)
            with pytest.raises(TapError):
                list(tap.fetch_frames(at, "latest"))
        assert tap.ping() > 0
    with connected(tap_port) as s:  # a frame of msgpack that is no request
        s.recv(4096)
        body = msgpack.packb([1, 2, 3])
        s.sendall(struct.pack(">I", len(body)) + body)
        s.settimeout(5)
        assert s.recv(4096)  # an error frame; the connection may go on

    # Ten thousand connections held open at once: max_clients are served, the rest turned
    # away. They come in waves of 500, each once the relay has taken the last: a flood
    # faster than the relay accepts overflows the kernel's accept queue (1024), and what
    # the kernel drops then waits out SYN-ACK retransmissions for up to a minute (on a
    # machine busy with other tests too), which says nothing about the relay.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 12000), hard))
    many: list[socket.socket] = []

    def taken() -> int:  # served or turned away: no longer in the kernel's queue
        downstream = relay.status().get("downstream", {})
        return int(downstream.get("accepted", 0)) + int(downstream.get("rejected", 0))
    try:
        start = taken()
        for _ in range(20):
            for _ in range(500):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", relay.port))
                many.append(s)
            # At most 400 left queued, so the next wave keeps the queue under 1024.
            wait_until(lambda: taken() - start + 400 >= len(many), 60,
                       "the relay to take the last wave of connections")
        wait_until(lambda: relay.status().get("downstream", {}).get("rejected", 0)
                   + 64 >= 9_000, 120,
                   "the relay to turn the connections over max_clients away")
        status = relay.status()
        assert len(status["clients"]) <= 64
        assert rss_kib(relay) < baseline + 200 * 1024, (baseline, rss_kib(relay))
    finally:
        for s in many:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wait_until(lambda: _can_connect(relay), 30, "the relay to take clients again")
    still_serving(relay, primary)
    assert rss_kib(relay) < baseline + 200 * 1024


def _can_connect(relay: RelayProcess) -> bool:
    try:
        with contextlib.closing(relay_client(relay.port)):
            return True
    except pymysql.err.MySQLError:
        return False
