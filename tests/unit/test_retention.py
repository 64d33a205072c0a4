"""Retention: the plan (pure), removal through the relay log, readers that lose segments,
recovery after an interrupted purge, and the log re-opened after a full disk."""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib

import pytest

from relay.binlog.gtid import Gtid, GtidState
from relay.config import SyncMode, SyncPolicy, VerifyMode
from relay.errors import CorruptLog, LogWriteError, SegmentPurged
from relay.relaylog import fileio, segfile
from relay.relaylog.cursor import Cursor, SegmentReader
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import read_index
from relay.relaylog.positions import PositionError, resolve_gtid
from relay.relaylog.readers import ReaderInfo, ReaderKind
from relay.relaylog.retention import (
    Retention,
    RetentionPolicy,
    SegmentFacts,
    UnknownSegment,
    plan,
    plan_explicit,
)
from relay.relaylog.segments import SegmentList
from relay.relaylog.series import BinlogSeries, relay_log_files
from tests.helpers import fde, transaction, write_transactions

NOW = 1_800_000_000.0


def _segs(n: int, size: int = 100, age_step: float = 3600.0) -> list[SegmentFacts]:
    """n segments of `size` bytes, the oldest sealed n*age_step ago, the last open."""
    return [SegmentFacts(f"relay-bin.{i:06d}", i, size,
                         None if i == n else NOW - (n - i) * age_step) for i in range(1, n + 1)]


def _reader(name: str, segment: int, kind: ReaderKind = ReaderKind.LIVE) -> ReaderInfo:
    return ReaderInfo(name, kind, (segment, 4), NOW)


def test_plan_by_size_keeps_min_segments_and_the_open_one() -> None:
    segs = _segs(10)
    p = plan(segs, [], RetentionPolicy(max_size=450, min_segments=2), NOW)
    assert p.names == [f"relay-bin.{i:06d}" for i in range(1, 7)]
    assert p.bytes == 600 and p.reason == "size" and not p.forced
    p = plan(segs, [], RetentionPolicy(max_size=1, min_segments=4), NOW)
    assert len(p.names) == 6  # 10 - 4
    p = plan(segs, [], RetentionPolicy(max_size=1, min_segments=1), NOW)
    assert len(p.names) == 9  # never the open segment


def test_plan_by_age() -> None:
    segs = _segs(10)  # segment i sealed (10 - i) hours ago
    p = plan(segs, [], RetentionPolicy(max_age=5.5 * 3600), NOW)
    assert p.names == [f"relay-bin.{i:06d}" for i in range(1, 5)] and p.reason == "age"
    assert plan(segs, [], RetentionPolicy(), NOW).names == []


def test_a_reader_holds_retention_back_and_is_reported() -> None:
    segs = _segs(10)
    readers = [_reader("replica 7", 3), _reader("tap subscriber s1", 5, ReaderKind.HOLD)]
    p = plan(segs, readers, RetentionPolicy(max_size=250), NOW)
    assert p.names == ["relay-bin.000001", "relay-bin.000002"]
    held = {h.reader: h.bytes for h in p.held_back}
    assert held == {"replica 7": 600, "tap subscriber s1": 400}  # 3..8 and 5..8 wanted
    # Two readers of one name and kind: one holdback, the one further behind
    p = plan(segs, [*readers, _reader("replica 7", 2), _reader("replica 7", 6)],
             RetentionPolicy(max_size=250), NOW)
    assert sorted((h.reader, h.segment, h.bytes) for h in p.held_back) == [
        ("replica 7", 2, 700), ("tap subscriber s1", 5, 400)]


def test_a_hold_too_far_behind_protects_nothing() -> None:
    segs = _segs(10)
    hold = _reader("tap:old", 2, ReaderKind.HOLD)
    assert plan(segs, [hold], RetentionPolicy(max_size=300), NOW).names == ["relay-bin.000001"]
    p = plan(segs, [hold], RetentionPolicy(max_size=300, hold_max=500), NOW)
    assert len(p.names) == 7  # 900 - 4 bytes behind: over hold_max, it keeps nothing
    live = _reader("replica", 2)  # a connected reader is never dropped by hold_max
    assert plan(segs, [live], RetentionPolicy(max_size=300, hold_max=500), NOW).names == [
        "relay-bin.000001"]


