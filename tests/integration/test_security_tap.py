"""Tap authorization per user (issue 31), attacked as a tap user would, against a real
MariaDB primary and a relay: one user cannot reach another's subscribers or snapshots
(nor see them), a user whose tap rules hide a table cannot learn it through plan,
checksum, schema or snapshot_save, snapshots are bounded per user, and failed logins
back off and then block the address (even the right password is refused from it).

One primary and one relay serve the module; each test uses users (and client addresses)
of its own, so the tests stay independent."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from relay.binlog import walk
from relay.binlog.decoder import StreamDecoder
from relay.logins import FIRST_DELAY
from relay.tap import protocol
from relay.tap.client import TapClient, parse_endpoint
from relay.tap.protocol import TapError
from relay.tap.snapshot import Chunk
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, check_output, wait_until

pytestmark = pytest.mark.integration

USERS = ("alice", "bob", "intern", "q-count", "q-bytes", "q-other", "guard", "masked",
         "planner", "q-names")
MAX_CONNECT_ERRORS = 4
BYTES_CAP = 256 << 10
CONFIG = "".join(f'[[tap.users]]\nname = "{u}"\npassword = "{u}-pw"\n' for u in USERS) + \
    textwrap.dedent("""
        [[rules]]
        name = "intern-sees-users-only"
        at = "tap"
        clients = ["intern"]
        do_tables = ["app.users"]

        [[rules]]
        name = "masked-emails"
        at = "tap"
        clients = ["masked"]
        [[rules.mask]]
        column = "app.users.email"
        with = "null"
    """)
# Rows the workload writes: app.users 3 (in 2 transactions), app.secrets 6.
USER_ROWS, ALL_ROWS = 3, 9


@dataclass
class Tap:
    process: RelayProcess
    endpoint: str

    def client(self, user: str) -> TapClient:
        return TapClient(self.endpoint, user, f"{user}-pw", timeout=30)


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(base_dir=str(tmp_path_factory.mktemp("sec-tap-primary")))
    server.start()
    server.execute_many([
        "CREATE DATABASE app",
        "CREATE TABLE app.users (id INT PRIMARY KEY, email VARCHAR(100))",
        "CREATE TABLE app.secrets (id INT PRIMARY KEY, secret VARCHAR(100))",
        "INSERT INTO app.users VALUES (1, 'alice@example.com'), (2, 'bob@example.com')",
        "INSERT INTO app.secrets VALUES (1, 'hunter2'), (2, 's3cr3t'), (3, 'x')",
        "BEGIN",
        "INSERT INTO app.users VALUES (3, 'carol@example.com')",
        "INSERT INTO app.secrets VALUES (4, 'y'), (5, 'z')",
        "COMMIT",
        "UPDATE app.secrets SET secret = 'rotated' WHERE id = 1",
    ])
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def tap(primary: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tap]:
    port = free_port()
    proc = RelayProcess(str(tmp_path_factory.mktemp("sec-tap-relay")), primary.url,
                        {"tap": {"listen": f"127.0.0.1:{port}",
                                 "max_connect_errors": MAX_CONNECT_ERRORS,
                                 "host_block_time": "10m",
                                 "max_snapshot_bytes_per_user": f"{BYTES_CAP}B"}},
                        CONFIG)
    proc.start()
    relay = Tap(proc, f"127.0.0.1:{port}")

    def caught_up() -> bool:
        if proc.proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"the relay exited:\n{proc.output()[-3000:]}")
        with contextlib.suppress(OSError, TapError), relay.client("alice") as c:
            return bool(c.status()["gtid_state"] == primary.gtid_binlog_pos())
        return False
    wait_until(caught_up, 60, "the relay's tap to serve the workload")
    yield relay
    proc.stop()
    check_output(proc)


def _error(fn: Any, *args: Any) -> TapError:
    with pytest.raises(TapError) as err:
        fn(*args)
    return err.value


TABLE_USERS = {"schema": "app", "table": "users", "keys": ["id"], "unique": True,
               "columns": [["id", "int", False], ["email", "varchar", False]]}
TABLE_SECRETS = {**TABLE_USERS, "table": "secrets",
                 "columns": [["id", "int", False], ["secret", "varchar", False]]}


def _chunks(n: int) -> list[list[Any]]:
    return [Chunk(i, 0, None if i == 0 else (i * 10,), (i * 10 + 10,)).to_wire()
            for i in range(n)]


# --- one user's subscribers and snapshots are out of another's reach ----------------------

def test_another_users_subscriber_cannot_be_acked_dropped_or_resnapshot(tap: Tap) -> None:
    with tap.client("alice") as alice, tap.client("bob") as bob:
        first, last = alice.resolve("earliest"), alice.resolve("latest")
        alice.ack("orders-job", first)
        alice.resnapshot("orders-job", ["app.users"], token="t1")
        assert alice.status()["subscribers"] == {"orders-job": first}
        # bob does not see it, and what bob does under the same name is bob's own.
        assert "orders-job" not in bob.status()["subscribers"]
        assert bob.acked("orders-job") is None
        bob.ack("orders-job", last)            # would let retention purge what alice needs
        assert bob.acked("orders-job") == last
        assert alice.acked("orders-job") == first
        assert bob.resnapshot("orders-job", ["app.secrets"], token="t1")  # bob's own token
        assert alice.snapshot_requested("orders-job") == ["app.users"]
        bob.unsubscribe("orders-job")          # bob's own subscriber goes
        err = _error(bob.unsubscribe, "orders-job")
        assert err.code == "not_in_log"
        assert alice.acked("orders-job") == first
        assert alice.status()["subscribers"] == {"orders-job": first}
        assert alice.snapshot_requested("orders-job") == ["app.users"]
        assert alice.status()["retain_from"] is not None
    # The operator sees every user's, with its owner.
    subscribers = tap.process.status()["tap"]["subscribers"]
    assert subscribers.get("alice/orders-job") == first
    assert "bob/orders-job" not in subscribers


def test_another_users_snapshot_cannot_be_loaded_reported_or_dropped(tap: Tap) -> None:
    with tap.client("alice") as alice, tap.client("bob") as bob:
        start = alice.resolve("latest")
        snap_id = alice.snapshot_save("snap-job", start, [TABLE_USERS], _chunks(2))
        assert snap_id is not None
        assert snap_id in alice.status()["snapshots"]
        assert bob.status()["snapshots"] == {}
        for attempt in (lambda: bob.snapshot_load(snap_id),
                        lambda: bob.snapshot_done(snap_id, 0, 5),
                        lambda: bob.snapshot_drop(snap_id)):
            err = _error(attempt)
            # Answered as for an id that does not exist: nothing says it is someone's.
            assert err.code == "not_in_log", err
            assert err.message == _error(bob.snapshot_load, "0" * 16).message.replace(
                "0" * 16, snap_id)
        err = _error(bob.unsubscribe, "snap-job")  # nor through alice's subscriber's name
        assert err.code == "not_in_log"
        saved = alice.snapshot_load(snap_id)
        assert saved["done"] == {} and saved["name"] == "snap-job"
        assert alice.status()["snapshots"][snap_id]["tables"]["app.users"]["chunks_done"] == 0
    snapshots = tap.process.status()["tap"]["snapshots"]
    assert snapshots[snap_id]["user"] == "alice" and snapshots[snap_id]["name"] == "snap-job"


# --- a table the user's rules hide cannot be learned ------------------------------------------

def test_a_hidden_table_is_unknown_to_schema(tap: Tap) -> None:
    with tap.client("intern") as intern, tap.client("alice") as alice:
        assert alice.schema("app.secrets")  # there, with row changes in the log
        intern.schema("app.users")
        hidden = _error(intern.schema, "app.secrets")
        unknown = _error(intern.schema, "app.nosuch")
        assert hidden.code == unknown.code == "not_in_log"
        assert hidden.message == unknown.message.replace("app.nosuch", "app.secrets")
        versions = _error(intern.schema_versions, "app.secrets")
        assert (versions.code, versions.message) == (hidden.code, hidden.message)


def test_plan_counts_only_the_rows_a_users_rules_let_through(tap: Tap) -> None:
    with tap.client("intern") as intern, tap.client("alice") as alice:
        first, last = alice.resolve("earliest"), alice.resolve("latest")
        everything = alice.plan(first, last)
        assert everything["rows"] == ALL_ROWS  # a user without rules: every row, as before
        mine = intern.plan(first, last)
        assert mine["rows"] == USER_ROWS
        assert mine["transactions"] == everything["transactions"]  # emptied ones go too
        assert mine["end"] == everything["end"]
        delivered = sum(len(m["changes"]) for m in intern.fetch_changes(first, last))
        assert delivered == USER_ROWS
        frames = list(intern.fetch_frames(first, last))
        assert frames[-1]["k"] == "end" and frames[-1]["rows"] == USER_ROWS
        assert frames[-1]["transactions"] == everything["transactions"]
        # Parts and batch limits are cut on the same counts.
        parts = intern.plan(first, last, split_rows=1)["parts"]
        assert sum(p[2] for p in parts) == USER_ROWS
        assert [p[2] for p in parts if p[2]] == [2, 1]
        assert intern.plan(first, last, max_rows=2)["rows"] == 2


def test_checksum_hashes_only_what_a_users_rules_let_through(tap: Tap) -> None:
    with tap.client("intern") as intern, tap.client("alice") as alice:
        first, last = alice.resolve("earliest"), alice.resolve("latest")
        mine = intern.checksum(first, last)
        assert mine["rows"] == USER_ROWS
        assert mine["sha256"] != alice.checksum(first, last)["sha256"]
        # The hash of intern's own fetch, made as the relay makes a checksum: the same.
        assert mine["sha256"] == _hash_of(intern.fetch_frames(first, last))


def _hash_of(frames: Iterator[dict[str, Any]]) -> str:
    """SHA-256 over the events of a fetch's raw frames, each without log_pos and CRC."""
    h = hashlib.sha256()
    crc = 0
    for frame in frames:
        if frame["k"] == "fde":
            decoder = StreamDecoder()
            decoder.format_description(frame["data"])
            crc = 4 if decoder.checksum else 0
        elif frame["k"] == "raw":
            data = frame["data"]
            for at, size in walk.spans(data):
                h.update(data[at : at + 13])
                h.update(data[at + 17 : at + size - crc])
    return h.hexdigest()


