"""The snapshot's row reader: the text-result kernels' twins held to each other (any bytes:
well-formed rows, cut ones, mutated ones, the EOF and error packets), the JSON they write
held to the snapshot's generated writer (json_row_writer, the definition), and TextResult
around them (blocks of any size, rows of several packets, errors named)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.kernels import pure
from relay.kernels.protocol import Kernels, TextStep
from relay.tap.json_images import JsonImages
from relay.tap.snapshot import ColumnSpec, TableSpec, json_row_writer, json_text_plan
from relay.tap.textresult import MalformedResult, TextResult
from relay.wire.codec import lenenc_str

COMPILED = kernels.compiled_kernels()
EXAMPLES = int(os.environ.get("RELAY_KERNEL_EXAMPLES", "200"))   # more: bench/fuzz.py
EOF = b"\xfe\x00\x00\x02\x00"
ERROR = b"\xff" + struct.pack("<H", 1317) + b"#70100Query execution was interrupted"


def twins() -> tuple[Kernels, Kernels]:
    assert COMPILED is not None, kernels.REASON
    return pure, COMPILED


def packet(payload: bytes, seq: int = 0) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes((seq & 0xFF,)) + payload


def row_payload(values: tuple[bytes | None, ...]) -> bytes:
    return b"".join(b"\xfb" if v is None else lenenc_str(v) for v in values)


def stream(rows: list[tuple[bytes | None, ...]], end: bytes = EOF) -> bytes:
    return b"".join(packet(row_payload(r), i) for i, r in enumerate(rows)) + \
        (packet(end) if end else b"")


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except ValueError as exc:
        return "refused", str(exc)


VALUES = st.none() | st.binary(max_size=40) | st.builds(lambda n: b"v" * n,
                                                         st.sampled_from([250, 251, 300, 65535,
                                                                          65536]))


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.data())
def test_text_rows_twins_agree_on_any_result(ncols: int, data: st.DataObject) -> None:
    rows = data.draw(st.lists(st.tuples(*[VALUES] * ncols), max_size=6))
    raw = bytearray(stream(rows, data.draw(st.sampled_from([EOF, packet(ERROR), b""]))))
    if raw and data.draw(st.booleans()):  # a mutated byte, or a stream cut short
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if raw and data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw) - 1)):]
    limit = data.draw(st.integers(0, 8))
    width = data.draw(st.sampled_from([ncols, ncols + 1, max(1, ncols - 1)]))
    got = []
    for k in twins():
        out: list[tuple[bytes | None, ...]] = []
        got.append((outcome(partial(k.text_rows, raw, 0, len(raw), width, out, limit)), out))
    assert got[0] == got[1]
    if width == ncols and raw == stream(rows):
        assert got[0][1] == rows[:limit]


def test_text_rows_stop_at_the_end_and_at_rows_of_several_packets() -> None:
    for k in twins():
        raw = stream([(b"1", None), (b"2", b"x")])
        out: list[tuple[bytes | None, ...]] = []
        pos = k.text_rows(raw, 0, len(raw), 2, out, 100)
        assert out == [(b"1", None), (b"2", b"x")] and raw[pos:] == packet(EOF)
        big = b"\xff\xff\xff\x00" + b"\x00" * 10  # a payload of 0xFFFFFF bytes: not taken
        assert k.text_rows(big, 0, len(big), 1, out, 100) == 0
        for bad in (-1, 5):
            with pytest.raises(ValueError):
                k.text_rows(raw, bad if bad < 0 else 0, len(raw) + bad, 2, out, 1)
        with pytest.raises(ValueError):
            k.text_rows(raw, 0, len(raw), 0, out, 1)


# Values as the server prints them, per step, and bytes no server prints.
SERVER_TEXT = {
    TextStep.INT: st.integers(-(2**63), 2**64 - 1).map(lambda n: str(n).encode())
    | st.integers(0, 99999).map(lambda n: b"%05d" % n),
    TextStep.TEXT: st.text(max_size=12).map(lambda s: s.encode("utf-8", "surrogatepass")),
    TextStep.BASE64: st.binary(max_size=12),
    TextStep.DECIMAL: st.decimals(allow_nan=False, allow_infinity=False, places=9,
                                  min_value=-(10**20), max_value=10**20).map(
        lambda d: f"{d:f}".encode()) | st.sampled_from([b"0.0000001", b"-0.000000100",
                                                         b"0.000001", b"-0.00", b"7"]),
    TextStep.DATE: st.sampled_from([b"2024-02-28", b"2024-02-29", b"0000-00-00", b"2024-00-10",
                                    b"0999-12-31", b"2024-13-01", b"2024-04-31"]),
    TextStep.DATETIME: st.sampled_from([b"2024-02-28 10:00:00", b"2024-02-29 23:59:59.5",
                                        b"0000-00-00 00:00:00", b"1999-12-31 23:59:59.999999",
                                        b"2024-01-02 03:04:05.120", b"2024-01-00 00:00:00"]),
}
SERVER_TEXT[TextStep.TIMESTAMP] = SERVER_TEXT[TextStep.DATETIME]
NOISE = st.sampled_from([b"", b"-", b"1e5", b" 12", b"12 ", b"+1", b"1.", b".5", b"\xc3(",
                         b"\xed\xa0\x80", b"2024-02-28T10:00:00", b"2024-02-28 10:00:00.",
                         b"2024-02-28 10:00:00.1234567", b"\x00\x1f\"\\"])
KINDS = {TextStep.INT: "int", TextStep.TEXT: "varchar", TextStep.BASE64: "varbinary",
         TextStep.DECIMAL: "decimal", TextStep.DATE: "date", TextStep.DATETIME: "datetime",
         TextStep.TIMESTAMP: "timestamp"}


def spec_of(steps: list[TextStep]) -> TableSpec:
    return TableSpec("s", "t", tuple(ColumnSpec(f"c{i}\u00e9\"", KINDS[s], s is TextStep.BASE64)
                                     for i, s in enumerate(steps)), ("c0",), True)


@st.composite
def text_rows_of(draw: st.DrawFn, steps: list[TextStep], noise: bool) -> list[tuple[Any, ...]]:
    value = {s: st.none() | SERVER_TEXT[s] | (NOISE if noise else st.nothing()) for s in steps}
    return draw(st.lists(st.tuples(*[value[s] for s in steps]), max_size=6))


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list(TextStep)), min_size=1, max_size=7), st.data())
def test_json_text_rows_twins_agree_on_any_rows(steps: list[TextStep],
                                                data: st.DataObject) -> None:
    rows = data.draw(text_rows_of(steps, noise=True))
    raw = bytearray(stream(rows, data.draw(st.sampled_from([EOF, packet(ERROR), b""]))))
    if raw and data.draw(st.booleans()):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    plan = json_text_plan(spec_of(steps))
    assert plan is not None
    start = data.draw(st.integers(0, 9))  # rows already in the sink
    limit = data.draw(st.integers(0, 8))
    got = []
    for k in twins():
        sink = [bytearray(b"\xff" * (start // 8 + 1)), bytearray(4 * (start + 1)),
                bytearray(b"t" * start)]
        got.append((outcome(partial(k.json_text_rows, raw, 0, len(raw), *plan, sink, start,
                                    limit)), sink))
    assert got[0] == got[1]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list(TextStep)), min_size=1, max_size=7), st.data())
def test_the_snapshot_json_is_the_writers_through_the_kernel(steps: list[TextStep],
                                                             data: st.DataObject) -> None:
    """Whatever the kernel writes and whatever it leaves to the writer: the images are
    json_row_writer's for every row, read in blocks of any size."""
    rows = data.draw(text_rows_of(steps, noise=False))
    spec = spec_of(steps)
    plan = json_text_plan(spec)
    assert plan is not None
    write = json_row_writer(spec)
    raw = stream(rows)
    pieces = iter(data.draw(st.lists(st.integers(1, 64), min_size=len(raw), max_size=len(raw))))
    at = 0

    def read(size: int) -> bytes:
        nonlocal at
        n = min(size, next(pieces), len(raw) - at)
        assert n > 0, "read past the result"
        at += n
        return raw[at - n : at]

    result = TextResult(read, _error, len(steps), "test")
    images = JsonImages()
    while result.json_into(images, *plan, write, data.draw(st.integers(1, 4))):
        pass
    assert images.array().to_pylist() == [write(r) for r in rows]
    assert result.done and at == len(raw)


