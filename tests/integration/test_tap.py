"""The tap protocol against a relay mirroring a real primary, without Spark: bad requests
get error frames and the server keeps serving; a huge transaction arrives in parts;
two relays of one primary give the same checksum; subscriptions follow the log and keep
acknowledgements; a rebuilt log is refused by epoch."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from relay.binlog.changes import RowsStatement
from relay.binlog.decoder import StreamDecoder
from relay.binlog.jsonvalue import image_jsonable
from relay.binlog.tablemap import TableMap
from relay.sources import open_source
from relay.tap import protocol
from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.tap.sparktypes import spark_type
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, wait_until

pytestmark = pytest.mark.integration

USERS = textwrap.dedent("""
    [[tap.users]]
    name = "reader"
    password = "s3cret"
""")


def start_tap_relay(relay_factory: Callable[..., RelayProcess], primary: MariaDB,
                    extra: str = "", relaylog: dict[str, object] | None = None,
                    **tap: object) -> tuple[RelayProcess, str]:
    port = free_port()
    sections: dict[str, dict[str, object]] = {"tap": {"listen": f"127.0.0.1:{port}", **tap}}
    if relaylog:
        sections["relaylog"] = relaylog
    relay = relay_factory(primary.url, USERS + extra, **sections).start()
    endpoint = f"127.0.0.1:{port}"

    def up() -> bool:
        with contextlib.suppress(OSError, TapError), \
                TapClient(endpoint, "reader", "s3cret", timeout=5):
            return True
        return False
    wait_until(up, 60, "the tap to listen")
    return relay, endpoint


def caught_up(endpoint: str, primary: MariaDB) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError, TapError), \
                TapClient(endpoint, "reader", "s3cret") as tap:
            return bool(tap.status()["gtid_state"] == primary.gtid_binlog_pos())
        return False
    return check


def primary_changes(primary: MariaDB, schema: str) -> list[tuple[Any, ...]]:
    """(op, table, before, after) of `schema` in the primary's own binlog, as JSON."""
    out = []
    index = "file://" + os.path.join(primary.datadir, "mariadb-bin.index")
    for tx in open_source(index).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement) and st.table.schema == schema:
                for ch in st.changes():
                    out.append((ch.op, ch.table, _json(st.table, ch.before),
                                _json(st.table, ch.after)))
    return out


def _json(table: TableMap, image: Any) -> Any:
    return None if image is None else image_jsonable(table, image)


def test_bad_requests_get_error_frames(relay_factory: Callable[..., RelayProcess],
                                       mariadb_factory: Callable[..., MariaDB]) -> None:
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE b", "CREATE TABLE b.t (id INT PRIMARY KEY)",
                          "INSERT INTO b.t VALUES (1), (2)"])
    relay, endpoint = start_tap_relay(relay_factory, primary)
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    other = TapClient(endpoint, "reader", "s3cret").connect()  # stays connected throughout
    with TapClient(endpoint, "reader", "s3cret") as tap:
        with pytest.raises(TapError) as err:
            tap.request({"cmd": "explode"})
        assert err.value.code == "unknown_command" and "ping" in err.value.message
        status = tap.status()
        inside = status["first"] + 1  # inside the first transaction: no boundary
        for bad in (inside, status["last"] + 1000, 7):
            with pytest.raises(TapError) as err:
                list(tap.fetch_frames(bad, "latest"))
            assert err.value.code == "not_in_log", err.value
            assert str(bad) in err.value.message
        with pytest.raises(TapError) as err:
            tap.plan("earliest", "latest", max_rows=0)
        assert err.value.code == "bad_request"
        with pytest.raises(TapError) as err:
            tap.plan("earliest", "latest", epoch="not-this-log")
        assert err.value.code == "epoch"
        with pytest.raises(TapError) as err:
            tap.resolve("not-a-gtid")
        assert err.value.code == "bad_request"
        assert tap.ping() > 0  # the same connection goes on after each error
    # A wrong password: refused, connection closed.
    with pytest.raises(TapError) as err:
        TapClient(endpoint, "reader", "wrong").connect()
    assert err.value.code == "auth"
    with pytest.raises(TapError) as err:
        TapClient(endpoint, "nobody", "s3cret").connect()
    assert err.value.code == "auth"
    # Bytes that are not msgpack: an error frame, then that connection only is closed.
    host, port = endpoint.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        decoder = protocol.FrameDecoder()
        hello = _read_frame(raw, decoder)
        assert hello["hello"] == "relay-tap"
        raw.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        frame = _read_frame(raw, decoder)
        assert frame["error"] == "malformed"
        assert raw.recv(100) == b""
    # Requests before a login are refused.
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        decoder = protocol.FrameDecoder()
        _read_frame(raw, decoder)
        raw.sendall(protocol.encode({"cmd": "status"}))
        assert _read_frame(raw, decoder)["error"] == "auth"
    assert other.ping() > 0  # the other client never noticed
    other.close()
    code, metrics = relay.http("/metrics")
    assert code == 200
    assert 'relay_tap_errors_total{code="not_in_log"} 3.0' in metrics
    assert 'relay_tap_errors_total{code="malformed"} 1.0' in metrics
    assert relay.proc is not None and relay.proc.poll() is None


