import asyncio
import contextlib
import os
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from relay.binlog.constants import HEADER_LEN, EventType
from relay.binlog.events import Event, decode_rotate
from relay.binlog.file import iter_events
from relay.binlog.gtid import Gtid
from relay.config import SyncMode, SyncPolicy
from relay.errors import CorruptLog
from relay.relaylog import gtid_index
from relay.relaylog.cursor import Cursor
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import read_index
from tests.helpers import fde, read_file_events, transaction

T = TypeVar("T")


def _append_tx(log: RelayLog, g: Gtid, payload: bytes = b"x" * 40) -> None:
    log.appender().begin_group()
    for ev in transaction(g, checksum=log.checksum, payload=payload):
        log.appender().append(ev, 0, len(ev))
    log.appender().commit(g)


def _fill_rotating(d: str, transactions: int) -> list[str]:
    """A closed log of 64 KiB segments holding 0-1-1 .. 0-1-<transactions>; its segments."""
    log = _open(d, segment_size=1 << 16)
    log.appender().new_segment(fde())
    for seq in range(1, transactions + 1):
        _append_tx(log, Gtid(0, 1, seq))
        log.appender().rotate_if_full()
    log.appender().finish()
    log.close()
    return read_index(d, "relay-bin")


def _open(path: str, **kw: Any) -> RelayLog:
    log = RelayLog(path, sync=SyncPolicy(SyncMode.OFF), **kw)
    log.open()
    return log


def test_write_reopen_state_and_index(tmp_path: object) -> None:
    d = str(tmp_path)
    log = _open(d)
    log.appender().new_segment(fde())
    for seq in range(1, 6):
        _append_tx(log, Gtid(0, 1, seq))
    log.appender().finish()
    assert log.visible == (1, log.appender().committed)
    log.close()
    again = _open(d)
    assert str(again.state) == "0-1-5"
    entries = list(gtid_index.read_entries(again.path_of(again.segments.last)))
    assert [str(e.txn) for e in entries] == [f"0-1-{seq}" for seq in range(1, 6)]
    # The index finds a transaction's bytes without reading events: its GTID is there.
    found = gtid_index.find(again.path_of(again.segments.last), Gtid(0, 1, 3))
    assert found is not None and found.end - found.start == sum(
        len(ev) for ev in transaction(Gtid(0, 1, 3)))
    with open(again.path_of(again.segments.last), "rb") as f:
        f.seek(found.start)
        head = f.read(31)
    assert head[4] == EventType.GTID and int.from_bytes(head[19:27], "little") == 3
    assert gtid_index.find(again.path_of(again.segments.last), Gtid(0, 1, 99)) is None
    events = read_file_events(again.path_of(again.segments.last))
    # every event's log_pos is the relay's own end offset
    for raw in events:
        assert raw.log_pos == raw.offset + len(raw.data)
    assert events[0].type_code == EventType.FORMAT_DESCRIPTION
    assert events[1].type_code == EventType.GTID_LIST
    again.close()


def test_torn_transaction_is_truncated(tmp_path: object) -> None:
    d = str(tmp_path)
    log = _open(d)
    log.appender().new_segment(fde())
    _append_tx(log, Gtid(0, 1, 1))
    committed = log.appender().committed
    log.appender().begin_group()
    for ev in transaction(Gtid(0, 1, 2))[:2]:  # no XID: the process dies here
        log.appender().append(ev, 0, len(ev))
    log.appender().finish()
    path = log.path_of(log.segments.last)
    # kill -9: nothing else runs (the log is left open, unsynced)
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # and half an event header
    again = _open(d)
    assert os.path.getsize(path) == committed
    assert str(again.state) == "0-1-1"
    again.close()


def test_corrupt_committed_byte_names_file_and_offset(tmp_path: object) -> None:
    d = str(tmp_path)
    log = _open(d)
    log.appender().new_segment(fde())
    for seq in range(1, 4):
        _append_tx(log, Gtid(0, 1, seq))
    log.appender().finish()
    log.close()
    path = os.path.join(d, "relay-bin.000001")
    events = read_file_events(path)
    target = events[4]  # inside the first transaction
    with open(path, "r+b") as f:
        f.seek(target.offset + 25)
        byte = f.read(1)
        f.seek(target.offset + 25)
        f.write(bytes((byte[0] ^ 0x55,)))
    with pytest.raises(CorruptLog) as info:
        _open(d)
    assert info.value.path == path and info.value.offset == target.offset
    assert f"at offset {target.offset}" in str(info.value)


