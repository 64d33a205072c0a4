"""The flavour of a server and of the relay log that follows it: MariaDB or MySQL.

One relay follows one flavour, detected from its upstream (the server's version) or from a
binlog (its FORMAT_DESCRIPTION), and fixed for its relay log. What differs between the two
is asked of the flavour, not switched on where it is used: the GTID position type and its
text, the event a binlog file opens with (GTID_LIST, PREVIOUS_GTIDS) and its decoding, the
variable that holds a server's executed transactions, the words its users know it by.
Everything else that holds a position types it as `GtidPosition` (gtid.py).
"""

from __future__ import annotations

import uuid
from enum import Enum

from relay.binlog.constants import EventType
from relay.binlog.events import Event, decode_gtid_list
from relay.binlog.gtid import GtidPosition, GtidSet, GtidState


class Flavour(Enum):
    MARIADB = "mariadb"
    MYSQL = "mysql"

    @classmethod
    def of_version(cls, version: str) -> Flavour:
        """A server's flavour from its version string (`10.11.9-MariaDB-log`, `9.7.4`)."""
        return cls.MARIADB if "mariadb" in version.lower() else cls.MYSQL

    @classmethod
    def of_position(cls, position: GtidPosition) -> Flavour:
        return cls.MARIADB if isinstance(position, GtidState) else cls.MYSQL

    @classmethod
    def of_header(cls, type_code: int) -> Flavour:
        """The flavour of a binlog file that opens with this event type."""
        return cls.MARIADB if type_code == EventType.GTID_LIST else cls.MYSQL

    @property
    def label(self) -> str:
        return "MariaDB" if self is Flavour.MARIADB else "MySQL"

    def empty(self) -> GtidPosition:
        return GtidState() if self is Flavour.MARIADB else GtidSet()

    def parse(self, text: str) -> GtidPosition:
        """A position in this flavour's text: `0-1-100,1-2-5` or `uuid:1-100,uuid:7`.
        Raises ValueError naming the form expected."""
        return GtidState.parse(text) if self is Flavour.MARIADB else GtidSet.parse(text)

    @property
    def header_event(self) -> EventType:
        """The event a binlog file opens with: what was executed before the file."""
        return EventType.GTID_LIST if self is Flavour.MARIADB else EventType.PREVIOUS_GTIDS

    def decode_header(self, data: bytes, checksum: bool) -> GtidPosition:
        """The position a header event (`data`, a whole GTID_LIST or PREVIOUS_GTIDS event)
        holds."""
        ev = Event(data, checksum)
        if self is Flavour.MARIADB:
            return GtidState(decode_gtid_list(ev))
        return GtidSet.decode(ev.body)

    @property
    def executed_variable(self) -> str:
        """The server variable naming the transactions in its binlog."""
        return "gtid_binlog_pos" if self is Flavour.MARIADB else "gtid_executed"

    def mismatch(self, other: Flavour, what: str) -> str:
        """The words of a refusal: `what` is of flavour `other`, this log is of `self`."""
        return (f"this relay follows a {self.label} primary and its relay log holds "
                f"{self.label} GTIDs; {what} is {other.label}'s (a {other.label} client or "
                f"position cannot be served by a {self.label} relay)")


def relay_server_uuid(server_id: int) -> str:
    """The relay's own server_uuid (MySQL): what it tells a MySQL primary as @replica_uuid
    (a primary ends an older dump with the same one) and what its MySQL replicas read as
    @@server_uuid (they refuse a source with their own). Stable per server_id."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"relay.server_id.{server_id}"))


def header_position(data: bytes, checksum: bool) -> GtidPosition:
    """The position of a binlog file's header event, whichever flavour it is."""
    return Flavour.of_header(data[4]).decode_header(data, checksum)
