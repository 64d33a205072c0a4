"""`relay changes`' line kernel: over real binlog files (a MariaDB capture of every type
family, the MySQL 5.7 to 9.6 captures) its lines equal the general path's byte for byte,
compiled and pure, with any spill size; the twins agree on mutated events (checksums
fixed up, so the kernel reads them) in output, returned state and errors."""

from __future__ import annotations

import glob
import io
import json
import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.binlog.changelines import ChangeLines
from relay.binlog.changes import row_images
from relay.binlog.decoder import StreamDecoder
from relay.binlog.plans import PlanCache, json_plan
from relay.binlog.position import Position
from relay.binlog.tablemap import TypeHints
from relay.errors import RelayError
from relay.kernels import pure
from relay.kernels.protocol import Kernels
from relay.relaylog.series import BinlogSeries
from relay.sources import lines as lines_module
from relay.sources import open_source
from relay.sources.filters import TableFilter
from relay.sources.lines import LineWriter, file_lines

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
MARIADB = os.path.join(DATA, "mariadb", "types.000001")
FILES = [MARIADB, *sorted(glob.glob(os.path.join(DATA, "mysql8", "*.bin")))]
COMPILED = kernels.compiled_kernels()
EXAMPLES = int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150"))   # more: bench/fuzz.py


def hints_for(path: str) -> TypeHints:
    """The MariaDB capture's hints (types its binlog does not carry; one old DATETIME
    cannot be read without its precision)."""
    if path != MARIADB and path not in MARIADB_PATHS:
        return TypeHints()
    with open(os.path.join(DATA, "mariadb", "hints.json")) as f:
        return TypeHints.parse([f"{k}={v}" for k, v in json.load(f).items()])


def twins() -> list[Kernels]:
    assert COMPILED is not None, kernels.REASON
    return [pure, COMPILED]


