"""Row changes as data: transactions -> statements -> row changes over any binlog stream.

`ChangeStream(events)` takes events in stream order (from a file, a relay log or a live
primary: see relay/sources) and offers them in layers, each materialised only when asked,
like nested generators over one shared cursor:

    for tx in ChangeStream(events).transactions():   # GTID, server id, timestamp, start
        for st in tx.statements():                   # a query, or a run of rows events
            for change in st.changes():              # op, schema, table, before, after
                ...

A consumer that wants transactions never decodes a row; one that skips a statement
never decodes its rows either. Nothing holds a whole transaction in memory, so the
objects of one layer are valid while their parent is current: moving to the next
transaction finishes the previous one (its `end` and `xid` are set then).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from itertools import count, repeat
from typing import Any, NamedTuple

from relay.binlog import jsonb
from relay.binlog.checksum import verify
from relay.binlog.constants import HEADER_LEN, STMT_END_F, EventType
from relay.binlog.decoder import DecodedTables, StreamDecoder
from relay.binlog.events import Event, decode_query, decode_rotate
from relay.binlog.group import GROUP_START, GroupTracker, commit_time_us
from relay.binlog.position import Position
from relay.binlog.rowcodec import RowImage
from relay.binlog.rows import ROWS_TYPES, CodecCache, Images, RowData, RowsEvent, side
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.errors import MalformedEvent

E = EventType


class SourceEvent(NamedTuple):
    """One event as a source delivers it: the file it is in, its offset there, its bytes
    (with the CRC when the stream carries checksums)."""

    file: str
    offset: int
    data: bytes


class StreamEvent(NamedTuple):
    """An event inside a transaction. Events unpacked from a MySQL TRANSACTION_PAYLOAD
    carry the payload's position and no CRC."""

    position: Position
    data: bytes
    checksum: bool
    end: int                       # offset just after the event (after the payload)

    @property
    def type_code(self) -> int:
        return self.data[4]


_GROUP_START = GROUP_START
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MYSQL_GTIDS = frozenset({E.MYSQL_GTID, E.ANONYMOUS_GTID, E.GTID_TAGGED})
_NON_GROUP = frozenset({E.FORMAT_DESCRIPTION, E.ROTATE, E.STOP, E.HEARTBEAT, E.HEARTBEAT_V2,
                        E.BINLOG_CHECKPOINT, E.GTID_LIST, E.START_ENCRYPTION,
                        E.PREVIOUS_GTIDS})
_ANNOTATIONS = frozenset({E.ANNOTATE_ROWS, E.ROWS_QUERY})


class ChangeStream:
    """Layered iteration over a stream of `SourceEvent`s.

    `hints` supply real types the binlog does not carry (UUID, INET4/6, MariaDB JSON);
    `checksum` forces the CRC mode for streams that start without a FORMAT_DESCRIPTION;
    `tables`: decoded maps and codecs kept from the reader's earlier streams.
    """

    def __init__(self, events: Iterable[SourceEvent], *, hints: TypeHints = NO_HINTS,
                 checksum: bool | None = None, tables: DecodedTables | None = None) -> None:
        self._source = iter(events)
        self.decoder = StreamDecoder(hints, checksum=checksum, tables=tables)
        self._ahead: list[StreamEvent] = []
        self._current: Transaction | None = None
        self.file = ""            # the file the stream is in (from the source or ROTATE)

    # --- the shared cursor ---------------------------------------------------------------

    def pull(self) -> StreamEvent | None:
        """The next event in stream order, payloads unpacked, decoding state updated."""
        if self._ahead:
            return self._prepare(self._ahead.pop())
        for src in self._source:
            data = src.data
            if self.file != src.file and src.file:
                self.file = src.file
            typ = data[4]
            pos = Position(src.file or self.file, src.offset)
            end = src.offset + len(data)
            if typ == E.FORMAT_DESCRIPTION:
                self.decoder.format_description(data)
                continue
            crc = self.decoder.checksum
            if typ == E.TRANSACTION_PAYLOAD:
                inner = [StreamEvent(pos, ev, False, end)
                         for ev in self.decoder.payload_events(data)]
                if not inner:
                    continue
                self._ahead.extend(reversed(inner[1:]))
                return self._prepare(inner[0])
            if typ == E.QUERY_COMPRESSED:
                return self._prepare(StreamEvent(pos, self.decoder.uncompressed_query(data),
                                                 False, end))
            return self._prepare(StreamEvent(pos, data, crc, end))
        return None

    def _prepare(self, ev: StreamEvent) -> StreamEvent:
        if ev.type_code == E.TABLE_MAP:
            self.decoder.remember_table_map(ev.data, checksum=ev.checksum)
        return ev

    def push_back(self, ev: StreamEvent) -> None:
        self._ahead.append(ev)

    @property
    def pending(self) -> bool:
        """An event was read ahead and not yet delivered (a group ended without its
        terminator): the source cannot be replaced now."""
        return bool(self._ahead)

    def resume(self, events: Iterable[SourceEvent]) -> None:
        """Read on from `events`: for a reader that took a stretch of the stream by
        another path (`relay changes`' line kernel) and gives the rest back here; the
        decoding state (checksums, table maps) carries on."""
        if self._ahead:
            raise ValueError("ChangeStream.resume with events read ahead")
        self._source = iter(events)

    # --- transactions --------------------------------------------------------------------

    def transactions(self) -> Iterator[Transaction]:
        while True:
            if self._current is not None:
                self._current.finish()
                self._current = None
            ev = self.pull()
            if ev is None:
                return
            typ = ev.type_code
            if typ in _NON_GROUP:
                if typ == E.ROTATE:
                    # A live stream opens with a ROTATE before any FORMAT_DESCRIPTION:
                    # whether it carries a CRC shows in the CRC itself.
                    crc = ev.checksum if self.decoder.fde is not None else verify(ev.data)
                    self.file = decode_rotate(Event(ev.data, crc)).next_file
                continue
            tx = Transaction(self, ev)
            self._current = tx
            yield tx

    def statements(self) -> Iterator[Statement]:
        for tx in self.transactions():
            yield from tx.statements()

    def changes(self) -> Iterator[RowChange]:
        for tx in self.transactions():
            yield from tx.changes()


