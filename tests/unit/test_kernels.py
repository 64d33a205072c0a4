"""The kernels' twins held to each other: the compiled module and the pure-Python one get
the same bytes (well-formed streams, cut ones, mutated ones) and must give the same output,
the same returned state and the same errors. And the compiled ones are what runs."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as tally
from hypothesis import strategies as st

import relay.kernels as kernels
from relay.binlog import build, walk
from relay.binlog import values as V
from relay.binlog.constants import EventType
from relay.errors import MalformedEvent
from relay.kernels import Implementation, pure
from relay.kernels.protocol import CleanKind, ColumnStep, EventKind, Kernels, SpliceMode
from relay.wire.dumpstream import frame_event

COMPILED = kernels.compiled_kernels()
# bench/memcheck.py runs these under valgrind with fewer examples; bench/fuzz.py (atheris)
# feeds the twins a million inputs.
EXAMPLES = int(os.environ.get("RELAY_KERNEL_EXAMPLES", "200"))


def test_the_compiled_kernels_are_the_ones_loaded() -> None:
    """scripts/setup builds them; only RELAY_PURE_PYTHON may choose the twins."""
    if os.environ.get("RELAY_PURE_PYTHON", "") not in ("", "0"):
        assert kernels.IMPLEMENTATION is Implementation.PURE
        return
    assert COMPILED is not None, kernels.REASON
    assert kernels.IMPLEMENTATION is Implementation.COMPILED, kernels.REASON
    assert kernels.frame_stored is COMPILED.frame_stored


def twins() -> tuple[Kernels, Kernels]:
    assert COMPILED is not None, kernels.REASON
    return pure, COMPILED


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except MalformedEvent as exc:
        return "error", (type(exc), str(exc), exc.offset)
    except (ValueError, OverflowError) as exc:  # (arguments no buffer can have: refused
        return "refused", (type(exc), str(exc))  # by both; a value its prefix cannot hold)


def event(typ: int, body: bytes, log_pos: int = 0) -> bytes:
    return build.build_event(EventType(typ), body, server_id=7, log_pos=log_pos)


TYPES = st.sampled_from([2, 4, 15, 16, 19, 30, 31, 32, 33, 160, 162])
EVENTS = st.lists(st.tuples(TYPES, st.binary(max_size=120)), max_size=12)


def stored_events(specs: list[tuple[int, bytes]]) -> bytes:
    out = bytearray()
    for typ, body in specs:
        out += event(typ, body, log_pos=len(out) + 19 + len(body) + 4)
    return bytes(out)


def cut_or_resized(stored: bytes, data: st.DataObject) -> bytearray:
    """Stored events mutated as a torn or corrupt log has them: a cut tail, a size field
    of any value."""
    out = bytearray(stored)
    if out and data.draw(st.booleans()):
        del out[data.draw(st.integers(0, len(out))):]
    if len(out) > 13 and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(out) - 13))
        struct.pack_into("<I", out, at + 9, data.draw(st.integers(0, 2**32 - 1)))
    return out


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.data())
def test_frame_stored_twins_agree_on_any_bytes(specs: list[tuple[int, bytes]],
                                               data: st.DataObject) -> None:
    stored = cut_or_resized(stored_events(specs), data)
    if stored and data.draw(st.booleans()):  # (and a flipped byte anywhere)
        stored[data.draw(st.integers(0, len(stored) - 1))] ^= data.draw(st.integers(1, 255))
    seq = data.draw(st.integers(0, 255))
    omit = data.draw(st.sampled_from([-1, 0, 160, 30, 256]))  # (-1: none)
    prefix = data.draw(st.binary(max_size=8))
    a, b = twins()
    out_a, out_b = bytearray(prefix), bytearray(prefix)
    for buf in (bytes(stored), memoryview(bytes(stored)), stored):
        out_a, out_b = bytearray(prefix), bytearray(prefix)
        got_a = outcome(lambda: a.frame_stored(out_a, buf, seq, omit))  # noqa: B023
        got_b = outcome(lambda: b.frame_stored(out_b, buf, seq, omit))  # noqa: B023
        assert got_a == got_b
        assert out_a == out_b


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.data())
def test_whole_events_twins_agree_on_any_bytes(specs: list[tuple[int, bytes]],
                                               data: st.DataObject) -> None:
    """Stored events, cut, with broken sizes, walked from any start to any end (also past
    the buffer): the same boundary, the same error; and where they fit, walk.spans' end."""
    stored = cut_or_resized(stored_events(specs), data)
    start = data.draw(st.integers(0, len(stored) + 2))
    end = data.draw(st.integers(0, len(stored) + 2))
    a, b = twins()
    got = outcome(lambda: a.whole_events(bytes(stored), start, end))
    assert got == outcome(lambda: b.whole_events(bytes(stored), start, end))
    assert got == outcome(lambda: b.whole_events(stored, start, end))
    if got[0] == "ok":
        assert got[1] == max([start] + [p + n for p, n in walk.spans(stored, start, end)])


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.data())
def test_checked_events_twins_agree_on_any_bytes(specs: list[tuple[int, bytes]],
                                                 data: st.DataObject) -> None:
    """Stored events, cut, with broken sizes or a flipped byte, checked from any start to
    any end, with and without CRCs: the same boundary, the same bad event, the same error;
    on intact events, every one."""
    stored = cut_or_resized(stored_events(specs), data)
    if stored and data.draw(st.booleans()):
        stored[data.draw(st.integers(0, len(stored) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    start = data.draw(st.integers(0, len(stored) + 2))
    end = data.draw(st.integers(0, len(stored) + 2))
    crc_len = data.draw(st.sampled_from([0, 4]))
    a, b = twins()
    got = outcome(lambda: a.checked_events(bytes(stored), start, end, crc_len))
    assert got == outcome(lambda: b.checked_events(bytes(stored), start, end, crc_len))
    assert got == outcome(lambda: b.checked_events(stored, start, end, crc_len))
    whole = stored_events(specs)
    assert a.checked_events(whole, 0, len(whole), 4) == b.checked_events(
        whole, 0, len(whole), 4) == (len(whole), -1)


def test_checked_events_names_the_event_whose_crc_does_not_hold() -> None:
    events = [event(30, b"x" * 20), event(30, b"y" * 20), event(16, b"z" * 8)]
    stored = bytearray(b"".join(events))
    stored[len(events[0]) + 25] ^= 0x40  # a byte of the second event's body
    for twin in twins():
        assert twin.checked_events(bytes(stored), 0, len(stored), 4) == \
            (len(events[0]), len(events[0]))
        assert twin.checked_events(bytes(stored), 0, len(stored), 0) == (len(stored), -1)
        with pytest.raises(ValueError, match="crc_len"):
            twin.checked_events(bytes(stored), 0, len(stored), 3)


def test_frame_stored_splits_events_of_16_mib_as_the_protocol_does() -> None:
    small = event(30, b"s" * 40)
    for body in (0xFFFFFF - 20, 0xFFFFFF - 19, 0xFFFFFF + 5, 2 * 0xFFFFFF):
        big = event(30, b"r" * body)
        stored = small + big + small + small
        results = []
        for twin in twins():
            out = bytearray()
            results.append((twin.frame_stored(out, stored, 250), bytes(out)))
        assert results[0] == results[1]
        each = bytearray()
        seq = 250
        for ev in (small, big, small, small):
            seq = frame_event(each, ev, seq)
        assert results[0][1] == bytes(each) and results[0][0][0] == seq
        assert results[0][0][1:] == (len(stored), len(stored) - len(small))
        # Left out, a large event is passed over whole, as a small one is.
        other = small[:4] + b"\x1f" + small[5:]  # (type 31)
        mixed = other + big + other + other
        for omit, framed in ((30, (other, other, other)), (31, (big,))):
            results = []
            for twin in twins():
                out = bytearray()
                results.append((twin.frame_stored(out, mixed, 3, omit), bytes(out)))
            assert results[0] == results[1]
            each = bytearray()
            seq = 3
            for ev in framed:
                seq = frame_event(each, ev, seq)
            last = len(mixed) - len(other) if omit == 30 else len(other)
            assert results[0] == ((seq, len(mixed), last), bytes(each))


def test_an_impossible_size_is_named_at_its_offset_after_the_events_before_it() -> None:
    good = event(30, b"x" * 10)
    bad = bytearray(event(30, b"y" * 10))
    struct.pack_into("<I", bad, 9, 5)
    for twin in twins():
        out = bytearray()
        with pytest.raises(MalformedEvent, match=f"impossible event size 5 at offset {len(good)}"):
            twin.frame_stored(out, good + bad, 0)
        assert bytes(out[5:]) == good


def dump_packets(specs: list[tuple[int, bytes, int]], seq: int) -> bytes:
    out = bytearray()
    for typ, body, log_pos in specs:
        seq = frame_event(out, event(typ, body, log_pos), seq)
    return bytes(out)


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(TYPES, st.binary(max_size=80), st.integers(0, 2**32 - 1)),
                max_size=10), st.data())
def test_read_dump_twins_agree_on_any_stream(specs: list[tuple[int, bytes, int]],
                                             data: st.DataObject) -> None:
    seq = data.draw(st.integers(0, 255))
    # Often placed one after the other (unmarked), sometimes not.
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, 1000))
        placed = []
        for typ, body, _ in specs:
            at += 19 + len(body) + 4
            placed.append((typ, body, at))
        specs = placed
    stream = bytearray(dump_packets(specs, seq))
    if stream and data.draw(st.booleans()):
        del stream[data.draw(st.integers(0, len(stream))):]
    if stream and data.draw(st.booleans()):
        stream[data.draw(st.integers(0, len(stream) - 1))] ^= data.draw(st.integers(1, 255))
    start = data.draw(st.integers(0, 3))
    stream[0:0] = b"\xee" * start
    plain = bytes(data.draw(st.lists(st.integers(0, 1), min_size=256, max_size=256)))
    last_pos = data.draw(st.integers(-1, 2**32))
    tally0 = data.draw(st.lists(st.integers(0, 2**70), min_size=256, max_size=256))
    prefix = data.draw(st.binary(max_size=6))
    results = []
    for twin in twins():
        out, marks, tally = bytearray(prefix), [0] * len(prefix), list(tally0)
        ret = twin.read_dump(bytes(stream), start, seq, last_pos, plain, tally, out, marks)
        results.append((ret, bytes(out), marks, tally))
    assert results[0] == results[1]