def test_the_hard_cap_overrides_readers() -> None:
    segs = _segs(10)
    readers = [_reader("slow", 2)]
    p = plan(segs, readers, RetentionPolicy(max_size=300, hard_cap=600), NOW)
    assert p.names == [f"relay-bin.{i:06d}" for i in range(1, 5)]  # 1000 - 400 = 600
    assert p.forced and "hard cap" in p.reason
    # It lost segment 2 to the cap: it holds nothing back (not the 600 bytes of 2..7 that
    # size retention wanted, three of them gone with the cap); one further on holds what
    # the cap left of them, 6 and 7.
    assert p.held_back == []
    p = plan(segs, [*readers, _reader("further", 6)],
             RetentionPolicy(max_size=300, hard_cap=600), NOW)
    assert [(h.reader, h.segment, h.bytes) for h in p.held_back] == [("further", 6, 200)]
    # a session of the lost reader's name further on (a reconnect) holds what it holds
    p = plan(segs, [*readers, _reader("slow", 6)],
             RetentionPolicy(max_size=300, hard_cap=600), NOW)
    assert [(h.reader, h.segment, h.bytes) for h in p.held_back] == [("slow", 6, 200)]
    # Under the cap: the reader wins.
    p = plan(segs, readers, RetentionPolicy(max_size=300, hard_cap=2000), NOW)
    assert p.names == ["relay-bin.000001"] and not p.forced


def test_explicit_purge_stops_at_the_first_reader() -> None:
    segs = _segs(6)
    p = plan_explicit(segs, [_reader("r", 3)], to="relay-bin.000005")
    assert p.names == ["relay-bin.000001", "relay-bin.000002"]
    assert p.blocked_by is not None and p.blocked_by.name == "r"
    p = plan_explicit(segs, [], before=NOW - 3.5 * 3600)
    assert p.names == ["relay-bin.000001", "relay-bin.000002"] and p.blocked_by is None
    p = plan_explicit(segs, [], to="relay-bin.000006")
    assert len(p.names) == 5  # everything before the open one
    with pytest.raises(UnknownSegment):
        plan_explicit(segs, [], to="relay-bin.000099")


def _filled(d: str, transactions: int, *, sync: SyncMode = SyncMode.OFF) -> RelayLog:
    log = RelayLog(d, sync=SyncPolicy(sync), segment_size=1 << 14)
    log.open()
    log.start()
    write_transactions(log.appender(), range(1, transactions + 1), payload=b"x" * 400,
                       rotate=True)
    return log


async def test_purge_removes_files_index_and_serves_what_is_left(tmp_path: pathlib.Path) -> None:
    d = str(tmp_path)
    log = _filled(d, 300)
    await log.wait_beyond((log.current_number, 0), 5)
    names = list(log.segments.names)
    assert len(names) > 5
    keeper = Cursor(log, names[3], reader="replica 9")
    retention = Retention(log, RetentionPolicy(max_size=1, min_segments=2))
    done = await retention.check()
    assert done.names == names[:3]  # stopped by the reader in the fourth
    assert read_index(d, "relay-bin") == names[3:]
    for gone in names[:3]:
        assert not os.path.exists(os.path.join(d, gone))
        assert not os.path.exists(os.path.join(d, gone + ".gtidx"))
    assert [h.reader for h in retention.stats.held_back] == ["replica 9"]
    assert retention.stats.oldest_gtid  # the header state of the new oldest segment
    # A GTID from a purged segment is refused as a primary refuses it.
    with pytest.raises(PositionError, match="purged"):
        resolve_gtid(log, GtidState.parse("0-1-2"), log.state.copy())
    keeper.close()
    # With the reader gone, size retention takes everything but min_segments.
    done = await retention.check()
    assert len(log.segments) == 2
    log.close()
    # Recovery takes the purged log as it is.
    again = RelayLog(d, sync=SyncPolicy(SyncMode.OFF))
    again.open()
    assert again.segments.names == log.segments.names
    assert str(again.state) == "0-1-300"
    again.close()


async def test_the_hard_cap_tells_the_reader_it_lost(tmp_path: pathlib.Path) -> None:
    log = _filled(str(tmp_path), 300)
    await log.wait_beyond((log.current_number, 0), 5)
    names = list(log.segments.names)
    slow = Cursor(log, names[1], reader="slow replica")
    log.readers.hold("tap subscriber gone", (log.segments.number_of(names[0]), 4))
    retention = Retention(log, RetentionPolicy(max_size=1, min_segments=2, hard_cap=1))
    done = await retention.check()
    assert done.forced and len(log.segments) == 2
    assert {x.reader for x in retention.stats.losses} == {"slow replica",
                                                          "tap subscriber gone"}
    assert log.readers.held("tap subscriber gone") is None
    with pytest.raises(SegmentPurged, match="purged"):
        slow.read_chunk()
    slow.close()
    log.close()