def test_a_snapshot_of_a_hidden_table_is_refused(tap: Tap) -> None:
    with tap.client("intern") as intern:
        start = intern.resolve("latest")
        for tables in ([TABLE_SECRETS], [TABLE_USERS, TABLE_SECRETS]):
            err = _error(intern.snapshot_save, "intern-job", start, tables, _chunks(1))
            assert err.code == "denied" and "app.secrets" in err.message
        assert intern.status()["snapshots"] == {}
        assert intern.acked("intern-job") is None   # a refused save holds nothing either
        allowed = intern.snapshot_save("intern-job", start, [TABLE_USERS], _chunks(1))
        assert allowed is not None and intern.snapshot_load(allowed)["tables"] == [TABLE_USERS]
        intern.snapshot_drop(allowed)


def test_a_snapshot_of_a_masked_table_is_refused(tap: Tap) -> None:
    """Snapshot rows are read from the primary directly (Spark's executors), where no mask
    applies: a table a user's tap mask covers is not snapshotted for it; its changes
    still come, masked."""
    with tap.client("masked") as masked:
        start = masked.resolve("latest")
        for tables in ([TABLE_USERS], [TABLE_SECRETS, TABLE_USERS]):
            err = _error(masked.snapshot_save, "masked-job", start, tables, _chunks(1))
            assert err.code == "denied", err
            assert "app.users" in err.message and "'masked-emails'" in err.message
        err = _error(masked.snapshot_save, "masked-job", start, [TABLE_USERS], [])
        assert err.code == "denied"  # (a batch read's driver asks so)
        assert masked.status()["snapshots"] == {} and masked.acked("masked-job") is None
        allowed = masked.snapshot_save("masked-job", start, [TABLE_SECRETS], _chunks(1))
        assert allowed is not None
        masked.snapshot_drop(allowed)
        changes = [c for m in masked.fetch_changes("earliest", "latest") for c in m["changes"]
                   if c[2] == "users"]
        assert len(changes) == USER_ROWS
        assert all(c[4]["email"] is None for c in changes)