class Transaction:
    """One event group. Known at once: `gtid` (MariaDB "domain-server-seq", MySQL
    "uuid:gno", None for anonymous), `server_id`, `timestamp` (UTC), `start`. Known once
    the transaction is finished: `end` (offset after its last event) and `xid`."""

    def __init__(self, stream: ChangeStream, first: StreamEvent) -> None:
        self.stream = stream
        self.start = first.position
        self.end: Position | None = None
        self.xid: int | None = None
        hdr = struct.unpack_from("<IBIIIH", first.data, 0)
        self.server_id: int = hdr[2]
        self.timestamp = datetime.fromtimestamp(hdr[0], UTC)
        self.gtid: str | None = None
        self._tracker = GroupTracker()
        self._done = False
        self._statement: Statement | None = None
        # An event to deliver again (pushed back), with whether it closed the group;
        # None for "not looked at yet".
        self._held: tuple[StreamEvent, bool | None] | None = None
        self._last: tuple[StreamEvent, bool] = (first, False)
        typ = first.type_code
        if typ in _GROUP_START:
            if typ == E.GTID and len(first.data) < HEADER_LEN + 13:
                raise MalformedEvent("GTID event too short", where=first.position.file,
                                     offset=first.position.offset)
            self._tracker.feed(first.data, first.checksum)
            txn = self._tracker.txn
            self.gtid = str(txn) if txn is not None else None
            if typ in _MYSQL_GTIDS:
                commit_us = commit_time_us(first.data, first.checksum)
                # (exact: a float of the seconds can be a microsecond off)
                self.timestamp = _EPOCH + timedelta(microseconds=commit_us)
        elif typ == E.QUERY and _query_text(first).strip().upper() == b"BEGIN":
            # A stream without GTID events: a group opens at its BEGIN.
            self._tracker.begin_without_gtid(standalone=False)
        else:
            # A stream without GTID events (or one starting inside a group): the first
            # event belongs to the group itself; a lone statement is its own group.
            self._tracker.begin_without_gtid(standalone=typ in (E.QUERY, E.INCIDENT))
            self._held = (first, None)

    def __repr__(self) -> str:
        return f"<Transaction {self.gtid or '(anonymous)'} at {self.start}>"

    # --- events --------------------------------------------------------------------------

    def next_event(self) -> StreamEvent | None:
        """The next event of this transaction; None once it has ended."""
        if self._held is not None:
            ev, closes = self._held
            self._held = None
        elif self._done:
            return None
        else:
            pulled = self.stream.pull()
            if pulled is None:
                self._done = True
                return None
            if pulled.type_code in _GROUP_START or pulled.type_code in _NON_GROUP:
                # The group ended without a terminator (a cut stream): stop before it.
                self.stream.push_back(pulled)
                self._done = True
                return None
            ev, closes = pulled, None
        if closes is None:
            closes = self._closes(ev)
        if closes:
            self._done = True
            self.end = Position(ev.position.file, ev.end)
        self._last = (ev, closes)
        return ev

    def _closes(self, ev: StreamEvent) -> bool:
        if ev.type_code == E.XID and len(ev.data) >= HEADER_LEN + 8:
            self.xid = struct.unpack_from("<Q", ev.data, HEADER_LEN)[0]
        return self._tracker.feed(ev.data, ev.checksum)

    def push_back(self, ev: StreamEvent) -> None:
        """Undo the last _next: deliver `ev` again."""
        self._held = (ev, self._last[1])
        self._done = False

    def events(self) -> Iterator[StreamEvent]:
        """The raw events after the GTID event, in order (payloads unpacked)."""
        while (ev := self.next_event()) is not None:
            yield ev

    def finish(self) -> None:
        """Skip what was not read, so the stream stands at the next transaction."""
        while self.next_event() is not None:
            pass

    # --- statements ----------------------------------------------------------------------

    def statements(self) -> Iterator[Statement]:
        annotation: str | None = None
        decoder = self.stream.decoder
        while True:
            if self._statement is not None:
                self._statement.finish()
                self._statement = None
            ev = self.next_event()
            if ev is None:
                return
            typ = ev.type_code
            if typ in _ANNOTATIONS:
                annotation = ev_text(ev, decoder)
                continue
            if typ == E.QUERY:
                q = decode_query(Event(ev.data, ev.checksum))
                text = q.text.decode("utf-8", "replace")
                if text.strip().upper() in ("BEGIN", "COMMIT", "ROLLBACK"):
                    continue
                yield QueryStatement(self, ev.position, q.schema, text)
                continue
            if typ in ROWS_TYPES:
                rev = decoder.rows_event(ev.data, checksum=ev.checksum)
                st = RowsStatement(self, ev, rev, decoder.table_for(rev), annotation)
                annotation = None
                self._statement = st
                yield st

    def changes(self) -> Iterator[RowChange]:
        for st in self.statements():
            if isinstance(st, RowsStatement):
                yield from st.changes()


