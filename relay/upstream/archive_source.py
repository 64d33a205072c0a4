"""An archive of binlog files as the upstream (`file:///archive/mariadb-bin.*`): a folder a
backup process fills with one primary's files, followed as a replica follows a primary,
alone or as the last source of a failover list.

From the relay log's GTID position it finds the file that holds the next transaction and
plays the files from there to the ingest as a primary's dump from that file and offset
would send them (relaylog/archive.py): the transactions the log holds already are passed
over, and the first file is resumed at the first one it lacks, so the log places a segment
of its own there. At the last file's end it waits: the file may grow (only whole
transactions are taken; a partial one is read again once it is complete) and newer files
may appear. A file that cannot be read (a bad event, a gap in the series) ends the session
with the error, as a primary's refusal would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from relay.binlog import walk
from relay.binlog.constants import EventType
from relay.binlog.events import decode_fde
from relay.binlog.flavour import Flavour
from relay.binlog.group import GROUP_START, GroupTracker
from relay.binlog.gtid import GtidPosition
from relay.errors import FatalUpstreamError, UpstreamError
from relay.relaylog.archive import (
    ArchiveError,
    ArchiveFile,
    FileDump,
    archive_files,
    first_lacking,
    header,
)
from relay.upstream.protocol import EventSink, NoLink, StreamStart
from relay.wire.dumpstream import EventBatch

log = logging.getLogger("relay.upstream")

_FILE_ENDS = frozenset({EventType.ROTATE, EventType.STOP})


@dataclass(frozen=True)
class ArchiveInfo:
    """What the archive says of its primary (for /status, as a live primary's version)."""

    version: str
    server_id: int
    flavour: Flavour
    first_position: GtidPosition  # before its oldest file (a new log starts there)


def inspect_archive(pattern: str) -> ArchiveInfo:
    """The archive's primary, from its newest file (blocking)."""
    files = _listed(pattern)
    newest = header(files[-1])[0]
    fde = decode_fde(newest)
    flavour = Flavour.MARIADB if fde.is_mariadb else Flavour.MYSQL
    first_fde, position = header(files[0])
    first = flavour.empty() if position is None else \
        flavour.decode_header(position, decode_fde(first_fde).has_crc)
    return ArchiveInfo(fde.server_version, _server_id(newest), flavour, first)


def _listed(pattern: str) -> list[ArchiveFile]:
    try:
        return archive_files([pattern])
    except ArchiveError as exc:
        raise UpstreamError(f"archive {pattern}: {exc}") from None


def _server_id(fde: bytes) -> int:
    return int.from_bytes(fde[5:9], "little")


class ArchiveSession:
    """One pass over the archive from the relay log's position; `run` returns only with an
    error (or when cancelled), as a session with a primary does."""

    def __init__(self, pattern: str, sink: EventSink, *, poll: float = 1.0,
                 on_streaming: Callable[[], None] | None = None) -> None:
        self.pattern = pattern
        self.sink = sink
        self.poll = poll
        self._on_streaming = on_streaming

    async def run(self, state: GtidPosition) -> None:
        files = await asyncio.to_thread(_listed, self.pattern)
        index, offset = await asyncio.to_thread(_start, files, state)
        if self._on_streaming is not None:
            self._on_streaming()
        skip: GtidPosition | None = state  # the first file: pass over what the log has
        try:
            while True:
                current = files[index]
                offset, ended = await self._play(current, offset, skip)
                skip = None
                seen = current.size
                while True:  # until the file grows, or the next one is there
                    files = await asyncio.to_thread(_listed, self.pattern)
                    if files[0].number > current.number:
                        raise FatalUpstreamError(f"archive {self.pattern}: {current.name} "
                                                 "was removed while the relay read it")
                    later = [f for f in files if f.number > current.number]
                    if not ended and current.size > seen:
                        index = files.index(current)
                        break
                    if later:  # (a file its server left without a ROTATE: it crashed)
                        index, offset = files.index(later[0]), 4
                        break
                    await asyncio.sleep(self.poll)
        finally:
            await self.sink.on_end()

    async def _play(self, f: ArchiveFile, start: int,
                    skip: GtidPosition | None) -> tuple[int, bool]:
        """Feed `f` from `start`: (where its last whole transaction ends, whether the file
        ended with a ROTATE or STOP). The file is read and walked in a worker thread; the
        loop only hands each run to the sink."""
        fde = decode_fde(header(f)[0])
        self.sink.on_stream(StreamStart(fde.has_crc, NoLink(), source=f.path))
        play = _FilePlay(FileDump(f, start), fde.has_crc, skip)
        while True:
            try:
                batch = await asyncio.to_thread(play.next_run)
            except ArchiveError as exc:
                raise FatalUpstreamError(f"archive: {exc}") from None
            if batch is None:
                break
            if batch:
                self.sink.on_events(EventBatch(batch))
            await asyncio.sleep(0)
        if play.tracker.in_group:
            # A transaction the file does not finish yet: taken again once it is whole.
            await self.sink.on_end()
        return play.done, play.ended


class _FilePlay:
    """A file's runs of events as the sink takes them: the transactions `skip` holds
    passed over, and where its last whole transaction ends kept (blocking: a worker
    thread's)."""

    def __init__(self, dump: FileDump, checksum: bool, skip: GtidPosition | None) -> None:
        self.reader = dump.events()
        self.checksum = checksum
        self.skip = skip
        self.tracker = GroupTracker()
        self.at = self.done = dump.start  # the file offset of the next event; past the
        self.ended = False                 # last whole transaction or file event fed
        self._skipping = False
        self._resume_header = dump.start > 4  # a resume's first FDE is the dump's, not the file's

    def next_run(self) -> bytearray | None:
        events = next(self.reader, None)
        if events is None:
            return None
        tracker, batch = self.tracker, bytearray()
        view = memoryview(events)
        for pos, size in walk.spans(events):
            ev = view[pos : pos + size]
            typ = events[pos + 4]
            # (the type first: the log_pos slice only for the two kinds a dump makes)
            if (typ == EventType.ROTATE or (typ == EventType.FORMAT_DESCRIPTION
                                            and self._resume_header)) \
                    and events[pos + 13 : pos + 17] == b"\0\0\0\0":
                batch += ev  # what the dump sends first: the file's name, its header
                self._resume_header = False
                continue
            closes = tracker.feed(ev, self.checksum)
            if tracker.in_group or closes:
                if self.skip is not None and typ in GROUP_START and tracker.txn is not None:
                    self._skipping = self.skip.contains(tracker.txn)
                if not self._skipping:
                    batch += ev
                if closes:
                    self._skipping = False
            else:
                batch += ev
                self.ended = typ in _FILE_ENDS
            self.at += size
            if not tracker.in_group:
                self.done = self.at
        view.release()
        return batch


def _start(files: list[ArchiveFile], state: GtidPosition) -> tuple[int, int]:
    """The file that holds the first transaction `state` lacks: the newest whose opening
    GTID position `state` covers (blocking)."""
    flavour = Flavour.of_position(state)
    for i in range(len(files) - 1, -1, -1):
        fde, position = header(files[i])
        checksum = decode_fde(fde).has_crc
        if position is None:
            continue
        theirs = Flavour.MARIADB if decode_fde(fde).is_mariadb else Flavour.MYSQL
        if theirs is not flavour:
            what = flavour.mismatch(theirs, "this archive")
            raise FatalUpstreamError(f"archive {files[i].path}: {what}")
        opened = flavour.decode_header(position, checksum)
        if state == opened:
            return i, 4  # the file as it is: the log's next segment mirrors it
        if state.covers(opened):
            return i, _first_lacking(files[i], state)
    raise FatalUpstreamError(f"the archive's oldest file {files[0].name} starts after "
                             f"transactions the relay log lacks (it holds {state or 'none'}): "
                             "the files that hold them are not in the archive")



def _first_lacking(f: ArchiveFile, state: GtidPosition) -> int:
    try:
        return first_lacking(f, state)
    except ArchiveError as exc:
        raise FatalUpstreamError(f"archive: {exc}") from None
