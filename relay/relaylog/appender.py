"""The write side of the relay log: the one object that appends to the open segment.

The one writer (the ingest) takes it from `RelayLog.appender()` for each received batch
and ends the batch with `finish()`: the batch's bytes go to the OS in one write and the
sync policy is asked once to make its last commit durable. Inside a batch the ingest's
hot loop appends to `buf` and moves `end` itself (an event the upstream already placed at
our offset is copied as it is, others through `build.reframe`, as `append` does); commits,
segment starts, sealing and rotation go through the methods.

Bytes are appended as they arrive (a transaction is never held whole in memory); readers
see only up to the visible end (relaylog/visibility.py). A new segment's syncs (the old
segment, the new one, the index file, the directory) run on the log's worker, and the new
segment becomes visible once they are done.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from relay.binlog import build
from relay.binlog.constants import FL_STANDALONE
from relay.binlog.events import decode_fde
from relay.binlog.gtid import Gtid, GtidPosition, TxnId
from relay.binlog.position import LogPosition
from relay.errors import LogWriteError, SegmentOrder
from relay.kernels.protocol import PlanStep
from relay.relaylog import fileio, gtid_index
from relay.relaylog.durability import Syncer, SyncTarget
from relay.relaylog.naming import segment_number, write_index
from relay.relaylog.segments import SegmentList
from relay.relaylog.visibility import Visibility

log = logging.getLogger("relay.relaylog")

_POS = struct.Struct("<II")  # event_size, log_pos at offset 9
_MARIADB_RECORD = gtid_index.MARIADB_RECORD.pack
_BEGIN, _COMMIT = int(PlanStep.BEGIN), int(PlanStep.COMMIT)


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying a scan plan left for the ingest's transaction tracker."""

    run: int                              # data[run:] is the caller's to append still
    opened: tuple[TxnId, bool] | None     # a transaction it opened and left open (GTID,
    #                                       standalone)
    ended: bool                           # a COMMIT in it: what was open before is closed
    last_ts: int                          # the header timestamp of its last BEGIN (0: none)


@dataclass
class LogStats:
    """Counters the metrics layer reads; kept as plain numbers here."""

    bytes_written: int = 0
    events_written: int = 0
    events_rewritten: int = 0
    transactions: int = 0
    rotations: int = 0
    discarded_transactions: int = 0  # unfinished when their upstream connection ended
    discarded_bytes: int = 0


@dataclass(frozen=True)
class OpenSegment:
    """Where recovery left the last segment."""

    fde: bytes | None
    end: int
    sealed: bool


