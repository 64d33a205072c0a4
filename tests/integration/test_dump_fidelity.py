"""The dump as a primary sends it, compared with the primary itself: `mariadb-binlog
--read-from-remote-server` from GTID starts over two domains (some naming only one) reads
the same from the relay as from the primary once file names and positions are masked: the
FORMAT_DESCRIPTION's `created` (which tells a replica that the primary restarted and
makes it drop its temporary tables) and the artificial GTID_LIST as each domain's start
is passed included."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import pytest

from relay.testing.mariadb import MariaDB, find_binary
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import caught_up, start_relay

pytestmark = pytest.mark.integration


def remote_binlog(port: int, user: str, password: str, start: str, first_file: str) -> str:
    res = subprocess.run(
        [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
         "--host=127.0.0.1", f"--port={port}", f"--user={user}", f"--password={password}",
         f"--start-position={start}", "--to-last-log", first_file],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def decoded(text: str) -> list[str]:
    """The output with what differs by design masked: file names, positions, server ids
    in headers, timestamps of artificial events."""
    out = []
    for line in text.splitlines():
        if line.startswith("# at ") or line.startswith("#Q>"):
            continue
        line = re.sub(r"(mariadb|relay)-bin\.\d+", "{file}", line)
        line = re.sub(r"end_log_pos \d+", "end_log_pos N", line)
        line = re.sub(r"^#\d{6} ?\s?\d+:\d+:\d+", "#{time}", line)
        line = re.sub(r"server id \d+", "server id S", line)
        out.append(line)
    return out


def _no_crc(line: str) -> str:
    return re.sub(r"CRC32 0x[0-9a-f]{8}", "CRC32 X", line)


def test_a_gtid_start_naming_some_domains_reads_as_from_the_primary(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()  # a fresh server: its first binlog's header says "created"
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    for i in range(3):
        primary.execute_many(["SET SESSION gtid_domain_id = 1",
                              f"INSERT INTO s.t VALUES ({100 + i})"])
        primary.execute_many([f"INSERT INTO s.t VALUES ({i})"])
    relay = start_relay(relay_factory, primary)
    wait_until(lambda: caught_up(relay, primary), 30, "the relay to catch up")
    first = str(primary.query("SHOW BINARY LOGS")[0][0])
    for start in ("1-1-2", "0-1-3,1-1-1", "0-1-4,1-1-2"):
        want = remote_binlog(primary.port, primary.repl_user, primary.repl_password, start,
                             first)
        got = remote_binlog(relay.port, "repl", "relaypass", start, "relay-bin.000001")
        # The client holds transactions past the file's start: no "created" (which
        # mariadb-binlog shows as "at startup", and a replica as a primary restart).
        assert "at startup" not in want
        # Event for event as the primary: an artificial GTID_LIST as each requested
        # domain's GTID is passed, the same transactions. (CRCs differ where positions do.)
        assert [_no_crc(line) for line in decoded(got)] == \
            [_no_crc(line) for line in decoded(want)], start
        assert sum("Write_rows" in line for line in decoded(got)) > 0
