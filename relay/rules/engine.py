"""RuleStream: one stream's events through a rule chain, keeping the stream valid.

Feed events in order; get back the events to write, with their sizes and checksums
right (each keeps its original `log_pos`: the writer places it). What holds:

- A transaction whose events are all dropped still goes out as an empty transaction
  with its GTID (GTID + XID), so a replica in GTID strict mode sees no gap.
- A statement whose last rows event is dropped still ends: the end-of-statement flag
  moves to the last kept rows event. To know which that is, the last kept rows event is
  held back until the next event shows it; table maps and annotations are held until a
  rows event of theirs is kept, and vanish with their statement otherwise. So at most
  one statement's prologue and one rows event are ever held.
- Groups open and close where `relay.binlog.group.GroupTracker` says, as for every other
  reader of a stream; a dropped statement that was its group's only one (a standalone
  DDL) leaves its GTID with an XID in its place.
- Table decisions are made once per table map; rows are decoded only for rules that
  read them (masks, hooks).
- `feed_chunk` passes a whole transaction the chain leaves as it is (every table kept
  under its name, no rule reading its rows, no statement to judge) as one slice, with no
  per-event work: the common case of a filter that keeps most traffic stays close to the
  pass-through path. A run of such MariaDB transactions is found by a kernel
  (relay/kernels `scan_clean`, compiled) that calls back only for each table map, and
  goes out as one slice. A chain that drops annotations (masks, filters, hooks: compile.py
  says why) still takes it: the transaction goes out as the slices between them.
- What the rules decide holds for every byte that goes out, not only rows events:
  annotations as the chain says; statements (QUERY, QUERY_COMPRESSED decompressed, LOAD
  DATA's EXECUTE_LOAD_QUERY) through every rule, with the INTVAR/RAND/USER_VAR events
  that feed them going out only with them; LOAD DATA's file (BEGIN_LOAD_QUERY,
  APPEND_BLOCK) held until its statement names the table where a rule needs that
  (Rule.holds_load_files; up to LOAD_HOLD_LIMIT, past which the rules judge it as a
  statement whose table is unknown), elsewhere sent as it comes, with a DELETE_FILE in
  the place of a statement the rules drop; a MySQL TRANSACTION_PAYLOAD's events inflated
  one at a time and judged one by one, the payload sent as stored when the rules change
  none of them and packed again from what they let out otherwise. Events of a
  transaction met outside one (a stream started inside a transaction, or one without
  GTID events) open a group of their own: their rows are judged too, and a rows event
  whose TABLE_MAP the stream never showed stops it (a dump or listing from inside a
  transaction starts the engine at the transaction's first event instead).
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relay.binlog import build, walk
from relay.binlog.constants import (
    CRC_LEN,
    FL_DDL,
    FL_STANDALONE,
    HEADER_LEN,
    NON_GROUP_TYPES,
    STMT_END_F,
    EventType,
    RowKind,
)
from relay.binlog.decoder import StreamDecoder
from relay.binlog.group import CAN_CLOSE, GROUP_START, GroupTracker, query_ends_group
from relay.binlog.gtid import Gtid
from relay.binlog.header import HEADER
from relay.binlog.position import Position
from relay.binlog.rows import ROWS_TYPES, RowData, RowsEvent
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.config import OnError
from relay.errors import HookError, MalformedEvent
from relay.kernels import scan_clean, splice_rows
from relay.kernels.protocol import CleanKind, Replacer, SpliceMode
from relay.kernels.pure import PREFIXED
from relay.rules.chain import Chain, Outcome, QueryWork, RowsWork, Rule, StatementRefused
from relay.rules.mask import ColumnMask, MaskError
from relay.rules.payload import Packer, inner_events

E = EventType
KEPT, CHANGED, DROPPED = Outcome.KEPT, Outcome.CHANGED, Outcome.DROPPED
# Per-event type tests as plain ints: an enum member is a class attribute lookup (about
# 80 ns) where a global int is a cached load.
_STATEMENT_CONTEXT = frozenset(map(int, (E.INTVAR, E.RAND, E.USER_VAR)))
_GTID = int(E.GTID)
_TABLE_MAP = int(E.TABLE_MAP)
_XID = int(E.XID)
_QUERY = int(E.QUERY)
_QUERY_COMPRESSED = int(E.QUERY_COMPRESSED)
_PAYLOAD = int(E.TRANSACTION_PAYLOAD)
_ANNOTATIONS = frozenset(map(int, (E.ANNOTATE_ROWS, E.ROWS_QUERY)))
# What each type is to the scan kernel for untouched transactions (relay/kernels).
_MYSQL_GTIDS = frozenset(map(int, (E.MYSQL_GTID, E.ANONYMOUS_GTID, E.GTID_TAGGED)))
# Rows events whose rows splice_rows does not take (compressed; MySQL's partial JSON).
_NOT_SPLICED = frozenset(map(int, (E.PARTIAL_UPDATE_ROWS, E.WRITE_ROWS_COMPRESSED_V1,
                                   E.UPDATE_ROWS_COMPRESSED_V1, E.DELETE_ROWS_COMPRESSED_V1,
                                   E.WRITE_ROWS_COMPRESSED, E.UPDATE_ROWS_COMPRESSED,
                                   E.DELETE_ROWS_COMPRESSED)))
_OPENERS = frozenset({_GTID, *_MYSQL_GTIDS})
_CLEAN_KINDS = bytes(CleanKind.GTID if t == _GTID else CleanKind.MYSQL_GTID if t in _MYSQL_GTIDS
                     else CleanKind.QUERY if t == _QUERY
                     else CleanKind.TABLE_MAP if t == _TABLE_MAP
                     else CleanKind.ROWS if t in ROWS_TYPES
                     else CleanKind.ANNOTATION if t in _ANNOTATIONS
                     else CleanKind.XID if t == _XID else CleanKind.OTHER for t in range(256))
# LOAD DATA: the file's bytes, then the statement (EXECUTE_LOAD_QUERY) naming the table;
# DELETE_FILE when the server gave up on it. The formats before MySQL 5.0 (LOAD,
# CREATE_FILE, EXEC_LOAD, NEW_LOAD) are judged as statements whose table is unknown.
_LOAD_BLOCKS = frozenset(map(int, (E.BEGIN_LOAD_QUERY, E.APPEND_BLOCK)))
_EXECUTE_LOAD = int(E.EXECUTE_LOAD_QUERY)
_DELETE_FILE = int(E.DELETE_FILE)
_OLD_LOAD = frozenset(map(int, (E.LOAD, E.CREATE_FILE, E.EXEC_LOAD, E.NEW_LOAD)))
# The events that belong inside a transaction: met outside one, they open a group.
_CONTENT = frozenset({_TABLE_MAP, _QUERY, _QUERY_COMPRESSED, _PAYLOAD, _EXECUTE_LOAD,
                      _DELETE_FILE, *ROWS_TYPES, *_ANNOTATIONS, *_STATEMENT_CONTEXT,
                      *_LOAD_BLOCKS, *_OLD_LOAD})
# Distinct table maps a stream keeps judged for scan_clean (past it, it starts again).
_UNTOUCHED_LIMIT = 4096
# LOAD DATA's file held per stream until its statement comes (past it, the rules judge
# the statement as one whose table is unknown: a mask or filter stops or drops it).
LOAD_HOLD_LIMIT = 16 << 20
_FRAMING = (b"BEGIN", b"COMMIT", b"ROLLBACK")
_DDL_WORDS = frozenset({"CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"})
# Statements that change accounts or maintain tables: not data (MariaDB's GTID flags
# them DDL; MySQL's carry no flag).
_ADMIN_WORDS = frozenset({"GRANT", "REVOKE", "FLUSH", "ANALYZE", "OPTIMIZE", "REPAIR",
                          "INSTALL", "UNINSTALL"})
_ACCOUNT_SET = re.compile(rb"SET\s+(?:PASSWORD|ROLE|DEFAULT\s+ROLE)\b", re.IGNORECASE)
# Whitespace and comments before a statement's first word (not the executable /*! */).
_LEAD = re.compile(rb"(?:\s+|/\*(?![!M]).*?\*/|(?:--\s|#)[^\n]*(?:\n|$))*", re.DOTALL)
_WORD = re.compile(rb"[A-Za-z_]+")
# What a LOAD DATA in progress does with its blocks: none yet, pass them (the rules kept
# a file too large to hold), drop them, or pass them unjudged (a chain that holds none).
_NONE, _PASSING, _DROPPING, _SENT = 0, 1, 2, 3


def _split_query(body: bytes, position: Position, post: int = 13) -> tuple[int, bytes, bytes]:
    """A QUERY body's parts (or an EXECUTE_LOAD_QUERY's, whose post-header is `post`
    bytes): where its status variables end, its default schema and its statement text
    (both raw)."""
    if len(body) < post:
        raise MalformedEvent("QUERY event too short", where=position.file,
                             offset=position.offset)
    db_len = body[8]
    start = post + int.from_bytes(body[11:13], "little")
    if start + db_len + 1 > len(body):
        raise MalformedEvent("QUERY event ends inside its status variables or schema",
                             where=position.file, offset=position.offset)
    return start, body[start : start + db_len], body[start + db_len + 1 :]


def _first_word(text: bytes) -> bytes:
    return text.lstrip().split(None, 1)[0].upper() if text.strip() else b""


def _statement_word(text: bytes) -> str:
    """A statement's first word, upper-cased, after whitespace and comments ("" when it
    starts otherwise: an executable comment, a parenthesis)."""
    m = _WORD.match(text, _LEAD.match(text).end())  # type: ignore[union-attr]  # (* matches)
    return m.group().decode().upper() if m else ""


def _is_data(verb: str, text: bytes) -> bool:
    """Whether a statement that is not DDL may change rows (account statements do not)."""
    return verb not in _ADMIN_WORDS and not (verb == "SET" and _ACCOUNT_SET.match(
        text, _LEAD.match(text).end()))  # type: ignore[union-attr]


def _move_file_name(body: bytearray, old: bytes, new: bytes, position: Position) -> None:
    """An EXECUTE_LOAD_QUERY's text replaced (a hook's tag): its file name's offsets
    (post-header bytes 17-24) follow the name to where it is in the new text."""
    start, end = struct.unpack_from("<II", body, 17)
    name = old[start:end]
    at = new.find(name) if name and end <= len(old) else -1
    if at < 0:
        raise HookError("rules", str(position), "a LOAD DATA statement's new text must keep "
                        "its file name as it was")
    struct.pack_into("<II", body, 17, at, at + len(name))


def _framing(text: bytes) -> bool:
    """Transaction framing (BEGIN, COMMIT, XA ..., SAVEPOINT ...): kept as it is."""
    return _first_word(text) in _FRAMING or text.strip().upper().startswith(
        (b"XA ", b"SAVEPOINT"))




class _DoesNotFit(Exception):
    """A masked value that its column cannot hold (raised from within splice_rows; its
    cause is the codec's error)."""


class _Undecodable(Exception):
    """A masked value that does not decode (raised from within splice_rows; its cause is
    the codec's error): the event is malformed."""


# splice_rows' arguments for one table's images: (layout, modes) and replacers per image,
# and the flag its replacers set when a value changes (as values: the count's measure).
_SpliceArgs = tuple[list[tuple[bytes, bytes]], list[tuple["Replacer | None", ...]],
                    list[bool]]
_SPLICES_LIMIT = 256  # sets of images a table keeps splice arguments for
_UNSEEN: Any = object()  # (a _TableResult's masking or splice not worked out yet)


@dataclass
class _TableResult:
    table: TableMap                  # as the decoder gave it (kept alive: ids are keys)
    out: TableMap                    # as the table-stage rules leave it
    outcomes: list[Outcome]          # per rule, for rows of this table
    dropped_at: int | None           # the rule that drops the table, if any
    per_event: bool                  # a rule must look at each rows event
    changed_at: tuple[int, ...] = ()  # the rules that changed the table (renames)
    # The table as each rule (by id) saw it, up to a drop: made once per table map,
    # handed to every rows event's RowsWork.
    seen: dict[int, TableMap] = field(default_factory=dict)
    # Masks on stored bytes (_masked_in_place), worked out at the first rows event: the
    # one rule that masks (False: none; None: the rows are decoded whole), and
    # splice_rows' arguments per set of images.
    masking: Any = _UNSEEN
    splices: dict[tuple[tuple[int, ...], ...], _SpliceArgs | None] = field(
        default_factory=dict)


class _Group:
    """What the rules need of the open group (its boundaries: the GroupTracker's)."""

    __slots__ = ("ddl", "gtid", "gtid_sent", "gtid_text", "headless", "server_id",
                 "timestamp")

    def __init__(self, gtid: bytes | None = None) -> None:
        self.gtid = gtid                 # held until something of the group goes out
        self.gtid_sent = False
        self.headless = False            # opened by an event inside it (no GTID seen)
        self.ddl = False
        self.gtid_text: str | None = None   # MariaDB's GTID, for hooks
        self.server_id = 0
        self.timestamp = 0               # header seconds


class _Statement:
    __slots__ = ("annotation", "held_rows", "maps", "maps_sent", "open", "prologue",
                 "sent_maps")

    def __init__(self) -> None:
        self.prologue: list[bytes] = []          # annotations, INTVAR, ... held
        self.annotation: str | None = None
        self.maps: dict[int, bytes] = {}         # held table maps by id
        self.sent_maps: dict[int, str] = {}      # id -> the name it went out under
        self.held_rows: bytes | None = None
        self.open = False                # a rows event without STMT_END_F went by
        self.maps_sent = False           # the held maps went out (a rows event was kept)


class RuleStream:
    def __init__(self, chain: Chain, *, hints: TypeHints = NO_HINTS) -> None:
        self.chain = chain
        self.decoder = StreamDecoder(hints)
        self._tables: dict[int, _TableResult] = {}
        # scan_clean's table maps judged untouched (body -> table id), for this chain and
        # the FORMAT_DESCRIPTION they were judged under: most repeat in every transaction.
        self._untouched: dict[bytes, int] = {}
        self._untouched_under: object = None
        self._tracker = GroupTracker()   # where groups open and close
        self._group = _Group()
        self._stmt = _Statement()
        self._out: list[bytes] = []
        self._id_size = 6
        self._load: list[bytes] = []     # LOAD DATA's file, held until its statement
        self._load_bytes = 0
        self._load_mode = _NONE
        # What feed_chunk had made ready when a rule stopped the stream: the client gets
        # the events before the one that stopped it, then the error.
        self.partial: list[bytes] = []

    @property
    def in_transaction(self) -> bool:
        return self._tracker.in_group

    def set_chain(self, chain: Chain) -> None:
        """Another chain from the next event on; call between transactions only."""
        self.chain = chain
        self._tables.clear()
        self._untouched.clear()

    # --- the entry point ------------------------------------------------------------------

    def feed(self, data: bytes, position: Position) -> list[bytes]:
        """One event in; the events ready to go out (possibly none, possibly several)."""
        out = self._out = []
        self._feed_event(data, position)
        return out

    def _feed_event(self, data: bytes, position: Position) -> None:
        typ = data[4]
        tracker = self._tracker
        if typ in GROUP_START:
            self._end_group()
            tracker.feed(data, self.decoder.checksum)
            self._start_group(data)
            return
        if typ in NON_GROUP_TYPES or (not tracker.in_group and typ not in _CONTENT):
            self._end_group()
            if typ == E.FORMAT_DESCRIPTION:
                self.decoder.format_description(data)
                self._tables.clear()
                self._id_size = 4 if self.decoder.post_header_len(E.WRITE_ROWS_V1) == 6 else 6
            self._out.append(data)
            return
        if not tracker.in_group:
            self._open_headless(data, position)
        if typ == _TABLE_MAP:
            self._table_map(data)
        elif typ in ROWS_TYPES:
            self._rows(data, position)
        elif typ == _QUERY:
            self._query(data, position)
        elif typ in _ANNOTATIONS:
            self._annotation(data)
        elif typ in _STATEMENT_CONTEXT:
            self._stmt.prologue.append(data)
        elif typ == _QUERY_COMPRESSED:
            plain = self.decoder.uncompressed_query(data)  # (no CRC)
            self._query(build.reframe(plain, self.decoder.checksum, body=plain[HEADER_LEN:]),
                        position, original=data)
        elif typ in _LOAD_BLOCKS:
            self._load_block(data, position)
        elif typ == _EXECUTE_LOAD:
            self._query(data, position, load=True)
        elif typ == _DELETE_FILE:
            self._delete_file(data)
        elif typ == _PAYLOAD and self.chain.rules:
            self._payload(data, position)
        elif typ in _OLD_LOAD and self.chain.judges_statements:
            self._old_load(data, position)
        else:  # XID, XA_PREPARE, INCIDENT, events we do not look into: as they are, ending
            # the group where the tracker says so
            closes = typ in CAN_CLOSE and tracker.feed(data, self.decoder.checksum)
            self._finish_statement()
            self._emit(data)
            if closes:
                self._close_group()

    def _open_headless(self, data: bytes, position: Position) -> None:
        """An event of a transaction outside one: a group opens at it (standalone when it
        is a statement other than BEGIN or XA START, as GroupTracker reads such streams)."""
        typ = data[4]
        standalone = typ == _QUERY_COMPRESSED
        if typ == _QUERY:
            _, _, text = _split_query(self.decoder.body(data), position)
            word = text.strip().upper()
            standalone = word != b"BEGIN" and not word.startswith(b"XA START")
        self._tracker.begin_without_gtid(standalone=standalone)
        g = _Group()
        g.headless = True
        ts, _typ, server_id = HEADER.unpack_from(data, 0)[:3]
        g.server_id = server_id
        g.timestamp = ts
        self._group = g
        self._stmt = _Statement()
        self._reset_load()

    def feed_chunk(self, chunk: bytes, segment: str, offset: int,
                   boundary: Callable[[], None] | None = None) -> list[bytes]:
        """The whole events of `chunk` (read at `offset` of `segment`) in; what goes out, as
        pieces of one or more whole events. `boundary` runs between transactions (where a
        new chain may take over)."""
        out: list[bytes] = []
        self.partial = []
        try:
            self._feed_chunk(chunk, segment, offset, boundary, out)
        except HookError:
            self.partial = out
            raise
        return out

    def _feed_chunk(self, chunk: bytes, segment: str, offset: int,
                    boundary: Callable[[], None] | None, out: list[bytes]) -> None:
        tracker = self._tracker
        n = len(chunk)
        pos = 0
        while pos < n:
            if not tracker.in_group:
                if boundary is not None:
                    boundary()
                if n - pos > 4 and chunk[pos + 4] in _OPENERS:
                    end = self._clean_run(chunk, pos, segment, offset, out) or (
                        chunk[pos + 4] == _GTID
                        and self._clean_transaction(chunk, pos, segment, offset, out))
                    if end:
                        pos = end
                        continue
            # Event by event, up to the end of the next group (or one event between groups).
            stop = pos
            for start, size in walk.spans(chunk, pos, where=segment, base=offset):
                stop = start + size
                out += self.feed(chunk[start:stop], Position(segment, offset + start))
                if not tracker.in_group:
                    break
            if stop == pos:
                raise MalformedEvent("an event runs past the end of its chunk", where=segment,
                                     offset=offset + pos)
            pos = stop

    def _clean_run(self, chunk: bytes, start: int, segment: str, offset: int,
                   out: list[bytes]) -> int:
        """The end of the run of MariaDB transactions from `start` that the chain leaves as
        they are (the scan kernel walks them; each distinct table map is judged here once,
        and one the kernel finds judged is not remembered by the decoder again: the rows
        events of a clean transaction are never decoded): they go to `out` as one piece,
        without its annotations when the chain drops them. 0 when not even
        the first is such a one (the caller looks at it with _clean_transaction or event
        by event, which also raises what judging its tables raises). A rules reload takes
        effect after the run, within the chunk; each transaction is judged by one chain."""
        decoder = self.decoder

        def table_map(pos: int, end: int) -> int:
            try:
                tid = decoder.remember_table_map(chunk[pos:end])
                res = self._table_result(decoder.table(tid), Position(segment, offset + pos))
            except (HookError, MalformedEvent):
                return -1  # (raised again where the transaction is looked at itself)
            if res.dropped_at is not None or res.per_event or res.out is not res.table:
                return -1
            return tid

        untouched = self._untouched
        if self._untouched_under is not decoder.fde or len(untouched) > _UNTOUCHED_LIMIT:
            untouched.clear()
            self._untouched_under = decoder.fde
        cuts: list[int] = []
        end, entered = scan_clean(chunk, start, _CLEAN_KINDS, self._id_size,
                                  CRC_LEN if decoder.checksum else 0, table_map, untouched,
                                  self.chain.annotation_drop is not None, cuts)
        if end == start:
            return 0
        return self._clean_out(chunk, start, end, entered, cuts, out)

    def _clean_transaction(self, chunk: bytes, start: int, segment: str, offset: int,
                           out: list[bytes]) -> int:
        """The end of the transaction at `start` when all of it is in `chunk` and the chain
        leaves it as it is but for its annotations, which go when the chain drops them
        (0 otherwise; nothing is counted then, nothing added to `out`). The transaction
        goes to `out` as one slice, or as the slices between its dropped annotations.
        Its table maps are remembered either way, as feed() would."""
        n = len(chunk)
        if n - start < HEADER_LEN + 13 or chunk[start + HEADER_LEN + 12] & FL_STANDALONE:
            return 0
        chain = self.chain
        tables = self._tables
        decoder = self.decoder
        id_size = self._id_size
        drop_at = chain.annotation_drop
        cuts: list[int] = []  # start and end of each dropped annotation
        entered = 0
        first = start + walk.event_size(chunk, start)
        for pos, size in walk.spans(chunk, first, where=segment, base=offset):
            end = pos + size
            typ = chunk[pos + 4]
            if typ in ROWS_TYPES:
                tid = int.from_bytes(chunk[pos + HEADER_LEN : pos + HEADER_LEN + id_size],
                                     "little")
                res = tables.get(tid)
                if res is None or res.table is not decoder.table(tid) \
                        or res.dropped_at is not None or res.per_event or res.out is not res.table:
                    return 0
                entered += 1
            elif typ == _TABLE_MAP:
                tid = decoder.remember_table_map(chunk[pos:end])
                res = self._table_result(decoder.table(tid), Position(segment, offset + pos))
                if res.dropped_at is not None or res.per_event or res.out is not res.table:
                    return 0
            elif typ == _XID:
                return self._clean_out(chunk, start, end, entered, cuts, out)
            elif typ in _ANNOTATIONS:
                entered += 1
                if drop_at is not None:
                    cuts += (pos, end)
            elif typ == _QUERY:
                # As feed() takes them: BEGIN and what ends the group are framing, kept as
                # they are; any other statement is for the rules to judge.
                _, _, text = _split_query(decoder.body(chunk[pos:end]),
                                          Position(segment, offset + pos))
                if query_ends_group(text):
                    return self._clean_out(chunk, start, end, entered, cuts, out)
                if not _framing(text):
                    return 0
            else:
                return 0
        return 0

    def _clean_out(self, chunk: bytes, start: int, end: int, entered: int, cuts: list[int],
                   out: list[bytes]) -> int:
        """Clean transactions go out: as one slice, or without their annotations (`cuts`)
        as one piece joined from the slices between them (a piece costs the dump's
        framing a Python step: one per run, not two per transaction)."""
        chain = self.chain
        chain.entered += entered
        if not cuts:
            out.append(chunk[start:end])
            return end
        assert chain.annotation_drop is not None
        chain.dropped[chain.annotation_drop] += len(cuts) // 2
        view = memoryview(chunk)
        parts = [view[start : cuts[0]]]
        parts += [view[cuts[i - 1] : cuts[i]] for i in range(2, len(cuts), 2)]
        parts.append(view[cuts[-1] : end])
        out.append(b"".join(parts))
        return end

    def flush(self) -> list[bytes]:
        """Whatever is held (the stream ends or stops here)."""
        self._out = []
        self._end_group()
        return self._out

    # --- groups ----------------------------------------------------------------------------

    def _start_group(self, data: bytes) -> None:
        """A group opened (the tracker took its first event)."""
        g = _Group(gtid=data)
        ts, _typ, server_id = HEADER.unpack_from(data, 0)[:3]
        g.server_id = server_id
        g.timestamp = ts
        if isinstance(self._tracker.txn, Gtid):  # MariaDB's GTID event (its length checked)
            g.ddl = bool(data[HEADER_LEN + 12] & FL_DDL)
            g.gtid_text = str(self._tracker.txn)
        self._group = g
        self._stmt = _Statement()

    def _emit(self, data: bytes) -> None:
        g = self._group
        if g.gtid is not None and not g.gtid_sent:
            self._out.append(g.gtid)
            g.gtid_sent = True
        self._out.append(data)

    def _close_group(self) -> None:
        self._tracker.end()
        self._stmt = _Statement()
        self._reset_load()

    def _end_group(self) -> None:
        """A group ended without its terminator (a cut stream): let out what is held (but
        a LOAD DATA's file whose statement never came, when the chain judges statements:
        its table is unknown)."""
        if self._tracker.in_group:
            self._finish_statement()
            if not self.chain.judges_statements:
                self._emit_load()
        self._close_group()

    def _empty_standalone(self, dropped: bytes) -> None:
        """The one statement of a standalone group (DDL) was dropped: the GTID goes out as
        an ordinary transaction's (standalone and DDL flags cleared) with an XID in the
        dropped statement's place, so a replica records the GTID and its position
        moves past the group."""
        g = self._group
        gtid = g.gtid
        if gtid is None or g.gtid_sent:
            return
        checksum = self.decoder.checksum
        if gtid[4] == E.GTID:
            body = bytearray(self.decoder.body(gtid))
            body[12] &= ~(FL_STANDALONE | FL_DDL) & 0xFF
            gtid = build.reframe(gtid, checksum, body=body)
        ts, _typ, server_id, _size, log_pos, _flags = HEADER.unpack_from(dropped, 0)
        self._out.append(gtid)
        self._out.append(build.build_event(E.XID, struct.pack("<Q", 0), server_id=server_id,
                                           log_pos=log_pos, timestamp=ts, checksum=checksum))
        g.gtid_sent = True

    # --- statements ---------------------------------------------------------------------------

    def _annotation(self, data: bytes) -> None:
        chain = self.chain
        chain.entered += 1
        if chain.annotation_drop is not None:
            chain.dropped[chain.annotation_drop] += 1
            if chain.has_hooks:  # hooks run inside the relay: they still see the text
                self._stmt.annotation = self._annotation_text(data)
            return
        self._stmt.prologue.append(data)
        self._stmt.annotation = self._annotation_text(data)

    def _annotation_text(self, data: bytes) -> str:
        body = self.decoder.body(data)
        if data[4] == E.ROWS_QUERY:
            body = body[1:]
        return body.decode("utf-8", "replace")

    def _end_rows_statement(self) -> None:
        """Before a statement event: the rows statement before it is over. The INTVAR,
        RAND and USER_VAR events held are the coming statement's own: they stay, to go
        out with it or not at all."""
        context = [ev for ev in self._stmt.prologue if ev[4] in _STATEMENT_CONTEXT]
        self._finish_statement()
        self._stmt.prologue = context

    def _finish_statement(self) -> None:
        """The statement is over: the held rows event goes out, ending the statement."""
        st = self._stmt
        held = st.held_rows
        if held is not None:
            st.held_rows = None
            if st.open:
                held = self._with_stmt_end(held)
            self._out.append(held)
        self._stmt = _Statement()

    def _with_stmt_end(self, data: bytes) -> bytes:
        rev = self.decoder.rows_event(data)
        return build.reframe(data, self.decoder.checksum,
                             body=rev.with_flags(rev.flags | STMT_END_F))

    def _table_map(self, data: bytes) -> None:
        st = self._stmt
        if st.held_rows is not None and not st.open:
            self._finish_statement()  # a table map after a complete statement: a new one
            st = self._stmt
        tid = self.decoder.remember_table_map(data)
        st.maps[tid] = data
        if st.maps_sent:  # a map after the statement's first kept rows event: in order
            self._send_maps(Position("", 0))

    def _table_result(self, table: TableMap, position: Position) -> _TableResult:
        res = self._tables.get(table.table_id)
        if res is not None and res.table is table:
            return res
        out = table
        outcomes: list[Outcome] = []
        dropped_at = None
        per_event = False
        seen_by_rule: dict[int, TableMap] = {}
        for i, rule in enumerate(self.chain.rules):
            seen = out
            seen_by_rule[id(rule)] = seen
            try:
                outcome, out = rule.table(out)
            except (MaskError, ValueError) as exc:  # (ValueError: a rename past 255 bytes)
                raise HookError(rule.name, str(position), str(exc)) from exc
            outcomes.append(outcome)
            if outcome is DROPPED:
                dropped_at = i
                break
            per_event = per_event or rule.per_event_for(seen)
        res = _TableResult(table, out, outcomes, dropped_at, per_event,
                           tuple(i for i, o in enumerate(outcomes) if o is CHANGED),
                           seen_by_rule)
        self._tables[table.table_id] = res
        return res

    def _rows(self, data: bytes, position: Position) -> None:
        st = self._stmt
        decoder = self.decoder
        chain = self.chain
        tid = int.from_bytes(data[HEADER_LEN : HEADER_LEN + self._id_size], "little")
        stmt_end = bool(data[HEADER_LEN + self._id_size] & STMT_END_F)
        try:
            table = decoder.table(tid)
        except MalformedEvent:
            if not self._group.headless:
                raise
            raise HookError("rules", str(position), "a rows event whose TABLE_MAP is not in "
                            "the stream: it starts inside a transaction, where the rules "
                            "cannot tell the rows' table; start at a transaction's first "
                            "event") from None
        res = self._table_result(table, position)
        new_table = res.out
        chain.entered += 1
        for i in res.changed_at:
            chain.changed[i] += 1
        dropped = False
        if res.dropped_at is not None:
            chain.dropped[res.dropped_at] += 1
            dropped = True
        elif res.per_event and (masked := self._masked_in_place(data, table, res,
                                                                position)) is not None:
            data = masked
        elif res.per_event:
            rev = decoder.rows_event(data)
            work = self._rows_work(rev, table, res, position)
            # (a rename counted at the table stage is not counted again here)
            dropped = self._run_rules(lambda rule: rule.rows(work), position,
                                      per_event_only=True, counted=res.changed_at)
            if not dropped:
                new_table = work.table
                if work.rows_changed:
                    assert work.rows is not None
                    rows = [RowData(b, a) for b, a in work.rows]
                    try:
                        body = rev.encode(table, rows, decoder.codecs)
                    except (ValueError, TypeError, KeyError) as exc:
                        raise HookError("rules", str(position),
                                        f"new row values do not fit {table.qualified}: "
                                        f"{exc}") from exc
                    data = build.reframe(data, decoder.checksum, body=body)
        if dropped:
            if stmt_end:
                self._finish_statement()
            else:
                st.open = True
            return
        # Kept: what was held goes out first, then the statement's table maps (all of
        # them, before its first rows event, as servers write them: a replica rejects a
        # table map between the rows events of one statement).
        if st.held_rows is not None:
            self._out_held()
        self._send_prologue()
        if not st.maps_sent:
            self._send_maps(position)
        name = new_table.qualified
        if tid not in st.sent_maps:
            raw = st.maps.get(tid)
            if raw is None:
                raise MalformedEvent(f"rows event for table id {tid} without a TABLE_MAP",
                                     where=position.file, offset=position.offset)
            self._emit(self._map_event(raw, table, new_table))
            st.sent_maps[tid] = name
        elif st.sent_maps[tid] != name:
            raise HookError("rules", str(position), f"table id {tid} went out as "
                            f"{st.sent_maps[tid]} and would now go out as {name}: "
                            "rename a table the same way for a whole statement")
        st.open = not stmt_end
        if stmt_end:
            self._emit(data)
            self._stmt = _Statement()
        else:
            st.held_rows = data

    def _masked_in_place(self, data: bytes, table: TableMap, res: _TableResult,
                         position: Position) -> bytes | None:
        """The rows event with the chain's masks applied to the stored bytes of the masked
        columns only (relay/kernels `splice_rows`), every other byte as it was; None when
        the chain does more to these rows than one rule's masks (another rule that reads
        them, masks from two rules, a renamed table, a compressed or partial-JSON rows
        event, a column whose stored form the kernel does not walk): the caller decodes
        and encodes whole rows then. The values replaced are the ones the whole-row path
        gives: each masked column decoded alone, masked, encoded alone; a value that does
        not decode stops the stream as it does there (no on_error skip sends it clear)."""
        if res.out is not table or data[4] in _NOT_SPLICED:
            return None
        if res.masking is _UNSEEN:
            res.masking = self._masking(res)
        masking = res.masking
        if masking is None:
            return None
        if not masking:
            return data
        i, rule, plan = masking
        decoder = self.decoder
        rev = decoder.rows_event(data)
        if rev.ncols > len(table.columns):
            raise MalformedEvent(f"rows event has {rev.ncols} columns, the table map of "
                                 f"{table.qualified} {len(table.columns)}",
                                 where=position.file, offset=position.offset)
        key = (rev.present,) if rev.present_after is None or rev.kind is RowKind.INSERT \
            else (rev.present, rev.present_after)
        splice = res.splices.get(key, _UNSEEN)
        if splice is _UNSEEN:
            if len(res.splices) >= _SPLICES_LIMIT:  # (MINIMAL images: one per column set)
                res.splices.clear()
            splice = res.splices[key] = self._splice(table, key, plan)
        if splice is None:
            return None
        images, replacers, values_changed = splice
        values_changed[0] = False
        try:
            rows, changed = splice_rows(rev.data[rev.rows_start:], images, replacers)
        except _Undecodable as exc:
            raise self._malformed(table, exc.__cause__, position) from exc.__cause__
        except UnicodeDecodeError as exc:  # (a hash of stored text that does not decode)
            raise self._malformed(table, exc, position) from exc
        except (_DoesNotFit, OverflowError) as exc:
            cause = exc.__cause__ or exc
            raise HookError("rules", str(position), f"new row values do not fit "
                            f"{table.qualified}: {cause}") from cause
        except (MaskError, ValueError) as exc:
            if not self._skip(i, rule, exc, position):
                raise
            return data
        if not (changed or values_changed[0]):
            return data
        if i not in res.changed_at:
            self.chain.changed[i] += 1
        return build.reframe(data, decoder.checksum, body=rev.data[: rev.rows_start] + rows)

    @staticmethod
    def _malformed(table: TableMap, exc: BaseException | None,
                   position: Position) -> MalformedEvent:
        return MalformedEvent(f"rows of {table.qualified}: {type(exc).__name__}: {exc}",
                              where=position.file, offset=position.offset)

    def _masking(self, res: _TableResult) -> tuple[int, Rule, list[ColumnMask]] | bool | None:
        """The one rule whose masks are all the chain does to this table's rows (its index,
        itself, its masks); False when no rule masks them; None when the chain does more
        (the rows are decoded and encoded whole then)."""
        masking: tuple[int, Rule, list[ColumnMask]] | bool = False
        for i, rule in enumerate(self.chain.rules):
            if not rule.per_event:
                continue
            plan = rule.column_masks(res.seen.get(id(rule), res.out))
            if plan is None:
                return None
            if plan:
                if masking:
                    return None  # (two rules' masks: values pass from one to the next)
                masking = (i, rule, plan)
        return masking

    def _splice(self, table: TableMap, images: tuple[tuple[int, ...], ...],
                plan: list[ColumnMask]) -> _SpliceArgs | None:
        """splice_rows' images and replacers for these images of the table: each column's
        layout (a width, or PREFIXED | the bytes of a length prefix of 1 to 4) and mode,
        and a replacer per masked column: a column's one hash of a prefixed string is made
        from its stored bytes (ColumnMask.hash_stored: what decoding, masking and encoding
        give), any other mask decodes the value alone, masks it and encodes it alone.
        None when a column's stored form is not one of those (the whole-row path)."""
        codecs = self.decoder.codecs
        by_column: dict[int, list[ColumnMask]] = {}
        for cm in plan:
            by_column.setdefault(cm.col.index, []).append(cm)
        values_changed = [False]
        layouts: list[tuple[bytes, bytes]] = []
        replacers: list[tuple[Replacer | None, ...]] = []
        for present in images:
            layout = bytearray()
            modes = bytearray()
            calls: list[Replacer | None] = []
            for column, p in zip(present, codecs.get(table, present).plans, strict=True):
                if p.size is not None and 0 <= p.size < PREFIXED:
                    layout.append(p.size)
                elif p.size is None and 1 <= p.prefix <= 4:
                    layout.append(PREFIXED | p.prefix)
                else:
                    return None
                masks = by_column.get(column)
                if masks is None:
                    modes.append(SpliceMode.KEEP)
                    calls.append(None)
                elif len(masks) == 1 and masks[0].hashes_stored and layout[-1] & PREFIXED:
                    modes.append(SpliceMode.VALUE)
                    calls.append(masks[0].hash_stored)
                else:
                    modes.append(SpliceMode.STORED)
                    calls.append(self._replacer(table, column, masks, values_changed))
            layouts.append((bytes(layout), bytes(modes)))
            replacers.append(tuple(calls))
        return layouts, replacers, values_changed

    def _replacer(self, table: TableMap, column: int, masks: list[ColumnMask],
                  values_changed: list[bool]) -> Replacer:
        """A masked column's value in its stored bytes, decoded alone (an error is the
        event's: _Undecodable), masked, and encoded alone (_DoesNotFit); the stored bytes
        as they are when the masks leave the value as it was (compared as values, as
        _mask_image does: `values_changed` is set otherwise, so the rule counts a change
        the whole-row path counts, such as 1 masked to 1.0)."""
        alone = self.decoder.codecs.get(table, (column,))

        def replace(raw: bytes) -> bytes | None:
            try:
                value = alone.decode(b"\0" + raw, 0)[0][0]
            except (IndexError, struct.error, ValueError, KeyError, TypeError, OverflowError,
                    UnicodeDecodeError, RecursionError) as exc:
                raise _Undecodable() from exc
            new = value
            for cm in masks:
                new = cm.apply(new)
            if new is None:
                return raw if value is None else None
            if new == value and type(new) is type(value):
                return raw
            values_changed[0] = True
            try:
                return alone.encode([new])[1:]
            except (ValueError, TypeError, KeyError) as exc:
                raise _DoesNotFit() from exc

        return replace

    def _map_event(self, raw: bytes, table: TableMap, out: TableMap) -> bytes:
        return raw if out is table else build.reframe(raw, self.decoder.checksum,
                                                      body=out.encode())

    def _send_maps(self, position: Position) -> None:
        """The statement's held table maps whose tables the rules keep, in their order."""
        st = self._stmt
        st.maps_sent = True
        for tid, raw in list(st.maps.items()):
            if tid in st.sent_maps:
                continue
            table = self.decoder.table(tid)
            res = self._table_result(table, position)
            if res.dropped_at is None:
                self._emit(self._map_event(raw, table, res.out))
                st.sent_maps[tid] = res.out.qualified

    def _out_held(self) -> None:
        st = self._stmt
        held = st.held_rows
        assert held is not None
        st.held_rows = None
        self._emit(held)

    def _send_prologue(self) -> None:
        st = self._stmt
        for ev in st.prologue:
            self._emit(ev)
        st.prologue = []

    def _rows_work(self, rev: RowsEvent, table: TableMap, res: _TableResult,
                   position: Position) -> RowsWork:
        decoder = self.decoder
        g = self._group

        def load() -> list[tuple[Any, Any]]:
            return [(r.before, r.after) for r in rev.rows(table, decoder.codecs)]

        before_cols = tuple(table.columns[i].name for i in rev.present)
        after_cols = tuple(table.columns[i].name for i in (
            rev.present_after if rev.present_after is not None else rev.present))
        if rev.kind is RowKind.INSERT:
            before_cols, after_cols = (), before_cols
        return RowsWork(rev.kind, res.out, position, load, before_cols, after_cols,
                        g.gtid_text, g.server_id, g.timestamp, self._stmt.annotation,
                        seen=res.seen)

    def _query(self, data: bytes, position: Position, *, original: bytes | None = None,
               load: bool = False) -> None:
        """A statement: QUERY, a QUERY_COMPRESSED decompressed (`original`, which goes out
        when the rules leave it as it is), or LOAD DATA's EXECUTE_LOAD_QUERY (`load`)."""
        g = self._group
        decoder = self.decoder
        tracker = self._tracker
        body = decoder.body(data)
        post = (decoder.post_header_len(_EXECUTE_LOAD) or 26) if load else 13
        start, schema_raw, text_raw = _split_query(body, position, post)
        alone = tracker.standalone or tracker.mysql_first_query  # may be the group's only
        closes = tracker.feed(data, decoder.checksum)
        if not load and ((closes and not alone) or _framing(text_raw)):
            # Transaction framing: always kept; a COMMIT/ROLLBACK ends the group.
            self._finish_statement()
            self._emit(original or data)  # (with the GTID first, if nothing else went out)
            if closes:
                self._close_group()
            return
        # A statement; when it closes its group, it was the group's only one (a standalone
        # group's, a MySQL DDL's).
        self._end_rows_statement()
        if load and self._load_mode == _DROPPING:  # dropped (and counted) at its file
            self._stmt = _Statement()
            self._reset_load()
            return
        verb = "LOAD DATA" if load else _statement_word(text_raw)
        ddl = not load and (g.ddl or verb in _DDL_WORDS)
        work = QueryWork(schema_raw.decode("utf-8", "replace"),
                         text_raw.decode("utf-8", "replace"), position, ddl, g.gtid_text,
                         g.server_id, g.timestamp,
                         data=load or (not ddl and _is_data(verb, text_raw)), verb=verb)
        before = (work.schema, work.text)
        if not (load and self._load_mode == _PASSING):  # (counted at its file then)
            self.chain.entered += 1
        if self._run_rules(lambda rule: rule.query(work), position):
            self._stmt = _Statement()
            if load and self._load_mode in (_PASSING, _SENT):
                self._emit(self._delete_file_for(data, body))  # (its file went out)
            self._reset_load()
            if closes:
                self._empty_standalone(data)
                self._close_group()
            return
        if (work.schema, work.text) != before:
            schema = work.schema.encode("utf-8")
            if len(schema) > 255:
                raise HookError("rules", str(position), "schema name longer than 255 bytes")
            text = work.text.encode("utf-8")
            new_body = bytearray(body[:start])
            new_body[8] = len(schema)
            if load and work.text != before[1]:
                _move_file_name(new_body, text_raw, text, position)
            new_body += schema + b"\0" + text
            data = build.reframe(data, decoder.checksum, body=new_body)
            original = None
        self._emit_load()
        self._send_prologue()
        self._emit(original or data)
        if load:
            self._reset_load()  # (the next LOAD DATA's file is judged anew)
        if closes:
            self._close_group()

    # --- LOAD DATA, compressed transactions ---------------------------------------------------

    def _reset_load(self) -> None:
        self._load = []
        self._load_bytes = 0
        self._load_mode = _NONE

    def _emit_load(self) -> None:
        """LOAD DATA's held file goes out (before its statement)."""
        for ev in self._load:
            self._emit(ev)
        self._load = []
        self._load_bytes = 0

    def _load_block(self, data: bytes, position: Position) -> None:
        """A piece of LOAD DATA's file: held until the statement names its table, so that
        it goes out only with a statement the rules keep (when the chain holds files:
        Rule.holds_load_files; otherwise it goes out now, and a DELETE_FILE takes the
        place of a statement the rules drop)."""
        self._end_rows_statement()
        mode = self._load_mode
        if mode == _DROPPING:
            return
        if mode in (_PASSING, _SENT) or not self.chain.holds_load_files:
            if mode == _NONE:
                self._load_mode = _SENT
            self._emit(data)
            return
        self._load.append(data)
        self._load_bytes += len(data)
        if self._load_bytes <= LOAD_HOLD_LIMIT:
            return
        # Too large to hold: judged now, as a statement whose table is unknown.
        g = self._group
        work = QueryWork("", "", position, False, g.gtid_text, g.server_id, g.timestamp,
                         data=True, verb="LOAD DATA")
        self.chain.entered += 1
        limit = (f"{LOAD_HOLD_LIMIT >> 20} MiB" if LOAD_HOLD_LIMIT % (1 << 20) == 0
                 else f"{LOAD_HOLD_LIMIT} bytes")
        why = (f"whose file passed {limit} before its statement named the table (the most "
               f"the relay holds per stream to judge a file), so its table is not known; "
               f"load such files in parts under {limit}")
        if self._run_rules(lambda rule: rule.unknown_statement(work, why), position):
            self._load = []
            self._load_bytes = 0
            self._load_mode = _DROPPING
        else:
            self._emit_load()
            self._load_mode = _PASSING

    def _delete_file_for(self, execute: bytes, body: bytes) -> bytes:
        """The DELETE_FILE a server writes for a LOAD DATA that gave up: for a statement
        the rules dropped after its file went out (a replica then discards the file), at
        the statement's position."""
        file_id = body[13:17]
        ts, _typ, server_id, _size, log_pos, _flags = HEADER.unpack_from(execute, 0)
        return build.build_event(E.DELETE_FILE, bytes(file_id), server_id=server_id,
                                 log_pos=log_pos, timestamp=ts,
                                 checksum=self.decoder.checksum)

    def _delete_file(self, data: bytes) -> None:
        """LOAD DATA gave up on its file: what of it is held goes, with this event."""
        held = bool(self._load) or self._load_mode == _DROPPING
        self._finish_statement()
        self._reset_load()
        if not held:
            self._emit(data)

    def _old_load(self, data: bytes, position: Position) -> None:
        """A LOAD event of the formats before MySQL 5.0: its table is not read here."""
        self._finish_statement()
        g = self._group
        work = QueryWork("", "", position, False, g.gtid_text, g.server_id, g.timestamp,
                         data=True, verb="LOAD DATA")
        self.chain.entered += 1
        why = "of a format before MySQL 5.0, whose table the relay does not read"
        if not self._run_rules(lambda rule: rule.unknown_statement(work, why), position):
            self._emit(data)

    def _payload(self, data: bytes, position: Position) -> None:
        """A MySQL TRANSACTION_PAYLOAD: its events, inflated one at a time, through the
        rules as any others. When the rules let every one out as it is, the payload goes
        out as stored; when they drop or change one, the events they let out are packed
        into a payload again, which goes out in the stored one's place (its header and
        log_pos; MySQL's own zstd level, a tighter one if that came out larger). A rule
        that stops the stream inside it stops it before the payload.

        The outcome is known only at the transaction's end, so what comes out of the rules
        is compared with what went in as it comes: while they agree, only the events the
        rules still hold (a statement's table maps, one rows event) are kept; once they
        differ, the packer takes the agreeing events again from the payload and the rest
        as it comes (its compressed frame, not the events, is what is held)."""
        checksum = self.decoder.checksum
        log_pos = int.from_bytes(data[13:17], "little")
        body = self.decoder.body(data)
        outer = self._out
        group = self._group
        gtid = group.gtid if not group.gtid_sent else None
        produced: list[bytes] = []
        pending: deque[bytes] = deque()  # fed, as framed for the rules, not yet let out
        agreed = 0                       # inner events let out as they went in, so far
        packer: Packer | None = None
        self._out = produced
        try:
            for inner in inner_events(body):  # (no CRCs)
                framed = build.reframe(inner, checksum, body=inner[HEADER_LEN:],
                                       log_pos=log_pos)
                if packer is None:
                    pending.append(framed)
                self._feed_event(framed, position)
                for ev in produced:
                    if ev is gtid:  # (the group's GTID goes out before the payload)
                        outer.append(ev)
                    elif packer is None and pending and ev == pending[0]:
                        pending.popleft()
                        agreed += 1
                    else:
                        if packer is None:
                            packer = self._repack(body, agreed)
                            pending.clear()
                        packer.add(build.reframe(ev, checksum, log_pos=0, strip_crc=True)
                                   if checksum else build.reframe(ev, False, log_pos=0))
                produced.clear()
        finally:
            self._out = outer
        if packer is None and not pending:
            outer.append(data)  # every event as it was: the payload as stored
            return
        if packer is None:  # the rules held back the last events: the agreed ones only
            packer = self._repack(body, agreed)
        outer.append(build.reframe(data, checksum, body=packer.body(within=len(body))))

    @staticmethod
    def _repack(body: bytes, count: int) -> Packer:
        """A packer holding the payload's first `count` inner events, as stored."""
        packer = Packer()
        if count:
            for i, inner in enumerate(inner_events(body)):
                packer.add(inner)
                if i + 1 == count:
                    break
        return packer

    def _run_rules(self, call: Callable[[Rule], Outcome], position: Position, *,
                   per_event_only: bool = False, counted: tuple[int, ...] = ()) -> bool:
        """Each rule's outcome for one event, counted; True when a rule dropped it."""
        chain = self.chain
        for i, rule in enumerate(chain.rules):
            if per_event_only and not rule.per_event:
                continue
            try:
                outcome = call(rule)
            except StatementRefused:  # never skipped (on_error): that would send the text
                chain.dropped[i] += 1
                chain.errors[i] += 1
                raise
            except (HookError, MaskError, ValueError) as exc:  # (ValueError: a rename
                if not self._skip(i, rule, exc, position):      # past 255 bytes)
                    raise
                outcome = KEPT
            if outcome is DROPPED:
                chain.dropped[i] += 1
                return True
            if outcome is CHANGED and i not in counted:
                chain.changed[i] += 1
        return False

    # --- errors --------------------------------------------------------------------------------

    def _skip(self, index: int, rule: Rule, exc: Exception, position: Position) -> bool:
        """OnError.SKIP: count the failure and go on as if the rule had kept the event as
        it was; OnError.STOP: let the error end the stream."""
        if rule.spec.on_error is not OnError.SKIP:
            if not isinstance(exc, HookError):
                raise HookError(rule.name, str(position), str(exc)) from exc
            return False
        self.chain.errors[index] += 1
        return True

