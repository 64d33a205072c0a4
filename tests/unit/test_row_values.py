"""The row_values kernel (row images as the row codec's Python values): the twins agree
on any rows, well-formed or not; and on every rows event of the MariaDB capture and the
MySQL captures its values are the generated decoder's, type and representation alike."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.binlog import jsonb
from relay.binlog import values as V
from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.plans import ValuesPlan, values_steps
from relay.binlog.rowcodec import RowCodec, RowImage
from relay.binlog.rows import ROWS_TYPES
from relay.kernels import pure
from relay.kernels.protocol import ColumnStep
from tests.unit.test_change_lines import FILES, hints_for
from tests.unit.test_json_document import DOCUMENTS
from tests.unit.test_kernels import _STEPS, CHARMAPS, EXAMPLES, _rows, twins


class Image(RowImage):
    """A table's image class, as the row codec makes one."""

    __slots__ = ()
    columns = ("a",)


def shown(rows: list[tuple[Any, ...]]) -> list[list[tuple[type, str]]]:
    """Values by type and repr: Decimal('1.50') and Decimal('1.5') are equal, not alike."""
    return [[(type(v), repr(v)) for v in row] for row in rows]


MEMBERS = (("a", "bb", "\u00e9t\u00e9"), tuple(f"m{i}" for i in range(300)))
# row_values' own steps, and a stored value of each (any bytes: TIME's borrow, ENUM numbers
# past the names; the rows may be cut or changed after)
_TIME2 = st.tuples(st.just(ColumnStep.TIME2), st.integers(0, 6), st.just(0), st.just(0))
_ENUM = st.tuples(st.just(ColumnStep.ENUM), st.sampled_from([1, 2]), st.just(0), st.just(0)) \
    | st.tuples(st.just(ColumnStep.ENUM), st.sampled_from([1, 2]), st.just(1),
                st.integers(0, len(MEMBERS) - 1))


_BIT = st.tuples(st.just(ColumnStep.BIT), st.integers(1, 8), st.just(0), st.just(0))
_SET = st.tuples(st.just(ColumnStep.SET), st.integers(1, 8), st.just(0), st.just(0)) \
    | st.tuples(st.just(ColumnStep.SET), st.integers(1, 8), st.just(1),
                st.integers(0, len(MEMBERS) - 1))


_TIMES = st.timedeltas(min_value=timedelta(hours=-838), max_value=timedelta(hours=838))


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEPS | _TIME2 | _ENUM | _BIT | _SET | st.tuples(
    st.just(ColumnStep.DECIMAL), st.integers(39, 65), st.integers(0, 30)).map(
    lambda s: (*s, V.decimal_size(s[1], s[2]))), min_size=1, max_size=9),
    st.integers(1, 2), st.sampled_from([tuple, Image]), st.data())
def test_row_values_twins_agree_on_any_rows(steps: list[tuple[int, int, int, int]],
                                            images: int, image: type[tuple[Any, ...]],
                                            data: st.DataObject) -> None:
    """Equal values, and each image an instance of the class asked for (a table's RowImage
    class, as the row codec asks, or tuple)."""
    plan = tuple(int(x) for s in steps for x in s)
    rows = bytes(_rows(steps, images, data))
    results = []
    for twin in twins():
        out: list[tuple[Any, ...]] = [("kept",)]
        n = twin.row_values(rows, 0, len(rows), plan, CHARMAPS, MEMBERS, images, out, image)
        assert all(type(row) is image for row in out[1:])
        results.append((n, shown(out)))
    assert results[0] == results[1]
    if results[0][0] < 0:
        assert results[0][1] == shown([("kept",)])


