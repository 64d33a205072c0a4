"""The SQL port reads nothing of the primary's data (issue 31): what a downstream user sends
never reaches the primary as text, and the look-ups the relay composes run on one
connection, bounded, as an account that can read metadata only.

The primary holds marker values in user tables (app.users, app.secrets) and the password
hash of its accounts in mysql.user; its upstream account is granted SELECT ON *.* here
(the old advice): the relay's allow-list must hold by itself, and the account warning
must say the grant is more than the relay needs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings

from relay.config import Source
from relay.errors import ServerError
from relay.mysql.metadata import MetadataClient
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, check_output, wait_until
from tests.integration.common import listening
from tests.sql_attacks import statements

pytestmark = [pytest.mark.integration,
              # COLUMNS lists the sys schema's views, whose functions repl may not run
              pytest.mark.filterwarnings("ignore:.*execute command denied:Warning")]

USERS = {"admin": "adminpw", "analytics": "analyticspw"}
MARKERS = ["alice@example.com", "555-0101", "bob@example.com", "4111-1111-1111-1111"]
RULES = """
[[downstream.users]]
name = "admin"
password = "adminpw"
admin = true
[[downstream.users]]
name = "analytics"
password = "analyticspw"
[[rules]]
name = "contacts"
at = "send"
clients = ["analytics"]
[[rules.mask]]
column = "app.users.email"
with = "null"
[[rules.mask]]
column = "app.users.phone"
with = "null"
"""


@dataclass
class Site:
    primary: MariaDB
    relay: RelayProcess
    markers: list[str]   # every value no downstream user may read


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    primary = MariaDB(base_dir=str(tmp_path_factory.mktemp("security-primary")))
    primary.start()
    relay = None
    try:
        primary.execute_many([
            "GRANT SELECT ON *.* TO 'repl'@'%'",
            "CREATE USER 'relay_meta'@'%' IDENTIFIED BY 'metapw'",
            "GRANT REFERENCES ON *.* TO 'relay_meta'@'%'",
            "CREATE DATABASE app",
            "CREATE TABLE app.users (id INT PRIMARY KEY, email VARCHAR(64), "
            "phone VARCHAR(32))",
            "INSERT INTO app.users VALUES (1, 'alice@example.com', '555-0101'), "
            "(2, 'bob@example.com', '555-0102')",
            "CREATE TABLE app.secrets (id INT PRIMARY KEY, card VARCHAR(32))",
            "INSERT INTO app.secrets VALUES (1, '4111-1111-1111-1111')"])
        hashes = [str(r[0]) for r in primary.query(
            "SELECT Password FROM mysql.user WHERE Password LIKE '*%'")]
        relay = RelayProcess(str(tmp_path_factory.mktemp("security-relay")), primary.url,
                             {"downstream": {"listen": f"127.0.0.1:{free_port()}"}}, RULES)
        relay.start()
        wait_until(lambda: listening(relay.port), 30, "the relay to listen")
        wait_until(lambda: relay.status().get("upstream", {}).get("connected") is True, 30,
                   "the relay to follow its primary")
        yield Site(primary, relay, MARKERS + hashes)
    finally:
        if relay is not None:
            relay.stop()
            check_output(relay)
        primary.cleanup()


def ask(port: int, sql: str, user: str = "analytics") -> tuple[list[Any], str]:
    """(rows, error text) of one statement sent as `user`."""
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=USERS[user],
                           connect_timeout=5, read_timeout=30)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()), ""
    except pymysql.err.MySQLError as exc:
        return [], f"{exc.args[0]}: {exc.args[1] if len(exc.args) > 1 else ''}"
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def leaked(site: Site, rows: list[Any], error: str) -> list[str]:
    text = repr(rows) + error
    return [m for m in site.markers if m in text]


def test_executable_comments_run_nothing_on_the_primary(site: Site) -> None:
    port = site.relay.port
    rows, error = ask(port, "SELECT 1 /*!, (SELECT group_concat(email, ':', phone) FROM "
                            "app.users) */ FROM information_schema.SCHEMATA LIMIT 1")
    assert error == "" and rows == [(1,)], (rows, error)   # what the relay read
    rows, error = ask(port, "SELECT SCHEMA_NAME /*M!, (SELECT group_concat(User, ':', "
                            "Password) FROM mysql.user), (SELECT card FROM app.secrets) */ "
                            "FROM information_schema.SCHEMATA ORDER BY 1 LIMIT 1")
    assert error == "" and rows == [("app",)], (rows, error)
    assert not leaked(site, rows, error)


def test_a_shows_where_never_reaches_the_primary(site: Site) -> None:
    port = site.relay.port
    for sql in ("SHOW DATABASES WHERE EXTRACTVALUE(1, CONCAT(0x7e, (SELECT card FROM "
                "app.secrets LIMIT 1)))",
                "SHOW TABLES FROM app WHERE (SELECT COUNT(*) FROM mysql.user WHERE "
                "User = 'repl') = 1"):
        rows, error = ask(port, sql)
        assert rows == [] and error.startswith("1235:"), (sql, rows, error)
        assert not leaked(site, rows, error)
    # a WHERE the relay can evaluate is answered, by the relay, over the primary's answer
    rows, error = ask(port, "SHOW FULL TABLES FROM app WHERE Tables_in_app LIKE 'u%'")
    assert (rows, error) == ([("users", "BASE TABLE")], "")


def test_nothing_reads_user_tables(site: Site) -> None:
    port = site.relay.port
    for sql in ("SELECT email FROM app.users", "SELECT * FROM mysql.user",
                "SELECT (SELECT card FROM app.secrets) FROM information_schema.SCHEMATA",
                "SELECT TABLE_NAME FROM information_schema.TABLES UNION SELECT email FROM "
                "app.users", "SELECT SLEEP(3) FROM information_schema.SCHEMATA",
                "SELECT LOAD_FILE('/etc/hostname') FROM information_schema.SCHEMATA",
                "SELECT INFO FROM information_schema.PROCESSLIST"):
        rows, error = ask(port, sql)
        assert rows == [] and error.split(":")[0] in ("1235", "1064"), (sql, rows, error)
        assert not leaked(site, rows, error)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=statements())
def test_no_statement_returns_a_marker(site: Site, sql: str) -> None:
    for user in ("analytics", "admin"):
        rows, error = ask(site.relay.port, sql, user)
        assert not leaked(site, rows, error), (user, sql, rows, error)


def _connections(primary: MariaDB) -> int:
    return int(str(primary.query("SHOW GLOBAL STATUS LIKE 'Connections'")[0][1]))


def test_look_ups_share_one_connection(site: Site) -> None:
    ask(site.relay.port, "SHOW DATABASES")   # the metadata connection is open now
    before = _connections(site.primary)
    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(lambda _: ask(
            site.relay.port, "SELECT COUNT(*) FROM information_schema.COLUMNS"), range(30)))
    assert all(error == "" for _, error in answers), answers
    # the counter's only new connection is the one reading it
    assert _connections(site.primary) - before == 1


# --- the metadata client itself, against the same primary ------------------------------------

def _source(site: Site, user: str = "repl", password: str = "replpass") -> Source:
    return Source("127.0.0.1", site.primary.port, user, password)


async def test_metadata_client_bounds(site: Site) -> None:
    client = MetadataClient(lambda: _source(site), timeout=2.0, max_rows=5, queue=2)
    try:
        # one runs, two wait, the rest are turned away at once
        outcomes = await asyncio.gather(*(client.query("SELECT SLEEP(0.3)") for _ in range(5)),
                                        return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, ServerError)]
        assert [o.errno for o in refused] == [1040, 1040], outcomes
        assert client.stats.refused_busy == 2
        with pytest.raises(ServerError) as too_many:
            await client.query("SELECT COLUMN_NAME FROM information_schema.COLUMNS")
        assert too_many.value.errno == 1104
        # the account's grants are read: repl can SELECT *.* here, more than look-ups need
        assert client.stats.reads == ["*.*"] and client.stats.connects == 1
    finally:
        client.close()


async def test_metadata_client_gives_up_on_a_slow_answer(site: Site) -> None:
    client = MetadataClient(lambda: _source(site), timeout=0.5, max_rows=100, queue=4)
    try:
        with pytest.raises(ServerError) as slow:
            await client.query("SELECT SLEEP(5)")
        assert slow.value.errno == 2013 and client.stats.timeouts == 1
        (value,), = (await client.query("SELECT 7")).rows   # on a new connection
        assert value == b"7" and client.stats.connects == 2
    finally:
        client.close()


async def test_metadata_account_reads_metadata_only(site: Site) -> None:
    client = MetadataClient(lambda: _source(site), timeout=5.0, max_rows=100, queue=4,
                            account=("relay_meta", "metapw"))
    try:
        result = await client.query("SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                                    "WHERE TABLE_SCHEMA = 'app' AND TABLE_NAME = 'users' "
                                    "ORDER BY ORDINAL_POSITION")
        assert [r[0] for r in result.rows] == [b"id", b"email", b"phone"]
        assert client.stats.reads == [] and client.stats.account.startswith("relay_meta@")
        create = await client.query("SHOW CREATE TABLE `app`.`users`")
        assert b"`email` varchar(64)" in create.rows[0][1]
        with pytest.raises(ServerError) as denied:   # the account itself reads no rows
            await client.query("SELECT email FROM app.users")
        assert denied.value.errno == 1142
    finally:
        client.close()


def test_metadata_user_setting(site: Site, tmp_path_factory: pytest.TempPathFactory) -> None:
    """[downstream] metadata_user: the relay's look-ups run as that account."""
    relay = RelayProcess(str(tmp_path_factory.mktemp("meta-relay")), site.primary.url,
                         {"downstream": {"listen": f"127.0.0.1:{free_port()}",
                                         "metadata_user": "relay_meta",
                                         "metadata_password_env": "META_PW"}}, RULES)
    relay.env = {"META_PW": "metapw"}
    relay.start()
    try:
        wait_until(lambda: listening(relay.port), 30, "the relay to listen")
        rows, error = ask(relay.port, "SHOW COLUMNS FROM app.users")
        assert error == "" and [r[0] for r in rows] == ["id", "email", "phone"]
        users = [str(r[0]) for r in site.primary.query(
            "SELECT USER FROM information_schema.PROCESSLIST")]
        assert "relay_meta" in users
    finally:
        relay.stop()
        check_output(relay)


