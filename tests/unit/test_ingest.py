"""The ingest's mirroring logic, driven with a synthesized primary binlog (no server)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.binlog import build, walk
from relay.binlog.constants import EventType
from relay.binlog.group import PLAIN
from relay.binlog.gtid import Gtid
from relay.config import SyncMode, SyncPolicy
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import read_index
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import StreamStart
from relay.wire.dumpstream import DumpReader, frame_event
from tests.conftest import gtids_in, read_binlog
from tests.helpers import fde, gtid_event, rows_event, transaction, xid_event


def primary_file(name: str, gtids: list[Gtid], start_state: list[Gtid],
                 next_file: str | None = None,
                 checkpoint_after: int | None = None) -> tuple[bytes, list[bytes]]:
    """A primary's binlog file: (file bytes, its events with real log_pos); with
    `checkpoint_after`, a Binlog_checkpoint between transactions after that many."""
    events: list[bytes] = []
    pos = 4

    def add(ev: bytes) -> None:
        nonlocal pos
        ev = build.reframe(ev, True, log_pos=pos + len(ev))
        events.append(ev)
        pos += len(ev)

    add(fde())
    add(build.gtid_list(start_state, server_id=1, log_pos=0))
    add(build.binlog_checkpoint(name, server_id=1, log_pos=0))
    for i, g in enumerate(gtids):
        if i == checkpoint_after:
            add(build.binlog_checkpoint(name, server_id=1, log_pos=0))
        for ev in transaction(g):
            add(ev)
    if next_file:
        add(build.rotate(next_file, server_id=1, log_pos=0))
    return b"\xfebin" + b"".join(events), events


def artificial_rotate(name: str, position: int = 4) -> bytes:
    return build.rotate(name, position=position, server_id=1, log_pos=0, artificial=True)


class _NoLink:
    """A connection no one pauses, fails or answers (the ingest never does)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def fail(self, exc: Exception) -> None:
        raise exc

    def reply(self, payload: bytes) -> None: ...


def new_log(tmp_path: pathlib.Path) -> RelayLog:
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    log.open()
    return log


@pytest.mark.parametrize("checkpoint_after", [None, 11], ids=["plain", "checkpoint"])
def test_clean_start_mirrors_the_file_byte_for_byte(tmp_path: pathlib.Path,
                                                    checkpoint_after: int | None) -> None:
    # With a checkpoint: the primary writes a Binlog_checkpoint into its current file once
    # the previous file's transactions are safe; the segment keeps it where it came.
    data, events = primary_file("mariadb-bin.000001", [Gtid(0, 1, s) for s in range(1, 30)],
                                [], checkpoint_after=checkpoint_after)
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *events])
    log.close()
    with open(os.path.join(str(tmp_path), "relay-bin.000001"), "rb") as f:
        assert f.read() == data
    assert log.stats.events_rewritten == 0
    assert str(log.state) == "0-1-29"


def test_reconnect_mid_transaction_continues_the_segment(tmp_path: pathlib.Path) -> None:
    gtids = [Gtid(0, 1, s) for s in range(1, 21)]
    _, events = primary_file("mariadb-bin.000001", gtids, [])
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    # The connection dies after two events of the 11th transaction.
    cut = 3 + 10 * 3 + 2
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *events[:cut]])
    asyncio.run(ingest.on_end())
    assert str(log.state) == "0-1-10"
    # Reconnect by GTID: the primary replays its header, then an artificial GTID_LIST
    # marking where it resumes, then the 11th transaction again.
    resume = struct.unpack_from("<I", events[3 + 10 * 3 - 1], 13)[0]
    fde_again = build.copy_fde(events[0], log_pos=struct.unpack_from("<I", events[0], 13)[0],
                               created=0)
    marker = build.gtid_list([Gtid(0, 1, 10)], server_id=1, log_pos=resume, artificial=True)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), fde_again, events[1], events[2],
                 marker, *events[3 + 10 * 3 :]])
    log.close()
    seg = os.path.join(str(tmp_path), "relay-bin.000001")
    assert read_index(str(tmp_path), "relay-bin") == ["relay-bin.000001"]
    assert gtids_in([seg]) == gtids  # nothing lost, nothing twice
    types = [ev[4] for ev in read_binlog(seg)]
    assert types.count(EventType.FORMAT_DESCRIPTION) == 1  # no header replayed into it
    assert types.count(EventType.GTID_LIST) == 1
    assert log.stats.events_rewritten == 0  # still aligned with the primary's file


def _streaming(tmp_path: pathlib.Path) -> tuple[RelayLog, Ingest]:
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    return log, ingest