def test_row_values_refuses_an_image_class_that_is_not_a_tuple() -> None:
    for twin in twins():
        for image in (list, None, 3):
            with pytest.raises(ValueError, match="image is a tuple"):
                twin.row_values(b"\0\x80\0\0", 0, 4, (ColumnStep.TIME2, 0, 0, 0), (), (), 1,
                                [], image)  # type: ignore[arg-type]


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(0, 6), st.binary(min_size=6, max_size=6) | _TIMES)
def test_time_values_are_the_row_codecs(fsp: int, value: bytes | timedelta) -> None:
    """TIME(fsp) from any stored bytes (and from every value a server writes): the value
    the row codec's reference decoder gives, borrow and all."""
    raw = V.encode_time2(value, fsp) if isinstance(value, timedelta) else \
        value[: 3 + (fsp + 1) // 2]
    expected = V.time2_value(raw, 0, fsp)
    for twin in twins():
        out: list[tuple[Any, ...]] = []
        assert twin.row_values(b"\0" + raw, 0, 1 + len(raw), (ColumnStep.TIME2, fsp, 0, 0),
                               (), (), 1, out) == 1
        assert shown(out) == shown([(expected,)])


def _assert_twins_decode_as_the_codec(table: Any, steps: ValuesPlan,
                                      rows: list[tuple[Any, ...]]) -> None:
    """`rows` encoded by the table's row codec, decoded by both twins' row_values with
    `steps`: the generated decoder's values, type and representation alike."""
    codec = RowCodec(table, tuple(range(len(table.columns))))
    data = b"".join(codec.encode(list(row)) for row in rows)
    expected = []
    p = 0
    while p < len(data):
        image, p = codec.decode(data, p)
        expected.append(tuple(image))
    for twin in twins():
        got: list[tuple[Any, ...]] = []
        plan, charmaps, members, calls = steps
        assert twin.row_values(data, 0, len(data), plan, charmaps, members, 1, got, tuple,
                               calls) == len(rows)
        assert shown(got) == shown(expected)


def _time_and_enum_table() -> Any:
    from relay.binlog.describe import ColumnDescription, table_map

    columns = [ColumnDescription(f"t{fsp}", "time", f"time({fsp})", True, None, None, fsp,
                                 None, None) for fsp in range(7)]
    names = ",".join(f"'m{i}'" for i in range(300))
    columns += [ColumnDescription("e1", "enum", "enum('a','bb','\u00e9t\u00e9')", True, None,
                                  None, None, 12, 45),
                ColumnDescription("e2", "enum", f"enum({names})", True, None, None, None,
                                  16, 45),
                ColumnDescription("id", "int", "int(11)", False, 10, 0, None, None, None)]
    return table_map("s", "t", columns, ["id"])


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.tuples(*[st.none() | _TIMES for _ in range(7)],
                          st.none() | st.sampled_from(["a", "bb", "\u00e9t\u00e9"]),
                          st.none() | st.integers(0, 299).map(lambda i: f"m{i}"),
                          st.integers(-5, 5)), max_size=5))
def test_time_and_enum_columns_decode_as_the_generated_decoder(rows: list[tuple[Any, ...]]) -> None:
    """A table of TIME(0) to TIME(6) and two ENUMs (one of 300 names: two bytes): rows the
    row codec encodes, decoded by both twins, are the generated decoder's values (the
    number 0, '' to both, and numbers past the names: test_row_values_twins_agree...)."""
    table = _time_and_enum_table()
    steps = values_steps(table)
    assert steps is not None and ColumnStep.TIME2 in steps[0] and ColumnStep.ENUM in steps[0]
    _assert_twins_decode_as_the_codec(table, steps, rows)


def _bit_and_set_table() -> Any:
    from relay.binlog.describe import ColumnDescription, table_map

    names = ",".join(f"'s{i}'" for i in range(64))
    columns = [ColumnDescription(f"b{n}", "bit", f"bit({n})", True, n, None, None, None,
                                 None) for n in (1, 7, 8, 13, 64)]
    columns += [ColumnDescription("s3", "set", "set('a','bb','\u00e9t\u00e9')", True, None,
                                  None, None, 12, 45),
                ColumnDescription("s64", "set", f"set({names})", True, None, None, None,
                                  64 * 4, 45),
                ColumnDescription("id", "int", "int(11)", False, 10, 0, None, None, None)]
    return table_map("s", "t", columns, ["id"])


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.tuples(*[st.none() | st.integers(0, 2 ** n - 1) for n in (1, 7, 8, 13, 64)],
                          st.none() | st.sets(st.sampled_from(["a", "bb", "\u00e9t\u00e9"])),
                          st.none() | st.sets(st.integers(0, 63).map(lambda i: f"s{i}")),
                          st.integers(-5, 5)), max_size=5))