def ev_text(ev: StreamEvent, decoder: StreamDecoder) -> str:
    body = decoder.body(ev.data, checksum=ev.checksum)
    if ev.type_code == E.ROWS_QUERY:
        body = body[1:]  # a length byte the server no longer trusts
    return body.decode("utf-8", "replace")


def _query_text(ev: StreamEvent) -> bytes:
    from relay.binlog.events import query_text

    return query_text(ev.data, ev.checksum)


class Statement:
    """A statement of a transaction: `QueryStatement` or `RowsStatement`."""

    kind: str = ""
    position: Position

    def changes(self) -> Iterator[RowChange]:
        return iter(())

    def finish(self) -> None:
        pass


class QueryStatement(Statement):
    """A statement logged as SQL text, with the default schema it ran in."""

    kind = "query"

    def __init__(self, tx: Transaction, position: Position, schema: str, text: str) -> None:
        self.transaction = tx
        self.position = position
        self.schema = schema
        self.text = text

    def __repr__(self) -> str:
        return f"<QueryStatement {self.schema}: {self.text[:60]!r}>"


class RowsStatement(Statement):
    """Row events of one table from one statement (up to the end-of-statement flag).
    `annotation` is the SQL text the server logged with them (ANNOTATE_ROWS or
    ROWS_QUERY), when it did."""

    kind = "rows"

    def __init__(self, tx: Transaction, first: StreamEvent, event: RowsEvent,
                 table: TableMap, annotation: str | None) -> None:
        self.transaction = tx
        self.position = first.position
        self.table = table
        self.annotation = annotation
        self._first = first
        self._first_event = event
        self._pending: StreamEvent | None = first
        self._ended = False

    @property
    def table_name(self) -> str:
        return self.table.table

    def __repr__(self) -> str:
        return f"<RowsStatement {self.table.qualified} at {self.position}>"

    def raw_events(self) -> Iterator[StreamEvent]:
        """The rows events of this statement as they are (nothing decoded)."""
        tx = self.transaction
        size = self.table.id_size
        flags_at = HEADER_LEN + size
        while True:
            if self._pending is not None:
                ev, self._pending = self._pending, None
                yield ev
                if ev.data[flags_at] & STMT_END_F:
                    self._ended = True
                    return
                continue
            if self._ended:
                return
            nxt = tx.next_event()
            if nxt is None:
                self._ended = True
                return
            if nxt.type_code not in ROWS_TYPES or int.from_bytes(
                    nxt.data[HEADER_LEN:flags_at], "little") != self.table.table_id:
                tx.push_back(nxt)
                self._ended = True
                return
            self._pending = nxt

    def events(self) -> Iterator[tuple[StreamEvent, RowsEvent]]:
        """The rows events of this statement, each as (raw event, parsed header)."""
        decoder = self.transaction.stream.decoder
        for ev in self.raw_events():
            if ev is self._first:
                yield ev, self._first_event
            else:
                yield ev, decoder.rows_event(ev.data, checksum=ev.checksum)

    def changes(self, columns: Iterable[str] | None = None) -> Iterator[RowChange]:
        """The row changes, decoded. `columns` limits the columns decoded."""
        wanted = frozenset(columns) if columns is not None else None
        for ev, rev in self.events():
            yield from self.changes_of(ev, rev, wanted)

    def changes_of(self, ev: StreamEvent, rev: RowsEvent,
                   wanted: frozenset[str] | None = None) -> list[RowChange]:
        """The row changes of one of this statement's events (see `events`), decoded
        (`wanted`: only these columns)."""
        table = self.table
        codecs = self.transaction.stream.decoder.codecs
        kind, schema, name, tx = rev.kind, table.schema, table.table, self.transaction
        position = ev.position
        new = tuple.__new__
        planned = planned_images(rev, table, codecs, position) if wanted is None else None
        if planned is not None:  # the kernel's images: a RowChange a row, no loop in Python
            return list(map(new, repeat(RowChange), zip(
                repeat(kind), repeat(schema), repeat(name), side(planned.before),
                side(planned.after), repeat(position), count(), repeat(tx))))
        rows = decoded_images(rev, table, codecs, ev.position, wanted)
        return [new(RowChange, (kind, schema, name, before, after, position, i, tx))
                for i, (before, after) in enumerate(rows)]

    def finish(self) -> None:
        for _ in self.raw_events():
            pass


