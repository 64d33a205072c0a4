"""Scanning a binlog file's events for where its complete transactions end.

`FileScan` takes a file's events in order and keeps: the committed end (after the last
event that closed a transaction or stood between transactions), the GTID position there
(the file's opening GTID_LIST / PREVIOUS_GTIDS plus every transaction committed since),
the FORMAT_DESCRIPTION in force, whether the file ended (a ROTATE or STOP), and, when asked,
where each transaction starts and ends. Recovery rebuilds the relay log's state with it,
and a reader of a growing file (a server's or the relay's) reads up to `committed` only.
Sans-I/O: the caller reads the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from relay.binlog.constants import LOG_EVENT_ARTIFICIAL_F, NON_GROUP_TYPES, EventType
from relay.binlog.events import decode_fde
from relay.binlog.flavour import header_position
from relay.binlog.group import GroupTracker
from relay.binlog.gtid import GtidPosition, GtidState, TxnId

E = EventType


@dataclass(frozen=True)
class Committed:
    """One complete transaction of the file: its id (None: anonymous) and byte range."""

    txn: TxnId | None
    start: int
    end: int


class FileScan:
    def __init__(self, *, start: int = 4, checksum: bool = False,
                 keep_transactions: bool = False) -> None:
        self.committed = start
        self.fde: bytes | None = None
        self.checksum = checksum
        self.state: GtidPosition = GtidState()
        self.sealed = False
        self.transactions: list[Committed] | None = [] if keep_transactions else None
        self._tracker = GroupTracker()
        self._group_start = start
        self._header_seen = False

    @property
    def in_group(self) -> bool:
        return self._tracker.in_group

    def feed(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """The event at `offset`; events come in file order."""
        tracker = self._tracker
        end = offset + len(data)
        if tracker.in_group:
            if tracker.feed(data, self.checksum):
                txn = tracker.txn
                if txn is not None:
                    self.state.update(txn)
                if self.transactions is not None:
                    self.transactions.append(Committed(txn, self._group_start, end))
                self.committed = end
            return
        typ = data[4]
        if typ in NON_GROUP_TYPES:
            if typ == E.FORMAT_DESCRIPTION:
                self.fde = bytes(data)
                self.checksum = decode_fde(self.fde).has_crc
            elif typ in (E.GTID_LIST, E.PREVIOUS_GTIDS) and not self._header_seen:
                flags = struct.unpack_from("<H", data, 17)[0]
                if not flags & LOG_EVENT_ARTIFICIAL_F:
                    self.state = _opening_position(bytes(data), self.checksum)
                    self._header_seen = True
            self.sealed = typ in (E.ROTATE, E.STOP)  # (a STOP ends an imported file)
            self.committed = end
            return
        self._group_start = offset
        self.sealed = False
        if tracker.feed(data, self.checksum):  # a one-event group cannot happen; be safe
            self.committed = end


def _opening_position(data: bytes, checksum: bool) -> GtidPosition:
    return header_position(data, checksum)
