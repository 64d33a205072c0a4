"""The dump stream's one reader: packets in (in any cuts), whole events out."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.binlog import build, walk
from relay.binlog.constants import EventType
from relay.binlog.gtid import Gtid
from relay.errors import RemoteProtocolError, ServerError
from relay.wire.codec import MAX_PACKET
from relay.wire.dumpstream import ACK_REQUESTED, DumpReader, EventBatch, EventTally, frame_event
from relay.wire.replies import build_eof, build_err
from tests.helpers import transaction

EVENTS = [ev for seq in range(1, 6) for ev in transaction(Gtid(0, 1, seq))]


def packets(events: list[bytes], *, seq: int = 1) -> bytes:
    out = bytearray()
    for ev in events:
        seq = frame_event(out, ev, seq)
    return bytes(out)


def events_of(batch: EventBatch) -> list[bytes]:
    return [bytes(batch.data[p : p + n]) for p, n in walk.spans(batch.data)]


def feed_in_pieces(reader: DumpReader, data: bytes, cuts: list[int]) -> list[bytes]:
    out = []
    pos = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > pos:
            out += events_of(reader.feed(data[pos:cut]))
            pos = cut
    return out


def test_events_come_out_whole_and_in_order() -> None:
    reader = DumpReader()
    batch = reader.feed(packets(EVENTS))
    assert events_of(batch) == EVENTS and not batch.acks


@given(st.lists(st.integers(0, 10_000), max_size=12))
def test_any_cut_of_the_bytes_gives_the_same_events(cuts: list[int]) -> None:
    assert feed_in_pieces(DumpReader(), packets(EVENTS), cuts) == EVENTS


def test_an_event_of_16_mib_and_more_is_joined_from_its_packets() -> None:
    big = build.build_event(EventType.WRITE_ROWS_V2, b"r" * (MAX_PACKET + 100), server_id=1,
                            log_pos=0)
    exact = build.build_event(EventType.WRITE_ROWS_V2, b"x" * (MAX_PACKET - 1 - 19 - 4),
                              server_id=1, log_pos=0)  # payload of exactly 0xFFFFFF bytes
    stream = [EVENTS[0], big, exact, EVENTS[1]]
    data = packets(stream)
    assert feed_in_pieces(DumpReader(), data, [5, MAX_PACKET, MAX_PACKET + 7,
                                              2 * MAX_PACKET + 3]) == stream


def test_semi_sync_headers_are_stripped_and_acks_marked() -> None:
    gtid, rows, xid = transaction(Gtid(0, 1, 7))
    heartbeat = build.heartbeat("bin.000001", server_id=1, log_pos=0)
    payloads = [b"\0\xef\x00" + gtid, b"\0\xef\x00" + rows, b"\0\xef\x01" + xid,
                b"\0" + heartbeat]  # heartbeats come without the header
    data = bytearray()
    for i, p in enumerate(payloads):  # the primary restarts its numbering after an ack
        data += len(p).to_bytes(3, "little") + bytes((1 if i == 3 else i + 1,)) + p
    batch = DumpReader(semi_sync=True).feed(bytes(data))
    assert events_of(batch) == [gtid, rows, xid, heartbeat]
    assert batch.acks == [len(gtid) + len(rows)]


def test_semi_sync_event_without_its_header_is_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="0xEF"):
        DumpReader(semi_sync=True).feed(packets([EVENTS[0]]))


def test_err_raises_the_primarys_error_and_eof_ends_the_dump() -> None:
    err = build_err(1236, "Could not find first log file name in binary log index file")
    data = packets(EVENTS[:3]) + len(err).to_bytes(3, "little") + bytes((4,)) + err
    reader = DumpReader()
    with pytest.raises(ServerError) as info:
        reader.feed(data)
    assert info.value.errno == 1236
    eof = build_eof()
    reader = DumpReader()
    batch = reader.feed(packets(EVENTS[:3]) + len(eof).to_bytes(3, "little") + b"\x04" + eof)
    assert events_of(batch) == EVENTS[:3] and reader.ended


def test_out_of_order_and_inconsistent_packets_are_refused() -> None:
    data = bytearray(packets(EVENTS[:2]))
    data[3 + len(EVENTS[0]) + 5] = 9  # the second packet's sequence id
    with pytest.raises(RemoteProtocolError, match="out of order"):
        DumpReader().feed(bytes(data))
    ev = bytearray(EVENTS[0])
    struct.pack_into("<I", ev, 9, len(ev) + 1)  # event_size disagrees with the packet
    with pytest.raises(RemoteProtocolError, match="event_size"):
        DumpReader().feed(packets([bytes(ev)]))


@given(st.binary(max_size=400))
def test_garbage_raises_a_protocol_error_or_waits(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError, ServerError):
        DumpReader().feed(data)


def test_marks_name_the_events_a_sink_must_look_at_and_the_tally_counts_all() -> None:
    """Marked: every event of a type the sink did not call plain, and every event whose
    log_pos does not follow the previous one's; a packet taken off the fast path marks
    itself and the event after it."""
    gtid, rows, xid = transaction(Gtid(0, 1, 1))
    placed = [build.reframe(gtid, True, log_pos=100 + len(gtid))]
    placed.append(build.reframe(rows, True, log_pos=100 + len(gtid) + len(rows)))
    placed.append(build.reframe(rows, True, log_pos=100 + len(gtid) + 2 * len(rows)))
    placed.append(build.reframe(rows, True, log_pos=999))  # not where the last one ended
    placed.append(build.reframe(xid, True, log_pos=999 + len(xid)))
    tally = EventTally()
    reader = DumpReader(plain=frozenset({rows[4]}), tally=tally)
    batch = reader.feed(packets(placed))
    offsets = [p for p, _ in walk.spans(batch.data)]
    assert batch.marks == [offsets[0], offsets[3], offsets[4]]
    assert tally.events == 5 and tally.events_by_type[rows[4]] == 3
    assert tally.bytes == sum(map(len, placed))
    # All types plain: the reader's first event and the one out of place.
    assert DumpReader().feed(packets(placed)).marks == [offsets[0], offsets[3]]


def test_the_sending_side_writes_what_the_reading_side_takes_with_semi_sync() -> None:
    big = build.build_event(EventType.WRITE_ROWS_V2, b"r" * (MAX_PACKET + 100), server_id=1,
                            log_pos=0)
    stream = [*EVENTS[:3], big, *EVENTS[3:6]]
    out = bytearray()
    seq = 1
    for i, ev in enumerate(stream):
        seq = frame_event(out, ev, seq, ACK_REQUESTED if i in (2, 6) else 0)
    batch = DumpReader(semi_sync=True).feed(bytes(out))
    assert events_of(batch) == stream
    ends = [sum(len(e) for e in stream[:i]) for i in (2, 6)]  # offsets of the asked events
    assert batch.acks == ends


def _framed(events: list[bytes], seq: int) -> bytes:
    out = bytearray()
    for ev in events:
        seq = frame_event(out, ev, seq)
    return bytes(out)


def test_stored_events_are_framed_as_one_event_at_a_time_would_be() -> None:
    from relay.wire.dumpstream import frame_eof, frame_stored

    big = build.build_event(EventType.WRITE_ROWS_V2, b"r" * (MAX_PACKET + 5), server_id=1,
                            log_pos=0)
    stored = b"".join([*EVENTS[:3], big, *EVENTS[3:]])
    out = bytearray()
    seq, used, last = frame_stored(out, stored, 7)
    each = bytearray()
    want_seq = 7
    for ev in [*EVENTS[:3], big, *EVENTS[3:]]:
        want_seq = frame_event(each, ev, want_seq)
    assert bytes(out) == bytes(each) and seq == want_seq
    assert used == len(stored) and last == len(stored) - len(EVENTS[-1])
    assert frame_stored(bytearray(), b"", 3) == (3, 0, -1)
    # A type left out (ANNOTATE_ROWS, for a client that did not ask): passed over whole.
    annotate = build.build_event(EventType.ANNOTATE_ROWS, b"INSERT INTO t VALUES (1)",
                                 server_id=1, log_pos=0)
    with_notes = b"".join([*EVENTS[:2], annotate, *EVENTS[2:], annotate])
    out = bytearray()
    seq, used, last = frame_stored(out, with_notes, 7, EventType.ANNOTATE_ROWS)
    assert bytes(out) == _framed(EVENTS, 7)
    assert used == len(with_notes)
    assert last == len(with_notes) - len(annotate) - len(EVENTS[-1])
    assert seq == (7 + len(EVENTS)) & 0xFF
    eof = frame_eof(9)
    assert eof[3] == 9 and eof[4:] == build_eof()
