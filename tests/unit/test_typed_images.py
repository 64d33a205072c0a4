"""The typed form's images built column by column (relay/tap/typed_images.py) equal the
definition, one image at a time (BatchBuilder.typed_values into Arrow's list-of-dicts
conversion), for every column type and the values that take the slow path: NULLs, zero
dates, a DATETIME that carries a zone, bytes where text is expected, geometry, images of
another version of the table and columns rescued as JSON."""

from __future__ import annotations

import dataclasses
import importlib
import os
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if os.environ.get("CI"):
    importlib.import_module("pyarrow")
else:
    pytest.importorskip("pyarrow")

import pyarrow as pa

import relay.kernels as kernels
from relay.binlog.constants import EventType
from relay.binlog.describe import ColumnDescription, table_map
from relay.binlog.jsonwriter import json_writer
from relay.binlog.plans import column_steps
from relay.binlog.rowcodec import RowImage
from relay.binlog.rows import RowData, RowsEvent
from relay.binlog.values import Geometry, InvalidTemporal
from relay.kernels import pure
from relay.tap.arrow import BatchBuilder
from relay.tap.evolution import SchemaEvolution
from relay.tap.json_images import JsonImages, json_event
from relay.tap.sparktypes import INVALID_TEMPORALS, image_struct, spark_type
from relay.tap.typed_images import TypedImages, decode_event


def col(name: str, data_type: str, column_type: str | None = None, *,
        precision: int | None = None, scale: int | None = None, fsp: int | None = None,
        octets: int | None = None, collation: int | None = None) -> ColumnDescription:
    return ColumnDescription(name, data_type, column_type or data_type, True, precision,
                             scale, fsp, octets, collation)


TABLE = table_map("s", "t", [
    col("id", "int"), col("big", "bigint", "bigint(20) unsigned"),
    col("tiny", "tinyint"), col("f", "float"), col("d", "double"),
    col("dec", "decimal", "decimal(10,2)", precision=10, scale=2),
    col("note", "varchar", "varchar(20)", octets=80, collation=45),
    col("raw", "varbinary", "varbinary(8)", octets=8),
    col("dt", "datetime", "datetime(3)", fsp=3), col("ts", "timestamp", "timestamp", fsp=0),
    col("day", "date"), col("t", "time", "time", fsp=0), col("doc", "json"),
    col("tags", "set", "set('a','b','c')"), col("kind", "enum", "enum('x','y')"),
    col("yr", "year"), col("bits", "bit", "bit(64)", precision=64),
    col("shape", "geometry")], ["id"])

_ZERO_DATE = InvalidTemporal("date", 0, 0, 0)
_ZERO_DATETIME = InvalidTemporal("datetime", 0, 0, 0)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-2**31, 2**31 - 1), "big": st.integers(0, 2**64 - 1),
    "tiny": st.integers(-128, 127), "f": st.floats(width=32, allow_nan=False,
                                                   allow_infinity=False),
    "d": st.floats(allow_nan=False, allow_infinity=False),
    "dec": st.decimals(min_value=-10**7, max_value=10**7, places=2),
    "note": st.text(max_size=5) | st.binary(max_size=4),
    "raw": st.binary(max_size=8) | st.text(max_size=3),
    "dt": st.datetimes(min_value=datetime(1, 1, 1)) | st.just(_ZERO_DATETIME)
    | st.just(datetime(2020, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))),
    "ts": st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(UTC)),
    "day": st.dates() | st.just(_ZERO_DATE) | st.just(datetime(2021, 2, 3, 4, 5)),
    "t": st.timedeltas(min_value=-timedelta(hours=838), max_value=timedelta(hours=838)),
    "doc": st.none() | st.integers() | st.text(max_size=3)
    | st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    "tags": st.frozensets(st.sampled_from("abc")), "kind": st.sampled_from(["x", "y"]),
    "yr": st.integers(1901, 2155), "bits": st.integers(0, 2**64 - 1),
    "shape": st.builds(Geometry, st.binary(min_size=1, max_size=9), st.integers(0, 9)),
}


def _image() -> st.SearchStrategy[tuple[Any, ...] | None]:
    return st.none() | st.tuples(*(st.none() | _VALUES[n] for n in TABLE.names))


