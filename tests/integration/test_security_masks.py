"""Masks hold in every byte a masked client can receive (issue 31).

Primaries logging ROW, MIXED and STATEMENT are seeded with marker values (addresses and
phone numbers) in app.users; the relay in front of each masks app.users.email and
app.users.phone for the downstream users `analytics` (on_statement stop, the default)
and `dropper` (on_statement = "drop"), and for the tap user `spark`. Everything those
users can receive is searched for the markers: the dump (mariadb-binlog's raw bytes and
its -v decoding), SHOW BINLOG EVENTS, `relay changes` through the relay, the tap in both
forms, and a real replica. Positive controls (`repl`, the tap user `spark_all`, with no
rules) see the markers in the same places, so the searches are not vacuous.

ROW: the masked users get the rows, masked, and no annotation. MIXED and STATEMENT: the
first statement on app.users stops analytics' stream (and spark's tap read) after what
came before it, with an error naming the rule, the statement's position and the remedy;
dropper's stream goes on without those statements, and a MariaDB replica behind dropper
converges on the other tables (an INSERT fed by a user variable, and under STATEMENT the
LOAD DATA files, included; MariaDB logs LOAD DATA as rows under MIXED)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest

from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.testing.mariadb import MariaDB, find_binary, free_port
from tests.conftest import RelayProcess, check_output, slave_status, wait_until
from tests.integration.common import caught_up, listening

pytestmark = pytest.mark.integration

MARKERS = ("alice@example.com", "555-0101", "bob@example.com", "555-0102",
           "carol@example.com", "555-0103")
USERS = {"repl": "relaypass", "analytics": "pw-analytics", "dropper": "pw-dropper"}
TAP_USERS = {"spark": "pw-spark", "spark_all": "pw-all"}
MASKS = """
[[rules.mask]]
column = "app.users.email"
with = "null"
[[rules.mask]]
column = "app.users.phone"
with = "null"
"""
RULES = textwrap.dedent("""
    [[rules]]
    name = "mask-contacts"
    at = "send"
    clients = ["analytics"]
""") + MASKS + textwrap.dedent("""
    [[rules]]
    name = "mask-contacts-drop"
    at = "send"
    clients = ["dropper"]
    on_statement = "drop"
""") + MASKS + textwrap.dedent("""
    [[rules]]
    name = "tap-mask"
    at = "tap"
    clients = ["spark"]