def test_corruption_in_older_segment_is_found(tmp_path: object) -> None:
    d = str(tmp_path)
    names = _fill_rotating(d, 799)
    assert len(names) >= 2
    first = os.path.join(d, names[0])
    with open(first, "r+b") as f:
        f.seek(2000)
        b = f.read(1)
        f.seek(2000)
        f.write(bytes((b[0] ^ 1,)))
    with pytest.raises(CorruptLog) as info:
        _open(d)
    assert info.value.path == first
    # with verification limited to the last segment, start-up proceeds
    _open(d, verify_on_start="last").close()


def test_rotation_by_size_seals_and_links(tmp_path: object) -> None:
    d = str(tmp_path)
    names = _fill_rotating(d, 999)
    assert len(names) >= 3
    seqs = []
    for i, name in enumerate(names):
        events = read_file_events(os.path.join(d, name))
        if i < len(names) - 1:
            last = events[-1]
            assert last.type_code == EventType.ROTATE
            assert decode_rotate(Event(last.data, True)).next_file == names[i + 1]
        seqs += [struct.unpack_from("<Q", e.data, 19)[0] for e in events
                 if e.type_code == EventType.GTID]
    assert seqs == list(range(1, 1000))
    assert str(_open(d).state) == "0-1-999"


def test_checksum_off_stream(tmp_path: object) -> None:
    d = str(tmp_path)
    log = _open(d)
    log.appender().new_segment(fde(checksum=False))
    assert not log.checksum
    _append_tx(log, Gtid(0, 1, 1))
    log.appender().finish()
    log.close()
    with open(os.path.join(d, "relay-bin.000001"), "rb") as f:
        events = list(iter_events(f.read()))
    assert [e.type_code for e in events][-3:] == [EventType.GTID, EventType.WRITE_ROWS_V1,
                                                  EventType.XID]
    assert str(_open(d).state) == "0-1-1"


async def test_cursor_tails_across_segments(tmp_path: object) -> None:
    d = str(tmp_path)
    log = RelayLog(d, sync=SyncPolicy(SyncMode.TRANSACTION), segment_size=1 << 14)
    log.open()
    log.start()
    log.appender().new_segment(fde())
    cursor = Cursor(log, log.segments[0])
    seen: list[int] = []

    async def reader() -> None:
        while len(seen) < 300:
            for ev in await cursor.read(timeout=5):
                if ev.data[4] == EventType.GTID:
                    seen.append(struct.unpack_from("<Q", ev.data, 19)[0])

    task = asyncio.create_task(reader())
    for seq in range(1, 301):
        _append_tx(log, Gtid(0, 1, seq))
        if seq % 7 == 0:  # a transaction split over two flushes stays invisible until done
            log.appender().begin_group()
            log.appender().finish()
        log.appender().rotate_if_full()
        log.appender().finish()
        if seq % 50 == 0:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(task, 10)
    assert seen == list(range(1, 301))
    assert len(log.segments) > 2
    cursor.close()
    log.close()


async def test_uncommitted_bytes_are_invisible(tmp_path: object) -> None:
    d = str(tmp_path)
    log = RelayLog(d, sync=SyncPolicy(SyncMode.OFF))
    log.open()
    log.start()
    log.appender().new_segment(fde())
    assert await log.wait_beyond((0, 0), 5)  # a new segment shows once its header is synced
    start = log.visible
    log.appender().begin_group()
    ev = transaction(Gtid(0, 1, 1))
    log.appender().append(ev[0], 0, len(ev[0]))
    log.appender().finish()
    assert log.visible == start
    cursor = Cursor(log, log.segments[0], start[1])
    assert cursor.read_available() == []
    log.appender().append(ev[1], 0, len(ev[1]))
    log.appender().append(ev[2], 0, len(ev[2]))
    log.appender().commit(Gtid(0, 1, 1))
    log.appender().finish()
    assert [e.data[4] for e in cursor.read_available()] == [162, 23, 16]
    cursor.close()
    log.close()


async def test_transaction_sync_publishes_after_fsync(tmp_path: object) -> None:
    fsyncs: list[float] = []
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.TRANSACTION), on_fsync=fsyncs.append)
    log.open()
    log.start()
    log.appender().new_segment(fde())
    assert await log.wait_beyond((0, 0), 5)  # the segment's own syncs done
    before = log.visible
    _append_tx(log, Gtid(0, 1, 1))
    log.appender().finish()
    assert log.visible == before  # not yet durable
    assert await log.wait_beyond(before, timeout=5)
    assert log.visible == (1, log.appender().committed) and fsyncs
    log.close()