async def test_explicit_purge_through_retention(tmp_path: pathlib.Path) -> None:
    log = _filled(str(tmp_path), 200)
    await log.wait_beyond((log.current_number, 0), 5)
    names = list(log.segments.names)
    retention = Retention(log, RetentionPolicy())
    reader = Cursor(log, names[2], reader="mysqlbinlog")
    done = await retention.purge(to=names[-1])
    assert done.names == names[:2] and done.blocked_by is not None
    assert done.blocked_by.name == "mysqlbinlog"
    reader.close()
    done = await retention.purge(to=names[-1])
    assert done.names == names[2:-1] and done.blocked_by is None
    assert log.segments.names == (names[-1],)
    log.close()


def test_recovery_removes_what_an_interrupted_purge_left(tmp_path: pathlib.Path) -> None:
    d = str(tmp_path)
    log = RelayLog(d, sync=SyncPolicy(SyncMode.OFF), segment_size=1 << 14)
    log.open()
    write_transactions(log.appender(), range(1, 200), payload=b"x" * 400, rotate=True)
    log.close()
    names = read_index(d, "relay-bin")
    # The index rewritten, the files not yet unlinked: a crash there.
    with open(os.path.join(d, "relay-bin.index"), "w") as f:
        f.writelines(f"./{n}\n" for n in names[2:])
    again = RelayLog(d, sync=SyncPolicy(SyncMode.OFF))
    again.open()
    assert list(again.segments.names) == names[2:]
    assert not os.path.exists(os.path.join(d, names[0]))
    assert not os.path.exists(os.path.join(d, names[1] + ".gtidx"))
    again.close()


async def test_reopen_after_a_full_disk_keeps_only_what_was_durable(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = str(tmp_path)
    log = _filled(d, 20, sync=SyncMode.TRANSACTION)
    await log.wait_beyond((log.current_number, 0), 5)
    while log.visible_state != log.state:
        await log.wait_beyond(log.visible, 5)
    durable = log.visible
    real_write = fileio.write
    budget = [3000]

    def full(fd: int, data: fileio.Buffer) -> int:
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, memoryview(data)[: budget[0]])
        budget[0] -= n
        return n

    monkeypatch.setattr(fileio, "write", full)
    w = log.appender()
    with pytest.raises(LogWriteError) as caught:
        for seq in range(21, 40):
            w.begin_group()
            for ev in transaction(Gtid(0, 1, seq), payload=b"x" * 400):
                w.append(ev, 0, len(ev))
            w.commit(Gtid(0, 1, seq))
            w.finish()
    assert caught.value.errno == errno.ENOSPC
    assert log.visible == durable  # nothing of the failed batch was shown
    monkeypatch.setattr(fileio, "write", real_write)
    await log.reopen()
    assert log.failure is None
    assert str(log.state) == "0-1-20" and log.visible == durable
    assert os.path.getsize(log.path_of(log.segments.last)) == durable[1]
    # It takes transactions again, after the last durable one.
    w = log.appender()
    w.begin_group()
    for ev in transaction(Gtid(0, 1, 21)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 21))
    w.finish()
    await log.wait_beyond(durable, 5)
    assert str(log.visible_state) == "0-1-21"
    log.close()


def test_fault_rules_parse_and_refuse_nonsense() -> None:
    faults = fileio.parse_faults("write:ENOSPC:after=10; fsync:EIO:after=2")
    assert faults["write"].code == errno.ENOSPC and faults["write"].after == 10
    assert faults["fsync"].code == errno.EIO
    assert faults["write"].spend(6) == 6 and faults["write"].spend(6) == 4
    assert faults["write"].spend(1) == 0
    with pytest.raises(ValueError, match="RELAY_FAULT"):
        fileio.parse_faults("write:NOPE:after=1")
    with pytest.raises(ValueError, match="RELAY_FAULT"):
        fileio.parse_faults("read:EIO:after=1")