def _read_frame(sock: socket.socket, decoder: protocol.FrameDecoder) -> Any:
    while True:
        data = sock.recv(1 << 16)
        assert data, "connection closed before a frame"
        frames = decoder.feed(data)
        if frames:
            return frames[0]


def test_huge_transaction_arrives_in_parts(relay_factory: Callable[..., RelayProcess],
                                           mariadb_factory: Callable[..., MariaDB]) -> None:
    primary = mariadb_factory()
    primary.execute_many([
        "CREATE DATABASE h", "CREATE TABLE h.t (id INT PRIMARY KEY, pad VARCHAR(200))",
        "CREATE TABLE h.small (id INT PRIMARY KEY)",
        "BEGIN",
        "INSERT INTO h.t SELECT seq, REPEAT('x', 150) FROM h.seq_1_to_3000",
        "UPDATE h.t SET pad = 'y' WHERE id <= 1000",
        "COMMIT",
        "INSERT INTO h.small VALUES (1)"])
    _relay, endpoint = start_tap_relay(relay_factory, primary, frame_size="16KiB")
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        frames = list(tap.fetch_frames("earliest", "latest"))
        raw = [f for f in frames if f["k"] == "raw"]
        assert len(raw) > 20  # ~500 KB of events in 16 KiB frames
        assert all(len(f["data"]) <= 16 << 10 for f in raw)
        assert [f["n"] for f in raw] == list(range(len(raw)))
        assert sum(1 for f in raw if not f["whole"]) > 20  # the big one spans many frames
        assert raw[-1]["whole"]
        end = frames[-1]
        assert end["k"] == "end" and end["rows"] == 4001
        # Decoded: the big transaction in numbered parts, the last one flagged.
        tap.send({"cmd": "fetch", "start": "earliest", "end": "latest", "form": "rows",
                  "max_changes": 500})
        parts: list[dict[str, Any]] = []
        while (f := tap.read_frame())["k"] != "end":
            parts.append(f)
        big = [m for m in parts if len(m["changes"]) and m["changes"][0][2] == "t"]
        assert [m["part"] for m in big] == list(range(8))
        assert [m["last"] for m in big] == [False] * 7 + [True]
        assert len({m["gtid"] for m in big}) == 1
        got = [(c[0], c[2], c[3], c[4]) for m in parts for c in m["changes"]]
        assert got == primary_changes(primary, "h")
        # The raw form decoded here gives the same.
        decoded = [(ch.op, ch.table, _json(st.table, ch.before), _json(st.table, ch.after))
                   for t in tap.fetch_transactions("earliest", "latest")
                   for st in t.tx.statements() if isinstance(st, RowsStatement)
                   for ch in st.changes()]
        assert decoded == got
        # A batch limit never cuts the transaction: it goes whole.
        first = tap.resolve("earliest")
        plan = tap.plan(first, "latest", max_rows=100)
        assert plan["rows"] == 4000 and plan["transactions"] >= 1