def test_sync_policy_parse() -> None:
    assert SyncPolicy.parse("interval:100ms") == SyncPolicy(SyncMode.INTERVAL, 0.1)
    assert SyncPolicy.parse("interval:2s") == SyncPolicy(SyncMode.INTERVAL, 2.0)
    with pytest.raises(ValueError, match="transaction"):
        SyncPolicy.parse("sometimes")


async def test_a_peek_takes_cached_bytes_on_the_loop_and_the_same_bytes_as_a_thread(
        tmp_path: object) -> None:
    """Bytes just written are in the page cache: the non-blocking peek returns them (no
    reader thread), identical to the blocking read; past the visible end it returns
    None, and the async peek then moves to the next segment through a thread."""
    d = str(tmp_path)
    log = RelayLog(d, sync=SyncPolicy(SyncMode.TRANSACTION), segment_size=1 << 12)
    log.open()
    log.start()
    log.appender().new_segment(fde())
    for seq in range(1, 90):
        _append_tx(log, Gtid(0, 1, seq))
        log.appender().rotate_if_full()
        log.appender().finish()
    assert len(log.segments) > 2
    assert await log.wait_beyond((log.segments.number_of(log.segments.last), 0), 5)
    with Cursor(log, log.segments[0]) as cursor:
        cached = cursor.peek_cached(1 << 20)
        assert cached is not None and cached == cursor.peek_chunk(1 << 20)
        assert cached.data[4] == EventType.FORMAT_DESCRIPTION
        cursor.advance(len(cached.data))  # the first segment, whole (its ROTATE included)
        assert cursor.peek_cached() is None  # the next segment needs opening
        nxt = await cursor.peek_chunk_async()
        assert nxt.segment == log.segments[1] and nxt.offset == 4 and nxt.data
    log.close()


async def test_a_cursor_at_the_visible_end_learns_it_without_a_thread(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dump asks once more after each chunk it sent: at the visible end of the segment
    being written the answer (nothing new) comes on the loop, not from a reader thread;
    bytes the page cache holds are read on the loop too, whole events only and the same
    as a thread's read; moving on to a next segment (a file to open) takes a thread."""
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))  # visible at once
    log.open()
    log.start()
    log.appender().new_segment(fde())
    _append_tx(log, Gtid(0, 1, 1))
    log.appender().finish()
    assert log.visible[1] == log.appender().end
    hops: list[object] = []
    real_read = log.read

    async def counted(fn: Callable[[], T]) -> T:
        hops.append(fn)
        return await real_read(fn)
    monkeypatch.setattr(log, "read", counted)
    with Cursor(log, log.segments[0]) as cursor, Cursor(log, log.segments[0]) as twin:
        cached = cursor.peek_cached() is not None  # (a kernel without RWF_NOWAIT: None)
        first = await cursor.read_chunk_async()
        assert first.data and first == twin.read_chunk()
        assert len(hops) == (0 if cached else 1)
        for ask in (cursor.read_chunk_async, cursor.peek_chunk_async):
            empty = await ask()
            assert empty.data == b"" and empty.offset == first.offset + len(first.data)
        assert len(hops) == (0 if cached else 1)  # "nothing new" took no thread
        _append_tx(log, Gtid(0, 1, 2))
        log.appender().finish()
        assert await cursor.wait(5)
        # A chunk smaller than the next event: the event whole, read by a thread
        one = await cursor.read_chunk_async(HEADER_LEN)
        assert one == twin.read_chunk(HEADER_LEN) and one.data[4] == EventType.GTID
        grown = await cursor.read_chunk_async()
        assert grown.data and grown == twin.read_chunk()
        assert len(hops) == (1 if cached else 3)
        log.appender().seal()
        log.appender().new_segment(fde())
        _append_tx(log, Gtid(0, 1, 3))
        log.appender().finish()
        assert await cursor.wait(5)
        rotate = await cursor.read_chunk_async()
        assert rotate == twin.read_chunk() and rotate.data[4] == EventType.ROTATE
        assert len(hops) == (1 if cached else 4)
        nxt = await cursor.read_chunk_async()
        assert nxt.segment == log.segments[1] and nxt.offset == 4 and nxt == twin.read_chunk()
        assert len(hops) == (2 if cached else 5)  # the next segment's file: a thread
    log.close()