def test_read_dump_stops_at_what_it_does_not_take() -> None:
    """A semi-sync header, an ERR packet, a sequence id out of order: the caller's."""
    rows = (30, b"r" * 30, 0)
    for twin in twins():
        ok = dump_packets([rows, rows], 5)
        for tail in (b"\x05\x00\x00\x07\xff\x01\x02xx", dump_packets([rows], 9),
                     dump_packets([rows], 7)[:-1]):
            out: bytearray = bytearray()
            tally = [0] * 256
            pos, seq, _ = twin.read_dump(ok + tail, 0, 5, -1, bytes(256), tally, out, [])
            assert (pos, seq) == (len(ok), 7)
            assert tally[30] == 2 * pure.EVENT + 2 * (19 + 30 + 4)


KINDS = bytes(EventKind.PLAIN if t in (19, 23, 24, 25, 30, 31, 32, 160) else
              EventKind.GTID if t == 162 else EventKind.XID if t == 16 else EventKind.OTHER
              for t in range(256))


def gtid_event(seq_no: int, domain: int, flags2: int, log_pos: int = 0) -> bytes:
    return event(162, struct.pack("<QIB", seq_no, domain, flags2) + b"\0" * 6, log_pos)


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 4), max_size=8), st.data())
def test_scan_ingest_twins_agree_on_any_batch(shape: list[int], data: st.DataObject) -> None:
    """Transactions of 1-4 row events (placed or not at the relay log's offsets), broken
    ones, mutated bytes, random marks: both twins give the same plan and state."""
    at = data.draw(st.integers(0, 5000))
    placed = data.draw(st.booleans())
    batch = bytearray()
    for i, rows in enumerate(shape):
        evs = [gtid_event(i + 1, 0, data.draw(st.integers(0, 255))),
               *[event(30, b"r" * data.draw(st.integers(0, 40))) for _ in range(rows)],
               event(16, b"x" * 8)]
        if data.draw(st.integers(0, 9)) == 0:
            evs.insert(1, event(2, b"q" * 20))  # a type the caller handles itself
        for ev in evs:
            at += len(ev)
            batch += build.reframe(ev, True, log_pos=at if placed else at + 1)
    if batch and data.draw(st.booleans()):
        batch[data.draw(st.integers(0, len(batch) - 1))] ^= data.draw(st.integers(1, 255))
    if batch and data.draw(st.booleans()):
        del batch[data.draw(st.integers(0, len(batch))):]
    marks = sorted(set(data.draw(st.lists(st.integers(0, len(batch)), max_size=6))))
    marks.append(len(batch))
    use_marks = data.draw(st.booleans())
    args = (data.draw(st.integers(0, 3)), 5000 - data.draw(st.integers(0, 5000)),
            data.draw(st.booleans()), data.draw(st.booleans()),
            data.draw(st.integers(0, 8000)))
    mi, wend, in_group, inline, segment_size = args
    results = []
    for twin in twins():
        plan: list[tuple[int, ...]] = []
        ret = twin.scan_ingest(bytes(batch), 0, list(marks) if use_marks else None, mi, KINDS,
                               wend, in_group, inline, segment_size, plan)
        results.append((ret, plan))
    assert results[0] == results[1]


