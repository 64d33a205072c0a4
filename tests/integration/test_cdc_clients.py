"""CDC libraries pointed at the relay read what they read from the primary.

Two libraries from the package registries, in two languages, each with its documented
MariaDB settings: python-mysql-replication (PyPI) and @vlasky/zongji (npm, installed into
tests/cdc by scripts/setup). Each reads the row changes of a workload with every column type
family from the primary and from a relay of it, by file/position and by GTID, and the two
readings must be equal. Only the address changes between them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, wait_until
from tests.integration import typed_tables as T
from tests.integration.common import fetch_one, start_relay

pytestmark = pytest.mark.integration

SCHEMA = "cdc_types"
STOP_TABLE = f"{SCHEMA}.zz_stop"
CDC_USER, CDC_PASSWORD = "cdc", "cdcpw"
NODE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "cdc")


@pytest.fixture
def primary_and_relay(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> Iterator[tuple[MariaDB, RelayProcess]]:
    primary = mariadb_factory()
    primary.execute_many([
        # the relay's metadata look-ups run as its upstream account, which reads metadata
        # and no rows (docs/security.md)
        "GRANT REFERENCES ON *.* TO 'repl'@'%'",
        f"CREATE USER '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{CDC_USER}'@'%'",
    ])
    T.workload(primary, SCHEMA)
    primary.execute_many([f"CREATE TABLE {STOP_TABLE} (id INT PRIMARY KEY)",
                          f"INSERT INTO {STOP_TABLE} VALUES (1)"])
    # a primary's net_write_timeout (60 s): the Python library decodes 20 MB values slowly
    relay = start_relay(relay_factory, primary, users={CDC_USER: CDC_PASSWORD},
                        downstream={"write_timeout": "60s"})
    target = primary.gtid_binlog_pos()
    wait_until(lambda: _relay_gtid(relay) == target, 60, "the relay to hold the workload")
    yield primary, relay
    relay.stop()


def _relay_gtid(relay: RelayProcess, ssl: dict[str, str] | None = None) -> str:
    import pymysql

    try:
        conn = pymysql.connect(host="127.0.0.1", port=relay.port, user=CDC_USER,
                               password=CDC_PASSWORD, ssl=ssl)
    except pymysql.MySQLError:
        return ""
    with conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        return str(fetch_one(cur)[0])


def _expected_tables() -> set[str]:
    return {f"{SCHEMA}.{t.name}" for t in T.TABLES}


def _read_pmr(port: int, start: dict[str, str] | None = None, *,
              ssl: dict[str, str] | None = None,
              stop: str = STOP_TABLE) -> list[tuple[str, str, str]]:
    """python-mysql-replication as its README configures it for MariaDB, following the
    stream (blocking, as a CDC tool runs) until the stop table's row arrives.

    Not BINLOG_DUMP_NON_BLOCK: the library's MariaDB dump packet carries one byte beyond its
    stated length, which a primary never reads; when the primary closes the connection at
    the end of a non-blocking dump, that unread byte makes the kernel reset the connection,
    the library loses the stream's tail, reconnects and reads it all again (duplicates,
    under load). The relay discards such bytes, so it is not affected; the comparison must
    not depend on the primary's race."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    settings: dict[str, Any] = {"host": "127.0.0.1", "port": port, "user": CDC_USER,
                                "password": CDC_PASSWORD}
    if ssl is not None:
        settings["ssl"] = ssl
    stream = BinLogStreamReader(
        connection_settings=settings, server_id=4343, is_mariadb=True, blocking=True,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], **(start or {}))
    rows: list[tuple[str, str, str]] = []
    try:
        for event in stream:
            table = f"{event.schema}.{event.table}"
            for row in event.rows:
                rows.append((type(event).__name__, table, repr(row)))
            if table == stop:
                break
    finally:
        stream.close()
    return rows


@pytest.mark.parametrize("start", [{}, {"auto_position": "0-1-3"}], ids=["file", "gtid"])
def test_python_mysql_replication_reads_the_same_rows(
        primary_and_relay: tuple[MariaDB, RelayProcess], start: dict[str, str]) -> None:
    primary, relay = primary_and_relay
    from_primary = _read_pmr(primary.port, start)
    from_relay = _read_pmr(relay.port, start)
    assert {table for _, table, _ in from_primary} >= _expected_tables() | {STOP_TABLE}
    assert len(from_relay) == len(from_primary)
    for ours, theirs in zip(from_relay, from_primary, strict=True):
        assert ours == theirs