async def test_waiters_wake_at_a_move_and_leave_nothing_behind() -> None:
    """Every follower waits once a transaction: one publish wakes them all; a wait that
    times out answers False and one that is cancelled (a client gone) is forgotten, so an
    idle log with heartbeats keeps no expired waiter."""
    from relay.relaylog.visibility import Visibility

    v = Visibility()
    for _ in range(3):
        assert not await v.wait_beyond((0, 0), 0.01)
    assert v.waiting == 0
    gone = asyncio.create_task(v.wait_beyond((0, 0)))
    await asyncio.sleep(0)
    assert v.waiting == 1
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    assert v.waiting == 0
    waiting = [asyncio.create_task(v.wait_beyond((0, 0), 5)) for _ in range(3)]
    later = asyncio.create_task(v.wait_beyond((1, 50), 5))  # past this move: still waits
    await asyncio.sleep(0)
    v.publish((1, 10))
    assert await asyncio.gather(*waiting) == [True, True, True]
    await asyncio.sleep(0)
    assert not later.done() and v.waiting == 1
    assert await v.wait_beyond((1, 5), 0)  # already past: at once, even with no time
    v.publish((1, 60))
    assert await later and v.waiting == 0


async def test_each_wait_times_out_at_its_own_deadline_under_one_timer() -> None:
    """The waits' deadlines share one timer at the earliest: a wait that comes later with
    an earlier deadline still ends at its own, a later one is not ended early, and the
    timer moves on to the next deadline after each."""
    from relay.relaylog.visibility import Visibility

    v = Visibility()
    loop = asyncio.get_running_loop()
    ended: dict[str, tuple[bool, float]] = {}

    async def wait(name: str, timeout: float) -> None:
        start = loop.time()
        got = await v.wait_beyond((0, 0), timeout)
        ended[name] = (got, loop.time() - start)

    long = asyncio.create_task(wait("long", 30.0))
    await asyncio.sleep(0)
    mid = asyncio.create_task(wait("mid", 0.2))
    short = asyncio.create_task(wait("short", 0.05))
    await asyncio.gather(short, mid)
    assert not ended["short"][0] and not ended["mid"][0]
    assert 0.05 - 0.002 <= ended["short"][1] < ended["mid"][1]
    assert ended["mid"][1] >= 0.2 - 0.002
    assert not long.done() and v.waiting == 1
    v.publish((1, 10))
    await long
    assert ended["long"][0] and v.waiting == 0


def test_a_wait_in_a_later_event_loop_times_out() -> None:
    """A timer armed in a loop that closed before it fired does not stand for the next
    loop's deadlines."""
    from relay.relaylog.visibility import Visibility

    v = Visibility()

    async def abandoned() -> None:
        task = asyncio.create_task(v.wait_beyond((0, 0), 0.05))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def later() -> bool:
        async with asyncio.timeout(5):
            return await v.wait_beyond((0, 0), 0.2)

    asyncio.run(abandoned())
    assert asyncio.run(later()) is False


def test_a_wait_without_a_timeout_in_a_later_event_loop_arms_no_timer() -> None:
    from relay.relaylog.visibility import Visibility

    v = Visibility()

    async def wait_then_move(to: tuple[int, int]) -> bool:
        task = asyncio.create_task(v.wait_beyond(v.visible))
        await asyncio.sleep(0)
        assert v.waiting == 1
        v.publish(to)
        return await task

    assert asyncio.run(wait_then_move((0, 10))) is True
    assert asyncio.run(wait_then_move((0, 20))) is True


async def test_a_pusher_is_called_at_each_move_instead_of_waking_its_wait() -> None:
    """A wait with `push` goes on while the pusher answers True; it ends (True) when the
    pusher answers False or fails, and the other waiters are woken either way."""
    from relay.relaylog.visibility import Visibility

    v = Visibility()
    calls: list[str] = []
    answers = {"keeps": [True, True, False], "fails": []}

    def pusher(name: str) -> Callable[[], bool]:
        def push() -> bool:
            calls.append(name)
            if not answers[name]:
                raise RuntimeError("a pusher's bug")
            return answers[name].pop(0)
        return push

    keeps = asyncio.create_task(v.wait_beyond((0, 0), 30, pusher("keeps")))
    fails = asyncio.create_task(v.wait_beyond((0, 0), 30, pusher("fails")))
    plain = asyncio.create_task(v.wait_beyond((0, 0), 30))
    await asyncio.sleep(0)
    v.publish((0, 10))
    assert await fails and await plain  # (the failing pusher: woken, not lost)
    assert not keeps.done() and v.waiting == 1
    v.publish((0, 20))
    await asyncio.sleep(0)
    assert not keeps.done() and v.waiting == 1
    v.publish((0, 30))  # the third answer: False
    assert await keeps and v.waiting == 0
    assert calls == ["keeps", "fails", "keeps", "keeps"]
    v.publish((0, 40))  # a finished wait's pusher is not called again
    assert calls == ["keeps", "fails", "keeps", "keeps"]