def test_a_plan_that_does_not_hold_together_is_refused(tap: Tap) -> None:
    """A plan's chunks name tables of the plan, and its table names (labels of /metrics
    series) are bounded: a plan that breaks either is refused, and /status and /metrics
    answer as before."""
    wide = [{**TABLE_USERS, "table": f"t{i}"} for i in range(1025)]
    bad: list[tuple[list[dict[str, Any]], list[list[Any]]]] = [
        ([TABLE_USERS], [[0, 7, None, None]]),                 # a table the plan has not
        ([TABLE_USERS], [[0, -1, None, None]]),
        ([TABLE_USERS], [[0, 0, None, [5]], [0, 0, [5], None]]),  # one index twice
        ([TABLE_USERS], [[True, 0, None, None]]),
        ([TABLE_USERS], [["0", 0, None, None]]),
        ([TABLE_USERS], [[0, 0, None]]),
        ([{**TABLE_USERS, "table": "x" * 65}], _chunks(1)),
        ([{**TABLE_USERS, "table": 'u"}\nrelay_up 0'}], _chunks(1)),
        ([TABLE_USERS, TABLE_USERS], _chunks(1)),
        (wide, _chunks(1)),
    ]
    with tap.client("planner") as planner:
        start = planner.resolve("latest")
        for tables, chunks in bad:
            err = _error(planner.snapshot_save, "plan-job", start, tables, chunks)
            assert err.code == "bad_request", (tables[:2], chunks, err)
        assert planner.status()["snapshots"] == {}
        assert planner.snapshot_save("plan-job", start, wide[:1024], _chunks(1)) is not None
    status, body = tap.process.http("/metrics")
    assert status == 200 and "relay_tap_snapshot_chunks" in body
    assert tap.process.status()["tap"]["snapshots"]