def test_scan_ingest_plans_what_the_appender_does() -> None:
    """Two placed transactions and one that is not: a BEGIN and a COMMIT each, the
    misplaced events rewritten, and a stop right after the commit that fills the segment."""
    evs = [gtid_event(1, 0, 1), event(30, b"a" * 10), event(16, b"x" * 8)]
    at = 100
    batch = bytearray()
    for ev in evs:
        at += len(ev)
        batch += build.reframe(ev, True, log_pos=at)
    first = len(batch)
    for ev in [gtid_event(2, 0, 1), event(30, b"b" * 10), event(16, b"x" * 8)]:
        batch += build.reframe(ev, True, log_pos=999)
    for twin in twins():
        plan: list[tuple[int, ...]] = []
        ret = twin.scan_ingest(bytes(batch), 0, None, 0, KINDS, 100, False, True, 10**9, plan)
        assert ret == (len(batch), 0, 100 + len(batch), False)
        assert [p[0] for p in plan] == [pure.BEGIN, pure.COMMIT, pure.BEGIN, pure.REWRITE,
                                        pure.REWRITE, pure.REWRITE, pure.COMMIT]
        assert plan[0] == (pure.BEGIN, 0, 0, 7, 1, 1, 100, 0)
        assert plan[1] == (pure.COMMIT, first, 100 + first)
        plan = []
        assert twin.scan_ingest(bytes(batch), 0, None, 0, KINDS, 100, False, True, 101,
                                plan)[0] == first


