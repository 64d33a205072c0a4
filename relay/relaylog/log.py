"""RelayLog: the one writer of the relay log, and what readers may see.

Bytes are appended as they arrive (a transaction is never held whole in memory), but
readers see only up to `visible`: the end of the last complete transaction that the
sync policy has made durable. Events keep their bytes untouched while the segment is
aligned with the upstream file (log_pos == our end + size); elsewhere only log_pos and
the CRC are rewritten.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from relay.binlog import build
from relay.binlog.events import decode_fde
from relay.binlog.gtid import Gtid, GtidState
from relay.relaylog import gtid_index
from relay.relaylog.durability import Position, Syncer, SyncPolicy
from relay.relaylog.identity import load_epoch
from relay.relaylog.naming import segment_name, segment_number, write_index
from relay.relaylog.recovery import recover

log = logging.getLogger("relay.relaylog")

_POS = struct.Struct("<II")  # event_size, log_pos at offset 9


@dataclass
class LogStats:
    """Counters the metrics layer reads; kept as plain numbers here."""

    bytes_written: int = 0
    events_written: int = 0
    events_rewritten: int = 0
    transactions: int = 0
    rotations: int = 0


class RelayLog:
    def __init__(self, directory: str, *, basename: str = "relay-bin",
                 segment_size: int = 256 << 20, sync: SyncPolicy | None = None,
                 verify_on_start: str = "all",
                 on_fsync: Callable[[float], None] | None = None) -> None:
        self.directory = directory
        self.basename = basename
        self.segment_size = segment_size
        self.policy = sync or SyncPolicy("transaction")
        self.verify_on_start = verify_on_start
        self.stats = LogStats()
        self.segments: list[str] = []
        self.state = GtidState()          # at the last commit (the writer's view)
        self.visible_state = GtidState()  # at `visible` (what readers can be served)
        self._pending: collections.deque[tuple[Position, Gtid]] = collections.deque()
        # called on the loop with the new visible end (semi-sync acknowledgements)
        self.on_durable: list[Callable[[Position], None]] = []
        self.fde: bytes | None = None
        self.checksum = False
        self.sealed = False
        self.end = 0
        self.committed = 0
        self._fd = -1
        self._wbuf = bytearray()
        self._ibuf = bytearray()
        self._ifd = -1
        self._written = 0  # bytes of the current segment handed to the OS
        self._group_start = 0
        self.visible: Position = (0, 0)
        self._changed = asyncio.Event()
        self._syncer: Syncer | None = None
        self._on_fsync = on_fsync
        self.write_error = ""
        self.epoch = ""  # the log's identity (set by open)

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Recover what is on disk. Blocking; call before the loop starts serving."""
        os.makedirs(self.directory, exist_ok=True)
        rec = recover(self.directory, self.basename, verify_all=self.verify_on_start == "all",
                      sync=self.policy.mode != "off")
        self.segments = rec.segments
        self.state = rec.state
        self.visible_state = rec.state.copy()
        self.epoch = load_epoch(self.directory, self.basename, fresh=not rec.segments,
                                sync=self.policy.mode != "off")
        if self.segments:
            self.fde = rec.fde
            self.checksum = decode_fde(rec.fde).has_crc if rec.fde else False
            self.sealed = rec.sealed
            self.end = self.committed = self._written = rec.end
            path = self.current_path
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._ifd = os.open(gtid_index.index_file(path), os.O_WRONLY | os.O_APPEND)
            self.visible = (self.current_number, rec.end)
            log.info("relay log %s: %d segment(s), last %s at offset %d, GTID state %s%s",
                     self.directory, len(self.segments), self.segments[-1], rec.end,
                     self.state or "(empty)", " (sealed)" if rec.sealed else "")
        else:
            log.info("relay log %s is empty", self.directory)

    def start(self) -> None:
        """Bind to the running loop (the fsync worker reports back on it)."""
        self._syncer = Syncer(self.policy, self._made_durable, self._on_fsync)

    def close(self) -> None:
        if self._syncer is not None:
            self._syncer.close()
            self._syncer = None
        self._flush_bytes()
        for fd in (self._fd, self._ifd):
            if fd >= 0:
                if self.policy.mode != "off":
                    os.fsync(fd)
                os.close(fd)
        self._fd = self._ifd = -1

    # --- read side ------------------------------------------------------------------------

    @property
    def current_number(self) -> int:
        return segment_number(self.segments[-1]) if self.segments else 0

    @property
    def current_path(self) -> str:
        return os.path.join(self.directory, self.segments[-1])

    def path_of(self, name: str) -> str:
        return os.path.join(self.directory, name)

    async def wait_beyond(self, pos: Position, timeout: float | None = None) -> bool:
        """Wait until `visible` moves past `pos`; False on timeout."""
        while self.visible <= pos:
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return False
        return True

    def start_from(self, state: GtidState) -> None:
        """An empty log begins at this GTID state (its first segment's GTID_LIST says so)."""
        self.state = state.copy()
        self.visible_state = state.copy()

    def _made_durable(self, pos: Position) -> None:
        if pos > self.visible:
            self.visible = pos
            pending = self._pending
            while pending and pending[0][0] <= pos:
                self.visible_state.update(pending.popleft()[1])
            for listener in self.on_durable:
                listener(pos)
            self._changed.set()
            self._changed = asyncio.Event()

    # --- write side -----------------------------------------------------------------------

    @property
    def needs_segment(self) -> bool:
        return not self.segments or self.sealed

    def new_segment(self, fde: bytes, headers: list[bytes] | None = None) -> None:
        """Start the next segment with `fde`. With `headers` (the upstream file's own header
        events, offered only when the upstream file starts here) they are written as they
        are; otherwise a GTID_LIST of our state and a BINLOG_CHECKPOINT are synthesized."""
        if self.segments and not self.sealed:
            raise AssertionError("new_segment on an open segment; seal() it first")
        self._flush_bytes()
        number = self.current_number + 1 if self.segments else 1
        name = segment_name(self.basename, number)
        path = self.path_of(name)
        server_id = struct.unpack_from("<I", fde, 5)[0]
        checksum = decode_fde(fde).has_crc
        sync = self.policy.mode != "off"
        # O_APPEND: after abort_group() truncates, the next write lands at the new end.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        head = bytearray(b"\xfebin")
        # A segment that does not start where an upstream file starts is no server start.
        fde_copy = build.copy_fde(fde, log_pos=4 + len(fde),
                                  created=None if headers is not None else 0)
        head += fde_copy
        if headers is None:
            ts = int(time.time())
            headers = [build.gtid_list(self.state, server_id=server_id, timestamp=ts,
                                       log_pos=0, checksum=checksum),
                       build.binlog_checkpoint(name, server_id=server_id, timestamp=ts,
                                               log_pos=0, checksum=checksum)]
        for ev in headers:  # placed at our offsets (mirrored ones usually already are)
            size, log_pos = _POS.unpack_from(ev, 9)
            end = len(head) + size
            head += ev if log_pos == end else build.with_log_pos(ev, end, checksum)
        os.write(fd, head)
        ifd = os.open(gtid_index.index_file(path),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        if sync:
            os.fsync(fd)
        old_fd, old_ifd = self._fd, self._ifd
        if sync and old_fd >= 0:
            os.fsync(old_fd)  # the sealed segment is durable before the next one is visible
        self.segments.append(name)
        write_index(self.directory, self.basename, self.segments, sync=sync)
        self._fd, self._ifd = fd, ifd
        for f in (old_fd, old_ifd):
            if f >= 0:
                self._close_later(f)
        self.fde = fde_copy
        self.checksum = checksum
        self.sealed = False
        self.end = self.committed = self._written = len(head)
        self.stats.rotations += 1
        log.info("rotated to segment %s (GTID state %s)", name, self.state or "(empty)")
        self._made_durable((number, self.committed))

    def _close_later(self, fd: int) -> None:
        # Closed on the fsync worker so an fsync still queued there never sees a reused fd.
        if self._syncer is None:
            os.close(fd)
        else:
            self._syncer.run_blocking(lambda: os.close(fd))

    def append(self, ev: bytes | bytearray | memoryview, log_pos: int, size: int) -> None:
        """Append one event of a transaction; hot path."""
        end = self.end + size
        if log_pos == end:
            self._wbuf += ev
        else:
            self._wbuf += build.with_log_pos(ev, end, self.checksum)
            self.stats.events_rewritten += 1
        self.end = end

    def begin_group(self) -> None:
        self._group_start = self.end

    def commit(self, gtid: Gtid | None) -> None:
        """The events appended since the last commit form one complete transaction."""
        if gtid is not None:
            self.state.update(gtid)
            self._pending.append(((self.current_number, self.end), gtid))
            self._ibuf += gtid_index.pack(gtid, self._group_start, self.end)
        self.committed = self.end
        self.stats.transactions += 1

    def abort_group(self) -> None:
        """Forget the appended part of an unfinished transaction (upstream went away)."""
        if self.end == self.committed:
            return
        keep = self.committed - self._written
        if keep >= 0:
            del self._wbuf[keep:]
        else:
            self._wbuf.clear()
            os.ftruncate(self._fd, self.committed)
            self._written = self.committed
        log.info("discarded %d bytes of an unfinished transaction", self.end - self.committed)
        self.end = self.committed

    def seal(self, timestamp: int = 0) -> None:
        """End the current segment with a ROTATE naming the next one."""
        if not self.segments or self.sealed:
            return
        assert self.fde is not None
        server_id = struct.unpack_from("<I", self.fde, 5)[0]
        next_name = segment_name(self.basename, self.current_number + 1)
        rot = build.rotate(next_name, server_id=server_id, timestamp=timestamp, log_pos=0,
                           checksum=self.checksum)
        ev = build.with_log_pos(rot, self.end + len(rot), self.checksum)
        self._wbuf += ev
        self.end = self.committed = self.end + len(ev)
        self.sealed = True
        self.flush()

    def _flush_bytes(self) -> None:
        if self._wbuf:
            try:
                written = os.write(self._fd, self._wbuf)
            except OSError as exc:
                self.write_error = f"{self.current_path}: {exc}"
                raise
            if written != len(self._wbuf):
                self.write_error = f"{self.current_path}: short write ({written} bytes)"
                raise OSError(self.write_error)
            self.write_error = ""
            self._written += len(self._wbuf)
            self.stats.bytes_written += len(self._wbuf)
            self._wbuf.clear()
        if self._ibuf:
            os.write(self._ifd, self._ibuf)
            self._ibuf.clear()

    def flush(self) -> None:
        """Hand buffered bytes to the OS and let the sync policy publish the committed end.
        Called once per received batch, not per event."""
        if not self.segments:
            return
        self._flush_bytes()
        target = (self.current_number, self.committed)
        if target > self.visible:
            if self._syncer is None:
                self._made_durable(target)
            else:
                self._syncer.request(self._fd, target)

    def rotate_if_full(self) -> None:
        """At a transaction boundary: seal and start a synthesized segment past the size."""
        if self.end >= self.segment_size and self.fde is not None and not self.sealed:
            fde = self.fde
            self.seal(int(time.time()))
            self.new_segment(fde)

    def size_bytes(self) -> int:
        total = 0
        for name in self.segments:
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(self.path_of(name))
        return total