@pytest.mark.builds("machine", "mariadb-11.8")
def test_two_relays_agree_on_checksums_and_rules_apply(
        relay_factory: Callable[..., RelayProcess],
        mariadb_factory: Callable[..., MariaDB]) -> None:
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE c", "CREATE TABLE c.t (id INT PRIMARY KEY, "
                          "email VARCHAR(100), pad TEXT)"] +
                         [f"INSERT INTO c.t VALUES ({i}, 'user{i}@example.com', "
                          f"REPEAT('p', 600))" for i in range(300)])
    mask = textwrap.dedent("""
        [[tap.users]]
        name = "plain"
        password = "s3cret"

        [[rules]]
        name = "no-emails"
        at = "tap"
        clients = ["reader"]
        [[rules.mask]]
        column = "c.t.email"
        with = "null"
    """)
    _one, ep1 = start_tap_relay(relay_factory, primary, mask)
    # The second relay cuts its segments small: other files, other positions.
    _two, ep2 = start_tap_relay(relay_factory, primary, mask, {"segment_size": "64KiB"})
    for ep in (ep1, ep2):
        wait_until(caught_up(ep, primary), 60, "both relays to catch up")
    sums: dict[str, list[dict[str, Any]]] = {}
    for user in ("plain", "reader"):
        with TapClient(ep1, user, "s3cret") as a, TapClient(ep2, user, "s3cret") as b:
            assert b.status()["segments"] > a.status()["segments"] == 1
            assert a.status()["last"] != b.status()["last"]
            for tap in (a, b):
                start = tap.resolve("0-1-2")   # GTID positions mean the same on both
                sums.setdefault(user, []).append(tap.checksum(start, "latest"))
    # The same rules on both relays: the same checksum, the masked user's its own (a
    # checksum over what the mask hides would let it test guesses of the hidden values).
    for user, (one, two) in sums.items():
        assert one["sha256"] == two["sha256"], (user, one, two)
        assert one["transactions"] == two["transactions"] == 300 and one["rows"] == 300
    assert sums["plain"][0]["sha256"] != sums["reader"][0]["sha256"]
    # The tap rule masks what `reader` gets only.
    with TapClient(ep2, "plain", "s3cret") as a, TapClient(ep2, "reader", "s3cret") as b:
        emails_a = {c[4]["email"] for m in a.fetch_changes("earliest", "latest")
                    for c in m["changes"]}
        emails_b = {c[4]["email"] for m in b.fetch_changes("earliest", "latest")
                    for c in m["changes"]}
    assert len(emails_a) == 300 and emails_b == {None}


def test_subscribe_acks_and_epoch(relay_factory: Callable[..., RelayProcess],
                                  mariadb_factory: Callable[..., MariaDB]) -> None:
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)"])
    relay, endpoint = start_tap_relay(relay_factory, primary)
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    sub = TapClient(endpoint, "reader", "s3cret").connect()
    frames = sub.subscribe("latest", name="job", tables=["s.%"])
    primary.execute_many([f"INSERT INTO s.t VALUES ({i})" for i in range(5)])
    got: list[int] = []
    last = 0
    while len(got) < 5:
        f = next(frames)
        if f["k"] == "tx":
            got += [c[4]["id"] for c in f["changes"]]
            last = f["pos"]
    assert got == [0, 1, 2, 3, 4]
    sub.subscription_ack(last)
    with TapClient(endpoint, "reader", "s3cret") as tap:
        wait_until(lambda: tap.acked("job") == last, 10, "the ack to land")
        assert tap.status()["retain_from"] == last
    sub.stop()
    assert next(f for f in frames if f["k"] == "end")["pos"] >= last
    sub.close()
    with TapClient(endpoint, "reader", "s3cret") as tap:  # an abandoned subscriber goes
        tap.unsubscribe("job")
        assert tap.acked("job") is None and tap.status()["retain_from"] is None
        with pytest.raises(TapError) as err:
            tap.unsubscribe("job")
        assert err.value.code == "not_in_log"
    old_epoch = TapClient(endpoint, "reader", "s3cret").connect().epoch
    # The log rebuilt from scratch: old positions are refused, not re-read.
    relay.stop()
    shutil.rmtree(relay.data_dir)
    relay.start()
    wait_until(caught_up(endpoint, primary), 60, "the rebuilt relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        assert tap.epoch != old_epoch
        with pytest.raises(TapError) as err:
            list(tap.fetch_frames("earliest", "latest", epoch=old_epoch))
        assert err.value.code == "epoch"
        assert tap.acked("job") is None  # the old log's acknowledgements are gone


@pytest.mark.builds("machine", "mariadb-11.8")
def test_a_typed_schema_of_a_table_with_no_change_comes_from_the_primary(
        relay_factory: Callable[..., RelayProcess],
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """A table whose rows were written before the relay's log began (here: without the
    binlog) has no TABLE_MAP in the log: the tap describes it from the primary's
    information_schema, as the primary's own map will, and says what is missing when
    the relay's user may not see it."""
    primary = mariadb_factory()
    primary.execute_many([
        "SET sql_log_bin = 0",
        "CREATE DATABASE q",
        "CREATE TABLE q.t (id BIGINT UNSIGNED PRIMARY KEY, y YEAR, n TINYINT, "
        "d DECIMAL(65,30), e ENUM('a', 'b') CHARACTER SET utf8mb4, s VARCHAR(20))",
        "INSERT INTO q.t VALUES (18446744073709551615, 2024, -1, 1.5, 'b', 'x')",
        "SET sql_log_bin = 1",
    ])
    _relay, endpoint = start_tap_relay(relay_factory, primary)
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        with pytest.raises(TapError) as err:
            tap.schema("q.t")
        assert err.value.code == "not_in_log" and "no privilege" in str(err.value)
    primary.execute_many([f"GRANT SELECT ON q.* TO '{primary.repl_user}'@'%'"])
    with TapClient(endpoint, "reader", "s3cret") as tap:
        described = decode_table(tap.schema("q.t"))
    assert described.names == ("id", "y", "n", "d", "e", "s")
    assert [spark_type(c) for c in described.columns] == [
        "DECIMAL(20,0)", "SMALLINT", "TINYINT", "STRING", "STRING", "STRING"]
    primary.execute_many(["INSERT INTO q.t VALUES (1, 1999, 5, 0, 'a', 'y')"])
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        logged = decode_table(tap.schema("q.t"))
    assert logged.columns == described.columns
    assert logged.primary_key == described.primary_key == (0,)


@pytest.mark.builds("machine", "mariadb-11.8")
def test_text_in_the_servers_default_collation_reads_as_text(
        relay_factory: Callable[..., RelayProcess],
        mariadb_factory: Callable[..., MariaDB]) -> None:
    """A VARCHAR in the server's default character set and collation (10.11: latin1;
    11.8: utf8mb4_uca1400_ai_ci) is text in the tap's JSON images, as SELECT gives it."""
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, "
                          "s VARCHAR(20))", "INSERT INTO d.t VALUES (1, 'caf\u00e9')"])
    _relay, endpoint = start_tap_relay(relay_factory, primary)
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        got = [c[4] for m in tap.fetch_changes("earliest", "latest") for c in m["changes"]]
    assert got == [{"id": 1, "s": "caf\u00e9"}] == [
        {"id": i, "s": s} for i, s in primary.query("SELECT id, s FROM d.t")]


