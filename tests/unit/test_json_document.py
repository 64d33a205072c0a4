"""The json_document kernel (MySQL's binary JSON documents): the compiled twin gives what
the pure one gives, value for value and type for type, and the same error for bad bytes;
relay/binlog/jsonb decodes through the kernel chosen at import."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.binlog import jsonb
from relay.binlog import values as V
from relay.kernels import pure
from relay.kernels.protocol import ColumnStep
from tests.unit.test_kernels import outcome, twins

_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
            | st.integers(0, 2**64 - 1).map(jsonb.JsonUInt)
            | st.floats(allow_nan=False) | st.text(max_size=30)
            | st.decimals(allow_nan=False, allow_infinity=False, places=3,
                          min_value=Decimal(-10**20), max_value=Decimal(10**20))
            | st.datetimes(min_value=datetime(1000, 1, 1)) | st.dates(min_value=date(1000, 1, 1))
            | st.timedeltas(min_value=timedelta(hours=-838), max_value=timedelta(hours=838))
            | st.binary(max_size=20).map(lambda b: jsonb.JsonOpaque(252, b)))
DOCUMENTS = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=6)
                         | st.dictionaries(st.text(max_size=10), inner, max_size=6),
                         max_leaves=40)


# what relay/binlog/jsonb.py gives the kernel to make
DOCUMENT_TYPES = (jsonb.JsonUInt, jsonb.decode_opaque, jsonb.json_decimal)


def shape(value: Any) -> Any:
    """A value with every type spelled out (True is not 1, JsonUInt is not int, a key's
    order counts), comparable with ==."""
    if isinstance(value, dict):
        return "dict", [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return "list", [shape(v) for v in value]
    if isinstance(value, jsonb.JsonDecimal):
        return "JsonDecimal", repr(value), value.precision
    return type(value).__name__, repr(value)


def decoded(kernel: Any, raw: bytes) -> tuple[str, Any]:
    return outcome(lambda: shape(kernel.json_document(raw, *DOCUMENT_TYPES)))


@given(DOCUMENTS)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_twins_decode_any_document_as_it_was_encoded(value: Any) -> None:
    raw = jsonb.encode(value)
    results = [decoded(twin, raw) for twin in twins()]
    assert results[0] == results[1] and results[0][0] == "ok"
    back = twins()[1].json_document(raw, *DOCUMENT_TYPES)
    assert back == value and jsonb.encode(back) == raw


@given(DOCUMENTS, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.integers(1, 10**6))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_twins_agree_on_mutated_and_cut_documents(value: Any, changes: list[tuple[int, int]],
                                                  cut: int) -> None:
    """Bad bytes: the same value or the same MalformedEvent (message included)."""
    raw = bytearray(jsonb.encode(value))
    for at, byte in changes:
        raw[at % len(raw)] = byte
    data = bytes(raw[: max(1, cut % (len(raw) + 1))])
    pure_result, compiled_result = (decoded(twin, data) for twin in twins())
    assert pure_result == compiled_result
    assert pure_result[0] in ("ok", "error")


def test_twins_agree_past_the_depth_a_server_writes() -> None:
    """MySQL nests at most 100 deep; a deeper document (not from a server) is the pure
    twin's to decode, so both give the same."""
    for depth in (99, 100, 101, 150):
        value: Any = 7
        for _ in range(depth):
            value = [value]
        raw = jsonb.encode(value)
        results = [decoded(twin, raw) for twin in twins()]
        assert results[0] == results[1] == ("ok", shape(value))


def test_twins_agree_on_empty_and_unknown_types() -> None:
    for raw in (b"", b"\x0d", b"\x04\x03", b"\x0c\x05ab", b"\x0c\x02\xff\xfe", b"\x00\x01"):
        results = [decoded(twin, raw) for twin in twins()]
        assert results[0] == results[1]
        assert results[0][0] == "error"