def _definition(builder: BatchBuilder, images: list[tuple[Any, ...] | None],
                columns: tuple[str, ...], rescued: frozenset[str] = frozenset(),
                evolution: SchemaEvolution = SchemaEvolution.FAIL) -> pa.Array:
    dicts = [None if image is None else builder.typed_values(
        dict(zip(columns, image, strict=True)), rescued) for image in images]
    return pa.array(dicts, image_struct(TABLE, evolution))


def _rows(array: pa.Array) -> list[Any]:
    """The array's rows, each image's zero temporals in name order (a map's entries have
    no order; the builder lists them by the query's columns)."""
    rows: list[Any] = array.to_pylist()
    for row in rows:
        if row is not None and row.get(INVALID_TEMPORALS):
            row[INVALID_TEMPORALS] = sorted(row[INVALID_TEMPORALS])
    return rows


@settings(max_examples=int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150")), deadline=None)
@given(st.lists(_image(), max_size=12))
def test_column_wise_images_equal_the_one_image_definition(
        images: list[tuple[Any, ...] | None]) -> None:
    builder = BatchBuilder("typed", TABLE)
    typed = TypedImages(TABLE, SchemaEvolution.FAIL)
    for image in images:
        typed.add(image, TABLE.names)
    got = typed.array()
    want = _definition(builder, images, TABLE.names)
    assert got.type == want.type
    assert _rows(got) == _rows(want)


@settings(max_examples=int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150")), deadline=None)
@given(st.lists(_image(), max_size=8), st.permutations(range(len(TABLE.names))),
       st.integers(1, len(TABLE.names)), st.frozensets(st.sampled_from(TABLE.names)))
def test_images_of_another_version_are_put_in_the_querys_columns(
        images: list[tuple[Any, ...] | None], order: list[int], keep: int,
        rescued: frozenset[str]) -> None:
    """A MINIMAL image or another version's: some columns, in another order; with
    schemaEvolution=json some of them rescued as JSON text."""
    picked = order[:keep]
    columns = tuple(TABLE.names[i] for i in picked)
    shown = [None if image is None else tuple(image[i] for i in picked) for image in images]
    for evolution, gone in ((SchemaEvolution.ADD_COLUMNS, frozenset[str]()),
                            (SchemaEvolution.JSON, rescued)):
        builder = BatchBuilder("typed", TABLE, evolution=evolution)
        typed = TypedImages(TABLE, evolution)
        for image in shown:
            typed.add(image, columns, gone)
        want = _definition(builder, shown, columns, gone, evolution)
        assert _rows(typed.array()) == _rows(want)


def test_a_batch_of_changes_and_snapshot_rows_keeps_its_images_in_row_order() -> None:
    """No image (an insert's before, a marker) is a NULL struct, the rows in between keep
    their places, and clearing starts the next batch empty."""
    builder = BatchBuilder("typed", TABLE, batch_rows=3)
    row = (7, 2**64 - 1, -1, 1.5, 2.5, Decimal("-3.25"), "n", b"r",
           datetime(2024, 1, 2, 3, 4, 5, 6000), datetime(2024, 1, 2, tzinfo=UTC),
           date(2024, 1, 2), timedelta(hours=-5), {"a": 1}, frozenset({"b", "a"}), "y",
           2024, 5, Geometry(b"\x01", 4326))
    shape = builder.check.shape(TABLE, "here") if builder.check else None
    batches = list(builder.add_snapshot_rows("s", "t", TABLE.names, [row, row], 9, 0,
                                             shape=shape))
    batches += list(builder.add_marker("s", "t", "snapshot_end", 9))
    batches += list(builder.add_snapshot_rows("s", "t", TABLE.names, [row], 10, 0,
                                              shape=shape))
    batches.append(builder.flush())
    assert [b.num_rows for b in batches] == [3, 1]
    first = batches[0]
    assert first.column("before").to_pylist() == [None, None, None]
    after = first.column("after").to_pylist()
    assert after[2] is None and after[0] == after[1]
    assert after[0]["big"] == Decimal(2**64 - 1) and after[0]["tags"] == ["a", "b"]
    assert after[0]["doc"] == '{"a":1}' and after[0]["shape"] == b"\xe6\x10\x00\x00\x01"
    assert batches[1].column("after").to_pylist()[0] == after[0]


# --- rows events through the decode_columns kernel ---------------------------------------------

KERNEL_TABLE = table_map("s", "k", [
    col("id", "int"), col("big", "bigint", "bigint(20) unsigned"),
    col("tiny", "tinyint", "tinyint(3) unsigned"), col("small", "smallint"),
    col("mid", "mediumint"), col("f", "float"), col("d", "double"),
    col("dec", "decimal", "decimal(20,6)", precision=20, scale=6),
    col("wide", "decimal", "decimal(38,10)", precision=38, scale=10),
    col("note", "varchar", "varchar(20)", octets=80, collation=45),
    col("ch", "char", "char(4)", octets=16, collation=45),
    col("raw", "varbinary", "varbinary(8)", octets=8), col("bin", "binary", "binary(4)",
                                                           octets=4),
    col("dt", "datetime", "datetime(6)", fsp=6), col("dt0", "datetime", "datetime", fsp=0),
    col("ts", "timestamp", "timestamp(3)", fsp=3), col("day", "date"), col("yr", "year"),
    col("body", "text", "text", octets=65535, collation=45),
    col("latin", "varchar", "varchar(10)", octets=10, collation=8),
    col("blob", "blob", "blob", octets=65535)], ["id"], table_id=42)

_KERNEL_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-2**31, 2**31 - 1), "big": st.integers(0, 2**64 - 1),
    "tiny": st.integers(0, 255), "small": st.integers(-2**15, 2**15 - 1),
    "mid": st.integers(-2**23, 2**23 - 1),
    "f": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "d": st.floats(allow_nan=False, allow_infinity=False),
    "dec": st.decimals(min_value=-10**14 + 1, max_value=10**14 - 1, places=6),
    "wide": st.decimals(min_value=-10**28 + 1, max_value=10**28 - 1, places=10),
    "note": st.text(max_size=20), "ch": st.text(max_size=4).map(lambda t: t.rstrip(" ")),
    "raw": st.binary(max_size=8), "bin": st.binary(max_size=4).map(lambda b: b.ljust(4, b"\0")),
    "dt": st.datetimes() | st.just(_ZERO_DATETIME),
    "dt0": st.datetimes().map(lambda v: v.replace(microsecond=0)),
    "ts": st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2038, 1, 1),
                       timezones=st.just(UTC)).map(
        lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000)),
    "day": st.dates() | st.just(_ZERO_DATE), "yr": st.integers(1901, 2155) | st.just(0),
    "body": st.text(max_size=30), "blob": st.binary(max_size=30),
    "latin": st.binary(max_size=10).map(lambda raw: raw.decode("cp1252", "mysql_latin1")),
}