# --- authorization between downstream users --------------------------------------------------

def _connect(port: int, user: str) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=USERS[user],
                           connect_timeout=5, read_timeout=10)


def _one(conn: pymysql.Connection, sql: str) -> list[Any]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def test_kill_and_processlist_belong_to_admins(site: Site) -> None:
    port = site.relay.port
    admin, analytics = _connect(port, "admin"), _connect(port, "analytics")
    try:
        admin_id = _one(admin, "SELECT CONNECTION_ID()")[0][0]
        analytics_id = _one(analytics, "SELECT CONNECTION_ID()")[0][0]
        listed = _one(analytics, "SHOW FULL PROCESSLIST")
        assert {row[1] for row in listed} == {"analytics"}, listed
        with pytest.raises(pymysql.err.OperationalError) as refused:
            _one(analytics, f"KILL {admin_id}")
        assert refused.value.args[0] == 1095
        admin.ping(reconnect=False)   # still connected
        assert {row[1] for row in _one(admin, "SHOW PROCESSLIST")} >= {"admin", "analytics"}
        _one(admin, f"KILL {analytics_id}")
        with pytest.raises(pymysql.err.OperationalError):
            analytics.ping(reconnect=False)
    finally:
        for conn in (admin, analytics):
            with contextlib.suppress(Exception):
                conn.close()


