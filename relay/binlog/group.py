"""Transaction (event-group) boundaries, MariaDB and MySQL.

A MariaDB group starts at GTID (162) and ends at XID, at a QUERY `COMMIT`/`ROLLBACK`
(non-transactional engines), at XA_PREPARE or an `XA COMMIT/ROLLBACK` query, or, for a
STANDALONE GTID (DDL), at the first QUERY/INCIDENT. MySQL: GTID/ANONYMOUS_GTID, then
either a DDL QUERY (not BEGIN), or BEGIN ... XID/COMMIT, or one TRANSACTION_PAYLOAD.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from relay.binlog.constants import FL_STANDALONE, EventType
from relay.binlog.events import query_text
from relay.binlog.gtid import Gtid
from relay.errors import MalformedEvent

_END_QUERIES = (b"COMMIT", b"ROLLBACK")
_XA_END = (b"XA COMMIT", b"XA ROLLBACK")


def query_ends_group(text: bytes) -> bool:
    t = text.strip().rstrip(b";").upper()
    return t in _END_QUERIES or t.startswith(_XA_END)


@dataclass
class GroupTracker:
    """Feed events in order; `feed` returns True when the event closed a group.

    `gtid` is the MariaDB GTID of the open (or just closed) group; MySQL groups carry None.
    """

    in_group: bool = False
    standalone: bool = False
    mysql_first_query: bool = False
    gtid: Gtid | None = None

    def feed(self, data: bytes | memoryview, checksum: bool) -> bool:
        typ = data[4]
        if typ == EventType.GTID:
            if len(data) < 19 + 13:
                raise MalformedEvent(f"GTID event of {len(data)} bytes is too short")
            seq, domain, flags2 = struct.unpack_from("<QIB", data, 19)
            server_id = struct.unpack_from("<I", data, 5)[0]
            self.gtid = Gtid(domain, server_id, seq)
            self.in_group = True
            self.standalone = bool(flags2 & FL_STANDALONE)
            self.mysql_first_query = False
            return False
        if typ in (EventType.MYSQL_GTID, EventType.ANONYMOUS_GTID, EventType.GTID_TAGGED):
            self.gtid = None
            self.in_group = True
            self.standalone = False
            self.mysql_first_query = True
            return False
        if not self.in_group:
            return False
        if typ == EventType.XID or typ == EventType.XA_PREPARE:
            return self._close()
        if typ == EventType.TRANSACTION_PAYLOAD or typ == EventType.INCIDENT:
            return self._close()
        if typ == EventType.QUERY or typ == EventType.QUERY_COMPRESSED:
            if self.standalone:
                return self._close()
            text = query_text(data, checksum) if typ == EventType.QUERY else b""
            if self.mysql_first_query:
                self.mysql_first_query = False
                if text.strip().upper() != b"BEGIN":
                    return self._close()  # MySQL DDL: GTID + one QUERY
                return False
            if query_ends_group(text):
                return self._close()
            return False
        self.mysql_first_query = False
        return False

    def _close(self) -> bool:
        self.in_group = False
        self.standalone = False
        return True
