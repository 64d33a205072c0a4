"""The tap's sans-I/O parts: frames, positions, the plan of a range over a real relay
log (the captured MariaDB binlog mirrored into one), raw frames back to transactions,
and the Arrow forms (generated JSON writer == the general one; Spark's exact schema).
Authorization per user: plans and checksums through a user's rules, which tables its rules
let it know of, subscribers' and snapshots' owners, per-user snapshot bounds, state from
before owners, and the login's back-off and block."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import struct
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from relay.binlog import describe, walk
from relay.binlog.changes import ChangeStream, RowsStatement, SourceEvent
from relay.binlog.decoder import StreamDecoder
from relay.binlog.describe import ColumnDescription
from relay.binlog.describe import table_map as describe_table
from relay.binlog.file import iter_file_events
from relay.binlog.gtid import Gtid, GtidState
from relay.binlog.jsonwriter import json_writer
from relay.binlog.plans import column_steps
from relay.binlog.rowcodec import RowImage
from relay.binlog.tablemap import TableMap, TypeHints
from relay.config import MaskKind, RulePoint
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import segment_header
from relay.relaylog.readers import ReaderRegistry
from relay.rules.chain import Chain, FilterRule
from relay.rules.engine import RuleStream
from relay.rules.mask import Mask
from relay.rules.model import RuleSpec
from relay.rules.runtime import Rules
from relay.tap import arrow, protocol
from relay.tap.arrow import BatchBuilder, arrow_schema, json_image
from relay.tap.client import TapClient
from relay.tap.frames import RawFrames, change_messages
from relay.tap.json_images import json_event
from relay.tap.protocol import TapError
from relay.tap.rules import ReaderRules, UserRules
from relay.tap.server import Subscribers, TapServer, hold_name
from relay.tap.settings import TapSettings
from relay.tap.snapshot import Chunk
from relay.tap.snapshots import Snapshot, SnapshotRegistry, check_plan
from relay.tap.sparktypes import spark_type
from relay.tap.store import Tally, TapStore
from relay.tap.typed_images import decode_event

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "mariadb")
BINLOG = os.path.join(DATA, "types.000001")


def _hints() -> TypeHints:
    with open(os.path.join(DATA, "hints.json")) as f:
        raw = json.load(f)
    out = TypeHints()
    for key, hint in raw.items():
        schema, table, column = key.split(".")
        out.add(schema, table, column, hint)
    return out


def test_frames_round_trip_and_malformed_input() -> None:
    dec = protocol.FrameDecoder(max_frame=1 << 10)
    data = protocol.encode({"cmd": "ping", "b": b"\x00\xff"}) + protocol.encode([1, 2])
    assert dec.feed(data[:5]) == []
    assert dec.feed(data[5:]) == [{"cmd": "ping", "b": b"\x00\xff"}, [1, 2]]
    assert dec.pending == 0
    with pytest.raises(TapError) as err:
        dec.feed(struct.pack(">I", 2) + b"\xc1\xc1")
    assert err.value.code == "malformed"
    with pytest.raises(TapError) as err:
        protocol.FrameDecoder(max_frame=10).feed(struct.pack(">I", 11))
    assert err.value.code == "malformed" and "11 bytes" in err.value.message
    assert protocol.split_position(protocol.position(7, 1234)) == (7, 1234)
    assert protocol.position_text(protocol.position(3, 99)) == "3:99"
    nonce = protocol.new_nonce()
    assert protocol.check_proof("pw", nonce, protocol.proof("pw", nonce))
    assert not protocol.check_proof("pw", nonce, protocol.proof("other", nonce))
    assert not protocol.check_proof("pw", nonce, "not bytes")


@pytest.fixture
def store(tmp_path: Any) -> TapStore:
    """The tap over a relay log holding a copy of the captured binlog as its segment."""
    d = str(tmp_path)
    shutil.copy(BINLOG, os.path.join(d, "relay-bin.000001"))
    with open(os.path.join(d, "relay-bin.index"), "w") as f:
        f.write("./relay-bin.000001\n")
    log = RelayLog(d, sync=None)
    log.open()
    return TapStore(log, frame_bytes=4096)


def _primary_changes(hints: TypeHints) -> list[tuple[Any, ...]]:
    with open(BINLOG, "rb") as f:
        events = [SourceEvent("x", e.offset, e.data) for e in iter_file_events(f)]
    out = []
    for tx in ChangeStream(events, hints=hints).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement):
                out += [(ch.op, ch.schema, ch.table, json_image(st.table, ch.before),
                         json_image(st.table, ch.after)) for ch in st.changes()]
    return out


def test_plan_and_read_a_range(store: TapStore) -> None:
    first, last, count = store.bounds()
    assert first > 0 and last > first and count > 20
    whole = store.plan(first, last, None, None)
    assert whole["end"] == last and whole["transactions"] == count
    rows = whole["rows"]
    # Parts of about 5 rows: cut at transaction boundaries, covering the range exactly.
    parts = store.plan(first, last, None, 5)["parts"]
    assert parts[0][0] == first and parts[-1][1] == last
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    assert sum(p[2] for p in parts) == rows
    for a, b, _ in parts:
        store.check(a, "start")
        store.check(b, "end")
    # A batch cap: whole transactions, at least one with rows.
    capped = store.plan(first, last, 1, None)
    assert 1 <= capped["rows"] < rows and first < capped["end"] < last
    with pytest.raises(TapError) as err:
        store.check(first + 1, "start")
    assert err.value.code == "not_in_log"
    # Raw frames decode to the same changes as the file itself, part by part.
    hints = _hints()
    got = []
    for a, b, _ in parts:
        frames = [*store.read_raw(a, b), {"k": "end"}]
        for f in frames[:-1]:  # a frame holds whole events, one alone when larger
            size = struct.unpack_from("<I", f["data"], 9)[0]
            assert len(f["data"]) <= 4096 or len(f["data"]) == size
        for item in RawFrames(frames, hints=hints):
            assert a < item.position <= b
            got += [(ch.op, ch.schema, ch.table, json_image(st.table, ch.before),
                     json_image(st.table, ch.after))
                    for st in item.tx.statements() if isinstance(st, RowsStatement)
                    for ch in st.changes()]
    assert got == _primary_changes(hints)
    # The decoded form, a huge transaction in numbered parts.
    msgs = list(change_messages(RawFrames([*store.read_raw(first, last), {"k": "end"}],
                                          hints=hints), max_changes=2))
    assert sum(len(m["changes"]) for m in msgs) == rows
    assert all(len(m["changes"]) <= 2 for m in msgs)
    for m, nxt in itertools.pairwise(msgs):
        if not m["last"]:
            assert nxt["gtid"] == m["gtid"] and nxt["part"] == m["part"] + 1


def test_arrow_batches_hold_their_schema(store: TapStore) -> None:
    """Every batch has exactly the schema announced (that it is Spark's own Arrow schema
    for the DDL is checked with a Spark session in tests/integration/test_spark_tap.py)."""
    hints = _hints()
    first, last, _ = store.bounds()
    for form in ("json", "map"):
        builder = BatchBuilder(form, None, batch_rows=7)
        items = RawFrames([*store.read_raw(first, last), {"k": "end"}], hints=hints)
        batches = [b for item in items for b in builder.add_transaction(item)]
        batches.append(builder.flush())
        assert all(b.schema == arrow_schema(form) for b in batches)
        table = pa.Table.from_batches(batches)
        assert table.num_rows == len(_primary_changes(hints))
        keys = list(zip(table["position"].to_pylist(), table["change"].to_pylist(),
                        strict=True))
        assert len(set(keys)) == len(keys)
    # Typed: each table's STRUCT, Spark's Arrow schema exactly, with batches of it.
    tables: dict[str, TableMap] = {}
    for item in RawFrames([*store.read_raw(first, last), {"k": "end"}], hints=hints):
        for st in item.tx.statements():
            if isinstance(st, RowsStatement):
                tables.setdefault(st.table.qualified, st.table)
    assert len(tables) >= 5
    for table_map in tables.values():
        builder = BatchBuilder("typed", table_map)
        items = RawFrames([*store.read_raw(first, last), {"k": "end"}], hints=hints)
        batches = [b for item in items for b in builder.add_transaction(item)]
        batches.append(builder.flush())
        assert sum(b.num_rows for b in batches) > 0
        assert all(b.schema == arrow_schema("typed", table_map) for b in batches)


def test_generated_json_writer_writes_what_json_image_writes() -> None:
    hints = _hints()
    with open(BINLOG, "rb") as f:
        events = [SourceEvent("x", e.offset, e.data) for e in iter_file_events(f)]
    seen = 0
    for tx in ChangeStream(events, hints=hints).transactions():
        for st in tx.statements():
            if not isinstance(st, RowsStatement):
                continue
            for ch in st.changes():
                for image in (ch.before, ch.after):
                    if image is None:
                        continue
                    assert json_writer(st.table, tuple(image.columns))(image) == \
                        json_image(st.table, image)
                    seen += 1
    assert seen > 50


def test_json_images_print_a_temporal_with_its_columns_precision() -> None:
    """A DATETIME(3) at a whole second keeps ".000" (the value alone cannot tell), a
    TIME(2) its two digits, a DATETIME(0) none, a TIMESTAMP(6) its zone after them."""
    table = describe_table("s", "t", [
        ColumnDescription("d3", "datetime", "datetime(3)", True, None, None, 3, None, None),
        ColumnDescription("d0", "datetime", "datetime", True, None, None, 0, None, None),
        ColumnDescription("t2", "time", "time(2)", True, None, None, 2, None, None),
        ColumnDescription("ts6", "timestamp", "timestamp(6)", True, None, None, 6, None,
                          None)], [])
    row = type("Row", (RowImage,), {"__slots__": (), "columns": ("d3", "d0", "t2", "ts6")})
    image = row((datetime(2024, 1, 2, 3, 4, 5), datetime(2024, 1, 2, 3, 4, 5),
                 -timedelta(hours=838, minutes=59, seconds=59),
                 datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC)))
    assert json.loads(json_writer(table, image.columns)(image)) == {
        "d3": "2024-01-02T03:04:05.000", "d0": "2024-01-02T03:04:05",
        "t2": "-838:59:59.00", "ts6": "2038-01-19T03:14:07.000000+00:00"}


async def test_a_connection_accepted_as_the_server_closes_is_turned_away(
        store: TapStore) -> None:
    # Its callback can run after close() has cancelled the clients it knew: it must not
    # start serving then (it would outlive the relay log).
    server = TapServer(store.log, TapSettings("127.0.0.1", 0))
    await server.start()
    await server.close()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    async with asyncio.timeout(5):
        await server._accept(ours)
        theirs.setblocking(False)
        assert await asyncio.get_running_loop().sock_recv(theirs, 16) == b""  # closed
    assert not server.clients
    theirs.close()


def test_watermarks_place_a_gtid_state_at_its_transaction(store: TapStore) -> None:
    first, last, _ = store.bounds()
    header = segment_header(store.log, store.log.segments.names[0])
    state = header.state.copy()
    # The state before any transaction (a relay that started at the primary's current
    # position holds none yet): the start of the segment.
    assert store.watermark(state.copy()) == (1 << 32 | header.header_end,) * 2
    assert isinstance(state, GtidState)
    seen = 0
    for item in RawFrames([*store.read_raw(first, last), {"k": "end"}]):
        if item.tx.gtid is None:
            continue
        state.update(Gtid.parse(item.tx.gtid))
        assert store.watermark(state.copy()) == (item.position, item.position)
        seen += 1
    assert seen > 20
    ahead = state.copy()
    top = next(iter(state))
    ahead.update(Gtid(top.domain, top.server_id, top.seq + 1))
    assert store.watermark(ahead) is None  # not in the log yet: the tap waits for it
    with pytest.raises(TapError, match="past the end") as err:
        store.resolve_gtid(str(ahead))
    assert err.value.code == "not_in_log"
    assert store.resolve_gtid(str(state)) == last  # everything read: the end


def test_the_gtid_state_at_a_position(store: TapStore) -> None:
    """gtid_at: the state of the transactions before a boundary (Spark's offsets carry
    it): the segment's starting state, then each transaction's GTID at its end."""
    first, last, _ = store.bounds()
    state = segment_header(store.log, store.log.segments.names[0]).state.copy()
    assert store.gtid_at(first) == str(state)
    seen = 0
    for item in RawFrames([*store.read_raw(first, last), {"k": "end"}]):
        if item.tx.gtid is not None:
            state.update(Gtid.parse(item.tx.gtid))
        assert store.gtid_at(item.position) == str(state)
        seen += 1
    assert seen > 20 and store.gtid_at(last) == store.visible_gtids()[0]
    with pytest.raises(TapError) as err:
        store.gtid_at(first + 1)   # not a transaction boundary
    assert err.value.code == "not_in_log"


def test_the_gtid_set_at_a_position_of_a_mysql_log(tmp_path: Any) -> None:
    """A MySQL log: GTID sets, tagged transactions in them (MySQL 9.6's own file)."""
    d = str(tmp_path)
    shutil.copy(os.path.join(DATA, "..", "mysql8", "mysql-9.6.0-gtid-tagged.bin"),
                os.path.join(d, "relay-bin.000001"))
    with open(os.path.join(d, "relay-bin.index"), "w") as f:
        f.write("./relay-bin.000001\n")
    log = RelayLog(d, sync=None)
    log.open()
    store = TapStore(log)
    first, last, count = store.bounds()
    assert count == 1
    sid = "55778904-0299-11f1-b1b8-4ef0c4956feb"
    assert store.gtid_at(first) == f"{sid}:1-13:mytag:1-2"
    assert store.gtid_at(last) == f"{sid}:1-13:mytag:1-3" == store.visible_gtids()[0]


# --- authorization per user --------------------------------------------------------------------

def _filter(*patterns: str) -> RuleStream:
    return RuleStream(Chain([FilterRule(RuleSpec("f", RulePoint.TAP, do_tables=patterns))]))


def _changes_through(store: TapStore, first: int, last: int, stream: RuleStream) -> int:
    hints = _hints()
    return sum(len(list(st.changes()))
               for item in RawFrames([*store.read_raw(first, last, stream), {"k": "end"}],
                                     hints=hints)
               for st in item.tx.statements() if isinstance(st, RowsStatement))


def test_plans_count_the_rows_a_readers_rules_let_through(store: TapStore) -> None:
    first, last, count = store.bounds()
    # A filter that keeps every table changes events (it drops annotations): the rows are
    # counted on what it lets through, and the cuts are those of the index, exactly.
    for max_rows, split_rows in ((None, None), (None, 5), (1, None), (7, 3), (100, 1)):
        assert store.plan(first, last, max_rows, split_rows, _filter("%.%")) == \
            store.plan(first, last, max_rows, split_rows), (max_rows, split_rows)
    # One table of several: its rows only, every transaction still counted.
    mine = store.plan(first, last, None, None, _filter("full.t"))
    assert mine["transactions"] == count and mine["end"] == last
    assert 0 < mine["rows"] == _changes_through(store, first, last, _filter("full.t")) \
        < store.plan(first, last, None, None)["rows"]
    parts = store.plan(first, last, None, 2, _filter("full.t"))["parts"]
    assert sum(p[2] for p in parts) == mine["rows"]
    assert parts[0][0] == first and parts[-1][1] == last
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    capped = store.plan(first, last, 1, None, _filter("full.t"))
    assert 1 <= capped["rows"] < mine["rows"] and capped["end"] < last


def test_checksums_hash_what_a_readers_rules_let_through(store: TapStore) -> None:
    first, last, count = store.bounds()
    mine = store.checksum(first, last, _filter("full.t"))
    assert mine["transactions"] == count
    assert mine["rows"] == store.plan(first, last, None, None, _filter("full.t"))["rows"]
    assert mine["sha256"] != store.checksum(first, last)["sha256"]
    # The hash of the reader's own fetch, each event without log_pos and CRC.
    h = hashlib.sha256()
    crc = 4 if _has_crc(store) else 0
    for frame in store.read_raw(first, last, _filter("full.t")):
        if frame["k"] == "raw":
            data = frame["data"]
            for at, size in walk.spans(data):
                h.update(data[at : at + 13])
                h.update(data[at + 17 : at + size - crc])
    assert mine["sha256"] == h.hexdigest()


def _has_crc(store: TapStore) -> bool:
    decoder = StreamDecoder()
    decoder.format_description(store.fde_of(store.refresh()[0]))
    return decoder.checksum


def test_a_users_rules_decide_the_tables_it_knows_of() -> None:
    rules = Rules([
        RuleSpec("intern-only-users", RulePoint.TAP, clients=("intern",),
                 do_tables=("app.users",)),
        RuleSpec("no-emails", RulePoint.TAP, clients=("intern", "masked"),
                 masks=(Mask("app.users.email", MaskKind.NULL),)),
        RuleSpec("other", RulePoint.SEND, do_tables=("nothing.%",)),
    ])
    intern = UserRules(rules, "intern")
    assert intern.keeps("app", "users")
    assert not intern.keeps("app", "secrets") and not intern.keeps("other", "users")
    assert intern.counting() is not None and intern.hashing() is not None
    masked = UserRules(rules, "masked")  # a mask hides no table and no row
    assert masked.keeps("app", "secrets")
    assert masked.counting() is None and masked.hashing() is not None
    free = UserRules(rules, "spark")  # send rules are not the tap's
    assert free.keeps("app", "secrets")
    assert free.counting() is None and free.hashing() is None
    anyone = UserRules(Rules(), "anyone")
    assert anyone.counting() is None and anyone.hashing() is None


def _hook_module(tmp_path: Any) -> str:
    path = tmp_path / "tap_hook.py"
    path.write_text("def tap(event, ctx):\n    return event\n")
    return str(path)


def test_a_users_rules_say_which_tables_values_they_change(tmp_path: Any) -> None:
    """What a snapshot (read from the primary, past every tap rule) may not copy: tables
    whose columns a mask of the user's covers, as the chain names them there, and every
    table when a hook of the user's may rewrite rows."""
    rules = Rules([
        RuleSpec("rename", RulePoint.TAP, clients=("renamed",),
                 rename_schema=(("app", "copy"),)),
        RuleSpec("no-emails", RulePoint.TAP, clients=("masked", "renamed"),
                 masks=(Mask("app.users.email", MaskKind.NULL),)),
        RuleSpec("copy-phones", RulePoint.TAP, clients=("renamed",),
                 masks=(Mask("copy.people.ph%", MaskKind.NULL),)),
        RuleSpec("hooked", RulePoint.TAP, clients=("hooked",), hook=_hook_module(tmp_path)),
        RuleSpec("send-mask", RulePoint.SEND, masks=(Mask("app.%.%", MaskKind.NULL),)),
    ])
    masked = UserRules(rules, "masked")
    assert masked.changes_values("app", "users") == "no-emails"
    assert masked.changes_values("app", "secrets") is None
    # After the rename the chain knows app.people as copy.people: the second mask's.
    renamed = UserRules(rules, "renamed")
    assert renamed.changes_values("app", "people") == "copy-phones"
    assert renamed.changes_values("app", "users") is None  # copy.users by then
    assert UserRules(rules, "hooked").changes_values("any", "table") == "hooked"
    assert UserRules(rules, "spark").changes_values("app", "users") is None  # send rules


def _plan(n: int = 2) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    tables = [{"schema": "s", "table": "t", "keys": ["id"], "unique": True,
               "columns": [["id", "bigint", False]]}]
    return tables, [Chunk(i, 0, None, (i,)).to_wire() for i in range(n)]


def test_snapshots_belong_to_their_owner_and_are_bounded_per_owner(tmp_path: Any) -> None:
    reg = SnapshotRegistry(str(tmp_path), max_per_user=2, max_bytes_per_user=1 << 20)
    tables, chunks = _plan()
    a1 = reg.create("job", 1, tables, chunks, owner="a")
    b1 = reg.create("job", 1, tables, chunks, owner="b")
    assert reg.owned("a", a1.id) is a1 and reg.owned("b", a1.id) is None
    assert [s.id for s in reg.of("b")] == [b1.id]
    a2 = reg.create("job", 1, tables, chunks, owner="a")
    with pytest.raises(TapError) as err:
        reg.create("job", 1, tables, chunks, owner="a")
    assert err.value.code == "quota" and "max_snapshots_per_user = 2" in err.value.message
    reg.create("job", 1, tables, chunks, owner="c")  # another owner's bound is its own
    # A finished snapshot does not count; it goes when its room is needed.
    for chunk in range(2):
        reg.chunk_done(a1.id, chunk, 3)
    assert a1.finished and not a2.finished
    a3 = reg.create("job", 1, tables, chunks, owner="a")
    assert {s.id for s in reg.of("a")} == {a2.id, a3.id}
    assert not os.path.exists(os.path.join(reg.directory, f"{a1.id}.msgpack"))
    assert reg.drop(a2.id)  # a dropped one frees its share
    reg.create("job", 1, tables, chunks, owner="a")
    # Bytes: the files of the owner's unfinished plans.
    small = SnapshotRegistry(str(tmp_path / "small"), max_per_user=100,
                             max_bytes_per_user=2000)
    big_tables, big_chunks = _plan(100)
    first = small.create("job", 1, big_tables, big_chunks, owner="a")
    assert 500 < first.size < 1000
    with pytest.raises(TapError) as err:
        for _ in range(4):
            small.create("job", 1, big_tables, big_chunks, owner="a")
    assert err.value.code == "quota" and "max_snapshot_bytes_per_user" in err.value.message
    assert len(small.of("a")) == 2 and sum(s.size for s in small.of("a")) <= 2000
    # Re-snapshot requests are the owner's too.
    reg.request("job", ["s.t"], "tok", owner="a")
    assert reg.requested("job", owner="b") == [] and reg.request("job", ["s.u"], "tok",
                                                                 owner="b")
    reg.forget("job", owner="b")
    assert reg.requested("job", owner="a") == ["s.t"]
    again = SnapshotRegistry(str(tmp_path))
    again.load()
    assert again.requested("job", owner="a") == ["s.t"]
    assert {s.owner for s in again.snapshot()} == {"a", "b", "c"}


def test_a_plan_is_checked_and_a_bad_one_is_set_aside_at_load(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import msgpack

    tables, chunks = _plan(3)
    assert check_plan(tables, chunks) == (tables, chunks)
    spec = tables[0]
    for bad_tables, bad_chunks, says in (
            (tables, [[0, 7, None, None]], "not one of the plan's 1"),
            (tables, [[0, 0, None, None], [0, 0, None, None]], "another chunk's"),
            (tables, [[False, 0, None, None]], "not a count"),
            (tables, [[0, 0, "lo", None]], "key values"),
            (tables, [(0, 0, None, None)], "not [index"),
            ([{**spec, "table": "t" * 65}], chunks, "65 characters"),
            ([{**spec, "schema": ""}], chunks, "0 characters"),
            ([{**spec, "table": "a\x00b"}], chunks, "control character"),
            ([{**spec, "table": "\U0001F600"}], chunks, "Basic Multilingual Plane"),
            ([spec, dict(spec)], chunks, "twice"),
            ([{**spec, "keys": "id"}], chunks, "keys"),
            ([{**spec, "columns": [["id"]]}], chunks, "columns"),
            ("s.t", chunks, "lists"),
            ([{**spec, "table": f"t{i}"} for i in range(1025)], chunks, "at most 1024")):
        with pytest.raises(ValueError, match=re.escape(says)):
            check_plan(bad_tables, bad_chunks)
    monkeypatch.setattr("relay.tap.snapshots.MAX_PLAN_CHUNKS", 2)
    with pytest.raises(ValueError, match="at most 2"):
        check_plan(tables, chunks)
    monkeypatch.undo()
    # What /status and /metrics read answers whatever a plan holds.
    odd = Snapshot("0" * 16, "job", 1, tables, [[0, 0, None, None], [1, 7, None, None],
                                                [2, "x", None, None], [3]], done={0: 5})
    assert odd.progress() == {"s.t": {"chunks": 1, "chunks_done": 1, "rows": 5}}
    assert odd.stale_tables() == []
    # A kept plan that does not check is set aside at load, the others load.
    reg = SnapshotRegistry(str(tmp_path))
    good = reg.create("job", 1, tables, chunks, owner="a")
    wire = {**good.to_wire(), "id": "1" * 16, "chunks": [[0, 7, None, None]]}
    bad_path = os.path.join(reg.directory, f"{'1' * 16}.msgpack")
    with open(bad_path, "wb") as f:
        f.write(msgpack.packb(wire, use_bin_type=True))
    again = SnapshotRegistry(str(tmp_path))
    again.load()
    assert [s.id for s in again.snapshot()] == [good.id]
    assert os.path.exists(bad_path + ".bad") and not os.path.exists(bad_path)


def _write_old_registry(directory: str, created: float) -> Snapshot:
    """A snapshot and re-snapshot requests as a relay before owners saved them."""
    import msgpack

    tables, chunks = _plan()
    snap = Snapshot("0123456789abcdef", "job", 1, tables, chunks, created=created)
    wire = snap.to_wire()
    del wire["owner"]
    os.makedirs(os.path.join(directory, "tap-snapshots"))
    for name, data in ((f"{snap.id}.msgpack", wire),
                       ("requests.msgpack", {"requests": {"job": ["s.t"]},
                                             "honoured": {"job": ["tok"]}})):
        with open(os.path.join(directory, "tap-snapshots", name), "wb") as f:
            f.write(msgpack.packb(data, use_bin_type=True))
    return snap


def test_snapshots_from_before_owners(tmp_path: Any) -> None:
    # A tap with one namespace adopts them.
    one = str(tmp_path / "one")
    snap = _write_old_registry(one, time.time())
    reg = SnapshotRegistry(one)
    reg.load("spark", 3600)
    assert reg.owned("spark", snap.id) is not None
    assert reg.requested("job", owner="spark") == ["s.t"]
    assert not reg.request("job", ["s.t"], "tok", owner="spark")  # its tokens came along
    again = SnapshotRegistry(one)
    again.load(None, 3600)  # adopted for good (written with its owner)
    assert again.owned("spark", snap.id) is not None
    # With several users: nobody's, shown to the operator only; gone once old.
    many = str(tmp_path / "many")
    _write_old_registry(many, time.time())
    reg = SnapshotRegistry(many)
    reg.load(None, 3600)
    assert [s.owner for s in reg.snapshot()] == [None]
    assert reg.owned("", snap.id) is None and reg.owned("spark", snap.id) is None
    assert reg.requested("job", owner="") == []
    old = str(tmp_path / "old")
    _write_old_registry(old, time.time() - 7200)
    reg = SnapshotRegistry(old)
    reg.load(None, 3600)
    assert reg.snapshot() == []


def test_subscribers_are_held_per_owner(tmp_path: Any) -> None:
    readers = ReaderRegistry(str(tmp_path / "holds"), "epoch")
    subs = Subscribers(lambda: readers, 3600)
    # Names that would run together without the owner's escape stay apart.
    assert hold_name("a/b", "c") != hold_name("a", "b/c")
    subs.hold("a/b", "c", 1 << 32 | 10)
    subs.hold("a", "b/c", 1 << 32 | 20)
    subs.hold("", "job", 1 << 32 | 30)
    assert subs.of("a/b") == {"c": 1 << 32 | 10} and subs.of("a") == {"b/c": 1 << 32 | 20}
    assert subs.of("") == {"job": 1 << 32 | 30} and subs.held("b", "job") is None
    assert sorted(s.label for s in subs.active()) == ["/job", "a%2Fb/c", "a/b/c"]
    assert not subs.release("b", "job") and subs.release("", "job")
    # A hold from before owners is nobody's until adopted.
    readers.hold("tap:old-job", (1, 40))
    assert [s.label for s in subs.active() if s.owner is None] == ["?/old-job"]
    assert subs.of("a") == {"b/c": 1 << 32 | 20}
    subs.adopt("spark")
    assert subs.of("spark") == {"old-job": 1 << 32 | 40}
    assert readers.held("tap:old-job") is None


async def test_failed_tap_logins_back_off_block_and_log_sparingly(
        store: TapStore, caplog: pytest.LogCaptureFixture) -> None:
    server = TapServer(store.log, TapSettings("127.0.0.1", 0, {"u": "pw"},
                                              max_connect_errors=3, host_block_time=600))
    await server.start()
    endpoint = f"127.0.0.1:{server.port}"

    def attempt(password: str) -> str:
        try:
            TapClient(endpoint, "u", password, timeout=10).connect().close()
        except TapError as exc:
            return exc.code
        return "ok"

    try:
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.WARNING, logger="relay.tap"):
            assert await loop.run_in_executor(None, attempt, "wrong") == "auth"
            assert await loop.run_in_executor(None, attempt, "pw") == "ok"  # clears it
            codes = [await loop.run_in_executor(None, attempt, "wrong") for _ in range(3)]
            assert codes == ["auth"] * 3
            codes = [await loop.run_in_executor(None, attempt, pw)
                     for pw in ["pw"] + ["wrong"] * 50]
            assert codes == ["blocked"] * 51  # the right password too
        assert server.stats.login_failures == 4 and server.stats.logins_blocked == 51
        assert server.logins.blocked_hosts() == ["127.0.0.1"]
        assert server.stats.errors == {"auth": 4, "blocked": 51}
        # 55 refusals in a few seconds: a few lines, not 55.
        warnings = [r for r in caplog.records if r.name == "relay.tap"
                    and r.levelno == logging.WARNING]
        assert 1 <= len(warnings) < 15, len(warnings)
    finally:
        await server.close()


def test_a_subscriber_holds_in_the_registry_of_the_opened_log(tmp_path: Any) -> None:
    """The app builds the tap server before it opens the relay log, and opening makes the
    log's reader registry anew: a hold must land in the one retention reads."""
    log = RelayLog(str(tmp_path / "log"))
    server = TapServer(log, TapSettings("127.0.0.1", 0, subscriber_ttl=3600))
    log.open()
    try:
        server.context.subscribers.hold("reader", "job", 1 << 32 | 500)
        assert [r.name for r in log.readers.snapshot()] == ["tap/reader/job"]
        assert log.readers.floor() == (1, 500)
        assert server.subscribers() == {"reader/job": 1 << 32 | 500}
    finally:
        log.close()


# --- the server's answers per user, over a real connection --------------------------------------

class _Served:
    """A TapServer over the captured log, and blocking clients run off the event loop."""

    def __init__(self, server: TapServer) -> None:
        self.server = server

    async def call(self, user: str, fn: Any) -> Any:
        """fn(client) for a client logged in as `user` (password "<user>-pw"); a TapError
        is returned, not raised."""
        endpoint = f"127.0.0.1:{self.server.port}"

        def run() -> Any:
            try:
                with TapClient(endpoint, user, f"{user}-pw", timeout=10) as tap:
                    return fn(tap)
            except TapError as exc:
                return exc
        return await asyncio.get_running_loop().run_in_executor(None, run)


def _tap_server(store: TapStore, rules: Rules, users: tuple[str, ...], **settings: Any
                ) -> TapServer:
    return TapServer(store.log, TapSettings("127.0.0.1", 0, {u: f"{u}-pw" for u in users},
                                            **settings), rules)


SPEC_USERS = {"schema": "app", "table": "users", "keys": ["id"], "unique": True,
              "columns": [["id", "int", False], ["email", "varchar", False]]}
SPEC_OTHER = {**SPEC_USERS, "table": "other"}


async def test_snapshots_of_masked_tables_are_denied(store: TapStore, tmp_path: Any) -> None:
    """A snapshot reads the primary directly: a table a user's tap mask covers (or any,
    under a tap hook of the user's) is refused when saved, and when loaded (a plan saved
    before the rule came)."""
    rules = Rules([
        RuleSpec("no-emails", RulePoint.TAP, clients=("masked",),
                 masks=(Mask("app.users.email", MaskKind.NULL),)),
        RuleSpec("hooked", RulePoint.TAP, clients=("hooked",), hook=_hook_module(tmp_path)),
    ])
    server = _tap_server(store, rules, ("masked", "hooked", "free"))
    old = server.snapshots.create("job", 1, [SPEC_USERS], [Chunk(0, 0, None, None).to_wire()],
                                  owner="masked")
    await server.start()
    served = _Served(server)

    def save(tables: list[dict[str, Any]]) -> Any:
        def run(tap: TapClient) -> Any:
            return tap.snapshot_save("job", tap.resolve("latest"), tables,
                                     [Chunk(0, 0, None, None).to_wire()])
        return run

    try:
        for user, tables, rule in (("masked", [SPEC_USERS], "no-emails"),
                                   ("masked", [SPEC_OTHER, SPEC_USERS], "no-emails"),
                                   ("hooked", [SPEC_OTHER], "hooked")):
            err = await served.call(user, save(tables))
            assert isinstance(err, TapError) and err.code == "denied", err
            assert "app.users" in err.message or user == "hooked"
            assert repr(rule) in err.message and "masked" in err.message
        # Nothing kept, nothing held for a refused save.
        assert [s.id for s in server.snapshots.of("masked")] == [old.id]
        assert server.subscribers() == {}
        err = await served.call("masked", lambda tap: tap.snapshot_load(old.id))
        assert isinstance(err, TapError) and err.code == "denied" and "app.users" in err.message
        # A table no mask touches, and a user without rules, as before.
        assert isinstance(await served.call("masked", save([SPEC_OTHER])), str)
        assert isinstance(await served.call("free", save([SPEC_USERS])), str)
        # A batch read's driver asks with no chunks: answered, nothing kept.
        def probe(tap: TapClient) -> Any:
            return tap.snapshot_save("batch", tap.resolve("latest"), [SPEC_USERS], [])
        err = await served.call("masked", probe)
        assert isinstance(err, TapError) and err.code == "denied"
        assert await served.call("free", probe) is None
        assert server.context.snapshots.requested("batch", owner="free") == []
    finally:
        await server.close()


def test_subscribers_and_requests_are_bounded_per_owner(tmp_path: Any) -> None:
    readers = ReaderRegistry(str(tmp_path / "holds"), "epoch")
    subs = Subscribers(lambda: readers, 3600, max_per_owner=2)
    for name in ("a", "b", "a"):
        subs.hold("u", name, 1 << 32 | 10, bounded=True)
    with pytest.raises(TapError) as err:
        subs.hold("u", "c", 1 << 32 | 10, bounded=True)
    assert err.value.code == "quota" and "max_subscribers_per_user = 2" in err.value.message
    subs.hold("v", "c", 1 << 32 | 10, bounded=True)   # another owner's bound is its own
    subs.hold("u", "c", 1 << 32 | 10)                 # the server's own holds: unbounded
    assert subs.release("u", "c") and subs.release("u", "a")
    subs.hold("u", "c", 1 << 32 | 10, bounded=True)
    assert subs.of("u") == {"b": 1 << 32 | 10, "c": 1 << 32 | 10}
    # A hold not heard from within subscriber_ttl no longer counts.
    stale = Subscribers(lambda: readers, -1, max_per_owner=1)
    stale.hold("u", "d", 1 << 32 | 10, bounded=True)
    # Re-snapshot requests: subscribers with requests or honoured tokens.
    reg = SnapshotRegistry(str(tmp_path / "snap"), max_requests_per_user=2)
    assert reg.request("a", ["s.t"], owner="u") and reg.request("b", ["s.t"], "tok", owner="u")
    reg.taken("b", ["s.t"], owner="u")        # its token still counts
    with pytest.raises(TapError) as err:
        reg.request("c", ["s.t"], owner="u")
    assert err.value.code == "quota" and "max_subscribers_per_user = 2" in err.value.message
    assert not reg.request("b", ["s.u"], "tok", owner="u")  # honoured before: no room needed
    assert reg.request("a", ["s.u"], owner="u") and reg.request("c", ["s.t"], owner="v")
    with pytest.raises(TapError) as err:
        reg.request("a", [f"s.t{i}" for i in range(1023)], owner="u")
    assert err.value.code == "quota"
    reg.forget("b", owner="u")
    assert reg.request("c", ["s.t"], owner="u")
    again = SnapshotRegistry(str(tmp_path / "snap"), max_requests_per_user=2)
    again.load()
    assert again.requested("a", owner="u") == ["s.t", "s.u"]
    with pytest.raises(TapError):
        again.request("d", ["s.t"], owner="u")


async def test_acks_resnapshots_and_plans_within_the_subscriber_bound(
        store: TapStore) -> None:
    server = _tap_server(store, Rules(), ("u",), max_subscribers_per_user=2)
    await server.start()
    served = _Served(server)
    try:
        def over_the_bound(tap: TapClient) -> list[str]:
            pos = tap.resolve("latest")
            tap.ack("a", pos)
            tap.snapshot_save("b", pos, [SPEC_USERS], [Chunk(0, 0, None, None).to_wire()])
            codes = []
            attempts: list[Callable[[], object]] = [
                lambda: tap.ack("c", pos),
                lambda: tap.snapshot_save("c", pos, [SPEC_USERS],
                                          [Chunk(0, 0, None, None).to_wire()]),
                lambda: tap.ack("x" * 257, pos)]
            for attempt in attempts:
                try:
                    attempt()
                    codes.append("ok")
                except TapError as exc:
                    codes.append(exc.code)
            tap.unsubscribe("a")
            tap.ack("c", pos)
            return codes
        assert await served.call("u", over_the_bound) == ["quota", "quota", "bad_request"]
        assert sorted(server.subscribers()) == ["u/b", "u/c"]
        assert [s.name for s in server.snapshots.of("u")] == ["b"]
    finally:
        await server.close()


async def test_a_hidden_table_costs_what_a_missing_one_does(store: TapStore) -> None:
    """schema for a table the user's rules hide asks the primary the same look-ups as for
    a table that does not exist (their answers set aside), and answers the same: its time
    does not tell it apart. full.t has row changes in the log; app.secrets has none."""
    asked: list[str] = []

    async def primary_rows(sql: str) -> list[list[bytes | None]]:
        asked.append(sql)
        return []

    rules = Rules([RuleSpec("hide", RulePoint.TAP, clients=("u",),
                            ignore_tables=("full.t", "app.secrets"))])
    server = TapServer(store.log, TapSettings("127.0.0.1", 0, {"u": "u-pw", "free": "free-pw"}),
                       rules, primary_rows=primary_rows)
    await server.start()
    served = _Served(server)
    try:
        assert isinstance(await served.call("free", lambda tap: tap.schema("full.t")), tuple)
        assert asked == []  # (visible, in the log: the primary is not asked)
        answers = {}
        for table in ("full.t", "app.secrets", "app.nosuch"):
            for versions in (False, True):
                asked.clear()
                err = await served.call("u", lambda tap, t=table, v=versions:
                                        tap.schema_versions(t) if v else tap.schema(t))
                assert isinstance(err, TapError), (table, err)
                schema, name = table.split(".")
                assert asked == [describe.describe_sql(schema, name),
                                 describe.primary_key_sql(schema, name)], (table, asked)
                answers[table, versions] = (err.code, err.message.replace(table, "T"))
        assert len(set(answers.values())) == 1, answers
    finally:
        await server.close()


def _rows_hook(tmp_path: Any) -> str:
    """A tap hook that drops the rows events of multi.a and halves full.t's rows."""
    path = tmp_path / "rows_hook.py"
    path.write_text(
        "def tap(event, ctx):\n"
        "    if event.table == 'a':\n"
        "        return None\n"
        "    if event.table == 't' and event.schema == 'full' and event.rows:\n"
        "        return event.replace(rows=event.rows[: max(1, len(event.rows) // 2)])\n"
        "    return event\n")
    return str(path)


def test_a_fetch_counts_the_rows_it_sends_as_it_sends_them(store: TapStore,
                                                           tmp_path: Any) -> None:
    """read_raw's tally (the fetch's end frame) is the rows that went out, through every
    kind of rule (kept whole, without annotations, filtered, masked, rewritten by a hook),
    in small frames (transactions across frames) and large ones (many a frame); the
    frames are those of a read without a tally, byte for byte."""
    first, last, count = store.bounds()
    big = TapStore(store.log, frame_bytes=1 << 20)
    no_old = ("old.t",)  # (its rows decode only with type hints: the index estimates them)
    rules = Rules([
        RuleSpec("one", RulePoint.TAP, clients=("one",), do_tables=("full.t",)),
        RuleSpec("most", RulePoint.TAP, clients=("most", "masked", "hooked"),
                 ignore_tables=no_old),
        RuleSpec("mask", RulePoint.TAP, clients=("masked",),
                 masks=(Mask("full.t.ti", MaskKind.NULL), Mask("multi.%.v", MaskKind.NULL))),
        RuleSpec("hook", RulePoint.TAP, clients=("hooked",), hook=_rows_hook(tmp_path)),
    ])

    def streams() -> dict[str, RuleStream | None]:
        selection = ReaderRules(rules, "reader", ["full.%", "multi.%", "noblob.%"]).stream()
        return {"selection": selection,
                **{u: UserRules(rules, u).hashing() for u in ("one", "most", "masked",
                                                             "hooked")}}

    for tap_store in (store, big):
        for name, stream in streams().items():
            tally = Tally()
            frames = list(tap_store.read_raw(first, last, stream, tally=tally))
            sent = _changes_in(frames)
            assert tally.rows == sent and tally.transactions == count, (name, tally, sent)
            again = streams()[name]
            plain = list(tap_store.read_raw(first, last, again))
            assert b"".join(f["data"] for f in frames) == b"".join(f["data"] for f in plain)
        tally = Tally()  # without rules: the index's count
        list(tap_store.read_raw(first, last, tally=tally))
        assert (tally.rows, tally.transactions) == (store.plan(first, last, None, None)["rows"],
                                                   count)


def _changes_in(frames: list[dict[str, Any]]) -> int:
    hints = _hints()
    return sum(len(list(st.changes()))
               for item in RawFrames([*frames, {"k": "end"}], hints=hints)
               for st in item.tx.statements() if isinstance(st, RowsStatement))


async def test_a_fetchs_end_frame_counts_what_it_sent(store: TapStore) -> None:
    """The end frame: the range's transactions, and the rows sent, through the user's
    rules and the reader's own choice of tables."""
    rules = Rules([RuleSpec("most", RulePoint.TAP, clients=("f",), ignore_tables=("old.t",))])
    server = _tap_server(store, rules, ("f", "free"))
    await server.start()
    served = _Served(server)
    first, last, count = store.bounds()
    try:
        for user, tables in (("free", ["full.t"]), ("f", None), ("f", ["multi.%"])):
            frames = await served.call(user, lambda tap, t=tables: list(
                tap.fetch_frames(first, last, tables=t)))
            end = frames.pop()
            assert end["k"] == "end" and end["transactions"] == count
            assert end["rows"] == _changes_in(frames), (user, tables)
    finally:
        await server.close()


def test_batches_are_the_same_through_the_kernels(store: TapStore, monkeypatch: Any) -> None:
    """Every table of the captured stream gives the same typed and JSON batches whether
    its rows events go through the decode_columns and json_images kernels (where they
    convert them: multi.a and multi.b) or through the row codec."""
    hints = _hints()
    first, last, _ = store.bounds()
    tables: dict[str, TableMap] = {}
    for item in RawFrames([*store.read_raw(first, last), {"k": "end"}], hints=hints):
        for st in item.tx.statements():
            if isinstance(st, RowsStatement):
                tables.setdefault(st.table.qualified, st.table)
    assert {"multi.a", "multi.b"} <= {q for q, t in tables.items()
                                      if column_steps(t, [spark_type(c) for c in t.columns]) is not None}
    taken = {"typed": 0, "json": 0}  # rows the kernels took (they must take some)

    def counting(form: str, take: Any) -> Any:
        def counted(*a: Any, **k: Any) -> int:
            n: int = take(*a, **k)
            taken[form] += max(n, 0)
            return n
        return counted

    monkeypatch.setattr(arrow, "decode_event", counting("typed", decode_event))
    monkeypatch.setattr(arrow, "json_event", counting("json", json_event))

    def read(form: str, table: TableMap | None, columnar: bool) -> pa.Table:
        builder = BatchBuilder(form, table, batch_rows=3, columnar=columnar)
        items = RawFrames([*store.read_raw(first, last), {"k": "end"}], hints=hints)
        batches = [b for item in items for b in builder.add_transaction(item)]
        batches.append(builder.flush())
        return pa.Table.from_batches(batches)

    for table_map in tables.values():
        typed = read("typed", table_map, True)
        assert typed.num_rows > 0
        before = taken["typed"]
        assert typed.equals(read("typed", table_map, False)), table_map.qualified
        assert taken["typed"] == before  # (the codec's way: no kernel)
    json_form = read("json", None, True)
    assert json_form.num_rows == len(_primary_changes(hints))
    assert json_form.equals(read("json", None, False))
    assert taken["typed"] >= 8 and taken["json"] >= 8  # multi.a and multi.b's rows