def test_arguments_no_buffer_can_have_are_refused_by_both_twins() -> None:
    """A kernel never reads outside its buffer, whatever it is given: a negative offset,
    a short tally or kinds table, a sequence id that is not a byte."""
    stream = dump_packets([(30, b"r" * 30, 0)], 1)
    for twin in twins():
        for call in (
                lambda: twin.read_dump(stream, -5, 1, -1, bytes(256), [0] * 256,  # noqa: B023
                                       bytearray(), []),
                lambda: twin.read_dump(stream, 0, 1, -1, bytes(256), [0] * 10,  # noqa: B023
                                       bytearray(), []),
                lambda: twin.read_dump(stream, 0, 256, -1, bytes(256), [0] * 256,  # noqa: B023
                                       bytearray(), []),
                lambda: twin.frame_stored(bytearray(), stream, -1),  # noqa: B023
                lambda: twin.scan_ingest(stream, -1, None, 0, KINDS, 0, False, True,  # noqa: B023
                                         10, []),
                lambda: twin.scan_ingest(stream, 0, [5], -3, KINDS, 0, False, True,  # noqa: B023
                                         10, []),
                lambda: twin.scan_ingest(stream, 0, None, 0, b"\0" * 10, 0, False,  # noqa: B023
                                         True, 10, [])):
            with pytest.raises(ValueError):
                call()


CLEAN_KINDS = bytes(CleanKind.GTID if t == 162 else CleanKind.TABLE_MAP if t == 19
                    else CleanKind.MYSQL_GTID if t in (33, 34, 42) else CleanKind.QUERY if t == 2
                    else CleanKind.ROWS if t in (23, 24, 25, 30, 31, 32)
                    else CleanKind.ANNOTATION if t == 160
                    else CleanKind.XID if t == 16 else CleanKind.OTHER for t in range(256))


def mysql_query(text: bytes, status: bytes = b"") -> bytes:
    """A QUERY event: thread id, exec time, schema length, error code, status length, the
    status variables, the schema and its NUL, the statement."""
    return event(2, struct.pack("<IIBHH", 1, 0, 1, 0, len(status)) + status + b"d\0" + text)


def table_map_event(tid: int, log_pos: int = 0) -> bytes:
    return event(19, tid.to_bytes(6, "little") + b"\0\0\1d\0\1t\0\1\3\0", log_pos)


def rows_event(tid: int) -> bytes:
    return event(30, tid.to_bytes(6, "little") + b"\1\0\2\0\1\xff\0\1\0\0\0")


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(["map", "rows", "annotate", "query", "other-rows"]),
                         max_size=6), max_size=6), st.data())
def test_scan_clean_twins_agree_on_any_chunk(shapes: list[list[str]],
                                             data: st.DataObject) -> None:
    """Transactions of table maps (some judged not untouched), rows of mapped and unmapped
    tables, annotations and statements; standalone GTIDs, cut and mutated chunks: both
    twins take the same run, count the same events, cut the same annotations and ask
    about the same table maps."""
    chunk = bytearray()
    for i, shape in enumerate(shapes):
        if data.draw(st.booleans()):
            chunk += gtid_event(i + 1, 0, data.draw(st.sampled_from([0, 0, 0, 1, 8])))
        else:  # MySQL's: a GTID, then BEGIN (or another statement, or nothing)
            chunk += event(33, b"\0" * 25)
            text = data.draw(st.sampled_from([b"BEGIN", b"BEGIN", b"COMMIT", b"BEGIN ", b""]))
            if text:
                chunk += mysql_query(text, data.draw(st.binary(max_size=4)))
        for part in shape:
            tid = data.draw(st.integers(1, 5))
            makers: dict[str, Callable[[int], bytes]] = {
                "map": table_map_event, "rows": rows_event,
                "other-rows": lambda t: rows_event(t + 100),
                "annotate": lambda t: event(160, b"UPDATE t SET a = 1"),
                "query": lambda t: event(2, b"q" * 20)}
            chunk += makers[part](tid)
        chunk += event(16, b"x" * 8)
    if chunk and data.draw(st.booleans()):
        chunk[data.draw(st.integers(0, len(chunk) - 1))] ^= data.draw(st.integers(1, 255))
    if chunk and data.draw(st.booleans()):
        del chunk[data.draw(st.integers(0, len(chunk))):]
    unclean = data.draw(st.sets(st.integers(1, 5), max_size=2))
    drop = data.draw(st.booleans())
    # Table maps judged before (a negative id: judged again), as a stream's earlier chunks
    # leave them.
    seeded = {table_map_event(t)[19:-4]: data.draw(st.sampled_from([t, -1]))
              for t in data.draw(st.sets(st.integers(1, 5), max_size=3))}
    results = []
    for twin in twins():
        asked: list[tuple[int, int]] = []

        def judge(start: int, end: int) -> int:
            asked.append((start, end))  # noqa: B023
            tid = int.from_bytes(chunk[start + 19 : start + 25], "little")
            return -1 if tid in unclean else tid

        cuts: list[int] = [7]
        known = dict(seeded)
        ret = twin.scan_clean(bytes(chunk), 0, CLEAN_KINDS, 6, 4, judge, known, drop, cuts)
        results.append((ret, cuts, asked, known))
    assert results[0] == results[1]