def lines_of(path: str, kernel: Kernels | None, monkeypatch: pytest.MonkeyPatch,
             tables: list[str] | None = None, spill: int = 1 << 20) -> tuple[str, bytes]:
    """(how it ended, the lines) of `relay changes PATH --queries` by the general path
    (kernel None) or through `kernel`'s change_lines."""
    out = io.BytesIO()
    writer = LineWriter(out, TableFilter.parse(tables or []), queries=True)
    source = open_source(path, hints=hints_for(path))
    monkeypatch.setattr(lines_module, "SPILL", spill)
    try:
        if kernel is None:
            for tx in source.transactions():
                writer.transaction(tx)
        else:
            monkeypatch.setattr(kernels, "change_lines", kernel.change_lines)
            assert isinstance(source.reader, BinlogSeries)
            file_lines(source.reader, source.hints, writer)
    except RelayError as exc:
        return f"error: {exc}", out.getvalue()
    return "ok", out.getvalue()


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_the_kernels_lines_are_the_general_paths(path: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    expected = lines_of(path, None, monkeypatch)
    if path == MARIADB:  # every type family, read to the end
        assert expected[0] == "ok" and expected[1].count(b"\n") > 50
    for kernel in twins():
        for spill in (1 << 20, 1):  # (1: back to Python after every event)
            assert lines_of(path, kernel, monkeypatch, spill=spill) == expected, \
                (kernel is pure, spill)


def test_a_table_filter_holds_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    general = lines_of(MARIADB, None, monkeypatch, tables=["full.*"])
    assert general[0] == "ok" and general[1].count(b"\n") > 0
    for kernel in twins():
        assert lines_of(MARIADB, kernel, monkeypatch, tables=["full.*"]) == general


class Callbacks:
    """What relay/sources/lines.py gives the kernel, over one file's bytes."""

    def __init__(self, data: bytes, crc_len: int, decoder: StreamDecoder | None = None) -> None:
        self.decoder = decoder or StreamDecoder(hints_for(MARIADB))
        fde_size = struct.unpack_from("<I", data, 4 + 9)[0]
        self.decoder.format_description(data[4 : 4 + fde_size])
        self.data, self.crc_len = data, crc_len
        self.plans = PlanCache(json_plan)
        self.lines = ChangeLines()
        self.fde_end = 4 + fde_size
        self.calls: list[tuple[str, int]] = []

    def table_map(self, p: int, size: int) -> tuple[Any, ...] | None:
        self.calls.append(("table_map", p))
        table = self.decoder.table_map(self.data[p : p + size], checksum=bool(self.crc_len))
        plan = self.plans.get(table)
        names = b',"schema":"' + table.schema.encode() + b'","before":'
        body = self.data[p + 19 : p + size - self.crc_len]
        if plan is None:
            return (table.table_id, len(table.columns), None, (), (), names, body, table)
        return (table.table_id, len(table.columns), *plan, names, body, table)

    def images(self, p: int, size: int, entry: tuple[Any, ...]
               ) -> list[tuple[bytes | None, bytes | None]]:
        self.calls.append(("images", p))
        rev = self.decoder.rows_event(self.data[p : p + size], checksum=bool(self.crc_len))
        rows = row_images(rev, entry[7], self.decoder.codecs, Position("f", p))
        return self.lines.write_images(entry[7], rows)


def run_kernel(kernel: Kernels, data: bytes, limit: int,
               decoder: StreamDecoder | None = None) -> tuple[Any, ...]:
    """Every call of the kernel over data from its FORMAT_DESCRIPTION's end to the end,
    resuming as lines.py does; the outcome, the lines and the callbacks it made."""
    calls = Callbacks(data, 4, decoder)
    state: list[Any] = [0, 0, b"", {}, 0]
    out = bytearray()
    pos, stops = calls.fde_end, []
    try:
        while pos < len(data):
            new = kernel.change_lines(data, pos, len(data), 4, state, calls.table_map,
                                      calls.images, out, b',"file":"f","pos":', limit)
            stops.append((new, state[0], state[1], state[2]))
            if new == pos and not state[0]:  # (the general path's: on to the next GTID)
                new = next((p for p, _ in events_of(data, pos) if p > pos
                            and p + 4 < len(data) and data[p + 4] == 162), len(data))
            pos = new
    except Exception as exc:  # (a callback's error too: both must pass it on)
        return ("error", type(exc).__name__, str(exc), stops, bytes(out), calls.calls)
    return ("ok", stops, bytes(out), sorted(state[3]), calls.calls)


def events_of(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    p = start
    while p + 19 <= len(data):
        size = struct.unpack_from("<I", data, p + 9)[0]
        if size < 19:
            return
        yield p, size
        p += size


def capture() -> bytes:
    with open(MARIADB, "rb") as f:
        return f.read()


def test_the_kernel_takes_the_common_transactions_itself() -> None:
    data = capture()
    for kernel in twins():
        result = run_kernel(kernel, data, 1 << 30)
        assert result[0] == "ok"
        assert result[2].count(b"\n") > 40  # lines written (of 62 in the file)
        assert sum(1 for stop in result[1] if stop[0] > 0) > 10


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_the_twins_agree_on_mutated_events(data: st.DataObject) -> None:
    raw = bytearray(capture())
    spans = list(events_of(bytes(raw), 4))[1:]
    for _ in range(data.draw(st.integers(1, 3))):
        p, size = data.draw(st.sampled_from(spans))
        at = data.draw(st.integers(p + 4, p + size - 5))  # type, size, body: not the CRC
        raw[at] = data.draw(st.integers(0, 255))
        if at in range(p + 9, p + 13):
            break  # a size changed: the events after it are not where they were
        struct.pack_into("<I", raw, p + size - 4, zlib.crc32(raw[p : p + size - 4]))
    fde_end = spans[0][0]
    cut = data.draw(st.sampled_from([len(raw), len(raw) - 1,
                                     data.draw(st.integers(fde_end, len(raw)))]))
    limit = data.draw(st.sampled_from([1, 200, 1 << 30]))
    blob = bytes(raw[:cut])
    outcomes = [run_kernel(kernel, blob, limit) for kernel in twins()]
    assert outcomes[0] == outcomes[1]


def test_arguments_no_caller_passes_are_refused() -> None:
    data = capture()
    for kernel in twins():
        call: Callable[..., int] = kernel.change_lines
        with pytest.raises(ValueError):
            call(data, 4, len(data) + 1, 4, [0, 0, b"", {}, 0], None, None, bytearray(), b"", 1)
        with pytest.raises(ValueError):
            call(data, 4, len(data), 3, [0, 0, b"", {}, 0], None, None, bytearray(), b"", 1)
        with pytest.raises(ValueError):  # resuming elsewhere than it stopped
            call(data, 4, len(data), 4, [9, 99, b"", {}, 0], None, None, bytearray(), b"", 1)


# --- shapes the captures lack, built from the MariaDB capture's own events ----------------
# (offsets in types.000001: its FORMAT_DESCRIPTION, GTID_LIST and checkpoint end at 457;
# then transaction 0-1-3 at 685: GTID, ANNOTATE_ROWS, TABLE_MAP of old.t, WRITE_ROWS, XID)

def event_at(data: bytes, p: int) -> bytes:
    return data[p : p + struct.unpack_from("<I", data, p + 9)[0]]


def fixed(ev: bytes | bytearray, table_id: int | None = None) -> bytes:
    """The event with its size, table id (a rows or map event) and CRC made right."""
    ev = bytearray(ev)
    if table_id is not None:
        ev[19:25] = table_id.to_bytes(6, "little")
    struct.pack_into("<I", ev, 9, len(ev))
    struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
    return bytes(ev)


def same_lines_everywhere(blob: bytes, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                          spill: int = 1 << 20) -> tuple[str, bytes]:
    path = str(tmp_path / "x.000001")
    with open(path, "wb") as f:
        f.write(blob)
    monkeypatch.setattr(sys.modules[__name__], "MARIADB_PATHS", {path})
    general = lines_of(path, None, monkeypatch, spill=spill)
    for kernel in twins():
        assert lines_of(path, kernel, monkeypatch, spill=spill) == general, kernel is pure
    return general


MARIADB_PATHS: set[str] = set()


def parts() -> dict[str, bytes]:
    data = capture()
    tid = int.from_bytes(event_at(data, 887)[19:25], "little")
    return {"head": data[:685], "gtid": event_at(data, 685), "map": event_at(data, 887),
            "rows": event_at(data, 964), "xid": event_at(data, 1031),
            # full.t's map and rows under old.t's table id
            "map_b": fixed(event_at(data, 3307), tid), "rows_b": fixed(event_at(data, 3619), tid)}


def test_a_table_id_mapped_anew_inside_a_transaction(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    e = parts()
    tx = e["gtid"] + e["map"] + e["rows"] + e["map_b"] + e["rows_b"] + e["xid"]
    result = same_lines_everywhere(e["head"] + tx, tmp_path, monkeypatch)
    assert result[0] == "ok" and result[1].count(b"\n") > 3  # (and two DDL lines)


def test_maps_of_a_general_path_transaction_are_the_decoders(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel, general path (a rows event before its map), kernel with a map it has seen,
    then a rows event of no map of its own: each reads the map in force."""
    e = parts()
    txs = [e["gtid"] + e["map"] + e["rows"] + e["xid"],
           e["gtid"] + e["rows"] + e["map_b"] + e["rows_b"] + e["xid"],
           e["gtid"] + e["map"] + e["rows"] + e["xid"],
           e["gtid"] + e["rows"] + e["xid"]]
    result = same_lines_everywhere(e["head"] + b"".join(txs), tmp_path, monkeypatch)
    assert result[0] == "ok" and result[1].count(b"\n") >= 5


def test_a_second_format_description_switches_the_checksums(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    e = parts()
    fde = bytearray(e["head"][4 : 4 + struct.unpack_from("<I", e["head"], 13)[0]])
    fde[-5] = 0  # checksum algorithm: none (and the CRC itself still there, as servers do)
    blob = e["head"][:4] + fixed(fde) + e["head"][4:] + e["gtid"] + e["map"] + e["rows"] + \
        e["xid"]
    result = same_lines_everywhere(blob, tmp_path, monkeypatch)
    assert result[0] == "ok" and result[1].count(b"\n") >= 3


def test_a_transaction_of_65_maps_of_one_table(tmp_path: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    e = parts()
    blob = e["head"] + e["gtid"] + (e["map"] + e["rows"]) * 65 + e["xid"]
    for spill in (1 << 20, 1):
        result = same_lines_everywhere(blob, tmp_path, monkeypatch, spill=spill)
        assert result[0] == "ok" and result[1].count(b"\n") >= 65 + 2


def test_a_failing_event_keeps_the_whole_transactions_before_it(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its hints the capture's old DATETIME cannot be read: both paths print the
    transactions before it (one the kernel writes), then the error."""
    monkeypatch.setattr(sys.modules[__name__], "hints_for", lambda path: TypeHints())
    e, data = parts(), capture()
    full = e["gtid"] + event_at(data, 3307) + event_at(data, 3619) + e["xid"]
    old = e["gtid"] + e["map"] + e["rows"] + e["xid"]
    result = same_lines_everywhere(e["head"] + full + old, tmp_path, monkeypatch)
    assert result[0].startswith("error") and b'"table":"t"' in result[1]
    assert result[1].count(b"\n") > 3