async def test_a_segment_sealed_before_a_restart_keeps_its_size(tmp_path: pathlib.Path) -> None:
    """A log that stopped right after sealing a segment: once the next one starts, readers
    still see the sealed one whole (it was taken for purged before)."""
    d = str(tmp_path)
    log = _filled(d, 40)
    log.appender().seal()
    log.close()
    again = RelayLog(d, sync=SyncPolicy(SyncMode.OFF))
    again.open()
    again.start()
    sealed = again.segments.last
    size = os.path.getsize(again.path_of(sealed))
    w = again.appender()
    w.new_segment(fde())
    w.begin_group()
    for ev in transaction(Gtid(0, 1, 41)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 41))
    w.finish()
    await again.wait_beyond((again.current_number, 0), 5)
    assert again.visible_size(sealed) == size
    assert again.segments.sealed_at(sealed) is not None
    again.close()


def test_the_index_never_names_a_segment_whose_start_is_not_durable(
        tmp_path: pathlib.Path) -> None:
    """A purge's index write, run while a new segment's syncs are still queued, lists the
    segments up to the last one the worker made durable: after a power loss recovery never
    takes an unsynced segment for a sealed one."""
    segs = SegmentList(str(tmp_path), "relay-bin")
    for n in (1, 2, 3):
        (tmp_path / f"relay-bin.{n:06d}").write_bytes(b"\xfebin")
    segs.load(["relay-bin.000001", "relay-bin.000002", "relay-bin.000003"])
    segs.add("relay-bin.000004")  # created, its syncs and index write still queued
    segs.drop_oldest(["relay-bin.000001"])
    assert segs.index_names() == ["relay-bin.000002", "relay-bin.000003"]
    assert segs.index_names(4) == ["relay-bin.000002", "relay-bin.000003", "relay-bin.000004"]


async def test_compressed_segments_read_as_plain_ones(tmp_path: pathlib.Path) -> None:
    """compress_after: every reader gets the same bytes from a compressed segment (a
    cursor across segments, a start by GTID, SHOW BINLOG EVENTS' segment reader, the
    change stream over the directory), recovery verifies them, retention removes them."""
    d = str(tmp_path)
    log = _filled(d, 400)
    await log.wait_beyond((log.current_number, 0), 5)
    names = list(log.segments.names)
    plain = {n: pathlib.Path(log.path_of(n)).read_bytes() for n in names[:-1]}
    retention = Retention(log, RetentionPolicy(compress_after=2))
    squeezed = names[:-2]
    for _ in squeezed:  # one segment a check
        await retention.check()
    for n in squeezed:
        assert not os.path.exists(log.path_of(n)) and os.path.exists(log.path_of(n) + ".zst")
        assert log.segments.is_compressed(n) and log.visible_size(n) == len(plain[n])
    assert retention.stats.compressed_segments == len(squeezed)
    assert retention.stats.compressed_out < retention.stats.compressed_in
    assert log.size_bytes() < sum(len(b) for b in plain.values())
    # A cursor reads the same bytes across compressed and plain segments.
    cursor = Cursor(log, names[0], reader="test")
    by_segment: dict[str, bytearray] = {}
    while True:
        c = cursor.read_chunk(7777)
        if not c.data:
            break
        buf = by_segment.setdefault(c.segment, bytearray(b"\xfebin"))
        assert len(buf) == c.offset
        buf += c.data
    cursor.close()
    for n in names[:-1]:
        assert bytes(by_segment[n]) == plain[n], n
    # A start by GTID inside a compressed segment, and a segment reader's events.
    start = resolve_gtid(log, GtidState.parse("0-1-3"), log.state.copy())
    assert start.segment == names[0] and start.resume_offset > 4
    with SegmentReader(log, names[1], reader="SHOW BINLOG EVENTS") as seg:
        assert b"".join(e for _, e in seg.events()) == plain[names[1]][4:]
    log.close()
    # Recovery verifies them; `relay changes` over the directory reads every transaction.
    again = RelayLog(d, sync=SyncPolicy(SyncMode.OFF), verify_on_start=VerifyMode.ALL)
    again.open()
    assert again.segments.is_compressed(names[0]) and str(again.state) == "0-1-400"
    again.close()
    series = BinlogSeries(relay_log_files(d, "relay-bin"), always_scan=True)
    gtids = [e for e in series.events() if e.data[4] == 162]
    assert len(gtids) == 400
    # Retention removes a compressed segment with its index.
    again = RelayLog(d, sync=SyncPolicy(SyncMode.OFF))
    again.open()
    again.start()
    await Retention(again, RetentionPolicy(max_size=1)).check()
    assert not os.path.exists(again.path_of(names[0]) + ".zst")
    again.close()