# --- snapshots are bounded per user -------------------------------------------------------------

def test_the_17th_unfinished_snapshot_is_refused(tap: Tap) -> None:
    with tap.client("q-count") as q, tap.client("q-other") as other:
        start = q.resolve("latest")
        ids = [q.snapshot_save(f"job-{i}", start, [TABLE_USERS], _chunks(2))
               for i in range(16)]
        err = _error(q.snapshot_save, "job-16", start, [TABLE_USERS], _chunks(2))
        assert err.code == "quota" and "max_snapshots_per_user = 16" in err.message
        assert len(q.status()["snapshots"]) == 16
        # Another user's quota is its own.
        assert other.snapshot_save("other-job", start, [TABLE_USERS], _chunks(1)) is not None
        # A dropped snapshot frees its share, and so does a finished one.
        q.snapshot_drop(str(ids[0]))
        ids.append(q.snapshot_save("job-16", start, [TABLE_USERS], _chunks(2)))
        _error(q.snapshot_save, "job-17", start, [TABLE_USERS], _chunks(2))
        for chunk in (0, 1):
            q.snapshot_done(str(ids[1]), chunk, 10)
        assert q.snapshot_save("job-17", start, [TABLE_USERS], _chunks(2)) is not None
        # A chunk the plan does not have is no way to finish one.
        err = _error(q.snapshot_done, str(ids[2]), 99, 1)
        assert err.code == "bad_request"


def test_plans_beyond_the_byte_bound_are_refused(tap: Tap) -> None:
    with tap.client("q-bytes") as q:
        start = q.resolve("latest")
        chunks = _chunks(4000)   # about 60 KB of plan
        ids = []
        with pytest.raises(TapError) as err:
            for i in range(10):
                ids.append(q.snapshot_save(f"big-{i}", start, [TABLE_USERS], chunks))
        assert err.value.code == "quota"
        assert "max_snapshot_bytes_per_user" in err.value.message
        assert 1 <= len(ids) < 10
        kept = tap.process.status()["tap"]["snapshots"]
        assert sum(1 for s in kept.values() if s["user"] == "q-bytes") == len(ids)
        q.snapshot_drop(str(ids[0]))
        assert q.snapshot_save("big-again", start, [TABLE_USERS], chunks) is not None


