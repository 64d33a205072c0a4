"""SHOW BINLOG EVENTS over a relay log segment, in the columns and words a MariaDB primary
uses. Blocking (it reads the segment through a registered segment reader): callers run it
off the event loop."""

from __future__ import annotations

import struct

from relay.binlog.constants import FL_STANDALONE, HEADER_LEN, ROWS_EVENT_TYPES, EventType
from relay.binlog.events import Event, decode_fde, decode_gtid_list, decode_query, decode_rotate
from relay.downstream.replies import (
    NOT_NULL,
    T_LONG,
    UNSIGNED,
    Err,
    Reply,
    Rows,
    number_col,
    text_col,
)
from relay.errors import MalformedEvent, RelayError
from relay.relaylog.cursor import SegmentReader
from relay.relaylog.log import RelayLog

E = EventType
_NAMES: dict[int, str] = {
    E.FORMAT_DESCRIPTION: "Format_desc", E.GTID_LIST: "Gtid_list",
    E.BINLOG_CHECKPOINT: "Binlog_checkpoint", E.GTID: "Gtid", E.QUERY: "Query",
    E.ANNOTATE_ROWS: "Annotate_rows", E.TABLE_MAP: "Table_map", E.XID: "Xid",
    E.ROTATE: "Rotate", E.STOP: "Stop", E.INTVAR: "Intvar", E.RAND: "RAND",
    E.USER_VAR: "User var", E.WRITE_ROWS_V1: "Write_rows_v1",
    E.UPDATE_ROWS_V1: "Update_rows_v1", E.DELETE_ROWS_V1: "Delete_rows_v1",
    E.QUERY_COMPRESSED: "Query_compressed", E.XA_PREPARE: "XA_prepare",
    E.INCIDENT: "Incident",
}
COLUMNS = [
    text_col("Log_name", NOT_NULL), number_col("Pos", NOT_NULL | UNSIGNED, length=20),
    text_col("Event_type", NOT_NULL),
    number_col("Server_id", NOT_NULL | UNSIGNED, T_LONG, length=10),
    number_col("End_log_pos", NOT_NULL | UNSIGNED, length=20), text_col("Info", NOT_NULL),
]


def binlog_events(log: RelayLog, name: str, start: int, skip: int,
                  count: int | None) -> Reply:
    rows: list[list[str | None]] = []
    checksum = False
    table_names: dict[int, str] = {}
    try:
        with SegmentReader(log, name, reader="SHOW BINLOG EVENTS") as seg:
            if start > 4:  # the format first, for the checksum mode and post-header sizes
                for _offset, data in seg.events(4):
                    checksum = decode_fde(data).has_crc
                    break
            for offset, data in seg.events(start):
                if data[4] == E.FORMAT_DESCRIPTION:
                    checksum = decode_fde(data).has_crc
                if skip:
                    skip -= 1
                    continue
                if count is not None and len(rows) >= count:
                    break
                server_id, _size, log_pos = struct.unpack_from("<III", data, 5)
                rows.append([name, str(offset), _NAMES.get(data[4], f"Unknown({data[4]})"),
                             str(server_id), str(log_pos),
                             _info(data, checksum, table_names)])
    except (RelayError, MalformedEvent, OSError, ValueError) as exc:
        return Err(1220, f"Error when executing command SHOW BINLOG EVENTS: {exc}")
    return Rows([c.name for c in COLUMNS], rows, COLUMNS)


def _info(data: bytes, checksum: bool, table_names: dict[int, str]) -> str:
    typ = data[4]
    ev = Event(data, checksum)
    body = data[HEADER_LEN : len(data) - (4 if checksum else 0)]
    if typ == E.FORMAT_DESCRIPTION:
        return f"Server ver: {decode_fde(data).server_version}, Binlog ver: 4"
    if typ == E.GTID_LIST:
        return "[" + ",".join(str(g) for g in decode_gtid_list(ev)) + "]"
    if typ == E.BINLOG_CHECKPOINT:
        return body[4:].decode("utf-8", "replace")
    if typ == E.GTID and len(body) >= 13:
        seq, domain, flags = struct.unpack_from("<QIB", body, 0)
        server_id = struct.unpack_from("<I", data, 5)[0]
        gtid = f"{domain}-{server_id}-{seq}"
        return f"GTID {gtid}" if flags & FL_STANDALONE else f"BEGIN GTID {gtid}"
    if typ == E.QUERY:
        q = decode_query(ev)
        text = q.text.decode("utf-8", "replace")
        return f"use `{q.schema}`; {text}" if q.schema else text
    if typ == E.ANNOTATE_ROWS:
        return body.decode("utf-8", "replace")
    if typ == E.TABLE_MAP and len(body) >= 8:
        table_id = int.from_bytes(body[:6], "little")
        pos = 8
        db = body[pos + 1 : pos + 1 + body[pos]].decode("utf-8", "replace")
        pos += 2 + body[pos]
        table = body[pos + 1 : pos + 1 + body[pos]].decode("utf-8", "replace")
        table_names[table_id] = f"{db}.{table}"
        return f"table_id: {table_id} ({db}.{table})"
    if typ in ROWS_EVENT_TYPES and len(body) >= 8:
        table_id = int.from_bytes(body[:6], "little")
        flags = int.from_bytes(body[6:8], "little")
        return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & 1 else "")
    if typ == E.XID and len(body) >= 8:
        return f"COMMIT /* xid={struct.unpack_from('<Q', body, 0)[0]} */"
    if typ == E.ROTATE:
        r = decode_rotate(ev)
        return f"{r.next_file};pos={r.position}"
    return ""