def test_a_damaged_compressed_segment_is_reported_with_file_and_offset(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "relay-bin.000001"
    path.write_bytes(b"\xfebin" + os.urandom(3 << 20))
    segfile.compress(str(path), sync=False)
    stored = tmp_path / "relay-bin.000001.zst"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    f = segfile.open_segment(str(path))
    with pytest.raises(CorruptLog, match=r"relay-bin\.000001\.zst"):
        for offset in range(0, f.size, 1 << 20):
            f.pread(1 << 20, offset)
    f.close()


async def test_a_full_disk_at_fsync_drops_what_was_not_durable(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from fsync (delayed allocation, thin volumes): the batch it covered never
    becomes visible, the log's failure names the errno, and reopening drops those bytes,
    so the upstream sends them again and nothing is torn or doubled."""
    d = str(tmp_path)
    log = _filled(d, 10, sync=SyncMode.TRANSACTION)
    while log.visible_state != log.state:
        await log.wait_beyond(log.visible, 5)
    durable, durable_state = log.visible, str(log.visible_state)
    real_fsync = fileio.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "fsync", full)
    w = log.appender()
    for seq in range(11, 14):
        w.begin_group()
        for ev in transaction(Gtid(0, 1, seq)):
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    w.finish()
    while log.failure is None:
        await asyncio.sleep(0.01)
    assert log.failure.errno == errno.ENOSPC
    assert log.visible == durable and str(log.visible_state) == durable_state
    monkeypatch.setattr(fileio, "fsync", real_fsync)
    await log.reopen()
    assert str(log.state) == durable_state
    assert os.path.getsize(log.path_of(log.segments.last)) == durable[1]
    log.close()


def test_readers_before_the_log_keep_nothing_and_purge_spares_the_newest() -> None:
    segs = _segs(6)[2:]  # segments 3..6: 1 and 2 already purged
    stale = _reader("tap:gone", 1, ReaderKind.HOLD)
    assert len(plan(segs, [stale], RetentionPolicy(max_size=1, min_segments=1), NOW).names) == 3
    assert plan_explicit(segs, [stale], to="relay-bin.000006").blocked_by is None
    sealed_all = [SegmentFacts(s.name, s.number, s.size, NOW - 10) for s in segs]
    assert plan_explicit(sealed_all, [], before=NOW).names == [
        "relay-bin.000003", "relay-bin.000004", "relay-bin.000005"]


async def test_a_purge_whose_index_cannot_be_written_removes_nothing(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = str(tmp_path)
    log = _filled(d, 200)
    await log.wait_beyond((log.current_number, 0), 5)
    names = list(log.segments.names)

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("relay.relaylog.log.write_index", full)
    with pytest.raises(OSError):
        await log.remove_oldest(names[:2])
    assert list(log.segments.names) == names and log.failure is None
    assert log.visible_size(names[0]) == os.path.getsize(log.path_of(names[0]))
    assert os.path.exists(log.path_of(names[0]))
    log.close()


async def test_reopen_drops_a_segment_whose_start_was_not_durable(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while a rotation's syncs run: the new segment never became visible,
    so reopening removes it and cuts the sealed one back to its visible end."""
    d = str(tmp_path)
    log = _filled(d, 5, sync=SyncMode.TRANSACTION)
    while log.visible_state != log.state:
        await log.wait_beyond(log.visible, 5)
    durable = log.visible

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "fsync", full)
    w = log.appender()
    fde_event = w.fde
    assert fde_event is not None
    w.seal()
    w.new_segment(fde_event)
    while log.failure is None:
        await asyncio.sleep(0.01)
    assert log.visible == durable and len(log.segments) == 2
    monkeypatch.setattr(fileio, "fsync", os.fsync)
    await log.reopen()
    assert list(log.segments.names) == ["relay-bin.000001"]
    assert not os.path.exists(os.path.join(d, "relay-bin.000002"))
    assert read_index(d, "relay-bin") == ["relay-bin.000001"]
    assert os.path.getsize(log.path_of("relay-bin.000001")) == durable[1]
    assert str(log.state) == "0-1-5"
    log.close()