def test_bit_and_set_columns_decode_as_the_generated_decoder(rows: list[tuple[Any, ...]],
                                                            ) -> None:
    """A table of BIT(1) to BIT(64) and two SETs (one of 64 names: eight bytes): rows the
    row codec encodes, decoded by both twins, are the generated decoder's values (bits
    past a SET's names: test_row_values_twins_agree... and the next test)."""
    table = _bit_and_set_table()
    steps = values_steps(table)
    assert steps is not None and ColumnStep.BIT in steps[0] and ColumnStep.SET in steps[0]
    _assert_twins_decode_as_the_codec(table, steps, rows)


def _converted_table() -> Any:
    """MySQL's JSON, a GEOMETRY, a VARCHAR hinted as a uuid and one as inet6 (the columns
    row_values hands to the codec's converters), and an INT."""
    from dataclasses import replace

    from relay.binlog.describe import ColumnDescription, table_map

    columns = [ColumnDescription("j", "json", "json", True, None, None, None, None, None),
               ColumnDescription("g", "geometry", "geometry", True, None, None, None, None,
                                 None),
               ColumnDescription("u", "varbinary", "varbinary(16)", True, None, None, None,
                                 16, None),
               ColumnDescription("ip", "varbinary", "varbinary(16)", True, None, None, None,
                                 16, None),
               ColumnDescription("id", "int", "int(11)", False, 10, 0, None, None, None)]
    table = table_map("s", "t", columns, ["id"], mariadb=False)
    hinted = list(table.columns)
    hinted[2] = replace(hinted[2], hint="uuid")
    hinted[3] = replace(hinted[3], hint="inet6")
    return replace(table, columns=tuple(hinted))


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.none() | DOCUMENTS,
                          st.none() | st.tuples(st.binary(max_size=40), st.integers(0, 2**32 - 1)),
                          st.none() | st.uuids(),
                          st.none() | st.ip_addresses(v=6),
                          st.integers(-5, 5)), max_size=5))
def test_converted_columns_decode_as_the_generated_decoder(rows: list[tuple[Any, ...]]) -> None:
    """JSON (MySQL's binary form), GEOMETRY and hinted columns: row_values calls the row
    codec's converter on each value's bytes, and gives the generated decoder's values."""
    table = _converted_table()
    steps = values_steps(table)
    assert steps is not None and steps[0][0::4] == (ColumnStep.CALL,) * 4 + (ColumnStep.INT,)
    values = [(r[0], None if r[1] is None else V.Geometry(r[1][0], r[1][1]), *r[2:])
              for r in rows]
    _assert_twins_decode_as_the_codec(table, steps, values)


def test_a_value_its_converter_refuses_is_left_to_the_row_codec() -> None:
    """A converter that raises (bad binary JSON) or gives None: the kernel gives the event
    back (-1, `out` as it was), so the row codec raises its own error naming the column."""
    def nothing(raw: bytes) -> None:
        return None

    calls = (jsonb.decode, nothing, bytes)
    for twin in twins():
        for plan, image in (((ColumnStep.CALL, 1, 0, 0), b"\x02\x04\x02"),  # JSON false
                            ((ColumnStep.CALL, 1, 0, 2), b"\x01\xff")):
            out: list[tuple[Any, ...]] = []
            assert twin.row_values(b"\0" + image, 0, 1 + len(image), plan, (), (), 1, out,
                                   tuple, calls) == 1
        assert out == [(b"\xff",)]
        for plan, image in (((ColumnStep.CALL, 1, 0, 0), b"\x02\x04\x09"),   # no literal 9
                            ((ColumnStep.CALL, 1, 0, 1), b"\x01\xff"),        # None
                            ((ColumnStep.CALL, 2, 0, 2), b"\x05\x00ab")):    # cut
            out = [("kept",)]
            assert twin.row_values(b"\0" + image, 0, 1 + len(image), plan, (), (), 1, out,
                                   tuple, calls) == -1
            assert out == [("kept",)]
        with pytest.raises(ValueError, match="calls"):
            twin.row_values(b"\0\1a", 0, 3, (ColumnStep.CALL, 1, 0, 0), (), (), 1, [], tuple,
                            [jsonb.decode])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="no column is stored as"):
            twin.row_values(b"\0\1a", 0, 3, (ColumnStep.CALL, 1, 0, 3), (), (), 1, [], tuple,
                            calls)


