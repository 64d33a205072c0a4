"""The row_values kernel (row images as the row codec's Python values): the twins agree
on any rows, well-formed or not; and on every rows event of the MariaDB capture and the
MySQL captures its values are the generated decoder's, type and representation alike."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.binlog import values as V
from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.plans import column_steps
from relay.binlog.rowcodec import RowCodec
from relay.binlog.rows import ROWS_TYPES
from relay.kernels import pure
from relay.kernels.protocol import ColumnStep
from tests.unit.test_change_lines import FILES, hints_for
from tests.unit.test_kernels import _STEPS, CHARMAPS, EXAMPLES, _rows, twins


def shown(rows: list[tuple[Any, ...]]) -> list[list[tuple[type, str]]]:
    """Values by type and repr: Decimal('1.50') and Decimal('1.5') are equal, not alike."""
    return [[(type(v), repr(v)) for v in row] for row in rows]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEPS | st.tuples(st.just(ColumnStep.DECIMAL), st.integers(39, 65),
                                   st.integers(0, 30)).map(
    lambda s: (*s, V.decimal_size(s[1], s[2]))), min_size=1, max_size=9),
    st.integers(1, 2), st.data())
def test_row_values_twins_agree_on_any_rows(steps: list[tuple[int, int, int, int]],
                                            images: int, data: st.DataObject) -> None:
    plan = tuple(int(x) for s in steps for x in s)
    rows = bytes(_rows(steps, images, data))
    results = []
    for twin in twins():
        out: list[tuple[Any, ...]] = [("kept",)]
        n = twin.row_values(rows, 0, len(rows), plan, CHARMAPS, images, out)
        results.append((n, shown(out)))
    assert results[0] == results[1]
    if results[0][0] < 0:
        assert results[0][1] == shown([("kept",)])


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
                steps = column_steps(table, None)
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
                    n = twin.row_values(rev.data, rev.rows_start, len(rev.data), *steps,
                                        2 if rev.present_after is not None else 1, got)
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
