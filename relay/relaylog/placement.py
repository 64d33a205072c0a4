"""SegmentPlacement: where the relay log's segments start and end, decided from the events
that describe a source's binlog files (ROTATE, STOP, FORMAT_DESCRIPTION and the header
events after it), not from its transactions.

The policy belongs to the log, not to one writer of it: the upstream's ingest feeds it what
the primary sends, and a writer of archived binlog files feeds it the same events as each
file gives them. What it decides:

- A transaction after a header block continues the open segment when the source resumes
  the file the segment mirrors (a reconnect), and opens a segment otherwise: one whose
  header is the file's own when the source starts its file cleanly (so the segment stays
  byte-aligned with the file and no event needs rewriting), or the log's own position
  event followed by the file's Binlog_checkpoints when it does not (a start by GTID).
- A ROTATE that closes the source's file seals the segment; an artificial one (the source
  (re)starts describing a file) starts a header block, and a resume in a later file than
  the segment mirrors makes that file's transactions a segment of their own.
- A BINLOG_CHECKPOINT is kept where it came, as the source's file has it: between
  transactions, and at the head of a file, where a rotation under load writes two back to
  back.
- Names: a live primary's files become segments of the log's own names (the relay may
  start inside a file, and splits files by size); archived files keep their names
  (`SegmentNaming.SOURCE`), so a segment is its file and a replica asking for
  `mysql-bin.000042` at an offset gets that file's events from there.
"""

from __future__ import annotations

import logging
import struct
import time
from enum import Enum

from relay.binlog.constants import LOG_EVENT_ARTIFICIAL_F, EventType
from relay.binlog.events import Event, decode_fde, decode_rotate
from relay.errors import RemoteProtocolError
from relay.relaylog.appender import Appender

log = logging.getLogger("relay.relaylog")

# What a header block keeps (the file's GTID position events and checkpoints).
_HEADER_KEEP = frozenset({EventType.GTID_LIST, EventType.BINLOG_CHECKPOINT,
                          EventType.PREVIOUS_GTIDS})
_POSITION_EVENTS = frozenset({EventType.GTID_LIST, EventType.PREVIOUS_GTIDS})
_HDR = struct.Struct("<IBIIIH")  # timestamp, type, server_id, size, log_pos, flags
_POS = struct.Struct("<II")      # size, log_pos (at offset 9)


class SegmentNaming(Enum):
    OWN = "own"        # the log's base name, numbered in turn
    SOURCE = "source"  # each segment named as the source's file it holds


