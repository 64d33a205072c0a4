"""`relay import`: archived binlog files into a relay log, checked and resumable.

Each file becomes the segment of its own name, byte for byte (a replica asking for
`mysql-bin.000042` at an offset gets that file from there): its events are played to the
log's ingest as a primary's dump from that file would send them (relaylog/archive.py), so
the relay log places, indexes and syncs them exactly as it does a live primary's. What is
checked, with the file and offset named: every event's size and CRC32, one flavour, and
one history without a gap or an overlap (each file's GTID position event, GTID_LIST or
PREVIOUS_GTIDS, must be where the files before it end). An interrupted import (Ctrl-C,
kill -9) leaves the log at its last durable transaction; the same command again resumes
there, and newer files of the same series can be added to a log an import made.

The files are read on the event loop: the loop serves only this import (the log's sync
worker reports on it), so nothing waits behind the reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relay.binlog.events import decode_fde
from relay.binlog.flavour import Flavour
from relay.binlog.gtid import GtidPosition
from relay.config import SyncMode, SyncPolicy, VerifyMode
from relay.errors import RelayError
from relay.relaylog.archive import (
    ArchiveError,
    ArchiveFile,
    FileDump,
    archive_files,
    header,
    same_header,
)
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import list_index_files
from relay.relaylog.placement import SegmentNaming
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import NoLink, StreamStart
from relay.wire.dumpstream import EventBatch

log = logging.getLogger("relay.import")

NO_SIZE_LIMIT = 1 << 62  # a segment is its file, whatever its size


@dataclass
class ImportProgress:
    """What an import has done so far (for a progress display)."""

    files: int                       # to import in this run
    total_bytes: int
    file: str = ""                   # the file being read
    files_done: int = 0
    bytes_done: int = 0
    transactions: int = 0
    skipped: list[str] = field(default_factory=list)  # in the log already
    dropped: list[str] = field(default_factory=list)  # files that ended inside a transaction
    # (file, offset): a file that ends inside an event (one a server still writes, or a
    # copy cut short); what follows that offset is left for a later import
    torn: list[tuple[str, int]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    position: str = ""               # the log's GTID position now
    basename: str = ""               # the series' (and so the segments') base name
    interrupted: bool = False        # stopped before the last file's end

    @property
    def rate(self) -> float:
        """Bytes a second."""
        return self.bytes_done / max(time.monotonic() - self.started, 1e-6)


@dataclass
class _Start:
    file: ArchiveFile
    offset: int


def _plan(relay_log: RelayLog, files: list[ArchiveFile],
          progress: ImportProgress) -> list[_Start]:
    """Where each file starts: past what the log holds of it already."""
    segments = relay_log.segments
    if not segments:
        return [_Start(f, 4) for f in files]
    last = segments.last
    last_number = segments.number_of(last)
    visible = relay_log.visible[1]
    sealed = relay_log.appender().needs_segment
    out = []
    for f in files:
        if f.name in segments and not same_header(segments.path_of(f.name), f):
            # (a segment's size may differ from its file's: one that ended inside a
            # transaction, say; its header does not)
            raise ArchiveError(f"{f.path} does not start as the log's segment of that name "
                               "(another FORMAT_DESCRIPTION or GTID position): not the file "
                               "this log was made from")
        if f.number < last_number or (f.number == last_number and sealed):
            progress.skipped.append(f.name)
        elif f.number == last_number:
            if f.size < visible:
                raise ArchiveError(f"{f.path} is {f.size} bytes, shorter than the "
                                   f"{visible} the log holds of it: not the file this log "
                                   "was made from")
            out.append(_Start(f, visible))
        elif not out and f.number != last_number + 1:
            raise ArchiveError(f"the log ends with {last}, so {f.name} cannot follow it: "
                               f"{f.base}.{last_number + 1:06d} is missing")
        else:
            out.append(_Start(f, 4))
    return out


def _check_continuity(relay_log: RelayLog, f: ArchiveFile, flavour: Flavour,
                      position: GtidPosition | None) -> None:
    """A file that starts a segment must start where the log ends: its GTID position event
    names every transaction before it."""
    log_flavour = relay_log.flavour
    if relay_log.segments and flavour is not log_flavour:
        raise ArchiveError(f"{f.path} is a {flavour.label} binlog, and this log holds "
                           f"{log_flavour.label} transactions: "
                           f"{flavour.mismatch(log_flavour, 'files')}")
    if position is None or not relay_log.segments:
        return
    ends = relay_log.state
    if position != ends:
        raise ArchiveError(
            f"{f.path} starts after {flavour.label} GTIDs {position or '(none)'}, but the log "
            f"and the files before it end at {ends or '(none)'}: "
            + ("files are missing in between (or the server's history was reset)"
               if _ahead(position, ends) else
               "these files overlap or come from another server's history"))


def _ahead(position: GtidPosition, ends: GtidPosition) -> bool:
    """Whether `position` holds all of `ends` and more (a gap before it)."""
    return position.covers(ends) and position != ends


async def import_files(data_dir: str, patterns: Sequence[str], *,
                       sync: SyncPolicy | None = None,
                       on_progress: Callable[[ImportProgress], None] | None = None,
                       stop: asyncio.Event | None = None) -> ImportProgress:
    """Import the binlog files `patterns` names into the relay log in `data_dir` (made,
    or continued when an import of the same series made it). Raises ArchiveError for
    files that cannot be imported, naming file and offset; on `stop`, ends at the last
    whole transaction (run it again to go on)."""
    files = archive_files(patterns)
    base = files[0].base
    others = [n for n in list_index_files(data_dir) if n != base] \
        if os.path.isdir(data_dir) else []
    if others:
        raise ArchiveError(f"{data_dir} holds a relay log of {others[0]}.* segments: import "
                           f"{base}.* files into an empty directory, or into one an import "
                           f"of {base}.* files made")
    relay_log = RelayLog(data_dir, basename=base, segment_size=NO_SIZE_LIMIT,
                         sync=sync or SyncPolicy(SyncMode.TRANSACTION),
                         verify_on_start=VerifyMode.ALL)
    relay_log.open()
    relay_log.start()
    try:
        progress = ImportProgress(0, 0, basename=base)
        starts = _plan(relay_log, files, progress)
        progress.files = len(starts)
        progress.total_bytes = sum(s.file.size - s.offset for s in starts)
        ingest = Ingest(relay_log, SegmentNaming.SOURCE)
        for i, start in enumerate(starts):
            if stop is not None and stop.is_set():
                break
            await _import_file(relay_log, ingest, start, progress, on_progress, stop,
                               last=i == len(starts) - 1)
            progress.files_done += 1
        progress.position = str(relay_log.state)
        return progress
    finally:
        relay_log.close()


async def _import_file(relay_log: RelayLog, ingest: Ingest, start: _Start,
                       progress: ImportProgress,
                       on_progress: Callable[[ImportProgress], None] | None,
                       stop: asyncio.Event | None, *, last: bool) -> None:
    f = start.file
    progress.file = f.name
    fde, position_event = header(f)
    fmt = decode_fde(fde)
    flavour = Flavour.MARIADB if fmt.is_mariadb else Flavour.MYSQL
    position = None
    if start.offset == 4 and position_event is not None:
        position = flavour.decode_header(position_event, fmt.has_crc)
    _check_continuity(relay_log, f, flavour, position)
    if not relay_log.segments:
        relay_log.start_from(position if position is not None else flavour.empty())
    ingest.on_stream(StreamStart(fmt.has_crc, NoLink(), source=f.path))
    dump = FileDump(f, start.offset)
    before = relay_log.stats.transactions
    at = start.offset
    try:
        for events in dump.events():
            try:
                ingest.on_events(EventBatch(events))
            except ArchiveError:
                raise
            except RelayError as exc:
                raise ArchiveError(f"{f.path}, in the events from offset {at} to "
                                   f"{dump.end}: {exc}") from None
            progress.bytes_done += dump.end - at
            at = dump.end
            progress.transactions = relay_log.stats.transactions
            if on_progress is not None:
                on_progress(progress)
            await asyncio.sleep(0)  # the log's sync worker reports on this loop
            if stop is not None and stop.is_set():
                break
    except ArchiveError:
        await ingest.on_end()  # the log keeps the whole transactions before the error
        raise
    if not dump.complete and not (stop is not None and stop.is_set()):
        if not last:
            raise ArchiveError(f"{f.path} ends inside an event at offset {dump.end}, and "
                               "newer files follow it: a file cut short")
        progress.torn.append((f.name, dump.end))
    if ingest.tracker.in_group:
        # A transaction the file does not finish: a server that crashed in it (it was
        # never committed), or a file still being written.
        progress.dropped.append(f.name)
    await ingest.on_end()
    relay_log.appender().finish()
    log.info("%s: %d transactions", f.name, relay_log.stats.transactions - before)