def test_scan_clean_takes_mysql_transactions_that_open_with_begin() -> None:
    txn = event(33, b"\0" * 25) + mysql_query(b"BEGIN", b"\x01\x02") + table_map_event(3) \
        + rows_event(3) + event(16, b"x" * 8)
    ddl = event(33, b"\0" * 25) + mysql_query(b"CREATE TABLE t (a INT)")
    for twin in twins():
        assert twin.scan_clean(txn + txn + ddl, 0, CLEAN_KINDS, 6, 4, lambda s, e: 3, {},
                               False, []) == (2 * len(txn), 2)


def test_scan_clean_takes_a_run_and_stops_at_what_the_rules_must_see() -> None:
    clean = gtid_event(1, 0, 0) + event(160, b"INSERT") + table_map_event(3) + rows_event(3) \
        + event(16, b"x" * 8)
    unmapped = gtid_event(2, 0, 0) + rows_event(4) + event(16, b"x" * 8)
    chunk = clean + clean + unmapped + clean
    for twin in twins():
        cuts: list[int] = []
        assert twin.scan_clean(chunk, 0, CLEAN_KINDS, 6, 4, lambda s, e: 3, {}, True, cuts) == \
            (2 * len(clean), 4)
        annotation = len(gtid_event(1, 0, 0))
        assert cuts == [annotation, annotation + len(event(160, b"INSERT")),
                        len(clean) + annotation,
                        len(clean) + annotation + len(event(160, b"INSERT"))]
        assert twin.scan_clean(chunk, 0, CLEAN_KINDS, 6, 4, lambda s, e: -1, {}, False, []) == (0, 0)


def test_scan_clean_judges_each_table_map_once() -> None:
    """A table map judged untouched is kept by its body: the same map in later transactions
    (another header: timestamp, position) is not judged again; one judged -1 is."""
    def txn(tid: int, log_pos: int = 0) -> bytes:
        return gtid_event(1, 0, 0) + table_map_event(tid, log_pos) + rows_event(tid) \
            + event(16, b"x" * 8)

    chunk = txn(3) + txn(3, 1000) + txn(5) + txn(3, 2000)
    for twin in twins():
        asked: list[int] = []

        def judge(start: int, end: int) -> int:
            asked.append(start)  # noqa: B023
            return int.from_bytes(chunk[start + 19 : start + 25], "little")

        known: dict[bytes, int] = {}
        assert twin.scan_clean(chunk, 0, CLEAN_KINDS, 6, 4, judge, known, False, []) == \
            (len(chunk), 4)
        assert len(asked) == 2
        assert known == {table_map_event(3)[19:-4]: 3, table_map_event(5)[19:-4]: 5}
        assert twin.scan_clean(chunk, 0, CLEAN_KINDS, 6, 4, judge, known, False, []) == \
            (len(chunk), 4)
        assert len(asked) == 2
        known[table_map_event(5)[19:-4]] = -1
        assert twin.scan_clean(chunk, 0, CLEAN_KINDS, 6, 4, lambda s, e: -1, known, False,
                               []) == (2 * len(txn(3)), 2)


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 0x81, 0x82, 0x83, 0x84, 0x80,
                                                   0, 0x85, 0xFF]),
                                   st.sampled_from([0, 0, 1, 2, 3])), min_size=1, max_size=12),
                min_size=1, max_size=2),
       st.binary(max_size=300), st.data())