def decode_table(raw: tuple[bytes, bytes]) -> TableMap:
    """The tap's (FORMAT_DESCRIPTION, TABLE_MAP) answer, decoded as a reader does."""
    decoder = StreamDecoder()
    decoder.format_description(raw[0])
    return decoder.table_map(raw[1])


def test_a_failing_tap_hook_ends_the_subscription_with_an_error_frame(
        relay_factory: Callable[..., RelayProcess], mariadb_factory: Callable[..., MariaDB],
        tmp_path: Any) -> None:
    """The hook fails while a subscription streams: the client gets the `rules` error (not
    a dropped connection or a traceback in the relay's log) and the connection goes on."""
    hook = tmp_path / "boom.py"
    hook.write_text(textwrap.dedent("""
        def tap(event, ctx):
            if event.kind == "delete":
                raise RuntimeError("deletes are not for the tap")
            return event
    """))
    primary = mariadb_factory()
    # Between the insert and the delete, 1.5 MB of a statement (no row change): the
    # delete's transaction comes in a later frame (1 MiB) than the insert's, whose changes
    # go out before the error.
    primary.execute_many([
        "CREATE DATABASE h", "CREATE TABLE h.t (id INT PRIMARY KEY)",
        "CREATE TABLE h.big (v LONGTEXT)", "INSERT INTO h.t VALUES (1), (2)",
        "SET SESSION binlog_format = 'STATEMENT'",
        f"INSERT INTO h.big VALUES ('{'x' * 1_500_000}')",
        "SET SESSION binlog_format = 'ROW'", "DELETE FROM h.t WHERE id = 1"])
    rule = textwrap.dedent(f"""
        [[rules]]
        name = "boom"
        at = "tap"
        clients = ["reader"]
        hook = "{hook}"
    """)
    relay, endpoint = start_tap_relay(relay_factory, primary, rule)
    wait_until(caught_up(endpoint, primary), 60, "the relay to catch up")
    with TapClient(endpoint, "reader", "s3cret") as tap:
        kinds: list[str] = []
        with pytest.raises(TapError) as err:
            for frame in tap.subscribe("earliest"):
                kinds += [c[0] for c in frame.get("changes", ())]
        assert err.value.code == "rules" and "boom" in err.value.message
        assert kinds == ["insert", "insert"]  # all before the failing event, none past it
        assert tap.ping() > 0  # the same connection serves the next request
    code, metrics = relay.http("/metrics")
    assert code == 200 and 'relay_tap_errors_total{code="rules"} 1.0' in metrics
