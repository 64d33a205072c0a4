"""The relay log's write side and its readers: the ingest's hot loop against the public
appender, the sync policy's timing and failures, and the reader registry's floor."""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import struct
import threading
import time

import pytest

from relay.binlog import build
from relay.binlog.gtid import Gtid, GtidState
from relay.config import SyncMode, SyncPolicy
from relay.errors import LogWriteError
from relay.relaylog.cursor import Cursor, SegmentReader
from relay.relaylog.durability import Syncer, SyncTarget
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import read_index
from relay.relaylog.readers import ReaderKind, ReaderRegistry
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import StreamStart
from tests.helpers import fde, transaction


class _NoLink:
    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def fail(self, exc: Exception) -> None:
        raise exc

    def reply(self, payload: bytes) -> None: ...


def _primary_events(first: int, count: int, offset: int) -> list[bytes]:
    """Transactions as a primary placed them: log_pos from `offset` on (not the relay's)."""
    out = []
    pos = offset
    for seq in range(first, first + count):
        payload = bytes((seq % 251,)) * (40 + seq % 300)
        for ev in transaction(Gtid(0, 1, seq), payload=payload):
            ev = build.reframe(ev, True, log_pos=pos + len(ev))
            out.append(ev)
            pos += len(ev)
    return out


def _open(path: str, segment_size: int = 1 << 16) -> RelayLog:
    log = RelayLog(path, sync=SyncPolicy(SyncMode.OFF), segment_size=segment_size)
    log.open()
    log.start_from(GtidState.parse("0-1-0"))
    return log


def _segment_bytes(d: str) -> list[bytes]:
    out = []
    for name in read_index(d, "relay-bin"):
        with open(os.path.join(d, name), "rb") as f:
            out.append(f.read())
    return out


def test_append_and_the_ingest_hot_loop_write_the_same_bytes(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingest copies aligned runs and restamps the rest inline; append() does it per
    event: both must leave byte-identical segments, rotations included, when the
    primary's log_pos do not match the relay's offsets."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)  # synthesized headers' time
    events = _primary_events(1, 400, offset=12345)  # misaligned everywhere
    a_dir, b_dir = str(tmp_path / "append"), str(tmp_path / "ingest")

    a = _open(a_dir)
    w = a.appender()
    w.new_segment(fde())
    for i in range(0, len(events), 3):  # GTID, rows, XID
        w.begin_group()
        for ev in events[i : i + 3]:
            size, log_pos = struct.unpack_from("<II", ev, 9)
            w.append(ev, log_pos, size)
        w.commit(Gtid(0, 1, 1 + i // 3))
        w.rotate_if_full()
    w.finish()
    a.close()

    b = _open(b_dir)
    ingest = Ingest(b)
    ingest.on_stream(StreamStart(True, _NoLink()))
    rotate = build.rotate("mariadb-bin.000007", position=12345, server_id=1, log_pos=0,
                          artificial=True)
    ingest.feed([rotate, fde(), *events[:100]])
    ingest.feed(events[100:])  # a second batch, as the next read from the socket
    b.close()

    assert len(read_index(a_dir, "relay-bin")) > 1  # rotations were exercised
    assert _segment_bytes(a_dir) == _segment_bytes(b_dir)
    assert a.stats.events_rewritten == b.stats.events_rewritten == len(events)
    assert str(a.state) == str(b.state) == "0-1-400"


async def test_interval_policy_syncs_on_its_timer(tmp_path: pathlib.Path) -> None:
    fsyncs: list[float] = []
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.INTERVAL, 0.3), on_fsync=fsyncs.append)
    log.open()
    log.start()
    w = log.appender()
    w.new_segment(fde())
    assert await log.wait_beyond((0, 0), 5)

    def commit(seq: int) -> None:
        w.begin_group()
        for ev in transaction(Gtid(0, 1, seq)):
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
        w.finish()

    commit(1)  # no sync for a whole interval: this one goes at once
    assert await log.wait_beyond(log.visible, timeout=5)
    synced_at = time.monotonic()
    assert log.visible == (1, w.committed) and len(fsyncs) == 1
    before = log.visible
    commit(2)  # two batches inside the interval: the timer syncs both with one fsync
    commit(3)
    assert log.visible == before
    assert await log.wait_beyond(before, timeout=5)
    assert time.monotonic() - synced_at >= 0.25
    assert log.visible == (1, w.committed) and len(fsyncs) == 2
    assert str(log.visible_state) == "0-1-3"
    log.close()


async def test_a_failed_fsync_is_never_counted_durable(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.TRANSACTION))
    log.open()
    log.start()
    w = log.appender()
    w.new_segment(fde())
    assert await log.wait_beyond((0, 0), 5)
    visible = log.visible

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr("relay.relaylog.fileio.fsync", eio)
    w.begin_group()
    for ev in transaction(Gtid(0, 1, 1)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 1))
    w.finish()
    assert not await log.wait_beyond(visible, timeout=0.5)
    assert log.visible == visible and str(log.visible_state) == ""
    failure = log.failure
    assert failure is not None and failure.errno == errno.EIO
    assert log.segments.last in str(failure) and "fsync" in str(failure)
    with pytest.raises(LogWriteError):
        log.appender()  # the ingest takes no more
    monkeypatch.undo()
    log.close()


