"""Rules against real replicas: per-client filters, a schema rename and column masks at
send, a receive rule, hooks that fail with on_error stop and skip, a file/position replica
behind a filter, and a reload under connected replicas."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from relay.binlog.constants import HEADER_LEN, ROWS_EVENT_TYPES, EventType
from relay.binlog.file import iter_file_events
from relay.sources import open_source
from relay.testing.mariadb import MariaDB, find_binary, free_port
from tests.conftest import RelayProcess, mysqlbinlog_reads, slave_status, wait_until
from tests.integration.common import caught_up as relay_caught_up
from tests.integration.common import listening

pytestmark = pytest.mark.integration

KEY_ENV = "RELAY_IT_MASK_KEY"
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "hooks")

USERS = {"repl": "relaypass", "shop_user": "pw1", "copy_user": "pw2", "mask_user": "pw3",
         "stop_user": "pw4", "skip_user": "pw5", "count_user": "pw6", "pos_user": "pw7"}


def rules_toml(boom_hook: str, extra: str = "") -> str:
    return textwrap.dedent(f"""
        [[rules]]
        name = "no-scratch"
        at = "receive"
        ignore_tables = ["scratch.%"]

        [[rules]]
        name = "no-audit"
        at = "send"
        clients = ["shop_user", "pos_user"]
        ignore_tables = ["shop.audit%"]

        [[rules]]
        name = "only-shop"
        at = "send"
        clients = ["shop_user", "pos_user"]
        do_tables = ["shop.%"]

        [[rules]]
        name = "app-copy"
        at = "send"
        clients = ["copy_user"]
        rename_schema = {{ app = "app_copy" }}

        [[rules]]
        name = "mask-contacts"
        at = "send"
        clients = ["mask_user"]
        [[rules.mask]]
        column = "app.users.email"
        with = "hash"
        key_env = "{KEY_ENV}"
        [[rules.mask]]
        column = "app.users.phone"
        with = "null"

        [[rules]]
        name = "boom-stop"
        at = "send"
        clients = ["stop_user"]
        hook = "{boom_hook}"

        [[rules]]
        name = "boom-skip"
        at = "send"
        clients = ["skip_user"]
        hook = "{boom_hook}"
        on_error = "skip"

        [[rules]]
        name = "count"
        at = "send"
        clients = ["count_user"]
        hook = "{os.path.join(EXAMPLES, 'count_by_table.py')}"
    """) + extra


def connect(server: MariaDB, db: str | None = None) -> pymysql.Connection:
    return pymysql.connect(unix_socket=server.socket_path, user="root", autocommit=True,
                           database=db)


def setup_schemas(primary: MariaDB) -> None:
    primary.execute_many(["CREATE DATABASE shop", "CREATE DATABASE app",
                          "CREATE DATABASE other", "CREATE DATABASE scratch"])
    with contextlib.closing(connect(primary, "shop")) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY AUTO_INCREMENT, name VARCHAR(50), "
                    "price DECIMAL(10,2))")
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY AUTO_INCREMENT, item INT, qty INT)")
        cur.execute("CREATE TABLE audit_log (id INT PRIMARY KEY AUTO_INCREMENT, "
                    "msg VARCHAR(100))")
        cur.execute("CREATE TABLE audit_x (id INT PRIMARY KEY, v INT)")
    with contextlib.closing(connect(primary, "app")) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE users (id INT PRIMARY KEY AUTO_INCREMENT, name VARCHAR(50), "
                    "email VARCHAR(100), phone VARCHAR(20), born DATE)")
    with contextlib.closing(connect(primary, "other")) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    with contextlib.closing(connect(primary, "scratch")) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE tmp (id INT PRIMARY KEY, v INT)")


def load(primary: MariaDB, rounds: int, base: int = 0) -> None:
    """Transactions that mix kept and dropped tables, multi-row and multi-table statements,
    updates and deletes."""
    with contextlib.closing(connect(primary)) as c, c.cursor() as cur:
        for r in range(base, base + rounds):
            cur.execute("BEGIN")
            cur.execute("INSERT INTO shop.items (name, price) VALUES (%s, %s), (%s, %s)",
                        (f"item {r}a", r + 0.5, f"item {r}b", r + 0.25))
            cur.execute("INSERT INTO shop.audit_log (msg) VALUES (%s)", (f"added {r}",))
            cur.execute("INSERT INTO shop.orders (item, qty) VALUES (%s, %s)", (r, r % 7))
            cur.execute("COMMIT")
            cur.execute("INSERT INTO app.users (name, email, phone, born) VALUES "
                        "(%s, %s, %s, '1990-01-01')",
                        (f"user {r}", f"user{r}@example.com", f"+1-555-{r:04d}"))
            cur.execute("INSERT INTO other.t VALUES (%s, %s)", (r, r))
            cur.execute("INSERT INTO scratch.tmp VALUES (%s, %s)", (r, r))
            cur.execute("INSERT INTO shop.audit_x VALUES (%s, %s)", (r, r))
            # One statement, rows events for two tables: the audit one may end it.
            cur.execute("UPDATE shop.items i JOIN shop.audit_log a ON a.id = i.id "
                        "SET i.price = i.price + 1, a.msg = CONCAT(a.msg, '!')")
            if r % 3 == 2:
                cur.execute("DELETE FROM shop.orders WHERE id = %s", (r - 1,))
                cur.execute("UPDATE app.users SET phone = NULL WHERE id = %s", (r - 1,))


def replicate(replica: MariaDB, relay: RelayProcess, user: str, *, gtid: bool = True) -> None:
    replica.replicate_from("127.0.0.1", relay.port, user=user, password=USERS[user],
                           gtid=gtid, heartbeat=1.0)


def _no_error(st: dict[str, Any]) -> bool:
    """No replication error; False while the replica is reconnecting (a relay restart)."""
    io = str(st.get("Last_IO_Error") or "")
    if "reconnecting" in io or "Can't connect" in io:
        return False
    assert io == "" and st.get("Last_SQL_Error") == "", st
    return True


def caught_up(primary: MariaDB, replica: MariaDB) -> bool:
    if not _no_error(slave_status(replica)):
        return False
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == primary.gtid_binlog_pos()


def pos_caught_up(relay: RelayProcess, replica: MariaDB) -> bool:
    st = slave_status(replica)
    if not _no_error(st):
        return False
    status, body = relay.http("/status")
    if status != 200:
        return False
    rl = json.loads(body)["relay_log"]
    return bool(st.get("Relay_Master_Log_File") == rl["file"]
                and int(str(st.get("Exec_Master_Log_Pos") or 0)) == rl["position"])


def checksum(server: MariaDB, table: str) -> Any:
    return server.query(f"CHECKSUM TABLE {table}")[0][1]


def tables(server: MariaDB, schema: str) -> set[str]:
    rows = server.query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
                        "TABLE_SCHEMA = %s", (schema,))
    return {str(r[0]) for r in rows}


@pytest.fixture
def boom_hook(tmp_path: Any) -> str:
    path = tmp_path / "boom.py"
    path.write_text(textwrap.dedent("""
        def send(event, ctx):
            if event.kind == "delete":
                raise RuntimeError("deletes are not allowed here")
            return event
    """))
    return str(path)


def start_relay(relay_factory: Callable[..., RelayProcess], primary: MariaDB,
                toml: str) -> RelayProcess:
    relay = relay_factory(primary.url, toml, users=dict(USERS),
                          downstream={"listen": f"127.0.0.1:{free_port()}",
                                      "catchup_wait": "3s"})
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    return relay


def test_rules_per_client_against_real_replicas(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        boom_hook: str) -> None:
    os.environ[KEY_ENV] = "the-test-key"
    primary = mariadb_factory()
    setup_schemas(primary)
    relay = start_relay(relay_factory, primary, rules_toml(boom_hook))
    strict = {"gtid_strict_mode": "1"}
    shop = mariadb_factory(server_id=21, options=strict)
    copy = mariadb_factory(server_id=22, options=strict)
    mask = mariadb_factory(server_id=23, options=strict)
    stop = mariadb_factory(server_id=24)
    skip = mariadb_factory(server_id=25)
    count = mariadb_factory(server_id=26)
    by_pos = mariadb_factory(server_id=27)
    copy.execute_many(["CREATE DATABASE app_copy"])  # the rename's scope: see the README
    for replica, user in ((shop, "shop_user"), (copy, "copy_user"), (mask, "mask_user"),
                          (stop, "stop_user"), (skip, "skip_user"), (count, "count_user")):
        replicate(replica, relay, user)
    replicate(by_pos, relay, "pos_user", gtid=False)
    load(primary, 6)

    # The stop replica's stream ends at the first delete, with the rule named.
    def stopped() -> bool:
        st = slave_status(stop)
        return st.get("Slave_IO_Running") == "No" and "boom-stop" in str(st.get("Last_IO_Error"))
    wait_until(stopped, 60, "the stop replica's stream to end on its failing hook")
    assert "deletes are not allowed here" in str(slave_status(stop)["Last_IO_Error"])

    for replica in (shop, copy, mask, skip, count):
        wait_until(functools.partial(caught_up, primary, replica), 90, "a replica to catch up")
    wait_until(lambda: pos_caught_up(relay, by_pos), 90, "the file/position replica")

    # Through a restart of the relay and of a replica: no gap, no error, strict mode.
    assert relay.stop() == 0
    load(primary, 3, base=6)
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen again")
    shop.stop()
    shop.start()
    shop.execute_many(["START SLAVE"])
    by_pos.execute_many(["STOP SLAVE", "START SLAVE"])  # resumes where it stopped
    load(primary, 3, base=9)
    for replica in (shop, copy, mask, skip, count):
        wait_until(functools.partial(caught_up, primary, replica), 90,
                   "catch-up after restarts")
    wait_until(lambda: pos_caught_up(relay, by_pos), 90, "the file/position replica again")

    # Filters: shop.* but shop.audit*, nothing else.
    for replica in (shop, by_pos):
        assert tables(replica, "shop") == {"items", "orders"}
        for table in ("shop.items", "shop.orders"):
            assert checksum(replica, table) == checksum(primary, table), table
        assert not tables(replica, "app") and not tables(replica, "other")
    # Rename: app into app_copy.
    assert checksum(copy, "app_copy.users") == checksum(primary, "app.users")
    assert not tables(copy, "app")
    assert checksum(copy, "shop.items") == checksum(primary, "shop.items")
    # Receive: scratch was never stored, so nobody has its rows.
    assert not tables(copy, "scratch") or not copy.query("SELECT * FROM scratch.tmp")
    # Masks: hashed emails, NULL phones, every other column as on the primary.
    plain = {r[0]: r for r in primary.query("SELECT id, name, email, phone, born FROM app.users")}
    masked = {r[0]: r for r in mask.query("SELECT id, name, email, phone, born FROM app.users")}
    assert masked.keys() == plain.keys()
    for row_id, (_, name, email, phone, born) in masked.items():
        assert (name, born) == (plain[row_id][1], plain[row_id][4])
        assert phone is None
        assert email != plain[row_id][2] and len(str(email)) == 64
        int(str(email), 16)
    assert len({r[2] for r in masked.values()}) == len(masked)  # distinct in, distinct out
    # skip: the hook failed on every delete and the stream went on (events unchanged).
    for table in ("shop.items", "shop.orders", "app.users"):
        assert checksum(skip, table) == checksum(primary, table), table
    # The counting hook's metric, and the rules' counters.
    _, metrics = relay.http("/metrics")
    assert 'relay_hook_events_total{hook="count",kind="insert",table="shop.items"}' in metrics
    assert 'relay_rule_events_total{outcome="errors",point="send",rule="boom-skip"}' in metrics
    assert 'outcome="dropped",point="receive",rule="no-scratch"' in metrics
    _, status = relay.http("/status")
    rules = json.loads(status)["rules"]
    assert any(r["dropped"] > 0 for r in rules["send"] if "only-shop" in r["rule"])
    relay.stop()
    # The relay log holds no scratch rows and mysqlbinlog reads it.
    stored = {c.schema for c in open_source(f"relay://{relay.data_dir}").changes()}
    assert "scratch" not in stored and {"shop", "app", "other"} <= stored
    for seg in relay.segments():
        mysqlbinlog_reads(seg)


def test_reload_under_a_connected_replica(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        boom_hook: str) -> None:
    os.environ[KEY_ENV] = "the-test-key"
    primary = mariadb_factory()
    setup_schemas(primary)
    relay = start_relay(relay_factory, primary, rules_toml(boom_hook))
    shop = mariadb_factory(server_id=31, options={"gtid_strict_mode": "1"})
    replicate(shop, relay, "shop_user")
    load(primary, 2)
    wait_until(lambda: caught_up(primary, shop), 90, "the replica to catch up")

    def peer() -> str:
        _, body = relay.http("/status")
        return str(next(c["peer"] for c in json.loads(body)["clients"]
                        if c["user"] == "shop_user"))
    before = peer()
    # Add a rule for this client: orders stop arriving from the next transaction on.
    relay.extra_toml = rules_toml(boom_hook, textwrap.dedent("""
        [[rules]]
        name = "no-orders"
        at = "send"
        clients = ["shop_user"]
        ignore_tables = ["shop.orders"]
    """))
    relay.write_config()
    res = subprocess.run([sys.executable, "-m", "relay.cli", "rules", "reload", "--config",
                          relay.config_path], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "rules reloaded" in res.stdout, res.stderr
    orders_before = shop.query("SELECT COUNT(*) FROM shop.orders")[0][0]
    load(primary, 2, base=2)
    wait_until(lambda: caught_up(primary, shop), 90, "the replica to catch up after reload")
    assert shop.query("SELECT COUNT(*) FROM shop.orders")[0][0] == orders_before
    assert checksum(shop, "shop.items") == checksum(primary, "shop.items")
    assert peer() == before  # the same connection all along
    # A wrong rule set is refused and the one in force stays.
    relay.extra_toml = rules_toml(boom_hook, '[[rules]]\nname = "x"\nat = "send"\n')
    relay.write_config()
    res = subprocess.run([sys.executable, "-m", "relay.cli", "rules", "reload", "--url",
                          f"http://127.0.0.1:{relay.metrics_port}"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "exactly one thing" in res.stderr, res.stderr
    assert "old rules stay in force" in res.stderr
    _, body = relay.http("/status")
    assert any("no-orders" in r["rule"] for r in json.loads(body)["rules"]["send"])


# --- a dump asked to start inside a transaction (issue 31 review, item 2) -----------------------

def binlog_read(relay: RelayProcess, user: str, start: int, tmp: str
                ) -> tuple[int, list[bytes], str]:
    """mariadb-binlog --read-from-remote-server --raw --start-position=`start` of the
    relay's first segment as `user`: its exit code, the events it wrote, its stderr."""
    out = os.path.join(tmp, f"{user}-{start}-")
    res = subprocess.run([find_binary("mariadb-binlog", "mysqlbinlog"),
                          "--read-from-remote-server", "--raw", "--host=127.0.0.1",
                          f"--port={relay.port}", f"--user={user}",
                          f"--password={USERS[user]}", f"--start-position={start}",
                          f"--result-file={out}", "relay-bin.000001"],
                         capture_output=True, text=True, timeout=120)
    events: list[bytes] = []
    path = out + "relay-bin.000001"
    if os.path.exists(path):
        with open(path, "rb") as f:
            events = [e.data for e in iter_file_events(f, verify_crc=False)]
    return res.returncode, events, res.stderr