def _two_checkpoints_at_the_head(name: str, gtids: list[Gtid]) -> tuple[bytes, list[bytes]]:
    """A file that opens as a primary's does after a rotation under load: FDE, GTID_LIST,
    the previous file's Binlog_checkpoint, then its own, back to back."""
    return primary_file(name, gtids, [], checkpoint_after=0)


def test_a_batch_that_ends_inside_the_header_loses_nothing(tmp_path: pathlib.Path) -> None:
    # An idle primary's header may come in pieces: the segment opens once the file's
    # GTID_LIST is in, and a checkpoint written later follows it where the file has it.
    data, events = _two_checkpoints_at_the_head("mariadb-bin.000001",
                                                [Gtid(0, 1, s) for s in range(1, 6)])
    assert [ev[4] for ev in events[:4]] == [EventType.FORMAT_DESCRIPTION, EventType.GTID_LIST,
                                            EventType.BINLOG_CHECKPOINT,
                                            EventType.BINLOG_CHECKPOINT]
    log, ingest = _streaming(tmp_path)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), events[0]])
    assert read_index(str(tmp_path), "relay-bin") == []   # not on the FDE alone
    for ev in events[1:4]:
        ingest.feed([ev])
    ingest.feed(events[4:])
    _mirrors(tmp_path, log, data)


def _mirrors(tmp_path: pathlib.Path, log: RelayLog, data: bytes) -> None:
    """The log, closed, holds one segment: the primary's file byte for byte."""
    log.close()
    with open(os.path.join(str(tmp_path), "relay-bin.000001"), "rb") as f:
        assert f.read() == data
    assert log.stats.events_rewritten == 0


def test_a_reconnect_inside_the_header_keeps_the_later_checkpoint(
        tmp_path: pathlib.Path) -> None:
    # The link dies after the first checkpoint; the primary writes its second before the
    # relay is back, and sends the header again with it.
    data, events = _two_checkpoints_at_the_head("mariadb-bin.000001",
                                                [Gtid(0, 1, s) for s in range(1, 6)])
    log, ingest = _streaming(tmp_path)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *events[:3]])
    asyncio.run(ingest.on_end())
    fde_again = build.copy_fde(events[0], log_pos=struct.unpack_from("<I", events[0], 13)[0],
                               created=0)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), fde_again, *events[1:]])
    _mirrors(tmp_path, log, data)


def test_a_start_past_the_gtid_list_keeps_the_files_checkpoints(
        tmp_path: pathlib.Path) -> None:
    # A start by GTID at a file's first transaction: MariaDB 11.8 sends the file from past
    # its GTID_LIST (a fake FDE first). The segment's position event is the relay's own;
    # the file's checkpoints follow it at the file's offsets, and so does the rest.
    data, events = _two_checkpoints_at_the_head("mariadb-bin.000001",
                                                [Gtid(0, 1, s) for s in range(1, 6)])
    past_list = struct.unpack_from("<I", events[1], 13)[0]
    log, ingest = _streaming(tmp_path)
    ingest.feed([artificial_rotate("mariadb-bin.000001", past_list),
                 build.copy_fde(events[0], log_pos=0, created=0), *events[2:]])
    log.close()
    seg = os.path.join(str(tmp_path), "relay-bin.000001")
    with open(seg, "rb") as f:
        ours = f.read()
    assert ours[past_list:] == data[past_list:]
    assert [ev[4] for ev in read_binlog(seg)[:4]] == [ev[4] for ev in events[:4]]
    assert log.stats.events_rewritten == 0
    assert gtids_in([seg]) == [Gtid(0, 1, s) for s in range(1, 6)]


def test_a_reconnect_that_resumes_in_the_next_file_gives_it_its_segment(
        tmp_path: pathlib.Path) -> None:
    # The link ends after the last transaction of a file, before its ROTATE; the primary
    # rotates meanwhile, and the relay's GTID position resumes at the next file's start.
    first = [Gtid(0, 1, s) for s in range(1, 6)]
    second = [Gtid(0, 1, s) for s in range(6, 11)]
    _, ev1 = primary_file("mariadb-bin.000001", first, [], next_file="mariadb-bin.000002")
    data2, ev2 = primary_file("mariadb-bin.000002", second, [Gtid(0, 1, 5)])
    log, ingest = _streaming(tmp_path)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *ev1[:-1]])   # no ROTATE
    asyncio.run(ingest.on_end())
    ingest.feed([artificial_rotate("mariadb-bin.000002"), *ev2])
    log.close()
    names = read_index(str(tmp_path), "relay-bin")
    assert names == ["relay-bin.000001", "relay-bin.000002"]
    assert gtids_in([os.path.join(str(tmp_path), names[0])]) == first
    with open(os.path.join(str(tmp_path), names[1]), "rb") as f:
        assert f.read() == data2   # the next file's copy