async def test_a_new_segment_shows_only_after_its_syncs(tmp_path: pathlib.Path) -> None:
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.TRANSACTION))
    log.open()
    log.start()
    log.appender().new_segment(fde())
    assert log.segments.names == ("relay-bin.000001",)
    assert log.visible == (0, 0)  # listed, not yet shown: the worker syncs it first
    # (The worker writes the index too, at a moment of its own: whether it has by now is a
    # race, not a property. What must hold: once the segment shows, the index names it.)
    assert await log.wait_beyond((0, 0), 5)
    assert read_index(str(tmp_path), "relay-bin") == ["relay-bin.000001"]
    log.close()


def test_registry_floor_counts_live_readers_and_recent_holds(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "relay-bin.holds")
    reg = ReaderRegistry(path, "epoch-1", hold_ttl=60)
    assert reg.floor() is None
    a = reg.register("dump of server_id 7", (3, 400))
    reg.register("tap range", (5, 4))
    assert reg.floor() == (3, 400)
    a.move((4, 100))
    assert reg.floor() == (4, 100)
    reg.hold("tap:orders", (2, 1000))
    assert reg.floor() == (2, 1000)
    assert reg.hold("tap:orders", (1, 4)) == (2, 1000)  # an ack never moves a hold back
    a.close()
    # Holds survive a restart; a hold not renewed within the ttl no longer counts.
    again = ReaderRegistry(path, "epoch-1", hold_ttl=60)
    assert [(r.name, r.kind, r.position) for r in again.snapshot()] == [
        ("tap:orders", ReaderKind.HOLD, (2, 1000))]
    assert again.floor(now=time.time() + 61) is None
    # Another log's holds mean nothing here.
    assert ReaderRegistry(path, "epoch-2").floor() is None


async def test_cursors_and_segment_readers_register_while_open(tmp_path: pathlib.Path) -> None:
    log = _open(str(tmp_path))
    log.start()
    w = log.appender()
    w.new_segment(fde())
    for seq in range(1, 4):
        w.begin_group()
        for ev in transaction(Gtid(0, 1, seq)):
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    w.finish()
    await asyncio.sleep(0.1)
    name = log.segments.last
    with Cursor(log, name, reader="dump of server_id 9") as cursor:
        assert [r.name for r in log.readers.snapshot()] == ["dump of server_id 9"]
        events = await cursor.read(timeout=1)
        assert events and log.readers.floor() == (1, events[-1].offset + len(events[-1].data))
        with SegmentReader(log, name, reader="listing") as seg:
            assert [d for _, d in seg.events()] == [e.data for e in events]
            assert {r.name for r in log.readers.snapshot()} == {"dump of server_id 9",
                                                                  "listing"}
    assert log.readers.snapshot() == []
    log.close()


async def test_nothing_after_a_failed_job_becomes_durable(tmp_path: pathlib.Path) -> None:
    """A rotation's syncs fail on the worker while the next batch's fsync waits behind
    them: that fsync succeeds, and still nothing past the failure is published."""
    durable: list[tuple[int, int]] = []
    failures: list[LogWriteError] = []
    syncer = Syncer(SyncPolicy(SyncMode.TRANSACTION), durable.append, failures.append)
    fd = os.open(str(tmp_path / "new"), os.O_CREAT | os.O_WRONLY)
    release = threading.Event()

    def rotation_syncs() -> None:
        release.wait(5)
        raise OSError(errno.EIO, "Input/output error")

    failed = syncer.submit(rotation_syncs, what="starting a segment", path="old")
    syncer.request(SyncTarget(fd, "new", (2, 500)))  # the rest of the batch, new segment
    release.set()
    with pytest.raises(OSError):
        await failed
    await syncer.submit(lambda: None, what="a marker", path="")  # the fsync's report is in
    assert syncer.failed and [f.errno for f in failures] == [errno.EIO]
    assert durable == []
    syncer.close()
    os.close(fd)


def test_a_failure_the_loop_has_not_heard_of_fails_the_close(tmp_path: pathlib.Path) -> None:
    """Shutdown right after a worker job failed: close() reports it (the appender then
    skips its own final sync) instead of closing clean."""
    failures: list[LogWriteError] = []

    async def fail_then_close() -> None:
        syncer = Syncer(SyncPolicy(SyncMode.TRANSACTION), lambda _: None, failures.append)

        def eio() -> None:
            raise OSError(errno.EIO, "Input/output error")

        syncer.submit(eio, what="fsync", path=str(tmp_path / "seg"))
        syncer.close()  # before the loop ran the job's callback
        assert syncer.failed

    asyncio.run(fail_then_close())
    assert [f.errno for f in failures] == [errno.EIO]


def test_the_last_commit_stays_where_the_transaction_ended_across_a_rotation(
        tmp_path: pathlib.Path) -> None:
    # A semi-sync acknowledgement waits for the transaction's own end, not for the next
    # segment's header the rotation right after it opened.
    log = _open(str(tmp_path), segment_size=1)
    w = log.appender()
    w.new_segment(fde())
    w.begin_group()
    for ev in transaction(Gtid(0, 1, 1)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 1))
    ended = (w.number, w.committed)
    w.rotate_if_full()
    assert w.number == ended[0] + 1 and w.last_commit == ended
    log.close()