SEMI_SYNC_PRIMARY = {"rpl_semi_sync_master_enabled": "ON",
                     "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
                     "rpl_semi_sync_master_timeout": "60000"}


def _forge_ack(port: int, user: str, password: str) -> pymysql.Connection:
    """A client that negotiates semi-sync, starts a dump at the relay's end and claims to
    have received what it never was sent (pymysql's own packet functions carry it)."""
    import struct

    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password,
                           connect_timeout=5, read_timeout=10)
    with conn.cursor() as cur:
        cur.execute("SET @master_binlog_checksum = 'NONE', @rpl_semi_sync_slave = 1")
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
        assert row is not None
        name, pos = row[:2]
    raw: Any = conn   # pymysql's packet functions, as python-mysql-replication uses them
    raw._execute_command(0x12, struct.pack("<IHI", int(pos), 0, 7301) + name.encode())
    raw._read_packet()   # the first event: the dump runs
    ack = b"\xef" + struct.pack("<Q", 4294967295) + b"relay-bin.999999"
    raw._write_bytes(struct.pack("<I", len(ack))[:3] + b"\x00" + ack)
    return conn


def test_a_forged_semi_sync_acknowledgement_counts_for_nothing(
        mariadb_factory: Any, relay_factory: Any) -> None:
    from tests.integration.common import start_relay

    primary = mariadb_factory(options=SEMI_SYNC_PRIMARY)
    relay = start_relay(relay_factory, primary, downstream={"semi_sync": True},
                        upstream={"semi_sync": True, "semi_sync_wait_for_replicas": 1,
                                  "semi_sync_timeout": "3s"})
    wait_until(lambda: relay.status().get("upstream", {}).get("semi_sync") == "on", 30,
               "the relay to acknowledge its primary")
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])

    def upstream() -> dict[str, Any]:
        return dict(relay.status()["upstream"])
    # No replica yet: the first commit waits semi_sync_timeout, then the relay acknowledges
    # on durability alone until enough replicas have everything it acknowledged.
    wait_until(lambda: upstream()["semi_sync_fallen_back"], 30,
               "the relay to fall back without replicas")
    forger = _forge_ack(relay.port, "repl", "relaypass")
    try:
        wait_until(lambda: relay.status()["downstream"]["semi_sync"]["refused_acks"] == 1, 10,
                   "the forged acknowledgement to be refused")
        forging = [c for c in relay.status()["clients"] if c["server_id"] == 7301]
        assert [c["semi_sync"]["refused_acks"] for c in forging] == [1]
        # Taken, it would have counted as a replica holding everything (waiting again at
        # once, every later commit let through on its word).
        primary.execute_many(["INSERT INTO s.t VALUES (1)"])
        assert upstream()["semi_sync_fallen_back"] is True
        assert relay.status()["downstream"]["semi_sync"]["acks"] == 0
    finally:
        forger.close()