def _rows_event(kind: int, images: list[tuple[Any, ...]]) -> RowsEvent:
    """A rows event of KERNEL_TABLE (full images) written by the row codec."""
    full = tuple(range(len(KERNEL_TABLE.columns)))
    template = RowsEvent(kind, 42, 1, None, len(full), full,
                         full if kind == EventType.UPDATE_ROWS_V1 else None, b"", 0)
    row = type("Row", (RowImage,), {"__slots__": (), "columns": KERNEL_TABLE.names})
    if kind == EventType.UPDATE_ROWS_V1:
        pairs = [RowData(row(a), row(b)) for a, b in zip(images[::2], images[1::2],
                                                          strict=True)]
    elif kind == EventType.DELETE_ROWS_V1:
        pairs = [RowData(row(a), None) for a in images]
    else:
        pairs = [RowData(None, row(a)) for a in images]
    return RowsEvent.decode(kind, template.encode(KERNEL_TABLE, pairs))


# Rows events of KERNEL_TABLE: (type, images) with NULLs and zero dates among the values.
_EVENTS = st.lists(st.tuples(
    st.sampled_from([EventType.WRITE_ROWS_V1, EventType.UPDATE_ROWS_V1,
                     EventType.DELETE_ROWS_V1]),
    st.lists(st.tuples(*(st.none() | _KERNEL_VALUES[n] for n in KERNEL_TABLE.names)),
             min_size=2, max_size=6)), min_size=1, max_size=4)


