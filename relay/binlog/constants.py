"""Event type codes and header flags of MariaDB and MySQL binlogs (v4)."""

from __future__ import annotations

import enum
from enum import IntEnum

HEADER_LEN = 19
CRC_LEN = 4
BINLOG_MAGIC = b"\xfebin"


class EventType(IntEnum):
    UNKNOWN = 0
    START_V3 = 1
    QUERY = 2
    STOP = 3
    ROTATE = 4
    INTVAR = 5
    LOAD = 6
    SLAVE = 7
    CREATE_FILE = 8
    APPEND_BLOCK = 9
    EXEC_LOAD = 10
    DELETE_FILE = 11
    NEW_LOAD = 12
    RAND = 13
    USER_VAR = 14
    FORMAT_DESCRIPTION = 15
    XID = 16
    BEGIN_LOAD_QUERY = 17
    EXECUTE_LOAD_QUERY = 18
    TABLE_MAP = 19
    PRE_GA_WRITE_ROWS = 20
    PRE_GA_UPDATE_ROWS = 21
    PRE_GA_DELETE_ROWS = 22
    WRITE_ROWS_V1 = 23
    UPDATE_ROWS_V1 = 24
    DELETE_ROWS_V1 = 25
    INCIDENT = 26
    HEARTBEAT = 27
    IGNORABLE = 28
    ROWS_QUERY = 29
    WRITE_ROWS_V2 = 30
    UPDATE_ROWS_V2 = 31
    DELETE_ROWS_V2 = 32
    MYSQL_GTID = 33
    ANONYMOUS_GTID = 34
    PREVIOUS_GTIDS = 35
    TRANSACTION_CONTEXT = 36
    VIEW_CHANGE = 37
    XA_PREPARE = 38
    PARTIAL_UPDATE_ROWS = 39
    TRANSACTION_PAYLOAD = 40
    HEARTBEAT_V2 = 41
    GTID_TAGGED = 42
    ANNOTATE_ROWS = 160
    BINLOG_CHECKPOINT = 161
    GTID = 162
    GTID_LIST = 163
    START_ENCRYPTION = 164
    QUERY_COMPRESSED = 165
    WRITE_ROWS_COMPRESSED_V1 = 166
    UPDATE_ROWS_COMPRESSED_V1 = 167
    DELETE_ROWS_COMPRESSED_V1 = 168
    WRITE_ROWS_COMPRESSED = 169
    UPDATE_ROWS_COMPRESSED = 170
    DELETE_ROWS_COMPRESSED = 171


def type_name(code: int) -> str:
    try:
        return EventType(code).name
    except ValueError:
        return f"TYPE_{code}"


# Header flags
LOG_EVENT_BINLOG_IN_USE_F = 0x0001
LOG_EVENT_THREAD_SPECIFIC_F = 0x0004
LOG_EVENT_SUPPRESS_USE_F = 0x0008
LOG_EVENT_ARTIFICIAL_F = 0x0020
LOG_EVENT_RELAY_LOG_F = 0x0040
LOG_EVENT_IGNORABLE_F = 0x0080
LOG_EVENT_SKIP_REPLICATION_F = 0x8000

# MariaDB GTID_EVENT flags2
FL_STANDALONE = 0x01
FL_GROUP_COMMIT_ID = 0x02
FL_TRANSACTIONAL = 0x04
FL_ALLOW_PARALLEL = 0x08
FL_WAITED = 0x10
FL_DDL = 0x20
FL_PREPARED_XA = 0x40
FL_COMPLETED_XA = 0x80

# Rows event flags
STMT_END_F = 0x0001

ROWS_EVENT_TYPES = frozenset({
    EventType.WRITE_ROWS_V1, EventType.UPDATE_ROWS_V1, EventType.DELETE_ROWS_V1,
    EventType.WRITE_ROWS_V2, EventType.UPDATE_ROWS_V2, EventType.DELETE_ROWS_V2,
    EventType.PARTIAL_UPDATE_ROWS,
    EventType.WRITE_ROWS_COMPRESSED_V1, EventType.UPDATE_ROWS_COMPRESSED_V1,
    EventType.DELETE_ROWS_COMPRESSED_V1, EventType.WRITE_ROWS_COMPRESSED,
    EventType.UPDATE_ROWS_COMPRESSED, EventType.DELETE_ROWS_COMPRESSED,
})

# Events that may appear between groups only (never inside a transaction).
NON_GROUP_TYPES = frozenset({
    EventType.FORMAT_DESCRIPTION, EventType.ROTATE, EventType.STOP, EventType.HEARTBEAT,
    EventType.HEARTBEAT_V2, EventType.BINLOG_CHECKPOINT, EventType.GTID_LIST,
    EventType.START_ENCRYPTION, EventType.PREVIOUS_GTIDS,
})


class RowKind(enum.StrEnum):
    """What a rows event does to its rows. A `str` (StrEnum): it equals, hashes and prints
    as its value, so code and user hooks that compare it with "insert" keep working."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