class Appender:
    def __init__(self, segments: SegmentList, visibility: Visibility, *, segment_size: int,
                 sync: bool, state: GtidPosition) -> None:
        self.segments = segments
        self.visibility = visibility
        self.segment_size = segment_size
        self.sync = sync
        self._state = state             # at the last commit applied (see `state`)
        self.stats = LogStats()
        self.buf = bytearray()          # appended, not yet handed to the OS
        self.end = 0                    # offset the appended bytes reach
        self.group_start = 0            # where the open transaction began
        self.committed = 0              # end of the last complete transaction
        self.last_commit: LogPosition = (0, 0)  # (segment, end) of the last transaction
        self.fde: bytes | None = None
        self.checksum = False
        self.sealed = False
        self.needs_segment = True       # no open segment: the next transaction starts one
        # The open segment is the upstream file's prefix: its header mirrored and every
        # event since at the offset the upstream gave it (never true after a restart: not
        # known). An event of that file that comes late (a header event after the segment
        # opened) then goes where the upstream has it.
        self.aligned = False
        self.failure: LogWriteError | None = None
        self.syncer: Syncer | None = None
        self._written = 0               # bytes of the current segment handed to the OS
        self._commits: list[TxnId] = []  # committed since the last write out
        self._applied = 0               # of them, in `_state` already
        self._thread = threading.get_ident()  # the writer's (see `state`)
        self._ibuf = bytearray()
        self._index_started = False
        self._fd = -1
        self._ifd = -1
        self._path = ""
        self._number = 0

    # --- lifecycle ------------------------------------------------------------------------

    def resume(self, recovered: OpenSegment) -> None:
        """Continue the last segment recovery left (blocking: at open)."""
        if not self.segments:
            return
        self.fde = recovered.fde
        self.checksum = decode_fde(recovered.fde).has_crc if recovered.fde else False
        self.sealed = recovered.sealed
        self.needs_segment = recovered.sealed
        self.end = self.committed = self._written = recovered.end
        self._path = self.segments.path_of(self.segments.last)
        self._number = self.segments.current_number
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        index = gtid_index.index_file(self._path)
        self._index_started = os.path.exists(index) and os.path.getsize(index) > 0
        self._ifd = os.open(index, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def close(self) -> None:
        """Hand what is buffered to the OS, sync and close (blocking: at shutdown)."""
        if self.failure is None:
            self._write_out()
        for fd in (self._fd, self._ifd):
            if fd >= 0:
                if self.sync and self.failure is None:
                    fileio.fsync(fd)
                os.close(fd)
        self._fd = self._ifd = -1

    def discard(self) -> None:
        """Close the files and drop what was not handed to the OS (blocking: after a
        failure, when the log is re-opened from what is durable)."""
        self.buf.clear()
        self._ibuf.clear()
        self._commits = []
        self._applied = 0
        for fd in (self._fd, self._ifd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._ifd = -1

    # --- state ------------------------------------------------------------------------------

    @property
    def number(self) -> int:
        """The open segment's number."""
        return self._number

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    # --- appending --------------------------------------------------------------------------

    def append(self, ev: bytes | bytearray | memoryview, log_pos: int, size: int) -> None:
        """Append one event of a transaction at our offset (log_pos and CRC rewritten when
        the upstream placed it elsewhere)."""
        end = self.end + size
        if log_pos == end:
            self.buf += ev
        else:
            self.buf += build.reframe(ev, self.checksum, log_pos=end)
            self.stats.events_rewritten += 1
            self.aligned = False
        self.end = end

    def apply(self, data: memoryview, run: int, plan: Sequence[tuple[int, ...]],
              txn: TxnId | None, end: int) -> Applied:
        """Apply the ingest's scan plan over `data` (relay/kernels `scan_ingest`: BEGIN of
        a MariaDB GTID, REWRITE of an event not at its place, COMMIT after an XID), the
        appended bytes reaching `end` after it. `data[run:]` is appended but not yet in
        the buffer: it is copied up to each rewritten event, which follows rewritten; what
        follows the last one stays the caller's (the returned `run`), so a batch's last
        run can still be written from the batch. `txn` is the transaction open before the
        plan (one a COMMIT may close)."""
        buf = self.buf
        new_gtid = tuple.__new__  # a Gtid per transaction, without the NamedTuple call
        opened: tuple[TxnId, bool] | None = None
        ended = False
        last_ts = 0
        rewritten = 0
        for step in plan:
            op = step[0]
            if op == _BEGIN:
                _, _, domain, server_id, seq_no, flags2, self.group_start, last_ts = step
                txn = new_gtid(Gtid, (domain, server_id, seq_no))
                opened = (txn, (flags2 & FL_STANDALONE) != 0)
            elif op == _COMMIT:
                self.end = step[2]
                self.commit(txn)
                ended = True
                opened = None
            else:  # REWRITE
                _, at, stop, log_pos = step
                buf += data[run:at]
                buf += build.reframe(data[at:stop], self.checksum, log_pos=log_pos)
                run = stop
                rewritten += 1
        if rewritten:
            self.aligned = False
            self.stats.events_rewritten += rewritten
        self.end = end
        return Applied(run, opened, ended, last_ts)

    def take(self, data: bytes | bytearray | memoryview) -> None:
        """Copy events the caller already placed at our offsets into the buffer (the
        caller moves `end` past them)."""
        self.buf += data

    def take_rewritten(self, ev: bytes | bytearray | memoryview, log_pos: int) -> None:
        """Copy one event the upstream placed elsewhere, its log_pos (and CRC) made ours."""
        self.buf += build.reframe(ev, self.checksum, log_pos=log_pos)
        self.aligned = False
        self.stats.events_rewritten += 1

    def append_standalone(self, ev: bytes | bytearray | memoryview, log_pos: int) -> None:
        """Append an event that belongs to no transaction (a Binlog_checkpoint between
        transactions): committed at once, with no GTID index record."""
        self.append(ev, log_pos, len(ev))
        self.committed = self.end

    def begin_group(self) -> None:
        self.group_start = self.end

    @property
    def state(self) -> GtidPosition:
        """The position at the last commit (the writer's view). Commits reach it when it
        is read and once per batch, not one call per transaction. The writer's thread
        only (the event loop's): another thread takes a copy made there."""
        if threading.get_ident() != self._thread:
            raise RuntimeError("the relay log's writer state is read on the writer's thread "
                               "only; pass a copy to other threads")
        if self._applied < len(self._commits):
            self._state.update_all(self._commits[self._applied :])
            self._applied = len(self._commits)
        return self._state

    @state.setter
    def state(self, state: GtidPosition) -> None:
        self._state = state
        self._applied = len(self._commits)

    def commit(self, txn: TxnId | None) -> None:
        """The events appended since `begin_group` form one complete transaction, ending
        at `end`."""
        end = self.end
        if txn is not None:
            self._commits.append(txn)
            if not self._index_started:
                self._ibuf += gtid_index.file_header(txn)
                self._index_started = True
            if type(txn) is Gtid:  # the common record, packed here: one call a transaction
                self._ibuf += _MARIADB_RECORD(txn[0], txn[1], txn[2], self.group_start, end)
            else:
                self._ibuf += gtid_index.pack(txn, self.group_start, end)
        self.committed = end
        self.last_commit = (self._number, end)  # stays put across the rotation after it
        self.stats.transactions += 1

    async def abort_group(self) -> None:
        """Forget the appended part of an unfinished transaction (the upstream went away)."""
        if self.end == self.committed:
            return
        dropped = self.end - self.committed
        keep = self.committed - self._written
        if keep >= 0:
            del self.buf[keep:]
        else:
            self.buf.clear()
            fd, committed = self._fd, self.committed
            if self.syncer is None:
                os.ftruncate(fd, committed)
            else:
                await self.syncer.submit(lambda: os.ftruncate(fd, committed),
                                         what="truncating an unfinished transaction",
                                         path=self._path)
            self._written = committed
        log.info("discarded %d bytes of an unfinished transaction", dropped)
        self.stats.discarded_transactions += 1
        self.stats.discarded_bytes += dropped
        self.end = self.committed

    def finish(self) -> None:
        """The end of a batch: hand its bytes to the OS and let the sync policy publish
        the committed end."""
        if not self.segments:
            return
        self._write_out()
        target = (self._number, self.committed)
        if target > self.visibility.visible:
            if self.syncer is None:
                self.visibility.publish(target)
            else:
                self.syncer.request(SyncTarget(self._fd, self._path, target))

    def _write_out(self) -> None:
        self.check()
        if self._commits:  # they show once what ends at `committed` is durable
            _ = self.state  # the writer's view takes them first
            self.visibility.note_commits((self._number, self.committed), self._commits)
            self._commits = []
            self._applied = 0
        if self.buf:
            self._write_all(self._fd, self.buf, self._path)
            self._written += len(self.buf)
            self.stats.bytes_written += len(self.buf)
            self.buf.clear()
        if self._ibuf:
            self._write_all(self._ifd, self._ibuf, gtid_index.index_file(self._path))
            self._ibuf.clear()

    def write_through(self, data: memoryview) -> None:
        """Append `data` by writing it from the caller's buffer, not copying it into
        `buf` first (the ingest's aligned batches: one copy fewer per byte). Only with
        nothing in `buf`, so the file keeps its order."""
        if self.buf:
            self.buf += data
            return
        self.check()
        self._write_all(self._fd, data, self._path)
        self._written += len(data)
        self.stats.bytes_written += len(data)

    def _write_all(self, fd: int, data: bytearray | memoryview, path: str) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[fileio.write(fd, view):]
        except OSError as exc:
            self.failure = LogWriteError(path, exc.errno, f"write failed: {exc.strerror} "
                                                          f"(errno {exc.errno})")
            raise self.failure from exc
        finally:
            view.release()

    # --- segments -----------------------------------------------------------------------------

    def seal(self, timestamp: int = 0, *, next_name: str | None = None,
             closing: bytes | None = None) -> None:
        """End the current segment with a ROTATE naming the next one (`next_name`: the
        name the next segment will be given, when segments keep a source's names), or
        with `closing`, the source file's own last event (its ROTATE or STOP) when the
        segment is that file."""
        if not self.segments or self.sealed:
            return
        assert self.fde is not None
        server_id = struct.unpack_from("<I", self.fde, 5)[0]
        rot = closing if closing is not None else build.rotate(
            next_name or self.segments.next_name(), server_id=server_id, timestamp=timestamp,
            log_pos=0, checksum=self.checksum)
        self.buf += build.reframe(rot, self.checksum, log_pos=self.end + len(rot))
        self.end = self.committed = self.end + len(rot)
        self.sealed = self.needs_segment = True
        self.finish()
        self.segments.sealed(self.segments.last, self.end)

    def new_segment(self, fde: bytes, headers: list[bytes] | None = None,
                    checkpoints: Sequence[bytes] = (), *, name: str | None = None) -> None:
        """Start the next segment with `fde`. With `headers` (the upstream file's own header
        events, offered only when the upstream file starts here) they are written as they
        are; otherwise the GTID position's event is synthesized, followed by the upstream
        file's `checkpoints` (its Binlog_checkpoints that came before the first
        transaction) or, without any, a BINLOG_CHECKPOINT of the segment's own. `name`:
        the segment's name when segments keep a source's file names (of the log's base
        name, numbered past the last segment); otherwise the next number's.

        The segment is `aligned` when every upstream event of its header sits at the
        offset the upstream gave it (mirrored headers as a rule; checkpoints after a
        synthesized position event when the upstream skipped exactly its file's header)."""
        if self.segments and not self.sealed:
            raise AssertionError("new_segment on an open segment; seal() it first")
        self._write_out()
        name = self._named(name)
        path = self.segments.path_of(name)
        server_id = struct.unpack_from("<I", fde, 5)[0]
        checksum = decode_fde(fde).has_crc
        # A segment that does not start where an upstream file starts is no server start.
        fde_copy = build.copy_fde(fde, log_pos=4 + len(fde),
                                  created=None if headers is not None else 0)
        head = bytearray(b"\xfebin") + fde_copy
        upstream = list(headers) if headers is not None else list(checkpoints)
        if headers is None:
            ts = int(time.time())
            headers = [build.position_event(self.state, server_id=server_id, timestamp=ts,
                                            log_pos=0, checksum=checksum),
                       *(checkpoints or [build.binlog_checkpoint(
                           name, server_id=server_id, timestamp=ts, log_pos=0,
                           checksum=checksum)])]
        aligned = bool(upstream)
        for ev in headers:  # placed at our offsets (mirrored ones usually already are)
            size, log_pos = _POS.unpack_from(ev, 9)
            end = len(head) + size
            head += ev if log_pos == end else build.reframe(ev, checksum, log_pos=end)
            if any(ev is u for u in upstream):
                aligned = aligned and log_pos == end
        # O_APPEND: after abort_group() truncates, the next write lands at the new end.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        ifd = os.open(gtid_index.index_file(path),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        old = (self._fd, self._ifd, self._number, self.committed)
        try:
            self._write_all(fd, head, path)
        except LogWriteError:
            os.close(fd)
            os.close(ifd)
            raise
        self.segments.add(name)
        self._fd, self._ifd, self._path = fd, ifd, path
        self._number = self.segments.current_number
        self._index_started = False
        self.fde = fde_copy
        self.checksum = checksum
        self.sealed = self.needs_segment = False
        self.aligned = aligned
        self.end = self.committed = self._written = len(head)
        self.stats.rotations += 1
        log.info("started segment %s (GTID state %s)", name, self.state or "(empty)")
        self._made_safe(old, (self._number, self.committed), path)

    def _named(self, name: str | None) -> str:
        if name is None:
            return self.segments.next_name()
        base, _, _ = name.rpartition(".")
        if base != self.segments.basename or segment_number(name) <= self.segments.current_number:
            raise SegmentOrder(f"a segment named {name} cannot follow "
                               f"{self.segments.last if self.segments else 'nothing'} in a "
                               f"log of {self.segments.basename}.* files")
        return name

    def _made_safe(self, old: tuple[int, int, int, int], new: LogPosition, path: str) -> None:
        """The sealed segment and the new one synced, the index naming the new one
        replaced, then both ends published; on the worker, in order."""
        old_fd, old_ifd, old_number, old_end = old
        fd, segments, sync = self._fd, self.segments, self.sync
        directory, basename = self.segments.directory, self.segments.basename

        def job() -> None:
            if sync:
                if old_fd >= 0:
                    fileio.fsync(old_fd)  # the sealed segment is durable before the next
                fileio.fsync(fd)
            # The list as it is now (retention may have removed names since), up to this
            # segment: later ones are not durable yet.
            upto = max(segments.indexed, new[0])
            write_index(directory, basename, segments.index_names(upto), sync=sync)
            segments.indexed = upto
            for f in (old_fd, old_ifd):
                if f >= 0:
                    os.close(f)

        def publish(_: None) -> None:
            if old_fd >= 0:
                self.visibility.publish((old_number, old_end))
            self.visibility.publish(new)

        if self.syncer is None:
            job()
            publish(None)
            return
        self.syncer.forget_pending()  # the job syncs everything of the sealed segment
        self.syncer.submit(job, what="starting a segment", path=path, then=publish)

    def rotate_if_full(self) -> None:
        """At a transaction boundary: seal and start a synthesized segment past the size."""
        if self.end >= self.segment_size and self.fde is not None and not self.sealed:
            fde = self.fde
            self.seal(int(time.time()))
            self.new_segment(fde)
