"""Helpers the integration tests share: a relay in front of a real primary, and the checks
that a replica behind it (or the relay itself) caught up."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pymysql

from relay.binlog.gtid import GtidState
from relay.relaylog.recovery import scan_segment
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, slave_status, wait_until

# The tables workload.mixed writes.
TABLES = ("shop.items", "shop.log")


def start_relay(relay_factory: Callable[..., RelayProcess], primary: MariaDB,
                **extra: dict[str, object]) -> RelayProcess:
    """A relay on `primary` that serves replicas (user repl / relaypass), once it listens."""
    settings: dict[str, dict[str, object]] = {
        "downstream": {"listen": f"127.0.0.1:{free_port()}", "write_timeout": "5s",
                       "handshake_timeout": "2s", "catchup_wait": "3s"},
        "users": {"repl": "relaypass"},
    }
    for k, v in extra.items():
        settings.setdefault(k, {}).update(v)
    relay = relay_factory(primary.url, **settings).start()

    def up() -> bool:
        if relay.proc is not None and relay.proc.poll() is not None:
            raise AssertionError(f"the relay exited ({relay.proc.returncode}) before "
                                 f"listening:\n{relay.output()[-3000:]}")
        return listening(relay.port)
    wait_until(up, 30, "the relay to listen")
    return relay


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def caught_up(relay: RelayProcess, primary: MariaDB) -> bool:
    """The relay's last segment ends at the primary's GTID position."""
    segs = relay.segments()
    if not segs:
        return False
    return scan_segment(segs[-1]).state == GtidState.parse(primary.gtid_binlog_pos())


def converged(primary: MariaDB, replica: MariaDB) -> bool:
    st = slave_status(replica)
    assert st.get("Last_IO_Error") == "" and st.get("Last_SQL_Error") == "", st
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == primary.gtid_binlog_pos()


def assert_same_data(primary: MariaDB, replica: MariaDB) -> None:
    for table in TABLES:
        assert replica.query(f"CHECKSUM TABLE {table}")[0] == primary.query(
            f"CHECKSUM TABLE {table}")[0], table


def relay_client(port: int, password: str = "relaypass", user: str = "repl"
                 ) -> pymysql.Connection:
    """An SQL connection to the relay (as its replication user unless told)."""
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=password,
                           connect_timeout=5)


def fetch_one(cur: pymysql.cursors.Cursor) -> tuple[Any, ...]:
    """The next row, which must be there."""
    row = cur.fetchone()
    assert row is not None
    return row