def _first_binlog(port: int) -> str:
    """The first file of SHOW BINARY LOGS, as a user configuring the tool would look it up."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user=CDC_USER, password=CDC_PASSWORD)
    with conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return str(fetch_one(cur)[0])


def _read_zongji(port: int, start: str, stop: str = STOP_TABLE,
                 ca: str | None = None) -> list[dict[str, Any]]:
    proc = subprocess.run(
        ["node", "zongji_read.mjs", "127.0.0.1", str(port), CDC_USER, CDC_PASSWORD, start,
         stop, *([ca] if ca else [])], cwd=NODE_DIR, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _node_ready() -> bool:
    return shutil.which("node") is not None and os.path.isdir(
        os.path.join(NODE_DIR, "node_modules", "@vlasky", "zongji"))


@pytest.mark.parametrize("mode", ["file", "gtid-all", "gtid-from"])
@pytest.mark.builds("machine", "mariadb-11.8", only={"mode": "gtid-from"})
def test_zongji_reads_the_same_rows(primary_and_relay: tuple[MariaDB, RelayProcess],
                                    mode: str) -> None:
    if not _node_ready():
        if os.environ.get("CI"):
            raise AssertionError("node or tests/cdc/node_modules missing; scripts/setup installs them")
        pytest.skip("node and `npm ci` in tests/cdc are needed (scripts/setup)")
    primary, relay = primary_and_relay
    starts = {
        "file": (f"file:{_first_binlog(primary.port)}:4", f"file:{_first_binlog(relay.port)}:4"),
        "gtid-all": ("gtid:", "gtid:"),
        "gtid-from": ("gtid:0-1-3", "gtid:0-1-3"),
    }[mode]
    from_primary = _read_zongji(primary.port, starts[0])
    from_relay = _read_zongji(relay.port, starts[1])
    assert {r["table"] for r in from_primary} >= _expected_tables() | {STOP_TABLE}
    assert len(from_relay) == len(from_primary)
    for ours, theirs in zip(from_relay, from_primary, strict=True):
        assert ours == theirs


def test_both_libraries_over_tls_to_a_relay_that_requires_it(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess], tmp_path: Any) -> None:
    """With [downstream.tls] require = true, python-mysql-replication (ssl with the CA)
    and zongji (ssl with the CA, the server's name checked) read over TLS what they read
    from the primary."""
    from relay.testing.certs import Certs

    certs = Certs(str(tmp_path), "relay")
    primary = mariadb_factory()
    primary.execute_many([
        "GRANT REFERENCES ON *.* TO 'repl'@'%'",
        f"CREATE USER '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{CDC_USER}'@'%'",
        "CREATE DATABASE tls_cdc",
        "CREATE TABLE tls_cdc.t (id INT PRIMARY KEY, v VARCHAR(20), d DATETIME(3))",
        "INSERT INTO tls_cdc.t VALUES (1, 'a', '2024-01-02 03:04:05.000'), (2, 'b', NULL)",
        "UPDATE tls_cdc.t SET v = 'c' WHERE id = 2", "DELETE FROM tls_cdc.t WHERE id = 1",
        "CREATE TABLE tls_cdc.zz_stop (id INT PRIMARY KEY)",
        "INSERT INTO tls_cdc.zz_stop VALUES (1)"])
    relay = start_relay(relay_factory, primary, users={CDC_USER: CDC_PASSWORD},
                        **{"downstream.tls": {"cert": certs.cert, "key": certs.key,
                                              "require": True}})
    target = primary.gtid_binlog_pos()
    wait_until(lambda: _relay_gtid(relay, ssl={"ca": certs.ca}) == target, 60,
               "the relay to hold the workload")
    stop = "tls_cdc.zz_stop"
    from_primary = _read_pmr(primary.port, stop=stop)
    assert {t for _, t, _ in from_primary} == {"tls_cdc.t", stop}
    assert _read_pmr(relay.port, ssl={"ca": certs.ca}, stop=stop) == from_primary
    import pymysql  # the same login in plain text is refused: the reads went over TLS

    with pytest.raises(pymysql.err.OperationalError, match="3159"):
        pymysql.connect(host="127.0.0.1", port=relay.port, user=CDC_USER,
                        password=CDC_PASSWORD, ssl_disabled=True, connect_timeout=5)
    if not _node_ready():
        if os.environ.get("CI"):
            raise AssertionError("node or tests/cdc/node_modules missing; scripts/setup "
                                 "installs them")
        pytest.skip("node and `npm ci` in tests/cdc are needed (scripts/setup)")
    assert _read_zongji(relay.port, "gtid:", stop, ca=certs.ca) == \
        _read_zongji(primary.port, "gtid:", stop)

