"""Faults on the links between the relay and its replicas, under a workload: resets,
stalls longer than the relay's write_timeout, and one-byte-at-a-time delivery. Each
replica reconnects by itself and ends equal to the primary."""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from collections.abc import Callable

import pytest

from relay.binlog.constants import HEADER_LEN, ROWS_EVENT_TYPES, EventType
from relay.binlog.file import iter_file_events
from relay.testing.faultproxy import FaultProxy
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import caught_up, listening, start_relay

pytestmark = pytest.mark.integration


def more_than(bg: workload.Background, count: int) -> bool:
    return bg.count > count


def applied(replica: MariaDB) -> str:
    st = replica.slave_status()
    assert not st.get("Last_SQL_Error"), st
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0])


def test_replicas_behind_faulty_links_end_equal_to_the_primary(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary, downstream={"write_timeout": "2s"})
    proxies = [FaultProxy("127.0.0.1", relay.port).start() for _ in range(2)]
    replicas = [mariadb_factory(server_id=80 + i) for i in range(2)]
    try:
        for proxy, replica in zip(proxies, replicas, strict=True):
            replicate_through(replica, proxy.port)
        resetting, slow = proxies
        with workload.Background(primary) as bg:
            wait_until(lambda: bg.count > 50, 30, "the workload")
            slow.trickle(True)  # every byte of the stream its own write
            for _ in range(3):
                wait_until(functools.partial(more_than, bg, bg.count + 30), 30,
                           "more transactions")
                resetting.reset_all()
            wait_until(lambda: slow.connections >= 1 and bg.count > 200, 30, "the workload")
            slow.trickle(False)

            def timeouts() -> int:
                return int(relay.status().get("downstream", {}).get("ended", {})
                           .get("timeout", 0))
            dropped = timeouts()
            slow.stall(True)  # longer than write_timeout: the relay drops that client
            wait_until(lambda: timeouts() > dropped, 60,
                       "the relay to drop the stalled replica (write_timeout)")
            slow.stall(False)
            before = bg.count
            wait_until(lambda: bg.count > before + 50, 30, "more transactions")
            assert bg.error is None, bg.error
        assert resetting.resets >= 3
        assert slow.trickled > 10_000  # stream bytes that reached it one at a time
        target = primary.gtid_binlog_pos()
        for replica in replicas:
            wait_until(lambda r=replica: applied(r) == target, 120,  # type: ignore[misc]
                       f"replica {replica.server_id} to converge")
            for table in ("bg.t",):
                assert replica.query(f"CHECKSUM TABLE {table}") == primary.query(
                    f"CHECKSUM TABLE {table}")
        assert slow.connections >= 2  # it reconnected after the stall
    finally:
        for proxy in proxies:
            proxy.stop()


FILTERED = ("filtered", "pw-filtered")
FILTER_RULES = f"""
[[rules]]
name = "no-audit"
at = "send"
clients = ["{FILTERED[0]}"]
ignore_tables = ["shop.audit%"]
"""


def _at_relay_position(relay: RelayProcess, replica: MariaDB) -> bool:
    """The file/position replica applied everything the relay stored (and no error)."""
    st = replica.slave_status()
    assert st.get("Last_IO_Errno") == 0 and st.get("Last_SQL_Errno") == 0, (
        st.get("Last_IO_Error"), st.get("Last_SQL_Error"))
    status = relay.status().get("relay_log")
    if not status:
        return False
    return bool(st.get("Relay_Master_Log_File") == status["file"]
                and int(str(st.get("Exec_Master_Log_Pos") or 0)) == status["position"])


def _dump_starts(replica: MariaDB, segment: str) -> list[int]:
    """Where the replica's dumps of `segment` started: the positions of the relay's
    ROTATE events its relay log holds (each dump opens with one)."""
    starts = []
    for name in sorted(os.listdir(replica.datadir)):
        if not name.startswith("replica-relay.") or not name.split(".")[-1].isdigit():
            continue
        with open(os.path.join(replica.datadir, name), "rb") as f:
            for ev in iter_file_events(f, verify_crc=False):
                body = ev.data[HEADER_LEN:]
                if ev.data[4] == EventType.ROTATE and body[8:].startswith(segment.encode()):
                    starts.append(struct.unpack_from("<Q", body)[0])
    return starts


