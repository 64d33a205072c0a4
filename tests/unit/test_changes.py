"""The layered change stream and the file sources, on a captured MariaDB binlog."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from relay.binlog.changes import ChangeStream, QueryStatement, RowsStatement, SourceEvent
from relay.binlog.decoder import DecodedTables
from relay.binlog.file import iter_file_events
from relay.binlog.position import Position
from relay.binlog.rowcodec import RowImage
from relay.binlog.tablemap import TypeHints
from relay.errors import MalformedEvent
from relay.relaylog.series import BinlogSeries
from relay.sources import SourceError, open_source
from relay.sources.filters import GtidFilter, TableFilter

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "mariadb")
BINLOG = os.path.join(DATA, "types.000001")


def _hint_args() -> list[str]:
    with open(os.path.join(DATA, "hints.json")) as f:
        return [a for k, v in json.load(f).items() for a in ("--type", f"{k}={v}")]


def _hints() -> TypeHints:
    args = _hint_args()
    return TypeHints.parse(args[1::2])


def _events(path: str = BINLOG) -> list[SourceEvent]:
    with open(path, "rb") as f:
        return [SourceEvent("types.000001", e.offset, e.data) for e in iter_file_events(f)]


def test_transactions_alone_decode_no_row_and_no_table_map() -> None:
    tables = DecodedTables(_hints())
    stream = ChangeStream(_events(), tables=tables)
    txs = list(stream.transactions())
    assert len(txs) > 20
    assert stream.decoder.codecs._codecs == {} and tables.maps == {}
    for a, b in itertools.pairwise(txs):
        assert a.end is not None and a.end.offset == b.start.offset  # no gaps
    assert all(tx.gtid and tx.gtid.startswith("0-1-") for tx in txs)


def test_a_readers_streams_share_decoded_maps_and_codecs() -> None:
    """Two streams over the same events with one DecodedTables (a tap subscription's
    ranges): the second decodes no map and compiles no codec again, and gives the same
    changes."""
    tables = DecodedTables(_hints())

    def read() -> tuple[list[Any], list[Any]]:
        stream = ChangeStream(_events(), tables=tables)
        maps, changes = [], []
        for tx in stream.transactions():
            for st in tx.statements():
                if isinstance(st, RowsStatement):
                    maps.append(st.table)
                    changes += [(c.op, c.before, c.after) for c in st.changes()]
        return maps, changes

    maps, changes = read()
    decoded, compiled = dict(tables.maps), dict(tables.codecs._codecs)
    assert maps and changes and decoded and compiled
    again, changes_again = read()
    assert changes_again == changes
    assert all(a is b for a, b in zip(maps, again, strict=True))
    assert tables.maps == decoded and tables.codecs._codecs == compiled


def test_statements_and_changes() -> None:
    stream = ChangeStream(_events(), hints=_hints())
    multi = None
    for tx in stream.transactions():
        sts = list(tx.statements())
        if any(isinstance(s, QueryStatement) and "CREATE TABLE t" in s.text for s in sts):
            assert len(sts) == 1 and tx.xid is None
        rows = [s for s in sts if isinstance(s, RowsStatement)]
        if rows and rows[0].table.schema == "full" and rows[0].annotation and \
                "(10, 'in tx')" in rows[0].annotation:
            multi = (tx, rows)
    assert multi is not None
    tx, rows = multi
    assert tx.xid is not None and tx.end is not None
    # Statements are lazy: skipped ones were never decoded, yet the next one is right.
    assert rows[0].table.qualified == "full.t"


def test_skipping_a_statement_keeps_the_stream_in_step() -> None:
    seen: list[tuple[Position, int, RowImage | None]] = []
    n = 0
    for tx in ChangeStream(_events(), hints=_hints()).transactions():
        for st in tx.statements():
            n += 1
            if n % 2:
                seen.extend((ch.position, ch.row, ch.after) for ch in st.changes())
    full = [(ch.position, ch.row, ch.after)
            for ch in ChangeStream(_events(), hints=_hints()).changes()]
    assert 0 < len(seen) < len(full)
    assert all(item in full for item in seen)


def test_row_images_are_named_tuples_of_values() -> None:
    ch = next(c for c in ChangeStream(_events(), hints=_hints()).changes() if c.schema == "full")
    assert isinstance(ch.after, tuple) and ch.after.columns[0] == "id"
    assert ch.after.get("id") == 1 and ch.after[0] == 1
    assert ch.asdict()["after"]["vc"] == ""


def test_changes_limited_to_columns() -> None:
    stream = ChangeStream(_events(), hints=_hints())
    for tx in stream.transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement) and st.table.schema == "full":
                ch = next(st.changes(columns=["id", "vc"]))
                assert ch.after is not None and ch.after.columns == ("id", "vc")
                return
    raise AssertionError("no rows of full.t")


def _spans(events: list[SourceEvent]) -> list[tuple[int, int]]:
    """(start, end) of each transaction; ends are known once a transaction is finished."""
    txs = list(ChangeStream(events).transactions())
    return [(tx.start.offset, tx.end.offset) for tx in txs if tx.end is not None]


def _open_file_image() -> bytes:
    """The captured binlog as a server has it while writing it: the FORMAT_DESCRIPTION
    marked in use (its CRC is taken without the mark, so it still verifies)."""
    with open(BINLOG, "rb") as f:
        data = bytearray(f.read())
    data[4 + 17] |= 0x01
    return bytes(data)


def _truncated_copy(tmp_path: Any, cut: int) -> str:
    path = os.path.join(tmp_path, "types.000001")
    with open(path, "wb") as f:
        f.write(_open_file_image()[:cut])
    return path


def test_a_file_being_written_is_read_to_its_last_complete_transaction(tmp_path: Any) -> None:
    events = _events()
    # Cut inside the last transaction: after its GTID and a few events, mid-event.
    txs = _spans(events)
    start, end = txs[-2]
    path = _truncated_copy(tmp_path, end - 7)
    got = [tx.start.offset for tx in open_source(path).transactions()]
    assert got == [s for s, _ in txs[:-2]]
    assert start not in got


def test_a_closed_file_cut_short_is_an_error(tmp_path: Any) -> None:
    path = os.path.join(tmp_path, "types.000001")
    with open(BINLOG, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-7])  # the server closed it: no transaction can still be coming
    with pytest.raises(SourceError, match="ends inside an event at offset"):
        list(open_source(path).transactions())


def test_follow_sees_a_file_grow(tmp_path: Any) -> None:
    data = _open_file_image()
    txs = _spans(_events())
    half = txs[len(txs) // 2][1]
    path = os.path.join(tmp_path, "types.000001")
    with open(path, "wb") as f:
        f.write(data[:half])
    src = open_source(path, follow=True)
    assert isinstance(src.reader, BinlogSeries)
    src.reader.poll = 0.02
    got: list[int] = []

    def grow() -> None:
        with open(path, "ab") as f:
            for i in range(half, len(data), 101):  # torn writes on the way
                f.write(data[i : i + 101])
                f.flush()
                time.sleep(0.001)

    writer = threading.Thread(target=grow)
    stream = src.transactions()
    for tx in stream:
        got.append(tx.start.offset)
        if len(got) == len(txs) // 2 + 1:
            writer.start()
        if len(got) == len(txs):
            break
    writer.join()
    assert got == [s for s, _ in txs]


def test_series_from_an_index_file_and_a_directory(tmp_path: Any) -> None:
    for n in (1, 2):
        shutil.copy(BINLOG, os.path.join(tmp_path, f"mysql-bin.00000{n}"))
    with open(os.path.join(tmp_path, "mysql-bin.index"), "w") as f:
        f.write("./mysql-bin.000001\n./mysql-bin.000002\n")
    single = len(list(open_source(BINLOG).transactions()))
    by_index = list(open_source(os.path.join(tmp_path, "mysql-bin.index")).transactions())
    by_dir = list(open_source(f"file://{tmp_path}").transactions())
    assert len(by_index) == len(by_dir) == 2 * single
    assert by_index[-1].start.file == "mysql-bin.000002"


def test_bad_sources_say_what_is_wrong(tmp_path: Any) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        open_source(os.path.join(tmp_path, "nope"))
    with pytest.raises(SourceError, match="unknown scheme"):
        open_source("ftp://x/y")
    with pytest.raises(SourceError, match="no relay log"):
        open_source(f"relay://{tmp_path}")
    bogus = os.path.join(tmp_path, "bogus.000001")
    with open(bogus, "wb") as f:
        f.write(b"\xfebin" + b"\x00" * 30)
    with pytest.raises(MalformedEvent, match=r"bogus\.000001 at offset 4"):
        list(open_source(f"{tmp_path}/bogus.000001").transactions())


@given(hs.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
def test_fuzz_corrupt_files_raise_only_our_errors(data: hs.DataObject) -> None:
    with open(BINLOG, "rb") as f:
        raw = bytearray(f.read())
    for _ in range(data.draw(hs.integers(1, 3))):
        pos = data.draw(hs.integers(4, len(raw) - 1))
        raw[pos] ^= data.draw(hs.integers(1, 255))
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".000001") as tmp:
        tmp.write(raw)
        tmp.flush()
        try:
            for ch in open_source(tmp.name, hints=_hints(), verify_crc=False).changes():
                if ch.after is not None:
                    ch.after.asdict()
        except (MalformedEvent, SourceError) as exc:
            assert str(exc)


def test_filters() -> None:
    tables = TableFilter.parse(["shop.*", "*.audit_?", "crm"])
    assert tables("shop", "items") and tables("x", "audit_1") and tables("crm", "users")
    assert not tables("x", "audit_10") and not tables("shopx", "a")
    gtids = GtidFilter("0-1-5,1-2-3..0-1-7")
    assert [gtids(f"0-1-{n}") for n in (4, 5, 7, 8)] == [False, True, True, False]
    assert gtids("1-2-9") and not gtids("1-2-2") and gtids("2-1-1") and not gtids(None)
    assert GtidFilter("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")(
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:5")


def test_changes_cli_filters_and_json(tmp_path: Any) -> None:
    def run(*args: str) -> list[dict[str, Any]]:
        res = subprocess.run([sys.executable, "-m", "relay.cli", "changes", BINLOG, *args,
                              *_hint_args()], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [json.loads(line) for line in res.stdout.splitlines()]

    lines = run("--table", "full.t")
    assert {(x["schema"], x["table"]) for x in lines} == {("full", "t")}
    first = lines[0]
    assert first["after"]["u"] == "01234567-89ab-4def-8123-456789abcdef"
    assert first["after"]["d65"] == "-1.000000000000000000000000000001"
    assert first["after"]["t4"] == "-00:00:00.0001"  # TIME(4): its four digits
    assert first["after"]["s"] == ["x", "z"] and first["after"]["i4"] == "10.0.0.1"
    gtid = lines[3]["gtid"]
    one = run("--gtid", f"{gtid}..{gtid}")
    assert one and {x["gtid"] for x in one} == {gtid}
    queries = run("--queries", "--table", "full")
    assert any(x["op"] == "query" and "CREATE TABLE" in x["query"] for x in queries)
    res = subprocess.run([sys.executable, "-m", "relay.cli", "changes", BINLOG],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "type hint" in res.stderr and "types.000001" in res.stderr


def test_change_lines_are_the_same_through_the_kernel_and_the_row_codec() -> None:
    """`relay changes`' lines of a captured binlog of every type family: byte-identical
    whether the json_images kernel or the generated writer writes an event's images (the
    kernel took rows), and each line's images are jsonvalue's image_jsonable."""
    from relay import kernels
    from relay.binlog.changelines import ChangeLines
    from relay.binlog.jsonvalue import image_jsonable

    outs = []
    for kernel in (True, False):
        writer = ChangeLines(kernel=kernel)
        out = bytearray()
        for tx in open_source(BINLOG, hints=_hints()).transactions():
            head = writer.head(tx.gtid, tx.server_id, tx.timestamp.isoformat())
            for st in tx.statements():
                if isinstance(st, RowsStatement):
                    writer.add(head, st, out, lambda: None)
        outs.append((bytes(out), writer.kernel_rows))
    (by_kernel, kernel_rows), (by_codec, codec_rows) = outs
    assert by_kernel == by_codec and codec_rows == 0
    if kernels.IMPLEMENTATION is kernels.Implementation.COMPILED:
        assert kernel_rows > 0  # (most of its tables have types only the codec takes)
    lines = [json.loads(line) for line in by_kernel.splitlines()]
    want = []
    for tx in open_source(BINLOG, hints=_hints()).transactions():
        for st in tx.statements():
            if isinstance(st, RowsStatement):
                for ch in st.changes():
                    want.append({"gtid": tx.gtid, "server_id": tx.server_id,
                                 "timestamp": tx.timestamp.isoformat(),
                                 "file": ch.position.file, "pos": ch.position.offset,
                                 "row": ch.row, "op": ch.op, "schema": ch.schema,
                                 "table": ch.table,
                                 "before": None if ch.before is None else image_jsonable(
                                     st.table, ch.before),
                                 "after": None if ch.after is None else image_jsonable(
                                     st.table, ch.after)})
    assert lines == json.loads(json.dumps(want))