def test_set_bits_past_its_names_are_left_to_the_row_codec() -> None:
    """A SET value with a bit past its names: the kernel leaves the event (-1), so the row
    codec raises its MalformedEvent with the column's name."""
    plan = (ColumnStep.SET, 1, 1, 0)   # MEMBERS[0]: three names
    for twin in twins():
        out: list[tuple[Any, ...]] = []
        assert twin.row_values(b"\0\x07", 0, 2, plan, (), MEMBERS, 1, out) == 1
        assert out == [(frozenset(MEMBERS[0]),)]
        assert twin.row_values(b"\0\x08", 0, 2, plan, (), MEMBERS, 1, out) == -1


def test_the_other_kernels_refuse_time_and_enum_steps() -> None:
    """ENUM and SET are row_values' alone (BIT and TIME2 the JSON writers' too): the JSON
    and typed kernels and a row_values plan that names members it was not given refuse
    them."""
    for twin in twins():
        for step in ((ColumnStep.ENUM, 1, 1, 0), (ColumnStep.SET, 8, 0, 0)):
            with pytest.raises(ValueError, match="no column is stored as"):
                twin.json_images(b"\0", 0, 1, step, (), (b'{"a":',), [[bytearray(),
                                 bytearray(4), bytearray()]], [0])
        for step in ((ColumnStep.BIT, 2, 0, 0), (ColumnStep.TIME2, 3, 0, 0)):
            with pytest.raises(ValueError, match="no column is stored as"):
                twin.decode_columns(b"\0", 0, 1, step, (), [[bytearray(), bytearray(4),
                                                              bytearray()]], [0])
        for step in ((ColumnStep.ENUM, 1, 1, 2), (ColumnStep.SET, 9, 0, 0),
                     (ColumnStep.BIT, 0, 0, 0), (ColumnStep.SET, 1, 1, 2)):
            with pytest.raises(ValueError, match="no column is stored as"):
                twin.row_values(b"\0\1", 0, 2, step, (), MEMBERS, 1, [])