@settings(max_examples=int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150")), deadline=None)
@given(_EVENTS, st.booleans())
def test_rows_events_through_the_kernel_equal_the_row_codecs_images(
        events: list[tuple[int, list[tuple[Any, ...]]]], pure_twin: bool) -> None:
    """The same batch from decode_event (each twin) as from the row codec's images, an
    event with a zero date given back to the codec; the kernel takes every other event."""
    decode = pure.decode_columns if pure_twin else kernels.decode_columns
    by_kernel = (TypedImages(KERNEL_TABLE, SchemaEvolution.FAIL),
                 TypedImages(KERNEL_TABLE, SchemaEvolution.FAIL))
    by_codec = (TypedImages(KERNEL_TABLE, SchemaEvolution.FAIL),
                TypedImages(KERNEL_TABLE, SchemaEvolution.FAIL))
    for kind, images in events:
        if kind == EventType.UPDATE_ROWS_V1:
            images = images[: len(images) // 2 * 2]  # before and after
        rev = _rows_event(kind, images)
        decoded = rev.rows(KERNEL_TABLE)
        taken = decode_event(rev, KERNEL_TABLE, *by_kernel, decode=decode)
        zero = any(isinstance(v, InvalidTemporal) for image in images for v in image)
        assert (taken < 0) == zero
        assert taken < 0 or taken == len(decoded)
        for side, (kernel_images, codec_images) in enumerate(zip(by_kernel, by_codec,
                                                                 strict=True)):
            for row in decoded:
                image = row.after if side else row.before
                codec_images.add(image, image.columns if image is not None else ())
                if taken < 0:
                    kernel_images.add(image, image.columns if image is not None else ())
    for kernel_images, codec_images in zip(by_kernel, by_codec, strict=True):
        got, want = kernel_images.array(), codec_images.array()
        assert got.type == want.type
        assert got.to_pylist() == want.to_pylist()
        assert got.equals(want)


def test_only_full_images_of_the_querys_own_columns_go_through_the_kernel() -> None:
    images = [tuple(None for _ in KERNEL_TABLE.names)]
    before, after = (TypedImages(KERNEL_TABLE, SchemaEvolution.FAIL) for _ in range(2))
    assert decode_event(_rows_event(EventType.WRITE_ROWS_V1, images), KERNEL_TABLE,
                        before, after) == 1
    assert (len(before), len(after)) == (1, 1)
    other = table_map("s", "k", [col("id", "int")], ["id"], table_id=42)
    assert decode_event(_rows_event(EventType.WRITE_ROWS_V1, images), other,
                        before, after) == -1
    assert column_steps(TABLE, [spark_type(c) for c in TABLE.columns]) is None  # JSON, SET, TIME, ...
    assert (len(before), len(after)) == (1, 1)


@settings(max_examples=int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150")), deadline=None)
@given(_EVENTS, st.booleans())
def test_rows_events_as_json_text_equal_the_generated_writers(
        events: list[tuple[int, list[tuple[Any, ...]]]], pure_twin: bool) -> None:
    """The JSON form's texts from json_event (each twin) equal the generated writer's from
    the row codec's images; an event with a zero date goes back to the writer."""
    write_json = pure.json_images if pure_twin else kernels.json_images
    writer = json_writer(KERNEL_TABLE, KERNEL_TABLE.names)
    by_kernel = (JsonImages(), JsonImages())
    by_writer = (JsonImages(), JsonImages())
    for kind, images in events:
        if kind == EventType.UPDATE_ROWS_V1:
            images = images[: len(images) // 2 * 2]
        rev = _rows_event(kind, images)
        decoded = rev.rows(KERNEL_TABLE)
        taken = json_event(rev, KERNEL_TABLE, *by_kernel, write=write_json)
        zero = any(isinstance(v, InvalidTemporal) for image in images for v in image)
        assert (taken < 0) == zero
        for side in (0, 1):
            for row in decoded:
                image = row.after if side else row.before
                text = None if image is None else writer(image)
                by_writer[side].add(text)
                if taken < 0:
                    by_kernel[side].add(text)
    for kernel_texts, writer_texts in zip(by_kernel, by_writer, strict=True):
        got, want = kernel_texts.array(), writer_texts.array()
        assert got.to_pylist() == want.to_pylist()
        assert got.equals(want)


def test_wide_and_tiny_decimals_as_json_text_equal_the_generated_writers() -> None:
    """DECIMAL(65,30) (past the typed form's 38 digits) and the values Python prints in
    scientific notation (str(Decimal) of 0.000000001 is "1E-9"): the same text both ways."""
    table = table_map("s", "d", [
        col("id", "int"), col("d65", "decimal", "decimal(65,30)", precision=65, scale=30),
        col("d18", "decimal", "decimal(18,9)", precision=18, scale=9)], ["id"], table_id=42)
    values = [(1, Decimal("-" + "9" * 35 + "." + "9" * 30), Decimal("0.000000001")),
              (2, Decimal(0), Decimal(0)), (3, Decimal("1E-30"), Decimal("-0.000001")),
              (4, Decimal("12345.678"), Decimal("-123456789.123456789"))]
    row = type("Row", (RowImage,), {"__slots__": (), "columns": table.names})
    full = tuple(range(3))
    body = RowsEvent(EventType.WRITE_ROWS_V1, 42, 1, None, 3, full, None, b"", 0).encode(
        table, [RowData(None, row(v)) for v in values])
    rev = RowsEvent.decode(EventType.WRITE_ROWS_V1, body)
    writer = json_writer(table, table.names)
    want = [writer(r.after) for r in rev.rows(table)]
    assert '"d18":"1E-9"' in want[0]
    for write in (pure.json_images, kernels.json_images):
        before, after = JsonImages(), JsonImages()
        assert json_event(rev, table, before, after, write=write) == len(values)
        assert after.array().to_pylist() == want
        assert before.array().null_count == len(values)


def test_a_decimal_zero_with_its_sign_bit_clear_is_the_codecs_zero() -> None:
    """Bytes no server writes for a value but a reader may get: DECIMAL(5,2) 7f ff ff is
    a "negative" zero. The codec gives 0; so do both kernels (no "-0.00")."""
    table = table_map("s", "z", [
        col("id", "int"), col("d", "decimal", "decimal(5,2)", precision=5, scale=2)], ["id"],
        table_id=42)
    template = RowsEvent(EventType.WRITE_ROWS_V1, 42, 1, None, 2, (0, 1), None, b"", 0)
    rev = RowsEvent.decode(EventType.WRITE_ROWS_V1, template.header_bytes()
                           + b"\0" + (7).to_bytes(4, "little") + b"\x7f\xff\xff")
    want = [json_writer(table, table.names)(r.after) for r in rev.rows(table)]
    assert want == ['{"id":7,"d":"0.00"}']
    for write in (pure.json_images, kernels.json_images):
        before, after = JsonImages(), JsonImages()
        assert json_event(rev, table, before, after, write=write) == 1
        assert after.array().to_pylist() == want
    for decode in (pure.decode_columns, kernels.decode_columns):
        images = (TypedImages(table, SchemaEvolution.FAIL),
                  TypedImages(table, SchemaEvolution.FAIL))
        assert decode_event(rev, table, *images, decode=decode) == 1
        assert images[1].array().to_pylist() == [{"id": 7, "d": Decimal("0.00")}]


def test_a_table_of_no_columns_has_no_plan() -> None:
    """(A table map of no columns: the codec refuses its rows, no kernel is asked.)"""
    assert column_steps(dataclasses.replace(KERNEL_TABLE, columns=()), None) is None


# A table of the columns a snapshot's text casts, and text as the server prints each.
CAST_TABLE = table_map("s", "t", [
    col("id", "int"), col("big", "bigint", "bigint(20) unsigned"), col("tiny", "tinyint"),
    col("small", "smallint", "smallint(5) unsigned"), col("f", "float"), col("d", "double"),
    col("dec", "decimal", "decimal(10,2)", precision=10, scale=2),
    col("wide", "decimal", "decimal(38,30)", precision=38, scale=30),
    col("note", "varchar", "varchar(20)", octets=80, collation=45),
    col("raw", "varbinary", "varbinary(8)", octets=8),
    col("dt", "datetime", "datetime(3)", fsp=3), col("ts", "timestamp", "timestamp(6)", fsp=6),
    col("day", "date"), col("kind", "enum", "enum('x','y')", octets=4, collation=45),
    col("yr", "year")], ["id"])
_TEXT: dict[str, st.SearchStrategy[bytes]] = {
    "id": st.integers(-2**31, 2**31 - 1).map(lambda n: b"%d" % n),
    "big": st.integers(0, 2**64 - 1).map(lambda n: b"%d" % n),
    "tiny": st.integers(-128, 127).map(lambda n: b"%d" % n),
    "small": st.integers(0, 65535).map(lambda n: b"%05d" % n),  # (as ZEROFILL prints)
    "f": st.floats(width=32, allow_nan=False, allow_infinity=False).map(
        lambda v: b"%.6g" % v),
    "d": st.floats(allow_nan=False, allow_infinity=False).map(lambda v: repr(v).encode()),
    "dec": st.decimals(min_value=-10**7, max_value=10**7, places=2).map(
        lambda v: f"{v:f}".encode()),
    "wide": st.decimals(min_value=-99, max_value=99, places=30).map(
        lambda v: f"{v:f}".encode()),
    "note": st.text(max_size=5).map(lambda s: s.encode("utf-8", "surrogatepass")),
    "raw": st.binary(max_size=8),
    "dt": st.datetimes(min_value=datetime(1, 1, 1)).map(
        lambda v: v.isoformat(" ", "milliseconds").encode())
    | st.sampled_from([b"0000-00-00 00:00:00.000", b"2024-02-30 10:00:00.000",
                       b"0000-03-04 05:06:07.000"]),
    "ts": st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2038, 1, 1)).map(
        lambda v: v.isoformat(" ", "microseconds").encode()),
    "day": st.dates().map(lambda v: v.isoformat().encode())
    | st.sampled_from([b"0000-00-00", b"0000-01-01"]),
    "kind": st.sampled_from([b"x", b"y", b""]),
    "yr": st.sampled_from([b"0000", b"1901", b"2155", b"2024"]),
}


@settings(max_examples=int(os.environ.get("RELAY_KERNEL_EXAMPLES", "150")), deadline=None)
@given(st.lists(st.tuples(*(st.none() | _TEXT[n] for n in CAST_TABLE.names)), max_size=12))
def test_a_snapshots_text_cast_by_arrow_is_its_values_images(
        rows: list[tuple[bytes | None, ...]]) -> None:
    """Rows as the server's text, cast by Arrow (add_text_rows), give the images the row
    codec's values (the snapshot's converters) give; rows with a value Arrow does not cast
    (a zero or impossible date, text that is not UTF-8) are refused whole, nothing added."""
    from relay.tap.snapshot import ColumnSpec, converter

    specs = [ColumnSpec(c.name, kind, c.name == "raw") for c, kind in zip(
        CAST_TABLE.columns, ["int", "bigint", "tinyint", "smallint", "float", "double",
                             "decimal", "decimal", "varchar", "varbinary", "datetime",
                             "timestamp", "date", "enum", "year"], strict=True)]
    convert = [converter(c) for c in specs]
    values = [tuple(None if v is None else f(v) for f, v in zip(convert, row, strict=True))
              for row in rows]
    by_codec = TypedImages(CAST_TABLE, SchemaEvolution.FAIL)
    for image in values:
        by_codec.add(image, CAST_TABLE.names)
    by_cast = TypedImages(CAST_TABLE, SchemaEvolution.FAIL)
    if by_cast.add_text_rows(rows):
        assert _rows(by_cast.array()) == _rows(by_codec.array())
    else:
        assert len(by_cast) == 0
        assert any(isinstance(v, InvalidTemporal) for image in values for v in image)


def test_text_is_cast_only_for_the_types_whose_text_arrow_reads_as_the_codec() -> None:
    """TIME, JSON, SET, BIT, a DECIMAL past 38 digits and hinted columns: the converters."""
    images = TypedImages(TABLE, SchemaEvolution.FAIL)  # (has TIME, JSON, SET, BIT)
    assert not images.add_text_rows([(b"1",) * len(TABLE.names)]) and len(images) == 0
    wide = table_map("s", "t", [col("id", "int"), col("dec", "decimal", "decimal(65,30)",
                                                      precision=65, scale=30)], ["id"])
    assert not TypedImages(wide, SchemaEvolution.FAIL).add_text_rows([(b"1", b"0.5")])
    plain = table_map("s", "t", [col("id", "int")], ["id"])
    images = TypedImages(plain, SchemaEvolution.FAIL)
    assert images.add_text_rows([(b"7",), (None,)]) and images.array().to_pylist() == [
        {"id": 7}, {"id": None}]


def test_a_row_of_every_cast_type_is_cast() -> None:
    """(So the property above compares casts, not only refusals.)"""
    row = (b"1", b"18446744073709551615", b"-5", b"00042", b"3.14159", b"0.1", b"-12.50",
           b"0.000000000000000000000000000001", "é".encode(), b"\x00",
           b"2024-01-02 03:04:05.120", b"2024-01-02 03:04:05.000001", b"2024-01-02", b"x",
           b"0000")
    images = TypedImages(CAST_TABLE, SchemaEvolution.FAIL)
    assert images.add_text_rows([row, (None,) * len(row)])
    got = images.array().to_pylist()
    assert got[0]["wide"] == Decimal("1E-30") and got[0]["small"] == 42
    assert got[0]["ts"] == datetime(2024, 1, 2, 3, 4, 5, 1, tzinfo=UTC)
    assert got[1] == dict.fromkeys(got[1])