def test_jsonb_decodes_through_the_chosen_kernel() -> None:
    assert kernels.json_document is (pure.json_document if kernels.IMPLEMENTATION
                                     is kernels.Implementation.PURE
                                     else twins()[1].json_document)
    raw = jsonb.encode({"a": [1, jsonb.JsonUInt(5), None], "b": Decimal("1.50")})
    assert shape(jsonb.decode(raw)) == shape({"a": [1, jsonb.JsonUInt(5), None],
                                              "b": jsonb.JsonDecimal(Decimal("1.50"), 3)})
    assert jsonb.decode(jsonb.encode(None)) is jsonb.JSON_NULL
    assert jsonb.decode(b"") is jsonb.JSON_EMPTY


def test_entries_that_share_a_value_are_refused_at_the_document_s_size() -> None:
    """Arrays whose two entries point at one child, 16 deep: 2**17 values by their
    offsets in 165 bytes (40 deep would be 2**41, hours). No server writes it (a document's
    values never share bytes); both twins refuse it once more values than bytes were seen,
    where they decoded every one before."""
    child = b"\x00\x00\x04\x00"                     # an empty small array
    for _ in range(16):
        size = 4 + 2 * 3 + len(child)
        child = (b"\x02\x00" + size.to_bytes(2, "little") + b"\x02\x0a\x00" * 2 + child)
    raw = b"\x02" + child
    results = [decoded(twin, raw) for twin in twins()]
    assert results[0] == results[1]
    assert results[0][0] == "error" and "more values than the document has bytes" in \
        results[0][1][1]


@given(st.integers(1, 65).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, min(p, 30)))),
       st.data())
def test_a_decimal_decodes_as_the_opaque_decoder_decodes_it(spec: tuple[int, int],
                                                            data: st.DataObject) -> None:
    """A DECIMAL scalar: the kernels' text of it, made a JsonDecimal, is the value, its
    text and its precision that jsonb.decode_opaque makes of the bytes (any bytes,
    what a server writes or not: those the text refuses go to decode_opaque itself)."""
    precision, scale = spec
    size = V.decimal_size(precision, scale)
    if data.draw(st.booleans()):
        digits = data.draw(st.integers(0, 10**precision - 1))
        value = Decimal((data.draw(st.integers(0, 1)), tuple(map(int, str(digits))), -scale))
        body = V.encode_decimal(value, precision, scale)
    else:
        body = data.draw(st.binary(min_size=size, max_size=size))
    opaque = bytes((precision, scale)) + bytes(body)
    raw = b"\x0f\xf6" + bytes((len(opaque),)) + opaque   # a document of one opaque scalar
    expected = outcome(lambda: shape(jsonb.decode_opaque(246, opaque)))
    for twin in twins():
        assert decoded(twin, raw) == expected


# --- a document as its JSON text: json_images and change_lines (ColumnStep.JSON) -------------

def _json_table() -> Any:
    from relay.binlog.describe import ColumnDescription, table_map

    return table_map("s", "docs", [
        ColumnDescription("id", "int", "int(11)", False, 10, 0, None, None, None),
        ColumnDescription("j", "json", "json", True, None, None, None, None, None)],
        ["id"], mariadb=False)


def _images(twin: Any, table: Any, data: bytes) -> tuple[int, bytes]:
    from relay.binlog.plans import json_plan

    steps = json_plan(table)
    assert steps is not None
    plan, charmaps, keys = steps
    sinks = [[bytearray(b"\xff"), bytearray(b"\0\0\0\0"), bytearray()]]
    n = twin.json_images(data, 0, len(data), plan, charmaps, keys, sinks, [0])
    return n, bytes(sinks[0][2])


def _both_images(steps: Any, data: bytes) -> list[tuple[int, bytes]]:
    """Both twins' json_images of `data` (one image a row) by `steps` (json_plan's)."""
    plan, charmaps, keys = steps
    out = []
    for twin in twins():
        sinks = [[bytearray(b"\xff"), bytearray(4), bytearray()]]
        out.append((twin.json_images(data, 0, len(data), plan, charmaps, keys, sinks, [0]),
                    bytes(sinks[0][2])))
    return out


def _written(table: Any, codec: Any, data: bytes) -> bytes:
    """What the generated writer writes of the row codec's images of `data`."""
    from relay.binlog.jsonwriter import json_writer

    writer = json_writer(table, table.names)
    out, p = [], 0
    while p < len(data):
        image, p = codec.decode(data, p)
        out.append(writer(image))
    return "".join(out).encode()


