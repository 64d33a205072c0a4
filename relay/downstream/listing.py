"""SHOW BINLOG EVENTS over a relay log segment, in the columns and words a MariaDB primary
uses. Blocking (it reads the segment through a registered segment reader): callers run it
off the event loop.

A user with send rules sees what that user's dump would carry (`listing_for`): the stored
events run through the same chain (annotations and refused or dropped statements gone,
hidden tables' maps gone, renamed tables under their new names), each listed at the
position of the stored event it came from; a statement the rules refuse (on_statement =
"stop") ends the listing with the error the dump would stop with. The chain starts at the
first event of the transaction holding FROM (the GTID index says where), so a listing
from inside a transaction is judged with that transaction's table maps."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from relay.binlog.constants import FL_STANDALONE, HEADER_LEN, ROWS_EVENT_TYPES, EventType
from relay.binlog.events import Event, decode_fde, decode_gtid_list, decode_query, decode_rotate
from relay.binlog.position import Position
from relay.config import RulePoint
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
from relay.relaylog import gtid_index
from relay.relaylog.cursor import SegmentReader
from relay.relaylog.log import RelayLog
from relay.rules.runtime import Rules

if TYPE_CHECKING:
    from relay.rules.chain import Chain

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


def listing_for(log: RelayLog, rules: Rules, user: str, name: str, start: int, skip: int,
                count: int | None) -> Reply:
    """SHOW BINLOG EVENTS as `user` may see it: through the send chain a dump of that user
    runs (rules keyed by a replica's server_id are routing, not access: a listing names
    no server_id, so they do not apply). The chain's counts reach the rule totals, as a
    dump's do."""
    if not rules.has(RulePoint.SEND):
        return binlog_events(log, name, start, skip, count)
    handle = rules.chain(RulePoint.SEND, user)
    try:
        return binlog_events(log, name, start, skip, count, handle.chain or None)
    finally:
        rules.release(handle.chain)


def binlog_events(log: RelayLog, name: str, start: int, skip: int,
                  count: int | None, chain: Chain | None = None) -> Reply:
    """The listing of the stored events (`chain`: through those rules, see the module)."""
    if chain is not None:
        return _through_rules(log, name, start, skip, count, chain)
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


def transaction_start(log: RelayLog, name: str, start: int) -> int:
    """The first event of the transaction that holds `start` (`start` itself when the
    GTID index knows none around it): where a reader through send rules starts its
    engine, so that the rules see the transaction's table maps (this listing; a dump
    asked for a file/position inside a transaction). Blocking: it reads the index."""
    if start <= 4:
        return 4
    for entry in gtid_index.read_entries(log.path_of(name)):
        if entry.start <= start < entry.end:
            return entry.start
    return start


def _through_rules(log: RelayLog, name: str, start: int, skip: int, count: int | None,
                   chain: Chain) -> Reply:
    from relay.rules.engine import RuleStream  # (loaded only for users with send rules)

    engine = RuleStream(chain)
    rows: list[list[str | None]] = []
    checksum = False
    table_names: dict[int, str] = {}
    origin: dict[int, int] = {}  # end -> start of the stored events the engine may hold
    begin = transaction_start(log, name, start)
    try:
        with SegmentReader(log, name, reader="SHOW BINLOG EVENTS") as seg:
            if begin > 4:  # the format first: the engine's decoder needs it
                for offset, data in seg.events(4):
                    checksum = decode_fde(data).has_crc
                    engine.feed(data, Position(name, offset))
                    break
            done = False
            events = seg.events(begin)
            while not done:
                item = next(events, None)
                if item is None:
                    out = engine.flush()
                    done = True
                else:
                    offset, data = item
                    if data[4] == E.FORMAT_DESCRIPTION:
                        checksum = decode_fde(data).has_crc
                    origin[offset + len(data)] = offset
                    out = engine.feed(data, Position(name, offset))
                for ev in out:
                    server_id, size, log_pos = struct.unpack_from("<III", ev, 5)
                    # Each event the rules let out keeps the log_pos of the stored event it
                    # came from (one they made: of the event it stands for).
                    pos = origin.get(log_pos, log_pos - size)
                    if pos < start:
                        continue
                    if skip:
                        skip -= 1
                        continue
                    if count is not None and len(rows) >= count:
                        done = True
                        break
                    rows.append([name, str(pos), _NAMES.get(ev[4], f"Unknown({ev[4]})"),
                                 str(server_id), str(log_pos),
                                 _info(ev, checksum, table_names)])
                if not engine.in_transaction:
                    origin.clear()
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