def test_the_values_are_the_generated_decoders_on_every_capture() -> None:
    """Each rows event of full images of a planned table: the kernel's values (compiled and
    pure) are the generated decoder's, and RowsEvent.rows gives them."""
    compared = 0
    for path in FILES:
        decoder = StreamDecoder(hints_for(path))
        with open(path, "rb") as f:
            data = f.read()
        pos = 4
        while pos + 19 <= len(data):
            size = int.from_bytes(data[pos + 9 : pos + 13], "little")
            if size < 19 or pos + size > len(data):
                break
            ev = data[pos : pos + size]
            pos += size
            typ = ev[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                decoder.format_description(ev)
            elif typ == EventType.TABLE_MAP:
                decoder.remember_table_map(ev)
            elif typ in ROWS_TYPES and typ not in (EventType.PARTIAL_UPDATE_ROWS,):
                rev = decoder.rows_event(ev)
                table = decoder.table_for(rev)
                steps = values_steps(table)
                full = len(rev.present) == len(table.columns) and \
                    rev.present_after in (None, rev.present)
                if steps is None or not full or rev.compressed:
                    continue
                codec = RowCodec(table, rev.present)
                expected: list[tuple[Any, ...]] = []
                p = rev.rows_start
                while p < len(rev.data):
                    for _ in range(2 if rev.present_after is not None else 1):
                        image, p = codec.decode(rev.data, p)
                        expected.append(tuple(image))
                for twin in twins():
                    got: list[tuple[Any, ...]] = []
                    plan, charmaps, members, calls = steps
                    n = twin.row_values(rev.data, rev.rows_start, len(rev.data), plan,
                                        charmaps, members,
                                        2 if rev.present_after is not None else 1, got,
                                        tuple, calls)
                    if n >= 0:
                        assert shown(got) == shown(expected), (path, table.qualified)
                        compared += 1
                via_rows = [img for r in rev.rows(table, decoder.codecs)
                            for img in (r.before, r.after) if img is not None]
                assert shown([tuple(i) for i in via_rows]) == shown(expected)
    assert compared > 40  # (both twins, every type family of the capture)
    assert kernels.row_values is (pure.row_values if kernels.IMPLEMENTATION
                                  is kernels.Implementation.PURE else twins()[1].row_values)


def test_a_build_older_than_the_code_is_not_loaded(monkeypatch: Any) -> None:
    """A compiled module without every kernel (built from an older checkout) is refused,
    so the relay runs the twins and says so, instead of failing at import."""
    import importlib
    import types

    old = types.ModuleType("relay.kernels.compiled")
    for name in ("frame_stored", "read_dump"):
        setattr(old, name, getattr(pure, name))
    monkeypatch.setattr(importlib, "import_module", lambda name: old)
    assert kernels.compiled_kernels() is None
    # every kernel, but built before the last column step: it would decode that step's
    # values as another's
    for name in dir(pure):
        setattr(old, name, getattr(pure, name))
    old.COLUMN_STEPS = int(max(ColumnStep)) - 1  # type: ignore[attr-defined]
    assert kernels.compiled_kernels() is None
    old.COLUMN_STEPS = int(max(ColumnStep))  # type: ignore[attr-defined]
    assert kernels.compiled_kernels() is old


def test_row_values_makes_each_subclass_as_tuple_new_does() -> None:
    """A class made in Python over tuple (a table's RowImage, or one with its own __new__)
    gets instances equal, and hashing equal, to tuples of the same values; a built-in
    subclass that tuple.__new__ refuses (time.struct_time) is refused by both twins."""
    import time

    class Own(tuple):  # type: ignore[type-arg]
        def __new__(cls, values: Any) -> Own:
            return tuple.__new__(cls, ("never",))

    class Sub(Image):
        pass

    data, plan = b"\0\x80\0\0", (ColumnStep.TIME2, 0, 0, 0)
    for twin in twins():
        for image in (Image, Sub, Own):
            out: list[tuple[Any, ...]] = []
            assert twin.row_values(data, 0, 4, plan, (), (), 1, out, image) == 1
            assert type(out[0]) is image and out[0] == (timedelta(0),)
            assert hash(out[0]) == hash((timedelta(0),))
        with pytest.raises(TypeError, match="is not safe"):
            twin.row_values(data, 0, 4, plan, (), (), 1, [], time.struct_time)


def test_text_that_is_not_utf8_in_a_planned_table_is_the_codecs_error_with_its_place(
        ) -> None:
    """Text that is not UTF-8 in a table the kernel plans: the kernel leaves the event to
    the generated decoder (it raises nothing of its own), and the change API raises
    MalformedEvent naming the event, the table, the file and the offset."""
    from relay.binlog import build
    from relay.binlog.changes import ChangeStream, SourceEvent
    from relay.binlog.describe import ColumnDescription, table_map
    from relay.binlog.gtid import Gtid
    from relay.binlog.rowcodec import RowCodec
    from relay.errors import MalformedEvent
    from tests.helpers import fde, gtid_event, rows_event, xid_event

    table = table_map("s", "t", [
        ColumnDescription("id", "int", "int(11)", False, 10, 0, None, None, None),
        ColumnDescription("name", "varchar", "varchar(20)", True, None, None, None, 80, 45)],
        ["id"], table_id=0x12)
    row = bytearray(RowCodec(table, (0, 1)).encode([7, "ok"]))
    row[-2:] = b"\xff\xfe"  # the two characters' bytes: not UTF-8
    tm = build.build_event(EventType.TABLE_MAP, table.encode(), server_id=1, log_pos=0)
    events = [fde(), gtid_event(Gtid(0, 1, 1)), tm,
              rows_event(b"\x02\xff" + bytes(row)), xid_event(1)]
    offsets = [4]
    for ev in events[:-1]:
        offsets.append(offsets[-1] + len(ev))
    stream = ChangeStream(SourceEvent("f.000001", o, e) for o, e in zip(offsets, events,
                                                                          strict=True))
    with pytest.raises(MalformedEvent) as caught:
        for tx in stream.transactions():
            list(tx.changes())
    assert "WRITE_ROWS_V1 of s.t" in str(caught.value) and "UnicodeDecodeError" in \
        str(caught.value)
    assert caught.value.where == "f.000001" and caught.value.offset == offsets[3]