def _after(events: list[bytes], position: int) -> list[bytes]:
    """The events whose stored end lies past `position` (log_pos; the artificial and
    the FORMAT_DESCRIPTION a dump from an offset sends carry 0)."""
    return [e for e in events if struct.unpack_from("<I", e, 13)[0] > position]


def test_a_dump_from_inside_a_transaction_through_a_filter(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        boom_hook: str, tmp_path: Any) -> None:
    """mariadb-binlog --start-position at an event inside a transaction (a rows event
    whose TABLE_MAP came before; the second TABLE_MAP of a multi-table statement; a rows
    event of a filtered table the kept table's rows ended), as a user behind a send
    filter: the dump starts its rules at the transaction's first event and sends, byte for
    byte, what a dump from there sends from that position on. It was refused with
    "a rows event whose TABLE_MAP is not in the stream"."""
    os.environ[KEY_ENV] = "the-test-key"
    primary = mariadb_factory()
    setup_schemas(primary)
    relay = start_relay(relay_factory, primary, rules_toml(boom_hook))
    load(primary, 3)
    wait_until(lambda: relay_caught_up(relay, primary), 60, "the relay to store the load")
    with open(relay.segments()[0], "rb") as f:
        stored = [(e.offset, e.data) for e in iter_file_events(f, verify_crc=False)]
    names: dict[int, str] = {}
    starts: dict[int, int] = {}  # offset -> offset of its transaction's GTID
    begin = 0
    for offset, data in stored:
        if data[4] == EventType.GTID:
            begin = offset
        starts[offset] = begin
        if data[4] == EventType.TABLE_MAP:
            body = data[HEADER_LEN:]
            db = body[9 : 9 + body[8]].decode()
            at = 9 + body[8] + 1
            name = body[at + 1 : at + 1 + body[at]].decode()
            names[int.from_bytes(body[:6], "little")] = f"{db}.{name}"

    def table(data: bytes) -> str:
        return names[int.from_bytes(data[HEADER_LEN : HEADER_LEN + 6], "little")]

    rows = [(o, d) for o, d in stored if d[4] in ROWS_EVENT_TYPES]
    items_rows = next(o for o, d in rows if table(d) == "shop.items"
                      and d[4] == EventType.WRITE_ROWS_V1)  # of the BEGIN ... COMMIT
    i = next(i for i, (o, d) in enumerate(stored) if d[4] == EventType.TABLE_MAP
             and stored[i + 1][1][4] == EventType.TABLE_MAP
             and stored[i + 2][1][4] in ROWS_EVENT_TYPES)  # the UPDATE ... JOIN
    second_map = stored[i + 1][0]
    audit_rows = next(o for o, d in stored[i + 2 :] if d[4] in ROWS_EVENT_TYPES
                      and table(d) == "shop.audit_log")
    for position in (items_rows, second_map, audit_rows):
        begin = starts[position]
        assert begin < position
        code, whole, err = binlog_read(relay, "pos_user", begin, str(tmp_path))
        assert code == 0, err
        code, part, err = binlog_read(relay, "pos_user", position, str(tmp_path))
        assert code == 0, err
        expected = _after(whole, position)
        assert expected and _after(part, position) == expected, position
        assert not [e for e in part if 4 < struct.unpack_from("<I", e, 13)[0] <= position]
    # The kept rows go out as stored (what a user without rules reads).
    code, plain, err = binlog_read(relay, "repl", items_rows, str(tmp_path))
    assert code == 0, err
    assert _after(plain, items_rows)[0] == dict(stored)[items_rows]
    code, part, err = binlog_read(relay, "pos_user", items_rows, str(tmp_path))
    assert _after(part, items_rows)[0] == dict(stored)[items_rows]