""") + MASKS + "".join(f'[[tap.users]]\nname = "{u}"\npassword = "{p}"\n'
                       for u, p in TAP_USERS.items())


@dataclass
class Setup:
    mode: str                  # the primary's binlog_format
    primary: MariaDB
    relay: RelayProcess
    tap: str                   # the tap's endpoint

    @property
    def row(self) -> bool:
        return self.mode == "ROW"


def _connect(primary: MariaDB) -> pymysql.Connection:
    return pymysql.connect(unix_socket=primary.socket_path, user="root", autocommit=True,
                           local_infile=True)


def seed(primary: MariaDB, workdir: str) -> None:
    """The workload: an orders row first (so a stream that stops on app.users has sent
    something), then markers into app.users by INSERT, UPDATE, DELETE and LOAD DATA,
    between orders rows (AUTO_INCREMENT: INTVAR events under STATEMENT) written by a user
    variable, in a transaction, and stock rows by LOAD DATA."""
    users_csv = os.path.join(workdir, "users.csv")
    orders_csv = os.path.join(workdir, "orders.csv")
    with open(users_csv, "w") as f:
        f.write("3,carol,carol@example.com,555-0103\n")
    with open(orders_csv, "w") as f:
        f.write("sku-1,5\nsku-2,6\n")
    with contextlib.closing(_connect(primary)) as c, c.cursor() as cur:
        for sql in (
            "CREATE DATABASE app",
            "CREATE TABLE app.users (id INT PRIMARY KEY, name VARCHAR(50), "
            "email VARCHAR(100), phone VARCHAR(20))",
            "CREATE TABLE app.stock (sku VARCHAR(20) PRIMARY KEY, qty INT)",
            "CREATE TABLE app.orders (id INT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(50), "
            "qty INT)",
            "INSERT INTO app.orders (item, qty) VALUES ('first', 1)",
            "INSERT INTO app.users (id, name, email, phone) VALUES (1, 'alice', "
            "'alice@example.com', '555-0101'), (2, 'bob', 'bob@example.com', '555-0102')",
            "SET @item = 'from-a-variable'",
            "INSERT INTO app.orders (item, qty) VALUES (@item, 2)",
            "BEGIN",
            "INSERT INTO app.orders (item, qty) VALUES ('in-a-transaction', 3)",
            "UPDATE app.users SET phone = '555-0102' WHERE name = 'alice'",
            "COMMIT",
            "DELETE FROM app.users WHERE email = 'bob@example.com'",
            f"LOAD DATA LOCAL INFILE '{orders_csv}' INTO TABLE app.stock "
            "FIELDS TERMINATED BY ',' (sku, qty)",
            f"LOAD DATA LOCAL INFILE '{users_csv}' INTO TABLE app.users "
            "FIELDS TERMINATED BY ',' (id, name, email, phone)",
            "INSERT INTO app.orders (item, qty) VALUES ('last', 4)",
        ):
            cur.execute(sql)


@pytest.fixture(scope="module", params=["ROW", "MIXED", "STATEMENT"])
def setup(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    mode = str(request.param)
    primary = MariaDB(base_dir=str(tmp_path_factory.mktemp(f"primary-{mode}")),
                      options={"binlog_format": mode, "local_infile": "1"})
    primary.start()
    tap_port = free_port()
    relay = RelayProcess(
        str(tmp_path_factory.mktemp(f"relay-{mode}")), primary.url,
        {"downstream": {"listen": f"127.0.0.1:{free_port()}", "catchup_wait": "3s",
                        "write_timeout": "5s"},
         "tap": {"listen": f"127.0.0.1:{tap_port}"}, "users": dict(USERS)},
        RULES)
    try:
        seed(primary, str(tmp_path_factory.mktemp(f"csv-{mode}")))
        relay.start()
        wait_until(lambda: listening(relay.port) and listening(tap_port), 30,
                   "the relay to listen")
        wait_until(lambda: caught_up(relay, primary), 60, "the relay to store the workload")
        yield Setup(mode, primary, relay, f"127.0.0.1:{tap_port}")
    finally:
        relay.stop()
        primary.stop()
        primary.drop_storage()
    check_output(relay)


def _markers_in(data: bytes | str) -> list[str]:
    text = data if isinstance(data, str) else data.decode("latin-1")
    return [m for m in MARKERS if m in text]


# --- the dump -----------------------------------------------------------------------------------

@dataclass
class Dump:
    code: int
    raw: bytes          # the events received, as mariadb-binlog --raw wrote them
    decoded: str        # mariadb-binlog -v of those events
    stderr: str


def dump(setup: Setup, user: str, tmp: str) -> Dump:
    """mariadb-binlog --read-from-remote-server --raw from the relay's first segment to
    its last, as `user`; then -v over what it wrote."""
    binlog = find_binary("mariadb-binlog", "mysqlbinlog")
    out = os.path.join(tmp, f"{user}-")
    res = subprocess.run([binlog, "--read-from-remote-server", "--raw", "--host=127.0.0.1",
                          f"--port={setup.relay.port}", f"--user={user}",
                          f"--password={USERS[user]}", f"--result-file={out}",
                          "--to-last-log", "relay-bin.000001"],
                         capture_output=True, text=True, timeout=120)
    files = sorted(os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith(f"{user}-"))
    raw = b""
    for path in files:
        with open(path, "rb") as f:
            raw += f.read()
    decoded = subprocess.run([binlog, "-v", "--base64-output=decode-rows", *files],
                             capture_output=True, text=True, timeout=120) if files else None
    return Dump(res.returncode, raw, decoded.stdout if decoded else "", res.stderr)


def test_the_dump_carries_no_marker(setup: Setup, tmp_path: Any) -> None:
    control = dump(setup, "repl", str(tmp_path))
    assert control.code == 0, control.stderr
    assert _markers_in(control.raw) == list(MARKERS)
    assert _markers_in(control.decoded)  # (rows, annotations or statements)
    for user in ("analytics", "dropper"):
        got = dump(setup, user, str(tmp_path))
        assert not _markers_in(got.raw), user
        assert not _markers_in(got.decoded), user
        assert not _markers_in(got.stderr), user
        assert b"first" in got.raw  # what comes before the masked table went out
        if setup.row or user == "dropper":
            assert got.code == 0, got.stderr
            assert b"last" in got.raw and b"from-a-variable" in got.raw
            if setup.row:  # the masked rows themselves went out, masked
                assert "INSERT INTO `app`.`users`" in got.decoded
                assert "@3=NULL" in got.decoded and "@4=NULL" in got.decoded
                assert "Annotate_rows" not in got.decoded and "#Q>" not in got.decoded
        else:
            # The first statement on app.users stops analytics' stream with an error
            # naming the rule, the statement's position and the remedy (the replica test
            # sees its code, 1236: mariadb-binlog prints only the text).
            assert got.code != 0
            assert "rule 'mask-contacts' at relay-bin.000001:" in got.stderr, got.stderr
            assert 'on_statement = "drop"' in got.stderr, got.stderr
    # The drops are the rule's (the counters /metrics reports).
    code, body = setup.relay.http("/status")
    assert code == 200
    import json

    send = {r["rule"].split(" ")[0]: r for r in json.loads(body)["rules"]["send"]}
    assert send["mask-contacts-drop"]["dropped"] > 0
    assert send["mask-contacts"]["dropped"] > 0


# --- SHOW BINLOG EVENTS -------------------------------------------------------------------------

def listing(setup: Setup, user: str, sql: str = "") -> list[tuple[Any, ...]]:
    with contextlib.closing(pymysql.connect(host="127.0.0.1", port=setup.relay.port,
                                            user=user, password=USERS[user],
                                            connect_timeout=5)) as c, c.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        rows: list[tuple[Any, ...]] = []
        for (name, _size) in cur.fetchall():
            cur.execute(sql or f"SHOW BINLOG EVENTS IN '{name}'")
            rows += list(cur.fetchall())
            if sql:
                break
        return rows


def test_show_binlog_events_applies_the_send_rules(setup: Setup) -> None:
    control = listing(setup, "repl")
    assert _markers_in(repr(control))
    dropped = listing(setup, "dropper")
    assert not _markers_in(repr(dropped))
    assert any("app.orders" in str(r[5]) for r in dropped)  # the orders go on
    if setup.row:
        masked = listing(setup, "analytics")
        assert not _markers_in(repr(masked))
        assert "Annotate_rows" in {r[2] for r in control}
        assert "Annotate_rows" not in {r[2] for r in masked}
        assert any("(app.users)" in str(r[5]) for r in masked)  # its rows are listed
        # From inside the transaction that wrote the markers: judged with its table map.
        at = next(r[1] for r in control if r[2] == "Annotate_rows" and "alice" in r[5])
        inside = listing(setup, "analytics",
                         f"SHOW BINLOG EVENTS IN 'relay-bin.000001' FROM {at}")
        assert inside and not _markers_in(repr(inside))
        assert all(int(r[1]) >= int(at) for r in inside)
        assert [r[1] for r in inside] == [r[1] for r in masked if int(r[1]) >= int(at)]
    else:
        with pytest.raises(pymysql.MySQLError) as info:
            listing(setup, "analytics")
        code, message = info.value.args[0], str(info.value.args[1])
        assert code == 1220 and "rule 'mask-contacts' at relay-bin.000001:" in message
        assert not _markers_in(message)


# --- relay changes through the relay ---------------------------------------------------------

def relay_changes(setup: Setup, user: str) -> subprocess.CompletedProcess[str]:
    url = f"mysql://{user}:{USERS[user]}@127.0.0.1:{setup.relay.port}?hints=off"
    return subprocess.run([sys.executable, "-m", "relay.cli", "changes", url, "--queries"],
                          capture_output=True, text=True, timeout=120)


def test_relay_changes_through_the_relay(setup: Setup) -> None:
    control = relay_changes(setup, "repl")
    assert control.returncode == 0, control.stderr
    assert _markers_in(control.stdout)
    dropped = relay_changes(setup, "dropper")
    assert dropped.returncode == 0, dropped.stderr
    assert not _markers_in(dropped.stdout + dropped.stderr)
    assert "in-a-transaction" in dropped.stdout and "last" in dropped.stdout
    masked = relay_changes(setup, "analytics")
    assert not _markers_in(masked.stdout + masked.stderr)
    if setup.row:
        assert masked.returncode == 0, masked.stderr
        images = [json.loads(line).get("after") for line in masked.stdout.splitlines()]
        users = [a for a in images if a and "email" in a]
        assert users and all(a["email"] is None and a["phone"] is None for a in users)
    else:
        assert masked.returncode != 0
        assert "1236" in masked.stderr and "mask-contacts" in masked.stderr, masked.stderr


# --- the tap ---------------------------------------------------------------------------------

def tap_read(setup: Setup, user: str, form: str) -> tuple[bytes, TapError | None]:
    """Everything the tap sends `user` for the whole log in `form` (as one repr), and the
    error that ended it, if any."""
    got: list[Any] = []
    with TapClient(setup.tap, user, TAP_USERS[user], timeout=30) as tap:
        try:
            for frame in tap.fetch_frames("earliest", "latest", form=form):
                got.append(frame)
        except TapError as exc:
            return repr(got).encode(), exc
    return repr(got).encode(), None


def test_the_tap_applies_its_masks(setup: Setup) -> None:
    wait_until(lambda: _tap_caught_up(setup), 60, "the tap to see the workload")
    for form in ("raw", "rows"):
        control, error = tap_read(setup, "spark_all", form)
        assert error is None, error
        if form == "raw" or setup.row:  # (the rows form carries no statements)
            assert _markers_in(control), form
        masked, error = tap_read(setup, "spark", form)
        assert not _markers_in(masked), form
        if setup.row:
            assert error is None, error
            assert b"from-a-variable" in masked and b"last" in masked
        else:
            assert error is not None and error.code == "rules", error
            assert "tap-mask" in str(error) and not _markers_in(str(error))


def _tap_caught_up(setup: Setup) -> bool:
    with contextlib.suppress(OSError, TapError), \
            TapClient(setup.tap, "spark_all", TAP_USERS["spark_all"]) as tap:
        return bool(tap.status()["gtid_state"] == setup.primary.gtid_binlog_pos())
    return False


# --- a real replica -----------------------------------------------------------------------------

def _replica_caught_up(primary: MariaDB, replica: MariaDB) -> bool:
    st = slave_status(replica)
    assert st.get("Last_SQL_Error") == "", st
    io = str(st.get("Last_IO_Error") or "")
    assert io == "" or "reconnecting" in io, st
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0]) == primary.gtid_binlog_pos()


def test_a_real_replica_behind_the_masks(setup: Setup,
                                         mariadb_factory: Callable[..., MariaDB]) -> None:
    """ROW: a replica of analytics converges with the contacts NULL. MIXED, STATEMENT:
    analytics' replica stops on the first statement on app.users with the rule's error
    (1236), having applied what came before it; dropper's converges on app.orders and
    app.stock (a user variable's INSERT, AUTO_INCREMENT values and LOAD DATA included)
    with every transaction's GTID; of app.users it has only rows logged as rows (LOAD DATA
    under MIXED), masked."""
    primary = setup.primary
    strict = {"gtid_strict_mode": "1"}
    masked = mariadb_factory(server_id=61, options=strict)
    masked.replicate_from("127.0.0.1", setup.relay.port, user="analytics",
                          password=USERS["analytics"], gtid=True, heartbeat=1.0)
    if setup.row:
        wait_until(functools.partial(_replica_caught_up, primary, masked), 90,
                   "analytics' replica to catch up")
        rows = masked.query("SELECT name, email, phone FROM app.users ORDER BY id")
        assert [r[0] for r in rows] == ["alice", "carol"]
        assert all(r[1] is None and r[2] is None for r in rows)
        for table in ("app.orders", "app.stock"):
            assert checksum(masked, table) == checksum(primary, table)
        return

    def stopped() -> bool:
        st = slave_status(masked)
        return st.get("Slave_IO_Running") == "No" and bool(st.get("Last_IO_Error"))
    wait_until(stopped, 60, "analytics' replica to stop on the statement")
    st = slave_status(masked)
    assert int(str(st["Last_IO_Errno"])) == 1236, st
    assert "rule 'mask-contacts' at relay-bin.000001:" in str(st["Last_IO_Error"]), st

    def applied() -> bool:  # what came before the statement, by the SQL thread
        with contextlib.suppress(pymysql.err.ProgrammingError):
            return [r[0] for r in masked.query("SELECT item FROM app.orders")] == ["first"]
        return False
    wait_until(applied, 60, "analytics' replica to apply what came before the statement")
    assert not masked.query("SELECT * FROM app.users")
    dropper = mariadb_factory(server_id=62, options=strict)
    dropper.replicate_from("127.0.0.1", setup.relay.port, user="dropper",
                           password=USERS["dropper"], gtid=True, heartbeat=1.0)
    wait_until(functools.partial(_replica_caught_up, primary, dropper), 90,
               "dropper's replica to catch up")
    for table in ("app.orders", "app.stock"):
        assert checksum(dropper, table) == checksum(primary, table)
    items = [r[0] for r in dropper.query("SELECT item FROM app.orders ORDER BY id")]
    assert items == ["first", "from-a-variable", "in-a-transaction", "last"]
    users = dropper.query("SELECT name, email, phone FROM app.users")
    assert users == ([] if setup.mode == "STATEMENT" else [("carol", None, None)])


def checksum(server: MariaDB, table: str) -> Any:
    return server.query(f"CHECKSUM TABLE {table}")[0][1]


def test_rules_check_says_where_a_stream_would_stop(setup: Setup) -> None:
    """`relay rules check --sample` over the relay's own log: a masked client's stream under
    MIXED/STATEMENT logging is reported as stopping, with the rule and position, not as a
    traceback."""
    res = subprocess.run([sys.executable, "-m", "relay.cli", "rules", "check", "--config",
                          setup.relay.config_path, "--sample",
                          f"relay://{setup.relay.data_dir}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    stops = [line for line in res.stdout.splitlines() if "would stop:" in line]
    if setup.row:
        assert not stops, res.stdout
    else:
        assert stops and all("mask-contacts" in line or "tap-mask" in line for line in stops)
        assert not _markers_in(res.stdout)


# --- an executable comment naming the masked table (issue 31 review, item 4) --------------------

def test_an_executable_comment_does_not_hide_the_masked_table(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`INSERT INTO /*!app.*/users ...` with the default schema `other`: the server runs
    what the comment holds (app.users), the relay's parser reads a comment. Under MIXED
    logging analytics' dump stops before the statement and dropper's goes on without it;
    neither carries its values (they reached both before)."""
    primary = MariaDB(base_dir=str(tmp_path_factory.mktemp("primary-comment")),
                      options={"binlog_format": "MIXED"})
    primary.start()
    relay = RelayProcess(
        str(tmp_path_factory.mktemp("relay-comment")), primary.url,
        {"downstream": {"listen": f"127.0.0.1:{free_port()}", "catchup_wait": "3s"},
         "tap": {"listen": f"127.0.0.1:{free_port()}"}, "users": dict(USERS)}, RULES)
    try:
        with contextlib.closing(_connect(primary)) as c, c.cursor() as cur:
            for sql in (
                "CREATE DATABASE app", "CREATE DATABASE other",
                "CREATE TABLE app.users (id INT PRIMARY KEY, name VARCHAR(50), "
                "email VARCHAR(100), phone VARCHAR(20))",
                "CREATE TABLE app.orders (id INT PRIMARY KEY, item VARCHAR(50))",
                "INSERT INTO app.orders VALUES (1, 'first')",
                "USE other",
                "INSERT INTO /*!app.*/users (id, name, email, phone) "
                "VALUES (1, 'alice', 'alice@example.com', '555-0101')",
                "INSERT INTO /*M!app.*/users (id, name, email, phone) "
                "VALUES (2, 'bob', 'bob@example.com', '555-0102')",
                "INSERT INTO app.orders VALUES (2, 'last')",
            ):
                cur.execute(sql)
        relay.start()
        wait_until(lambda: listening(relay.port), 30, "the relay to listen")
        wait_until(lambda: caught_up(relay, primary), 60, "the relay to store the workload")
        comment = Setup("MIXED", primary, relay, "")
        tmp = str(tmp_path_factory.mktemp("dumps-comment"))
        control = dump(comment, "repl", tmp)
        assert control.code == 0, control.stderr
        assert _markers_in(control.raw) == list(MARKERS[:4])  # (the statements as sent)
        dropped = dump(comment, "dropper", tmp)
        assert dropped.code == 0, dropped.stderr
        assert not _markers_in(dropped.raw) and not _markers_in(dropped.decoded)
        assert b"first" in dropped.raw and b"last" in dropped.raw
        stopped = dump(comment, "analytics", tmp)
        assert stopped.code != 0 and not _markers_in(stopped.raw)
        assert "rule 'mask-contacts' at relay-bin.000001:" in stopped.stderr, stopped.stderr
        assert "executable comment" in stopped.stderr, stopped.stderr
        assert b"first" in stopped.raw and b"last" not in stopped.raw
    finally:
        relay.stop()
        primary.stop()
        primary.drop_storage()
    check_output(relay)
