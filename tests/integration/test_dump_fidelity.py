"""The dump as a primary sends it, compared with the primary itself: `mariadb-binlog
--read-from-remote-server` from GTID starts over two domains (some naming only one) reads
the same from the relay as from the primary once file names and positions are masked: the
FORMAT_DESCRIPTION's `created` (which tells a replica that the primary restarted and
makes it drop its temporary tables) and the artificial GTID_LIST as each domain's start
is passed included. A segment that follows a primary file from its start is that file's
copy, byte for byte, Binlog_checkpoint events between transactions included."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import threading
from collections.abc import Callable

import pymysql
import pytest

from relay.binlog.constants import EventType
from relay.testing.faultproxy import FaultProxy
from relay.testing.mariadb import MariaDB, find_binary
from tests.conftest import (
    RelayProcess,
    group_events,
    gtids_in,
    primary_binlogs,
    read_binlog,
    wait_until,
)
from tests.integration.common import caught_up, start_relay

pytestmark = pytest.mark.integration


def remote_binlog(port: int, user: str, password: str, start: str, first_file: str,
                  stop: str = "", *options: str) -> str:
    res = subprocess.run(
        [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server",
         "--host=127.0.0.1", f"--port={port}", f"--user={user}", f"--password={password}",
         f"--start-position={start}", *([f"--stop-position={stop}"] if stop else []),
         *options, "--to-last-log", first_file],
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
    # 10.11 only: an 11.4+ primary starts a GTID dump past the file's GTID_LIST (its
    # binlog GTID index: ROTATE to that position, no header events; seen with 11.8.9),
    # where the relay starts as 10.11 does; replicas of either version take both.
    primary = mariadb_factory()  # a fresh server: its first binlog's header says "created"
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    for i in range(3):
        primary.execute_many(["SET SESSION gtid_domain_id = 1",
                              f"INSERT INTO s.t VALUES ({100 + i})"])
        primary.execute_many([f"INSERT INTO s.t VALUES ({i})"])
    relay = start_relay(relay_factory, primary)
    wait_until(lambda: caught_up(relay, primary), 30, "the relay to catch up")
    first = str(primary.query("SHOW BINARY LOGS")[0][0])
    for start, stop in (("1-1-2", ""), ("0-1-3,1-1-1", ""), ("0-1-4,1-1-2", ""),
                        ("0-1-2,1-1-1", "0-1-4,1-1-2"), ("1-1-1", "0-1-3,1-1-2")):
        want = remote_binlog(primary.port, primary.repl_user, primary.repl_password, start,
                             first, stop)
        got = remote_binlog(relay.port, "repl", "relaypass", start, "relay-bin.000001", stop)
        # The client holds transactions past the file's start: no "created" (which
        # mariadb-binlog shows as "at startup", and a replica as a primary restart).
        assert "at startup" not in want
        # Event for event as the primary: an artificial GTID_LIST as each requested
        # domain's GTID is passed, the same transactions. (CRCs differ where positions do.)
        assert [_no_crc(line) for line in decoded(got)] == \
            [_no_crc(line) for line in decoded(want)], (start, stop)
        assert sum("Write_rows" in line for line in decoded(got)) > 0
        assert "\n#Q> INSERT INTO s.t" in got  # (the ANNOTATE_ROWS it asks for by default)
    # A client that does not ask for ANNOTATE_ROWS gets none (a hole, as from a MariaDB
    # primary), and the same events otherwise.
    skip = "--skip-annotate-row-events"
    want = remote_binlog(primary.port, primary.repl_user, primary.repl_password, "1-1-1",
                         first, "", skip)
    got = remote_binlog(relay.port, "repl", "relaypass", "1-1-1", "relay-bin.000001", "", skip)
    assert "#Q>" not in want and "#Q>" not in got
    assert [_no_crc(line) for line in decoded(got)] == [_no_crc(line) for line in decoded(want)]
    assert sum("Write_rows" in line for line in decoded(got)) == 5  # 3 of domain 0, 2 of 1


def test_a_segment_that_follows_a_primary_file_is_its_copy(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # After a rotation the primary writes a Binlog_checkpoint into its new file once the
    # old file's transactions are safe in the engine. Its background thread picks the
    # moment: right after the header when nothing was in flight, between transactions when
    # commits were still settling. So rotate under a steady writer until a file holds one
    # between transactions; the relay keeps it there.
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY, v TEXT)"])
    written = [0]
    done = threading.Event()

    def write() -> None:
        with contextlib.closing(primary.root()) as conn, conn.cursor() as cur:
            while not done.is_set():
                cur.execute("INSERT INTO s.t VALUES (%s, REPEAT('x', 100))", (written[0],))
                written[0] += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    index = 0
    try:
        for _ in range(30):  # each rotation under load: a mid-file checkpoint is likely
            wait_until(functools.partial(_passed, written, written[0] + 50), 30,
                       "50 more commits")
            primary.execute_many(["FLUSH BINARY LOGS"])
            index = _file_with_a_checkpoint_between_transactions(primary)
            if index:
                break
    finally:
        done.set()
        writer.join(timeout=30)
    assert index, "no rotation under load put a Binlog_checkpoint between transactions"
    primary.execute_many(["FLUSH BINARY LOGS", "INSERT INTO s.t VALUES (-1, 'next file')"])
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
    name = primary.binlog_files()[index]
    with open(primary.binlog_path(name), "rb") as f:
        theirs = f.read()
    with open(relay.segments()[index], "rb") as f:
        ours = f.read()
    # Byte for byte up to the ROTATE that closes the file, which names the next file:
    # the primary's, the relay's.
    rotate_at = len(theirs) - int.from_bytes(read_binlog_last_size(theirs), "little")
    assert ours[:rotate_at] == theirs[:rotate_at]
    assert ours[rotate_at + 4] == theirs[rotate_at + 4] == EventType.ROTATE
    assert ours[rotate_at:].endswith(os.path.basename(relay.segments()[index + 1]).encode() +
                                     ours[-4:])


@pytest.mark.builds("machine", "mariadb-11.8")
def test_two_binlog_checkpoints_at_a_files_head_stay_two(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # After a rotation under load the primary's new file may open with two
    # Binlog_checkpoint events back to back: the previous file's (its transactions were
    # not yet safe in the engine when the file was made) and, up to a second later, its
    # own. The relay's link is reset right after each rotation, so it reconnects inside
    # new files' headers: before the second checkpoint was written, or with a GTID
    # position at the file's start (the primary then sends the file from past its
    # GTID_LIST). Each segment keeps the file's checkpoints as the file has them.
    primary = mariadb_factory()
    proxy = FaultProxy("127.0.0.1", primary.port).start()
    try:
        relay = relay_factory(f"mysql://{primary.repl_user}:{primary.repl_password}"
                              f"@127.0.0.1:{proxy.port}").start()
        primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY "
                              "AUTO_INCREMENT, v TEXT)"])
        written = [0]
        done = threading.Event()

        def write() -> None:
            with contextlib.closing(primary.root()) as conn, conn.cursor() as cur:
                while not done.is_set():
                    cur.execute("INSERT INTO s.t (v) VALUES (REPEAT('x', 100))")
                    written[0] += 1

        writers = [threading.Thread(target=write, daemon=True) for _ in range(2)]
        for writer in writers:
            writer.start()
        doubled = 0
        try:
            for rotations in range(1, 301):   # until two files opened with two
                wait_until(functools.partial(_passed, written, written[0] + 30), 30,
                           "30 more commits")
                primary.execute_many(["FLUSH BINARY LOGS"])
                proxy.reset_all()
                closed = primary_binlogs(primary)[-2]
                doubled += [ev[4] for ev in _head(closed)].count(
                    EventType.BINLOG_CHECKPOINT) == 2
                if doubled >= 2 and rotations >= 20:
                    break
        finally:
            done.set()
            for writer in writers:
                writer.join(timeout=30)
        primary.execute_many(["FLUSH BINARY LOGS", "INSERT INTO s.t (v) VALUES ('last')"])
        wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")
        assert relay.status()["upstream"]["reconnects"] >= 10
    finally:
        proxy.stop()
    assert doubled >= 2, "rotations under load seldom opened a file with two checkpoints"
    # Each primary file with transactions and the segment that holds its first one (a
    # file with none may have no segment: the relay opens one for a transaction, or for a
    # header it has read to its end).
    segment_of = {gtids_in([seg])[0]: seg for seg in relay.segments() if gtids_in([seg])}
    files = primary_binlogs(primary)
    pairs = [(f, segment_of[gtids_in([f])[0]]) for f in files[:-1] if gtids_in([f])]
    assert len(pairs) >= 20
    for theirs, ours in pairs:
        head = _head(theirs)
        # The same header events, the checkpoints as the file has them (each names a
        # primary file; their CRCs differ where their positions do: an 11.8 primary sends
        # its first file from past its GTID_LIST, which the relay writes 2 bytes shorter).
        assert [ev[4] for ev in _head(ours)] == [ev[4] for ev in head], theirs
        assert [ev[19:-4] for ev in _head(ours) if ev[4] == EventType.BINLOG_CHECKPOINT] \
            == [ev[19:-4] for ev in head if ev[4] == EventType.BINLOG_CHECKPOINT], theirs
    assert group_events(relay.segments()) == group_events(files)


def _head(path: str) -> list[bytes]:
    """A binlog file's events before its first transaction."""
    head = []
    for ev in read_binlog(path):
        if ev[4] == EventType.GTID:
            break
        head.append(ev)
    return head