# --- a receive filter under MIXED logging (issue 31 review, item 1) ------------------------------

def _stored(relay: RelayProcess) -> list[bytes]:
    out = []
    for seg in relay.segments():
        with open(seg, "rb") as f:
            out += [e.data for e in iter_file_events(f, verify_crc=False)]
    return out


def test_a_receive_filter_under_mixed_logging_keeps_mariadbs_semantics(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """The README's receive filter (ignore_tables = ["scratch.%"]) on a MariaDB primary in
    MIXED mode (its default): statements are stored or not as MariaDB's replication
    filters decide (by the tables they write), annotations are stored, and nothing stops
    the ingest. It stopped at SET STATEMENT ... FOR INSERT, at INSERT INTO app.report
    SELECT ... FROM scratch.tmp and at a stored function's SELECT, and every annotation
    was stripped for all replicas."""
    primary = mariadb_factory(options={"binlog_format": "MIXED",
                                       "log_bin_trust_function_creators": "1"})
    primary.execute_many([
        "CREATE DATABASE app", "CREATE DATABASE scratch",
        "CREATE TABLE app.t (id INT PRIMARY KEY, v BIGINT)",
        "CREATE TABLE app.report (n INT)",
        "CREATE TABLE scratch.tmp (id INT PRIMARY KEY, v INT)",
        "CREATE FUNCTION app.f(x INT) RETURNS INT MODIFIES SQL DATA "
        "BEGIN INSERT INTO app.t VALUES (100 + x, x); RETURN x; END",
    ])
    relay = start_relay(relay_factory, primary, textwrap.dedent("""
        [[rules]]
        name = "no-scratch"
        at = "receive"
        ignore_tables = ["scratch.%"]
    """))
    primary.execute_many([
        "INSERT INTO scratch.tmp VALUES (1, 1), (2, 2)",
        "SET STATEMENT max_statement_time=5 FOR INSERT INTO app.t VALUES (1, 1)",
        "INSERT INTO app.report SELECT COUNT(*) FROM scratch.tmp",
        "SELECT app.f(1)",
        "INSERT INTO app.t VALUES (2, UUID_SHORT())",  # unsafe: logged as rows
        "UPDATE scratch.tmp SET v = v + 1",
        "INSERT INTO app.t VALUES (3, 3)",
    ])
    wait_until(lambda: relay_caught_up(relay, primary), 60,
               "the relay to store everything (its ingest never stops)")
    stored = _stored(relay)
    text = b"".join(e for e in stored if e[4] == EventType.QUERY)
    assert b"SET STATEMENT max_statement_time=5 FOR INSERT INTO app.t" in text
    assert b"INSERT INTO app.report SELECT COUNT(*) FROM scratch.tmp" in text
    assert b"app`.`f`(1)" in text or b"app.f(1)" in text
    assert b"VALUES (3, 3)" in text
    assert b"INSERT INTO scratch.tmp" not in text and b"UPDATE scratch.tmp" not in text
    assert b"CREATE TABLE app.t" in text and b"CREATE TABLE scratch.tmp" not in text
    annotations = [e for e in stored if e[4] == EventType.ANNOTATE_ROWS]
    assert any(b"UUID_SHORT()" in e for e in annotations)
    _, body = relay.http("/status")
    receive = {r["rule"].split(" ")[0]: r for r in json.loads(body)["rules"]["receive"]}
    assert receive["no-scratch"]["dropped"] >= 3 and receive["no-scratch"]["errors"] == 0