def row_images(rev: RowsEvent, table: TableMap, codecs: CodecCache, position: Position,
               wanted: frozenset[str] | None = None
               ) -> list[tuple[RowImage | None, RowImage | None]]:
    """A rows event's (before, after) images, decoded (partial JSON updates applied where
    the before-image has the document); a bad row names the event's file and offset."""
    planned = planned_images(rev, table, codecs, position) if wanted is None else None
    if planned is not None:
        # (strict=False: the side an INSERT or a DELETE has not is an endless repeat)
        return list(zip(side(planned.before), side(planned.after), strict=False))
    return decoded_images(rev, table, codecs, position, wanted)


def planned_images(rev: RowsEvent, table: TableMap, codecs: CodecCache,
                   position: Position) -> Images | None:
    """`RowsEvent.planned_images`, a bad row naming the event's file and offset."""
    try:
        return rev.planned_images(table, codecs)
    except MalformedEvent as exc:
        raise MalformedEvent(str(exc), where=position.file, offset=position.offset) from exc


def decoded_images(rev: RowsEvent, table: TableMap, codecs: CodecCache, position: Position,
                   wanted: frozenset[str] | None = None
                   ) -> list[tuple[RowImage | None, RowImage | None]]:
    """`row_images` by the row codec's generated decoders alone (`planned_images` gave
    None)."""
    try:
        rows = rev.rows(table, codecs, wanted, planned=False)
    except MalformedEvent as exc:
        raise MalformedEvent(str(exc), where=position.file, offset=position.offset) from exc
    return [(before, _apply_partial(table, RowData(before, after, partial)) if partial
             else after) for before, after, partial in rows]


def _apply_partial(table: TableMap, row: RowData) -> RowImage | None:
    """The after-image with partial JSON diffs applied to the before-image's documents
    (left as `JsonPartial` where the before-image lacks the column)."""
    after = row.after
    if after is None or row.before is None or not row.partial_json:
        return after
    values = list(after)
    for idx in row.partial_json:
        name = table.columns[idx].name
        if name not in after.columns or name not in row.before.columns:
            continue
        k = after.columns.index(name)
        diff = values[k]
        if isinstance(diff, jsonb.JsonPartial):
            values[k] = jsonb.apply_diffs(row.before.get(name), diff)
    return type(after)(values)


class RowChange(NamedTuple):
    """One row change: its operation, table, images and where it is."""

    op: str                      # "insert", "update", "delete"
    schema: str
    table: str
    before: RowImage | None
    after: RowImage | None
    position: Position           # the rows event
    row: int                     # index of the row in its event
    transaction: Transaction

    @property
    def gtid(self) -> str | None:
        return self.transaction.gtid

    def asdict(self) -> dict[str, Any]:
        tx = self.transaction
        return {
            "gtid": tx.gtid, "server_id": tx.server_id, "timestamp": tx.timestamp,
            "file": self.position.file, "pos": self.position.offset, "row": self.row,
            "op": self.op, "schema": self.schema, "table": self.table,
            "before": None if self.before is None else self.before.asdict(),
            "after": None if self.after is None else self.after.asdict(),
        }