def _passed(count: list[int], mark: int) -> bool:
    return count[0] >= mark


def _file_with_a_checkpoint_between_transactions(primary: MariaDB) -> int:
    """The index of a closed binlog file (one rotated away from) with a Binlog_checkpoint
    after its first transaction, or 0."""
    files = primary.binlog_files()
    for index, name in enumerate(files[1:-1], start=1):
        kinds = [ev[4] for ev in read_binlog(primary.binlog_path(name))]
        first_gtid = kinds.index(EventType.GTID) if EventType.GTID in kinds else len(kinds)
        if any(kind == EventType.BINLOG_CHECKPOINT for kind in kinds[first_gtid:]):
            return index
    return 0


def read_binlog_last_size(data: bytes) -> bytes:
    """The size field of a binlog file's last event (walking the file from its start)."""
    pos, last = 4, 4
    while pos < len(data):
        last = pos
        pos += int.from_bytes(data[pos + 9 : pos + 13], "little")
    return data[last + 9 : last + 13]


def test_temporary_tables_live_across_a_reconnect_and_a_rotation(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    # Statement-based: a temporary table on the primary lives in the replica's SQL thread.
    # The replica replicates domain 1 only and reconnects naming only domain 1, while
    # the relay's first segment (the primary's first file after its start: "created" set)
    # begins with a domain 0 transaction. A FORMAT_DESCRIPTION with created set would
    # make it drop its temporary tables; the statements using them would then fail.
    primary = mariadb_factory(options={"binlog_format": "STATEMENT"})
    primary.execute_many(["CREATE DATABASE d0"])  # domain 0 opens the first file
    relay = start_relay(relay_factory, primary)
    replica = mariadb_factory(server_id=31)
    replica.execute_many([
        f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={relay.port}, "
        "MASTER_USER='repl', MASTER_PASSWORD='relaypass', MASTER_CONNECT_RETRY=1, "
        "MASTER_USE_GTID=slave_pos, DO_DOMAIN_IDS=(1)", "START SLAVE"])
    session = pymysql.connect(host="127.0.0.1", port=primary.port, user="root",
                              autocommit=True)
    with session, session.cursor() as cur:
        for sql in ["SET SESSION gtid_domain_id = 1", "CREATE DATABASE s",
                    "CREATE TABLE s.t (id INT PRIMARY KEY)",
                    "CREATE TEMPORARY TABLE s.tmp (id INT)",
                    "INSERT INTO s.tmp VALUES (1), (2)"]:
            cur.execute(sql)

        def domain1(pos: str) -> str:
            return ",".join(g for g in pos.split(",") if g.startswith("1-"))

        def applied() -> bool:
            st = replica.slave_status()
            assert st.get("Last_SQL_Error") == "" and st.get("Last_IO_Error") == "", st
            return domain1(str(replica.query("SELECT @@gtid_slave_pos")[0][0])) == \
                domain1(primary.gtid_binlog_pos())

        wait_until(applied, 60, "the replica to apply domain 1")
        # Reconnect by GTID naming domain 1 only (the domain it replicates), then use the
        # temporary table.
        replica.execute_many([
            "STOP SLAVE",
            f"SET GLOBAL gtid_slave_pos = '{domain1(primary.gtid_binlog_pos())}'",
            "START SLAVE"])
        cur.execute("INSERT INTO s.t SELECT id FROM s.tmp")
        # ... and across a rotation of the primary's binlog (and the relay's segment).
        primary.execute_many(["FLUSH BINARY LOGS"])
        cur.execute("INSERT INTO s.t SELECT id + 10 FROM s.tmp")
        wait_until(applied, 60, "the replica to apply what used the temporary table")
    assert [r[0] for r in replica.query("SELECT id FROM s.t ORDER BY id")] == [1, 2, 11, 12]
    assert len(relay.segments()) >= 2