def _error(payload: bytes) -> Exception:
    return RuntimeError(payload[3:].decode())


def reader_of(raw: bytes, block: int = 7) -> Callable[[int], bytes]:
    at = 0

    def read(size: int) -> bytes:
        nonlocal at
        n = min(size, block, len(raw) - at)
        if n == 0:
            raise ConnectionError("read past the result")
        at += n
        return raw[at - n : at]

    return read


def test_a_row_of_several_packets_is_joined() -> None:
    big = b"x" * (0xFFFFFF + 10)
    payload = row_payload((b"1", big))
    raw = packet(payload[:0xFFFFFF], 1) + packet(payload[0xFFFFFF:], 2) + \
        stream([(b"2", b"y")])
    result = TextResult(reader_of(raw, 1 << 20), _error, 2, "test")
    rows = [r for batch in result.rows() for r in batch]
    assert rows == [(b"1", big), (b"2", b"y")] and result.done


def test_an_error_packet_raises_the_servers_error_and_a_bad_packet_names_its_offset() -> None:
    raw = stream([(b"1",), (b"2",)], end=ERROR)
    result = TextResult(reader_of(raw), _error, 1, "test")
    with pytest.raises(RuntimeError, match="interrupted"):
        list(result.rows())
    raw = stream([(b"1",)], end=b"") + packet(b"\x05ab")  # says 5 bytes, has 2
    result = TextResult(reader_of(raw), _error, 1, "snapshot of s.t, chunk 3")
    with pytest.raises(MalformedResult, match=r"chunk 3: a packet of 3 bytes at offset 6 "):
        list(result.rows())


