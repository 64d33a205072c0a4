"""RelayLog: the relay log as one object: its segments, the one appender that writes them,
what readers may see, the worker that syncs, and the registry of its readers.

Bytes are appended as they arrive (a transaction is never held whole in memory), but
readers see only up to `visible`: the end of the last complete transaction that the
sync policy has made durable. Events keep their bytes untouched while the segment is
aligned with the upstream file (log_pos == our end + size); elsewhere only log_pos and
the CRC are rewritten. Every reader of segment files opens them through this package
(cursors, segment readers) and is registered with its position (relaylog/readers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from relay.binlog.events import decode_fde
from relay.binlog.flavour import Flavour
from relay.binlog.gtid import GtidPosition, GtidState
from relay.binlog.position import LogPosition
from relay.config import SyncMode, SyncPolicy, VerifyMode
from relay.errors import LogWriteError, SegmentPurged
from relay.relaylog import fileio, segfile
from relay.relaylog.appender import Appender, LogStats, OpenSegment
from relay.relaylog.atomic import fsync_dir
from relay.relaylog.durability import Syncer
from relay.relaylog.identity import load_epoch
from relay.relaylog.naming import index_path, read_index, segment_number, write_index
from relay.relaylog.readers import ReaderRegistry
from relay.relaylog.recovery import Recovered, recover
from relay.relaylog.replica_acks import ReplicaAckBoard
from relay.relaylog.segments import SegmentList
from relay.relaylog.visibility import Visibility

log = logging.getLogger("relay.relaylog")
T = TypeVar("T")

READ_THREADS = 4


class RelayLog:
    """The relay log in `directory`: open() recovers it, start() binds it to the running
    loop, close() syncs and closes it. The write side is `appender()`; the read side is
    `visible`, `visible_state`, `wait_beyond`, cursors and segment readers (relaylog/
    cursor.py), and `readers`, the registry of everyone reading."""

    def __init__(self, directory: str, *, basename: str = "relay-bin",
                 segment_size: int = 256 << 20, sync: SyncPolicy | None = None,
                 verify_on_start: VerifyMode = VerifyMode.ALL, hold_ttl: float = 7 * 86400.0,
                 on_fsync: Callable[[float], None] | None = None) -> None:
        self.directory = directory
        self.basename = basename
        self.policy = sync or SyncPolicy(SyncMode.TRANSACTION)
        self.verify_on_start = verify_on_start
        self.hold_ttl = hold_ttl
        self.segments = SegmentList(directory, basename)
        self.visibility = Visibility()
        self._appender = Appender(self.segments, self.visibility, segment_size=segment_size,
                                  sync=self.policy.syncs, state=GtidState())
        self._syncer: Syncer | None = None
        self._on_fsync = on_fsync
        self._reads: ThreadPoolExecutor | None = None
        self.readers = ReaderRegistry(os.path.join(directory, f"{basename}.holds"), "",
                                      hold_ttl=hold_ttl)
        self.epoch = ""  # the log's identity (set by open)
        # How far semi-sync replicas acknowledged it (the downstream reports, the upstream
        # may wait on it before acknowledging to its primary).
        self.replica_acks = ReplicaAckBoard()
        # Held by whatever rewrites the list of segments or their files besides the
        # writer: retention's purges and compression, and a re-open after a full disk.
        self.maintenance = asyncio.Lock()

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Recover what is on disk. Blocking; call before the loop starts serving."""
        os.makedirs(self.directory, exist_ok=True)
        rec = recover(self.directory, self.basename,
                      verify_all=self.verify_on_start is VerifyMode.ALL,
                      sync=self.policy.syncs)
        self.segments.load(rec.segments, last_sealed=rec.sealed)
        self._appender.state = rec.state
        self.epoch = load_epoch(self.directory, self.basename, fresh=not rec.segments,
                                sync=self.policy.syncs)
        self.readers = ReaderRegistry(os.path.join(self.directory, f"{self.basename}.holds"),
                                      self.epoch, hold_ttl=self.hold_ttl,
                                      sync=self.policy.syncs)
        self._appender.resume(OpenSegment(rec.fde, rec.end, rec.sealed))
        if self.segments:
            self.visibility.reset((self.segments.current_number, rec.end), rec.state)
            log.info("relay log %s: %d segment(s), last %s at offset %d, GTID state %s%s",
                     self.directory, len(self.segments), self.segments.last, rec.end,
                     rec.state or "(empty)", " (sealed)" if rec.sealed else "")
        else:
            self.visibility.reset((0, 0), rec.state)
            log.info("relay log %s is empty", self.directory)

    def start(self) -> None:
        """Bind to the running loop (the worker reports back on it)."""
        self._syncer = Syncer(self.policy, self.visibility.publish, self._failed,
                              self._on_fsync)
        self._appender.syncer = self._syncer
        self._reads = ThreadPoolExecutor(max_workers=READ_THREADS,
                                         thread_name_prefix="relay-read")

    def close(self) -> None:
        if self._syncer is not None:
            self._syncer.close()
            self._syncer = None
            self._appender.syncer = None
        if self._reads is not None:
            self._reads.shutdown(wait=True, cancel_futures=True)
            self._reads = None
        self._appender.close()

    async def reopen(self) -> None:
        """After a failed write or sync (a full disk): drop every byte that was not made
        durable and take the log up again from there, as a restart would (the upstream
        sends the rest again). Readers keep what they saw; nothing is shown twice. Holds
        `maintenance`, so retention neither purges nor compresses meanwhile."""
        async with self.maintenance:
            await self._reopen()

    async def _reopen(self) -> None:
        if self._syncer is not None:
            self._syncer.close()  # waits for the job in flight (an fsync at most)
            self._syncer = None
        old = self._appender
        vis_seg, vis_off = self.visibility.visible
        directory, basename, sync = self.directory, self.basename, self.policy.syncs
        listed = list(self.segments.names)

        def redo() -> tuple[Recovered, int]:
            old.discard()
            dropped = 0
            if vis_seg > 0:
                # Back to the visible end exactly: segments past it (a rotation whose syncs
                # had not finished) go, and the visible one is cut at the visible offset.
                indexed = read_index(directory, basename)
                later = {n for n in [*indexed, *listed] if segment_number(n) > vis_seg}
                for name in later:
                    path = os.path.join(directory, name)
                    with contextlib.suppress(FileNotFoundError):
                        dropped += os.path.getsize(segfile.stored_path(path))
                    segfile.remove(path)
                if any(n in later for n in indexed):
                    write_index(directory, basename, [n for n in indexed if n not in later],
                                sync=sync)
                current = next((n for n in indexed if segment_number(n) == vis_seg), None)
                if current is not None and os.path.exists(os.path.join(directory, current)):
                    with open(os.path.join(directory, current), "r+b") as f:
                        extra = os.fstat(f.fileno()).st_size - vis_off
                        if extra > 0:
                            f.truncate(vis_off)
                            dropped += extra
                        fileio.fsync(f.fileno())
            rec = recover(directory, basename, verify_all=False, sync=sync)
            return rec, dropped

        rec, dropped = await self.read(redo)
        self.segments.load(rec.segments, last_sealed=rec.sealed)
        appender = Appender(self.segments, self.visibility,
                            segment_size=old.segment_size, sync=self.policy.syncs,
                            state=rec.state)
        appender.stats = old.stats
        appender.resume(OpenSegment(rec.fde, rec.end, rec.sealed))
        self._appender = appender
        if self.segments:
            self.visibility.resume_at((self.segments.current_number, rec.end), rec.state)
        self._syncer = Syncer(self.policy, self.visibility.publish, self._failed,
                              self._on_fsync)
        appender.syncer = self._syncer
        log.info("relay log re-opened at %s offset %d (%d bytes that were not durable "
                 "dropped), GTID state %s", self.segments.last if self.segments else "-",
                 rec.end, dropped, rec.state or "(empty)")

    def _failed(self, error: LogWriteError) -> None:
        self._appender.failure = error

    # --- the write side ---------------------------------------------------------------------

    def appender(self) -> Appender:
        """The write side, for one batch (end it with `finish()`). Raises the log's
        LogWriteError once a write or sync failed."""
        self._appender.check()
        return self._appender

    def start_from(self, state: GtidPosition) -> None:
        """An empty log begins at this GTID position (its first segment's header says so)."""
        self._appender.state = state.copy()
        self.visibility.reset(self.visibility.visible, state)

    # --- what the writer has (for status) ------------------------------------------------------

    @property
    def state(self) -> GtidPosition:
        """The GTID position at the last commit (the writer's view, ahead of `visible`)."""
        return self._appender.state

    @property
    def fde(self) -> bytes | None:
        return self._appender.fde

    @property
    def flavour(self) -> Flavour:
        """The flavour of the transactions the log holds: its primary's (from its
        FORMAT_DESCRIPTION's server version), else its GTID state's."""
        fde = self.fde
        if fde is not None:
            return Flavour.MARIADB if decode_fde(fde).is_mariadb else Flavour.MYSQL
        return Flavour.of_position(self.state)

    @property
    def checksum(self) -> bool:
        return self._appender.checksum

    @property
    def stats(self) -> LogStats:
        return self._appender.stats

    @property
    def failure(self) -> LogWriteError | None:
        return self._appender.failure

    # --- the read side ----------------------------------------------------------------------

    @property
    def visible(self) -> LogPosition:
        return self.visibility.visible

    @property
    def visible_state(self) -> GtidPosition:
        return self.visibility.state

    @property
    def current_number(self) -> int:
        return self.segments.current_number

    def path_of(self, name: str) -> str:
        return self.segments.path_of(name)

    async def wait_beyond(self, pos: LogPosition, timeout: float | None = None,
                          push: Callable[[], bool] | None = None) -> bool:
        """Wait until `visible` moves past `pos`; False on timeout (`push`: see
        Visibility.wait_beyond)."""
        return await self.visibility.wait_beyond(pos, timeout, push)

    def visible_size(self, name: str) -> int:
        """Bytes of segment `name` readers may see."""
        number = self.segments.number_of(name)
        vis_seg, vis_off = self.visibility.visible
        if number < vis_seg:
            size = self.segments.sealed_size(name)
            if size is None:  # every sealed segment the list holds has its size
                raise SegmentPurged(f"binary log {name} is not in the relay log (purged); "
                                    "the required binlog files have been purged")
            return size
        return vis_off if number == vis_seg else 0

    def bytes_behind(self, segment: str, offset: int) -> int:
        """Visible bytes past `offset` of `segment` (what a reader there has yet to read)."""
        if not segment or segment not in self.segments:
            return 0
        number = self.segments.number_of(segment)
        vis_seg, vis_off = self.visibility.visible
        if number == vis_seg:
            return max(0, vis_off - offset)
        behind = 0
        for name in self.segments.names:
            n = self.segments.number_of(name)
            if n == number:
                behind += self.visible_size(name) - offset
            elif number < n < vis_seg:
                behind += self.visible_size(name)
        return behind + (vis_off if number < vis_seg else 0)

    def open_segment_bytes(self) -> int:
        """Bytes of the open segment (written or about to be)."""
        return self._appender.end if self.segments and \
            self.segments.sealed_size(self.segments.last) is None else 0

    async def remove_oldest(self, names: list[str]) -> None:
        """Retention's removal of the oldest sealed segments: out of the list now (no new
        reader opens them), then the index rewritten on the log's worker (in order with a
        rotation's), then the files and their GTID indexes unlinked in a reader thread.
        A crash in between leaves files the index no longer lists; recovery removes them.
        An index that cannot be written (a full disk) puts the names back and raises
        OSError: nothing is removed, and the log itself goes on. Callers hold
        `maintenance`."""
        dropped = self.segments.drop_oldest(names)
        directory, basename, sync = self.directory, self.basename, self.policy.syncs
        segments = self.segments

        def rewrite_index() -> None:
            write_index(directory, basename, segments.index_names(), sync=sync)

        try:
            if self._syncer is not None:
                await self._syncer.submit(rewrite_index, what="purging segments",
                                          path=index_path(directory, basename),
                                          fails_log=False)
            else:
                await self.read(rewrite_index)
        except OSError:
            self.segments.restore_oldest(dropped)
            raise
        paths = [self.path_of(n) for n in names]

        def unlink() -> None:
            for path in paths:
                segfile.remove(path)
            if sync:
                fsync_dir(directory)

        await self.read(unlink)

    def size_bytes(self) -> int:
        """Bytes the segments take on disk (the open one as far as written; compressed
        ones as stored)."""
        total = self.segments.sealed_bytes()
        if self.segments and self.segments.sealed_size(self.segments.last) is None:
            total += self._appender.end - len(self._appender.buf)
        return total

    async def read(self, fn: Callable[[], T]) -> T:
        """Run a blocking read of the log (a cursor's pread, a segment header) in the log's
        reader threads."""
        if self._reads is None:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._reads, fn)