def test_splice_rows_twins_agree_on_any_rows(images: list[list[tuple[int, int]]], rows: bytes,
                                             data: st.DataObject) -> None:
    """Any layout and modes (mode 3 and a by-value column without a length prefix are
    refused), any bytes (mostly cut or nonsense), replacements of any length or NULL, by
    stored bytes and by value: the same rows, the same changed flag, the same calls, the
    same errors."""
    layouts = [(bytes(w for w, _ in img), bytes(m for _, m in img)) for img in images]
    answers = data.draw(st.lists(st.one_of(st.none(), st.binary(max_size=6)), min_size=1,
                                 max_size=5))
    results = []
    for twin in twins():
        calls: list[tuple[int, int, bytes]] = []

        def replacer(image: int, column: int) -> Callable[[bytes], bytes | None]:
            def replace(raw: bytes) -> bytes | None:
                calls.append((image, column, raw))  # noqa: B023
                return raw if len(calls) % 3 == 0 else answers[len(calls) % len(answers)]  # noqa: B023
            return replace

        replacers = [tuple(replacer(k, i) if mode else None for i, (_w, mode) in enumerate(img))
                     for k, img in enumerate(images)]
        results.append((outcome(lambda: twin.splice_rows(rows, layouts, replacers)),  # noqa: B023
                        calls))
    assert results[0] == results[1]


def test_splice_rows_replaces_the_masked_values_and_keeps_every_other_byte() -> None:
    # Two images of (INT, VARCHAR with a 1-byte length, BIGINT), the VARCHAR masked; the
    # second row's VARCHAR is NULL in its before-image.
    layout = (bytes((4, 0x81, 8)), bytes((SpliceMode.KEEP, SpliceMode.STORED, SpliceMode.KEEP)))
    by_value = (layout[0], bytes((SpliceMode.KEEP, SpliceMode.VALUE, SpliceMode.KEEP)))
    row1 = b"\0" + b"\1\0\0\0" + b"\3abc" + b"\2" * 8
    row2 = b"\2" + b"\5\0\0\0" + b"\7" * 8

    def same(raw: bytes) -> bytes:
        return raw

    for twin in twins():
        out, changed = twin.splice_rows(row1 + row2, [layout, layout],
                                        [(None, lambda raw: b"\2zz", None),
                                         (None, lambda raw: None, None)])
        assert changed
        assert out == b"\0" + b"\1\0\0\0" + b"\2zz" + b"\2" * 8 \
            + b"\2" + b"\5\0\0\0" + b"\7" * 8
        out, changed = twin.splice_rows(row1, [layout], [(None, same, None)])
        assert (out, changed) == (row1, False)
        # By value: the replacer sees the value alone, the kernel writes its length.
        seen: list[bytes] = []

        def recorded(raw: bytes) -> bytes:
            seen.append(raw)  # noqa: B023
            return b"wxyz"

        out, changed = twin.splice_rows(row1, [by_value], [(None, recorded, None)])
        assert (out, changed, seen) == (b"\0\1\0\0\0\4wxyz" + b"\2" * 8, True, [b"abc"])
        out, changed = twin.splice_rows(row1, [by_value], [(None, same, None)])
        assert (out, changed) == (row1, False)
        with pytest.raises(OverflowError, match="longer than its 1-byte length prefix"):
            twin.splice_rows(row1, [by_value], [(None, lambda raw: b"x" * 256, None)])
        with pytest.raises(ValueError, match="only a column with a length prefix"):
            twin.splice_rows(row1, [(layout[0], b"\2\0\0")], [(same, None, None)])
        with pytest.raises(ValueError, match="a masked column has a replacer"):
            twin.splice_rows(row1, [layout], [(None, None, None)])
        with pytest.raises(MalformedEvent, match="runs past"):
            twin.splice_rows(row1[:-3], [layout], [(None, same, None)])


# --- decode_columns: row images into Arrow buffers ---------------------------------------------

def _column(step: ColumnStep, a: int, b: int, c: int) -> st.SearchStrategy[Any]:
    """A strategy of one stored value of a plan entry (what a server writes, but for
    random floats, timestamps and text bytes)."""
    if step is ColumnStep.INT:
        well = st.integers(0, 2 ** (8 * a) - 1).map(lambda v: v.to_bytes(a, "little"))
    elif step is ColumnStep.YEAR:
        well = st.binary(min_size=1, max_size=1)
    elif step in (ColumnStep.FLOAT, ColumnStep.DOUBLE):
        n = 4 if step is ColumnStep.FLOAT else 8
        well = st.binary(min_size=n, max_size=n)
    elif step is ColumnStep.DECIMAL:
        well = st.decimals(min_value=-(10 ** (a - b)) + 1, max_value=10 ** (a - b) - 1,
                           places=b, allow_nan=False, allow_infinity=False).map(
            lambda v: V.encode_decimal(v, a, b))
    elif step is ColumnStep.DATE:
        well = st.dates().map(V.encode_date)
    elif step is ColumnStep.DATETIME2:
        well = st.datetimes().map(lambda v: V.encode_datetime2(v, a))
    elif step is ColumnStep.TIMESTAMP2:
        n = 4 + (a + 1) // 2
        well = st.binary(min_size=n, max_size=n)
    elif step is ColumnStep.TIME2:  # (row_values': any bytes, and what a server writes)
        n = 3 + (a + 1) // 2
        well = st.binary(min_size=n, max_size=n) | st.timedeltas(
            min_value=timedelta(hours=-838), max_value=timedelta(hours=838)).map(
            lambda v: V.encode_time2(v, a))
    elif step is ColumnStep.ENUM:  # (numbers past the names too)
        well = st.integers(0, 310).map(lambda v: v.to_bytes(2, "little")[:a])
    elif step in (ColumnStep.BIT, ColumnStep.SET):  # (SET: bits past the names too)
        well = st.binary(min_size=a, max_size=a)
    else:
        text = st.lists(st.text(max_size=3).map(lambda t: t.encode()) | st.binary(max_size=3)
                        | st.sampled_from(_UTF8_EDGES), max_size=3).map(b"".join)
        well = text.map(lambda raw: len(raw).to_bytes(a, "little") + raw)
    return well