def test_subscriber_names_and_requests_are_bounded_per_user(tap: Tap) -> None:
    """Each subscriber name is a hold on retention (its ack rewrites and syncs the holds
    file) and each re-snapshot request an entry of requests.msgpack: a user keeps at most
    max_subscribers_per_user (64) of each; unsubscribing frees a name."""
    with tap.client("q-names") as q, tap.client("q-other") as other:
        pos = q.resolve("latest")
        for i in range(64):
            q.ack(f"sub-{i}", pos)
            assert q.resnapshot(f"sub-{i}", ["app.users"])
        for attempt in (lambda: q.ack("sub-64", pos),
                        lambda: q.resnapshot("sub-64", ["app.users"]),
                        lambda: q.snapshot_save("sub-64", pos, [TABLE_USERS], _chunks(1))):
            err = _error(attempt)
            assert err.code == "quota" and "max_subscribers_per_user = 64" in err.message
        assert len(q.status()["subscribers"]) == 64 and q.acked("sub-64") is None
        assert q.status()["snapshots"] == {}  # the refused plan is not kept
        q.ack("sub-0", pos)                    # names it has: as before
        assert q.resnapshot("sub-0", ["app.secrets"])
        other.ack("sub-64", pos)              # another user's bound is its own
        q.unsubscribe("sub-1")                # frees a name of each
        q.ack("sub-64", pos)
        assert q.resnapshot("sub-64", ["app.users"])
        err = _error(q.ack, "sub-65", pos)
        assert err.code == "quota"
        err = _error(q.ack, "n" * 257, pos)
        assert err.code == "bad_request"
    held = [k for k in tap.process.status()["tap"]["subscribers"] if k.startswith("q-names/")]
    assert len(held) == 64


# --- failed logins back off, then block the address -------------------------------------------

def _login_from(tap: Tap, source: str, user: str, password: str) -> tuple[dict[str, Any],
                                                                          float]:
    """The tap's answer to a login from `source` (its greeting when that is an error), and
    how long the login's answer took."""
    host, port = parse_endpoint(tap.endpoint)
    with socket.create_connection((host, port), timeout=30,
                                  source_address=(source, 0)) as sock:
        decoder = protocol.FrameDecoder()
        hello = _frame(sock, decoder)
        if "error" in hello:
            return hello, 0.0
        t0 = time.monotonic()
        sock.sendall(protocol.encode({"cmd": "login", "user": user,
                                      "proof": protocol.proof(password, hello["nonce"])}))
        return _frame(sock, decoder), time.monotonic() - t0


def _frame(sock: socket.socket, decoder: protocol.FrameDecoder) -> dict[str, Any]:
    while True:
        data = sock.recv(1 << 16)
        assert data, "the tap closed the connection before answering"
        frames = decoder.feed(data)
        if frames:
            return frames[0]  # type: ignore[no-any-return]


def test_failed_logins_back_off_then_block_the_address(tap: Tap) -> None:
    source = "127.0.0.2"
    for failure in range(1, MAX_CONNECT_ERRORS + 1):
        answer, took = _login_from(tap, source, "guard", "wrong")
        assert answer.get("error") == "auth", answer
        if failure >= 2:  # from the second failure in a row, each answer waits longer
            # (less 5%: an event loop runs a timer up to its clock's resolution early; seen
            # here: 0.19987 s for a 0.2 s wait)
            assert took >= 0.95 * FIRST_DELAY * 2 ** (failure - 2), (failure, took)
    # Blocked: refused at once, before any password is looked at, the right one too.
    answer, _ = _login_from(tap, source, "guard", "guard-pw")
    assert answer.get("error") == "blocked", answer
    assert "max_connect_errors" in answer["message"]
    with tap.client("guard") as guard:  # from another address: not blocked
        assert guard.ping() > 0
    status = tap.process.status()["tap"]["errors"]
    assert status.get("blocked", 0) >= 1 and status.get("auth", 0) >= MAX_CONNECT_ERRORS


def test_a_good_login_clears_the_failures(tap: Tap) -> None:
    source = "127.0.0.3"
    for _round in range(3):  # more failures than the bound, a good login between
        for _ in range(MAX_CONNECT_ERRORS - 1):
            assert _login_from(tap, source, "guard", "wrong")[0].get("error") == "auth"
        answer, _ = _login_from(tap, source, "guard", "guard-pw")
        assert answer == {"ok": True}, answer
    for _ in range(MAX_CONNECT_ERRORS):  # counted afresh from the last good login
        assert _login_from(tap, source, "guard", "wrong")[0].get("error") == "auth"
    assert _login_from(tap, source, "guard", "guard-pw")[0].get("error") == "blocked"