def test_drain_reads_to_the_end_of_the_rows() -> None:
    raw = stream([(b"%d" % i,) for i in range(1000)])
    result = TextResult(reader_of(raw, 100), _error, 1, "test")
    first = next(result.rows(limit=3))
    assert first == [(b"0",), (b"1",), (b"2",)]
    result.drain()
    assert result.done  # (and read no byte past the EOF packet: the reader would raise)


def test_a_plan_only_for_the_kinds_the_kernel_writes() -> None:
    assert json_text_plan(TableSpec("s", "t", (ColumnSpec("i", "int", False),
                                               ColumnSpec("f", "float", False)),
                                    ("i",), True)) is None
    plan = json_text_plan(TableSpec("s", "t", (ColumnSpec("y", "year", False),
                                               ColumnSpec("e", "enum", False),
                                               ColumnSpec("c", "char", True)), ("y",), True))
    assert plan == ((TextStep.INT, TextStep.TEXT, TextStep.BASE64),
                    (b'{"y":', b',"e":', b',"c":'))


def test_the_server_error_is_pymysqls_and_a_cut_one_ours() -> None:
    from relay.tap.snapshot import _server_error

    exc = _server_error(ERROR)
    assert isinstance(exc, pymysql.err.OperationalError) and exc.args[0] == 1317
    for cut in (b"\xff", b"\xff\x01\x02"):
        assert isinstance(_server_error(cut), MalformedResult)


def test_a_row_of_four_packets_read_in_small_blocks() -> None:
    """(Copied once when whole: reading 50 MB in 64 KiB blocks stays linear.)"""
    big = b"y" * (3 * 0xFFFFFF + 5)
    payload = row_payload((big,))
    raw = b"".join(packet(payload[i : i + 0xFFFFFF], i) for i in range(0, len(payload),
                                                                       0xFFFFFF))
    result = TextResult(reader_of(raw + packet(EOF), 1 << 16), _error, 1, "test")
    assert [r for batch in result.rows() for r in batch] == [(big,)] and result.done


def test_the_twins_take_the_steps_as_their_enum_too() -> None:
    raw = stream([(b"5",)])
    for k in twins():
        sink = [bytearray(), bytearray(4), bytearray()]
        assert k.json_text_rows(raw, 0, len(raw), (TextStep.INT,), (b'{"a":',), sink, 0,
                                9) == (len(raw) - 9, 1)
        assert bytes(sink[2]) == b'{"a":5}'
        with pytest.raises(ValueError):
            k.json_text_rows(raw, 0, len(raw), (1.0,), (b'{"a":',), sink, 1, 9)  # type: ignore[arg-type]