def test_status_says_the_accounts_read_more_than_needed(site: Site) -> None:
    """repl was granted SELECT ON *.* (the old advice): /status says so for the upstream
    account and for the metadata account (the same one here)."""
    ask(site.relay.port, "SHOW DATABASES")
    status = site.relay.status()
    assert status["upstream"]["account_reads"] == ["*.*"]
    metadata = status["downstream"]["metadata"]
    assert metadata["account_reads"] == ["*.*"] and metadata["account"].startswith("repl@")
    assert "relay_metadata_account_reads_tables 1.0" in site.relay.http("/metrics")[1]


async def test_metadata_client_after_a_cancelled_look_up(site: Site) -> None:
    """A look-up whose client went away (cancelled mid-statement) leaves the next one, of
    any client, a fresh connection; a character set the client library cannot speak is an
    error of that look-up only."""
    client = MetadataClient(lambda: _source(site), timeout=5.0, max_rows=100, queue=4)
    try:
        slow = asyncio.ensure_future(client.query("SELECT SLEEP(2)"))
        await asyncio.sleep(0.2)   # it is on the wire now
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        (value,), = (await client.query("SELECT 7")).rows
        assert value == b"7"
        with pytest.raises(ServerError) as bad:
            await client.query("SELECT 8", "utf32")
        assert bad.value.errno == 1300
        with pytest.raises(ServerError) as unencodable:
            await client.query("SELECT '\u4e2d'", "latin1")   # not in latin1 (cp1252)
        assert unencodable.value.errno == 1300
        (value,), = (await client.query("SELECT 9")).rows
        assert value == b"9"
    finally:
        client.close()