# Where UTF-8 decoders differ: surrogates, overlong forms, past U+10FFFF, cut sequences,
# and the valid sequences next to each.
_UTF8_EDGES = [b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2\x80",
               b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xe0\xa0\x80", b"\xf0\x80\x80\x80",
               b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf",
               b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98",
               b"\x80", b"\xff", "é漢😀".encode(), b"abcdefgh\xe2\x82\xac"]

_STEPS = st.one_of(
    st.tuples(st.just(ColumnStep.INT), st.sampled_from([1, 2, 3, 4, 8]), st.integers(0, 1),
              st.sampled_from([1, 2, 4, 8, 16])).filter(
        lambda s: s[3] > s[1] or (s[3] == s[1] and s[2] == 1)),
    st.tuples(st.just(ColumnStep.YEAR), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.sampled_from([ColumnStep.FLOAT, ColumnStep.DOUBLE]), st.just(0), st.just(0),
              st.just(0)),
    st.tuples(st.just(ColumnStep.DECIMAL), st.integers(1, 38), st.integers(0, 38)).filter(
        lambda s: s[2] <= s[1]).map(lambda s: (*s, V.decimal_size(s[1], s[2]))),
    st.tuples(st.just(ColumnStep.DATE), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.sampled_from([ColumnStep.DATETIME2, ColumnStep.TIMESTAMP2]),
              st.integers(0, 6), st.just(0), st.just(0)),
    st.tuples(st.just(ColumnStep.TEXT), st.integers(1, 4), st.just(0),
              st.sampled_from([0, 0, 3, 8])),
    st.tuples(st.just(ColumnStep.TEXT), st.integers(1, 4), st.just(1), st.just(0)),
    st.tuples(st.just(ColumnStep.TEXT), st.integers(1, 4), st.just(2), st.integers(0, 1)),
)


def _charmap(codec: str) -> bytes:
    out = bytearray()
    for ch in bytes(range(256)).decode(codec, "replace"):
        raw = ch.encode()
        out += bytes((len(raw),)) + raw.ljust(3, b"\0")
    return bytes(out)