@pytest.mark.twins
@given(st.lists(st.none() | DOCUMENTS, min_size=1, max_size=4))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_json_images_write_a_document_as_the_generated_writer(docs: list[Any]) -> None:
    """Rows with a JSON column: both twins' json_images write what the generated writer
    writes of the row codec's values, or both give the event back (a date inside a
    document: the generated writer's)."""
    from relay.binlog.rowcodec import RowCodec

    table = _json_table()
    codec = RowCodec(table, (0, 1))
    data = b"".join(codec.encode([i, doc]) for i, doc in enumerate(docs))
    results = [_images(twin, table, data) for twin in twins()]
    assert results[0] == results[1]
    n, text = results[0]
    if n < 0:
        assert text == b""
        assert any(_has_opaque(doc) for doc in docs)
        return
    assert n == len(docs)
    assert text == _written(table, codec, data)


def _has_opaque(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_opaque(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_opaque(v) for v in value)
    return isinstance(value, (date, timedelta, jsonb.JsonOpaque)) or (
        isinstance(value, float) and not math.isfinite(value))


@pytest.mark.twins
@given(DOCUMENTS, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.integers(0, 10**6))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_json_images_twins_agree_on_mutated_documents(value: Any,
                                                      changes: list[tuple[int, int]],
                                                      cut: int) -> None:
    raw = bytearray(jsonb.encode(value))
    for at, byte in changes:
        raw[at % len(raw)] = byte
    doc = bytes(raw[: cut % (len(raw) + 1)])
    data = b"\0" + (7).to_bytes(4, "little") + len(doc).to_bytes(4, "little") + doc
    results = [_images(twin, _json_table(), data) for twin in twins()]
    assert results[0] == results[1]


def test_a_key_twice_is_written_once_as_a_dict_keeps_it() -> None:
    """No server writes a key twice; where one is (bad bytes), the compiled writer leaves
    the document to the pure twin, which keeps the key once, with its last value."""
    # {"a": 1, "a": 2}: a small object of two entries, keys at 18 and 19
    doc = (b"\x00\x02\x00\x14\x00" + b"\x12\x00\x01\x00" + b"\x13\x00\x01\x00"
           + b"\x05\x01\x00" + b"\x05\x02\x00" + b"aa")
    data = b"\0" + (7).to_bytes(4, "little") + len(doc).to_bytes(4, "little") + doc
    results = [_images(twin, _json_table(), data) for twin in twins()]
    assert results[0] == results[1] == (1, b'{"id":7,"j":{"a":2}}')


def test_only_the_json_writers_take_a_document_step() -> None:
    """decode_columns (the typed form keeps the generated path for a JSON column) and
    row_values (a CALL step there) refuse a JSON step; the typed plan has none."""
    from relay.binlog.plans import column_steps

    plan = (ColumnStep.JSON, 4, 0, 0)
    row = b"\0\1\0\0\0\x04"
    for twin in twins():
        with pytest.raises(ValueError, match="no column is stored as"):
            twin.decode_columns(row, 0, len(row), plan, (), [[bytearray(), bytearray(4),
                                                              bytearray()]], [0])
        with pytest.raises(ValueError, match="no column is stored as"):
            twin.row_values(row, 0, len(row), plan, (), (), 1, [])
    assert column_steps(_json_table(), ["INT", "STRING"]) is None



@pytest.mark.twins
@given(st.lists(st.tuples(st.none() | st.integers(0, 2**13 - 1),
                          st.none() | st.integers(0, 2**64 - 1),
                          st.none() | st.tuples(st.binary(max_size=30),
                                                st.integers(0, 2**32 - 1)),
                          st.none() | DOCUMENTS), min_size=1, max_size=4))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_json_images_write_bit_and_geometry_as_the_generated_writer(
        rows: list[tuple[Any, ...]]) -> None:
    """BIT(13), BIT(64), GEOMETRY ({"srid":..,"wkb":..}) and JSON in one table: both
    twins' json_images write what the generated writer writes, or give the event back."""
    from relay.binlog.describe import ColumnDescription, table_map
    from relay.binlog.plans import json_plan
    from relay.binlog.rowcodec import RowCodec

    table = table_map("s", "wide", [
        ColumnDescription("b13", "bit", "bit(13)", True, 13, None, None, None, None),
        ColumnDescription("b64", "bit", "bit(64)", True, 64, None, None, None, None),
        ColumnDescription("g", "geometry", "geometry", True, None, None, None, None, None),
        ColumnDescription("j", "json", "json", True, None, None, None, None, None)],
        mariadb=False)
    steps = json_plan(table)
    assert steps is not None and steps[0][0::4] == (
        ColumnStep.BIT, ColumnStep.BIT, ColumnStep.GEOMETRY, ColumnStep.JSON)
    codec = RowCodec(table, range(4))
    data = b"".join(codec.encode([r[0], r[1], None if r[2] is None else V.Geometry(*r[2]),
                                  r[3]]) for r in rows)
    results = _both_images(steps, data)
    assert results[0] == results[1]
    if results[0][0] < 0:
        assert any(_has_opaque(r[3]) for r in rows)
        return
    assert results[0][1] == _written(table, codec, data)


@pytest.mark.twins
@given(st.lists(st.tuples(*[st.none() | st.timedeltas(min_value=timedelta(hours=-838),
                                                      max_value=timedelta(hours=838))
                            for _ in range(4)]), min_size=1, max_size=5),
       st.binary(min_size=0, max_size=40))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_json_images_write_time_as_the_generated_writer(rows: list[tuple[Any, ...]],
                                                        noise: bytes) -> None:
    """TIME(0), TIME(1), TIME(3), TIME(6): the server's text with the column's digits, as
    the generated writer writes the codec's timedelta (negative values borrowing); and
    any bytes as a TIME(3) and a TIME(6) value, the same from both twins."""
    from relay.binlog.describe import ColumnDescription, table_map
    from relay.binlog.plans import json_plan
    from relay.binlog.rowcodec import RowCodec

    table = table_map("s", "times", [
        ColumnDescription(f"t{fsp}", "time", f"time({fsp})", True, None, None, fsp, None, None)
        for fsp in (0, 1, 3, 6)], mariadb=False)
    steps = json_plan(table)
    assert steps is not None and steps[0][0::4] == (ColumnStep.TIME2,) * 4
    codec = RowCodec(table, range(4))
    cut = [tuple(None if v is None else v - timedelta(microseconds=v.microseconds % 10**(
        6 - fsp)) for v, fsp in zip(row, (0, 1, 3, 6), strict=True)) for row in rows]
    data = b"".join(codec.encode(list(row)) for row in cut)
    results = _both_images(steps, data)
    assert results[0] == results[1] and results[0][0] == len(rows)
    assert results[0][1] == _written(table, codec, data)
    raw = (noise + bytes(14))[:14]   # a row of t3 and t6 only: 5 and 6 bytes
    two = json_plan(table_map("s", "two", [
        ColumnDescription(f"t{fsp}", "time", f"time({fsp})", False, None, None, fsp, None,
                          None) for fsp in (3, 6)], mariadb=False))
    assert two is not None
    outs = _both_images(two, b"\0" + raw[:11])
    assert outs[0] == outs[1]


def test_entries_that_share_a_long_string_are_refused_at_the_document_s_size() -> None:
    """An array of 100 entries pointing at one string of 1,000 bytes: 100,000 bytes of
    text from a document of 1,307 (made large, a few entries at one long string would
    make gigabytes). Both twins refuse it, the JSON writers give it back."""
    string = b"\x0c" + bytes((0xE8, 0x07)) + b"x" * 1000   # type byte, varlen 1000, text
    offset = 4 + 100 * 3
    body = (100).to_bytes(2, "little") + (offset + len(string) - 1).to_bytes(2, "little") \
        + (b"\x0c" + offset.to_bytes(2, "little")) * 100 + string[1:]
    raw = b"\x02" + body
    results = [decoded(twin, raw) for twin in twins()]
    assert results[0] == results[1]
    assert results[0][0] == "error" and "more values than the document has bytes" in \
        results[0][1][1]
    data = b"\0" + (7).to_bytes(4, "little") + len(raw).to_bytes(4, "little") + raw
    assert [_images(twin, _json_table(), data) for twin in twins()] == [(-1, b"")] * 2