class SegmentPlacement:
    """A writer's view of the source's files, for placing segments. One per writer; the
    writer calls `file_event` for each event that describes a file and `place` before each
    transaction it appends."""

    def __init__(self, fde: bytes | None, checksum: bool,
                 naming: SegmentNaming = SegmentNaming.OWN) -> None:
        self.naming = naming
        self.fde = fde                   # the source file's FORMAT_DESCRIPTION
        self.checksum = checksum         # whether the source's events carry a CRC32
        # The header block since the source began describing a file (None: placed)
        self.headers: list[bytes] | None = None
        self._skipped = False            # the source skipped to a GTID position
        self._rotate_pending = False     # the next transaction starts a segment
        self.source_file: str | None = None   # the source's file being read (None: unknown)

    def reset(self) -> None:
        """The source's stream ended: a header block in progress is dropped."""
        self.headers = None
        self._skipped = False

    @property
    def pending(self) -> bool:
        """Whether a header block waits for its first transaction."""
        return self.headers is not None

    def file_event(self, w: Appender, data: bytes, typ: int, rotate_checksum: bool) -> None:
        """An event that describes a file (not a heartbeat); `rotate_checksum`: whether a
        ROTATE carries a CRC32 (an artificial one follows the session's agreement)."""
        flags = _HDR.unpack_from(data, 0)[5]
        log_pos = _HDR.unpack_from(data, 0)[4]
        if typ == EventType.ROTATE:
            rot = decode_rotate(Event(data, rotate_checksum))
            if flags & LOG_EVENT_ARTIFICIAL_F or log_pos == 0:
                # The source (re)starts describing a file: its header events follow.
                self.headers = []
                self._skipped = rot.position > 4
                if self.source_file not in (None, rot.next_file):
                    # A reconnect that resumes in a later file than the open segment
                    # follows (the link ended before that file's ROTATE came): that file's
                    # transactions go into a segment of their own, as from its ROTATE.
                    self._rotate_pending = True
                self.source_file = rot.next_file
                log.info("source streaming %s from position %d", rot.next_file, rot.position)
            else:
                # The source closed its file: so do we, and the next file's header comes.
                self._place_empty_file(w)
                self._rotate_pending = True
                self.source_file = rot.next_file
                w.seal(_HDR.unpack_from(data, 0)[0], next_name=self._name(),
                       closing=self._closing(data))
            return
        if typ == EventType.STOP:
            # The source's server stopped: its next file comes after a restart. A segment
            # that is the file ends with the STOP, as the file does.
            self._place_empty_file(w)
            self._rotate_pending = True
            if self.naming is SegmentNaming.SOURCE:
                w.seal(closing=data)
            return
        if typ == EventType.FORMAT_DESCRIPTION:
            self.fde = data
            self.checksum = decode_fde(data).has_crc
            if self.headers is None:
                self.headers = []
            self.headers.append(data)
            return
        if flags & LOG_EVENT_ARTIFICIAL_F:
            # The artificial GTID_LIST: the source skipped to our GTID position.
            self._skipped = True
            return
        if self.headers is not None and typ in _HEADER_KEEP:
            self.headers.append(data)
        elif typ == EventType.BINLOG_CHECKPOINT and not w.needs_segment:
            # Between transactions in the source's file, or after its header block (the
            # second of two a rotation under load writes back to back, once the previous
            # file's transactions are safe): kept where it came, so a segment that follows
            # the source's file stays byte-identical to it.
            w.append_standalone(data, log_pos)

    def before_transaction(self, w: Appender) -> None:
        """A transaction comes: its segment is placed first when one is due."""
        if self.headers is not None or w.needs_segment:
            self.place(w)

    def end_of_batch(self, w: Appender) -> None:
        """After a batch of events: an idle source's segment is opened now, so the log
        exists and shows where it starts, rather than at the first transaction; not
        before the file's GTID position event (a batch may end right after its
        FORMAT_DESCRIPTION)."""
        if self.headers is not None and w.needs_segment and self.fde is not None and (
                self._skipped or any(h[4] in _POSITION_EVENTS for h in self.headers)):
            self.place(w)

    def place(self, w: Appender) -> None:
        """First transaction after a header block: continue the open segment, or open one."""
        headers = self.headers or []
        self.headers = None
        fde = self.fde
        if fde is None:
            raise RemoteProtocolError("transaction before any FORMAT_DESCRIPTION event")
        if not w.needs_segment and not self._rotate_pending and _same_format(fde, w.fde):
            # A reconnect into the file we are already mirroring: keep appending. The
            # header events the source sent again are ours already, but for those that
            # came after the connection ended (the second of two Binlog_checkpoints at the
            # file's head): those follow at their offsets.
            if w.aligned:
                for ev in headers:
                    size, log_pos = _POS.unpack_from(ev, 9)
                    if ev[4] != EventType.FORMAT_DESCRIPTION and log_pos == w.end + size:
                        w.append_standalone(ev, log_pos)
            return
        if not w.needs_segment:
            w.seal(int(time.time()), next_name=self._name())
        self._rotate_pending = False
        clean = (not self._skipped and headers and headers[0][4] == EventType.FORMAT_DESCRIPTION
                 and _POS.unpack_from(headers[0], 9)[1] == 4 + len(headers[0]))
        if clean:
            w.new_segment(fde, headers[1:], name=self._name())
        else:
            # Not from the file's start (a start by GTID: the source sends the file from
            # past its GTID_LIST, or skips transactions): the log's own position event, then
            # the file's Binlog_checkpoints as they came (both, when a rotation under load
            # wrote two back to back).
            w.new_segment(fde, None, [h for h in headers
                                      if h[4] == EventType.BINLOG_CHECKPOINT],
                          name=self._name())

    def _place_empty_file(self, w: Appender) -> None:
        """A file with no transaction (its header, then its end) is a segment too, when
        segments are the source's files: its header is placed before its end."""
        if self.naming is SegmentNaming.SOURCE and self.headers is not None \
                and self.fde is not None and any(h[4] in _POSITION_EVENTS
                                                 for h in self.headers):
            self.place(w)

    def _closing(self, data: bytes) -> bytes | None:
        """The source's own closing event, for a segment that is the source's file."""
        return data if self.naming is SegmentNaming.SOURCE else None

    def _name(self) -> str | None:
        """The next segment's name: the source's file's (SOURCE), or the log's next."""
        return self.source_file if self.naming is SegmentNaming.SOURCE else None


def _same_format(a: bytes, b: bytes | None) -> bool:
    if b is None:
        return False
    fa, fb = decode_fde(a), decode_fde(b)
    return (fa.checksum_alg == fb.checksum_alg and fa.post_header_lens == fb.post_header_lens
            and fa.server_version == fb.server_version)