def test_primary_rotation_seals_and_mirrors_the_next_file(tmp_path: pathlib.Path) -> None:
    first = [Gtid(0, 1, s) for s in range(1, 6)]
    second = [Gtid(0, 1, s) for s in range(6, 11)]
    _, ev1 = primary_file("mariadb-bin.000001", first, [], next_file="mariadb-bin.000002")
    data2, ev2 = primary_file("mariadb-bin.000002", second, [Gtid(0, 1, 5)])
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *ev1,
                 artificial_rotate("mariadb-bin.000002"), *ev2])
    log.close()
    names = read_index(str(tmp_path), "relay-bin")
    assert names == ["relay-bin.000001", "relay-bin.000002"]
    last = read_binlog(os.path.join(str(tmp_path), names[0]))[-1]
    assert last[4] == EventType.ROTATE and b"relay-bin.000002" in last
    with open(os.path.join(str(tmp_path), names[1]), "rb") as f:
        assert f.read() == data2  # the second segment mirrors the second file exactly
    assert gtids_in([os.path.join(str(tmp_path), n) for n in names]) == first + second


def _reads_through_the_dump_reader(ingest: Ingest, events: list[bytes],
                                   cuts: list[int]) -> list[list[bytes]]:
    """Feed `events` as a primary's dump packets, cut into reads at `cuts`: the reader's
    marks let the ingest skip the plain runs it saw placed back to back. Returns the
    events of each batch."""
    batches: list[list[bytes]] = []
    data = bytearray()
    seq = 1
    for ev in events:
        seq = frame_event(data, ev, seq)
    reader = DumpReader(plain=PLAIN, tally=ingest.stats)
    pos = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > pos:
            batch = reader.feed(bytes(data[pos:cut]))
            if batch.data:
                batches.append([bytes(batch.data[p : p + n]) for p, n in walk.spans(batch.data)])
                ingest.on_events(batch)
            pos = cut
    return batches


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(1, 4), min_size=5, max_size=25),
       shift_at=st.integers(2, 200), shift=st.sampled_from([0, 7, -3]),
       cuts=st.lists(st.integers(0, 1 << 20), max_size=6))
def test_the_reader_s_marks_leave_the_same_file_as_visiting_every_event(
        rows: list[int], shift_at: int, shift: int, cuts: list[int]) -> None:
    """Transactions of several row events, placed as the primary did, and from one event
    on shifted (the primary's positions stop matching the relay's, even inside a
    transaction): the fast path over marks and the event-by-event path write the same
    bytes and state in the same reads, and the tally counts every event sent."""
    events: list[bytes] = []
    pos = 4
    for ev in [fde(), build.gtid_list([], server_id=1, log_pos=0)]:
        events.append(build.reframe(ev, True, log_pos=pos + len(ev)))
        pos += len(ev)
    for seq, k in enumerate(rows, 1):
        for ev in [gtid_event(Gtid(0, 1, seq)),
                   *(rows_event(bytes((seq, i)) * (20 + 9 * i)) for i in range(k)),
                   xid_event(seq)]:
            if len(events) == shift_at:
                pos += shift
            events.append(build.reframe(ev, True, log_pos=pos + len(ev)))
            pos += len(ev)
    stream = [artificial_rotate("mariadb-bin.000001"), *events]
    with tempfile.TemporaryDirectory() as a_dir, tempfile.TemporaryDirectory() as b_dir:
        written = []
        batches: list[list[bytes]] = []
        for d, marked in ((b_dir, True), (a_dir, False)):
            log = new_log(pathlib.Path(d))
            ingest = Ingest(log)
            ingest.on_stream(StreamStart(True, _NoLink()))
            if marked:
                batches = _reads_through_the_dump_reader(ingest, stream, cuts)
                assert ingest.stats.events == len(stream)
                assert ingest.stats.events_by_type[EventType.XID] == len(rows)
            else:
                for events_read in batches:
                    ingest.feed(events_read)
            log.close()
            assert str(log.state) == f"0-1-{len(rows)}"
            with open(os.path.join(d, "relay-bin.000001"), "rb") as f:
                written.append((f.read(), log.stats.events_rewritten))
        assert written[0] == written[1]
        if shift and shift_at < len(events):
            assert written[0][1] > 0  # the runs after the shift were restamped