def test_a_file_position_replica_behind_a_filter_resumes_inside_a_transaction(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """The relay link of a MariaDB replica in file/position mode behind a send filter is
    cut inside a transaction of multi-table statements (a row of shop.items and one of
    the filtered shop.audit_log each: TABLE_MAP, TABLE_MAP, rows, rows). Wherever the cut
    falls, the replica reconnects at an event whose statement's TABLE_MAP came before the
    cut (the audit table's map or rows: the relay sent the items rows with the statement's
    end on them); the relay starts its rules at the transaction's first event and sends
    what a dump from there sends from that position on, and the replica ends with the
    primary's kept tables (issue 31 review, item 2: every such reconnect was refused with
    error 1236, "a rows event whose TABLE_MAP is not in the stream"). (A MariaDB replica
    itself refuses to resume inside one statement's run of rows events, from a primary
    too: "did not receive an expected Rows-log end-of-statement".)"""
    rows = 4000
    primary = mariadb_factory()
    primary.execute_many([
        "CREATE DATABASE shop",
        "CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(250))",
        "CREATE TABLE shop.audit_log (id INT PRIMARY KEY, msg VARCHAR(250))",
        f"INSERT INTO shop.items SELECT seq, REPEAT('i', 200) FROM shop.seq_1_to_{rows}",
        f"INSERT INTO shop.audit_log SELECT seq, REPEAT('a', 200) FROM shop.seq_1_to_{rows}",
    ])
    relay = relay_factory(primary.url, FILTER_RULES,
                          downstream={"listen": f"127.0.0.1:{free_port()}",
                                      "write_timeout": "5s", "catchup_wait": "3s"},
                          users={"repl": "relaypass", FILTERED[0]: FILTERED[1]}).start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    proxy = FaultProxy("127.0.0.1", relay.port).start()
    replica = mariadb_factory(server_id=90, options={"relay_log": "replica-relay",
                                                     "relay_log_purge": "0"})
    try:
        replica.replicate_from("127.0.0.1", proxy.port, user=FILTERED[0],
                               password=FILTERED[1], gtid=False)
        wait_until(lambda: caught_up(relay, primary) and _at_relay_position(relay, replica),
                   60, "the replica to catch up")
        # One transaction of some 3.5 MB stored, 2 MB sent: the cut falls inside it.
        proxy.cut_after(800_000)
        with contextlib.closing(primary.root()) as conn, conn.cursor() as cur:
            cur.execute("BEGIN")
            for i in range(1, rows + 1):
                cur.execute("UPDATE shop.items i JOIN shop.audit_log a ON a.id = i.id "
                            "SET i.name = REPEAT('j', 200), a.msg = REPEAT('b', 200) "
                            "WHERE i.id = %s", (i,))
            cur.execute("COMMIT")
        wait_until(lambda: proxy.cuts == 1, 60, "the link to be cut")
        wait_until(lambda: caught_up(relay, primary) and _at_relay_position(relay, replica),
                   90, "the replica to resume and catch up")
        # It did resume inside the transaction, at an event of a statement whose
        # TABLE_MAPs came before that offset.
        segment = relay.segments()[-1]
        resumed = [p for p in _dump_starts(replica, os.path.basename(segment)) if p > 4]
        with open(segment, "rb") as f:
            at = {ev.offset: ev.data[4] for ev in iter_file_events(f, verify_crc=False)}
        inside = {EventType.TABLE_MAP, *ROWS_EVENT_TYPES}
        assert any(at.get(p) in inside for p in resumed), (resumed, [at.get(p) for p in resumed])
        assert proxy.connections >= 2
        assert replica.query("CHECKSUM TABLE shop.items") == primary.query(
            "CHECKSUM TABLE shop.items")
        assert replica.query("SELECT COUNT(*) FROM shop.items WHERE name LIKE 'j%'") == [
            (rows,)]
        assert not replica.query("SHOW TABLES IN shop LIKE 'audit%'")
    finally:
        proxy.stop()
