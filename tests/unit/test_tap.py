"""The tap's sans-I/O parts: frames, positions, the plan of a range over a real relay
log (the captured MariaDB binlog mirrored into one), raw frames back to transactions,
and the Arrow forms (generated JSON writer == the general one; Spark's exact schema)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import socket
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from relay.binlog.changes import ChangeStream, RowsStatement, SourceEvent
from relay.binlog.describe import ColumnDescription
from relay.binlog.describe import table_map as describe_table
from relay.binlog.file import iter_file_events
from relay.binlog.gtid import Gtid, GtidState
from relay.binlog.rowcodec import RowImage
from relay.binlog.tablemap import TableMap, TypeHints
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import segment_header
from relay.tap import protocol
from relay.tap.arrow import (
    BatchBuilder,
    arrow_schema,
    json_image,
    json_writer,
)
from relay.tap.frames import RawFrames, change_messages
from relay.tap.protocol import TapError
from relay.tap.server import TapServer
from relay.tap.settings import TapSettings
from relay.tap.store import TapStore

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