# Two single-byte character sets: cp1252 (MySQL's latin1, undefined bytes replaced), koi8_r.
CHARMAPS = (_charmap("cp1252"), _charmap("koi8_r"))


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEPS, min_size=1, max_size=9), st.integers(1, 2), st.data())
def test_decode_columns_twins_agree_on_any_rows(steps: list[tuple[int, int, int, int]],
                                                images: int, data: st.DataObject) -> None:
    """Equal buffers and the same count, or -1 from both with every buffer as it was."""
    pure_twin, compiled = twins()
    plan = tuple(int(x) for s in steps for x in s)
    rows = _rows(steps, images, data)
    before = data.draw(st.integers(0, 20))
    prefix = data.draw(st.binary(max_size=3))

    def sinks() -> list[list[bytearray]]:
        out = []
        for _ in range(images):
            sink = []
            for step, *_ in steps:
                offsets = bytes(4) if step == ColumnStep.TEXT else b""
                sink += [bytearray(b"\xff" * (before // 8 + 1)), bytearray(offsets),
                         bytearray(b"kept")]
            out.append(sink)
        return out

    results = []
    for twin in (pure_twin, compiled):
        out = sinks()
        buf = prefix + bytes(rows)
        n = twin.decode_columns(buf, len(prefix), len(buf), plan, CHARMAPS, out,
                                [before] * images)
        results.append((n, out))
    _same_sinks(results, before, sinks())


def _rows(steps: list[tuple[int, int, int, int]], images: int,
          data: st.DataObject) -> bytearray:
    """Row images of these columns: what a server writes, then maybe a byte changed or
    the end cut."""
    rows = bytearray()
    for _ in range(data.draw(st.integers(0, 6))):
        for _ in range(images):
            nulls = data.draw(st.binary(min_size=(len(steps) + 7) // 8,
                                        max_size=(len(steps) + 7) // 8))
            rows += nulls
            for j, (step, a, b, c) in enumerate(steps):
                if not nulls[j >> 3] >> (j & 7) & 1:
                    rows += data.draw(_column(ColumnStep(step), a, b, c))
    if rows and data.draw(st.integers(0, 3)) == 0:  # a byte changed: no server writes it
        at = data.draw(st.integers(0, len(rows) - 1))
        rows[at] = data.draw(st.integers(0, 255))
    if data.draw(st.integers(0, 3)) == 0:  # cut
        rows = rows[: data.draw(st.integers(0, len(rows)))]
    return rows


def _same_sinks(results: list[tuple[int, list[list[bytearray]]]], before: int,
                untouched: list[list[bytearray]]) -> None:
    """The twins' results: the same count and buffers (validity: the bits of the rows
    there), or -1 from both with every buffer as it was."""
    assert results[0][0] == results[1][0]
    tally(f"decoded rows: {min(results[0][0], 2)}")
    if results[0][0] < 0:
        assert results[0][1] == results[1][1] == untouched
        return
    for pure_sink, compiled_sink in zip(results[0][1], results[1][1], strict=True):
        for k, (p_buf, c_buf) in enumerate(zip(pure_sink, compiled_sink, strict=True)):
            if k % 3 == 0:  # validity: the bits of the rows decoded (later bits are free)
                bits = before + results[0][0]
                assert [p_buf[i >> 3] >> (i & 7) & 1 for i in range(bits)] == \
                    [c_buf[i >> 3] >> (i & 7) & 1 for i in range(bits)]
            else:
                assert p_buf == c_buf


@pytest.mark.twins
@settings(max_examples=EXAMPLES, deadline=None,  # (valgrind: bench/memcheck.py)
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEPS | st.tuples(st.just(ColumnStep.DECIMAL), st.integers(39, 65),
                                   st.integers(0, 30)).map(
    lambda s: (*s, V.decimal_size(s[1], s[2]))), min_size=1, max_size=9),
    st.integers(1, 2), st.data())
def test_json_images_twins_agree_on_any_rows(steps: list[tuple[int, int, int, int]],
                                             images: int, data: st.DataObject) -> None:
    pure_twin, compiled = twins()
    plan = tuple(int(x) for s in steps for x in s)
    keys = tuple(f'{"{" if j == 0 else ","}"c{j}":'.encode() for j in range(len(steps)))
    rows = _rows(steps, images, data)
    before = data.draw(st.integers(0, 20))

    def sinks() -> list[list[bytearray]]:
        return [[bytearray(b"\xff" * (before // 8 + 1)), bytearray(b"\0\0\0\0"),
                 bytearray(b"kept")] for _ in range(images)]

    results = []
    for twin in (pure_twin, compiled):
        out = sinks()
        results.append((twin.json_images(bytes(rows), 0, len(rows), plan, CHARMAPS, keys,
                                         out, [before] * images), out))
    _same_sinks(results, before, sinks())


def test_row_image_kernels_refuse_what_no_table_has_the_same_way() -> None:
    """A plan no column has, a charmap that is not one, a range outside the data, sinks of
    the wrong shape: the same ValueError from both twins, before any byte is read."""
    rows = b"\0\1\0\0\0" * 2
    one = [[bytearray(), bytearray(), bytearray()]]
    bad_decode = [
        ((1, 4, 0, 4), (), one, [0]), ((1, 4, 1, 4, 9), (), one, [0]),
        ((5, 39, 2, 18), (), one, [0]), ((9, 1, 2, 0), (), one, [0]),
        ((9, 1, 2, 0), (b"\0" * 1024,), one, [0]), ((1, 4, 1, 4), (), one, [0, 0]),
        ((1, 4, 1, 4), (), [[bytearray()]], [0]), ((1, 4, 1, 4), (), [], []),
        ((1, 4, 1, 4), (), one, [-8])]
    for twin in twins():
        for plan, charmaps, sinks, counts in bad_decode:
            with pytest.raises(ValueError) as caught:
                twin.decode_columns(rows, 0, len(rows), plan, charmaps, sinks, counts)
            with pytest.raises(ValueError, match=str(caught.value).replace("(", r"\(")
                               .replace(")", r"\)")):
                (twins()[1] if twin is pure else pure).decode_columns(
                    rows, 0, len(rows), plan, charmaps, sinks, counts)
        with pytest.raises(ValueError, match="within the data"):
            twin.decode_columns(rows, 3, 2, (1, 4, 1, 4), (), one, [0])
        with pytest.raises(ValueError, match="one key per column"):
            twin.json_images(rows, 0, len(rows), (1, 4, 1, 8), (), (), one, [0])
        assert twin.json_images(rows, 0, len(rows), (1, 4, 1, 8), (), (b'{"v":',),
                                [[bytearray(), bytearray(4), bytearray()]], [0]) == 2
