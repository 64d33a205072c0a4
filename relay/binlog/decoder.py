"""The decoding state of one binlog stream, for either flavour.

A stream is read in order; what an event means can depend on what came before it: the
FORMAT_DESCRIPTION in force (checksums, post-header lengths, MariaDB or MySQL) and the
TABLE_MAP events that rows events refer to by table id. `StreamDecoder` holds that
state, so the row codec, the rules and the tap need not track it themselves.
"""

from __future__ import annotations

import logging

from relay.binlog import compression
from relay.binlog.constants import CRC_LEN, HEADER_LEN, EventType
from relay.binlog.events import FormatDescription, decode_fde
from relay.binlog.rows import ROWS_TYPES, CodecCache, RowsEvent
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.errors import MalformedEvent

log = logging.getLogger("relay.binlog")

# Post-header lengths of the current formats, for events read without a FORMAT_DESCRIPTION.
_DEFAULT_POST: dict[int, int] = {EventType.TABLE_MAP: 8, EventType.QUERY: 13,
                                 EventType.QUERY_COMPRESSED: 13}
_DEFAULT_POST.update(dict.fromkeys(ROWS_TYPES, 8))
_DEFAULT_POST.update(dict.fromkeys((EventType.WRITE_ROWS_V2, EventType.UPDATE_ROWS_V2,
                                    EventType.DELETE_ROWS_V2, EventType.PARTIAL_UPDATE_ROWS,
                                    EventType.WRITE_ROWS_COMPRESSED,
                                    EventType.UPDATE_ROWS_COMPRESSED,
                                    EventType.DELETE_ROWS_COMPRESSED), 10))


class DecodedTables:
    """Table maps decoded once and their row codecs compiled once, for the successive
    streams of one reader (a tap subscription reads the log in a range per wake-up, and
    each range's own decoder would decode its maps and compile its codecs again: at a
    thousand transactions a second, a codec compiled for nearly every one). One set of
    type hints per cache; one reader's streams at a time (not shared across threads that
    run at once)."""

    def __init__(self, hints: TypeHints = NO_HINTS) -> None:
        self.hints = hints
        # (TABLE_MAP body, its post-header length, MariaDB's) -> the decoded map
        self.maps: dict[tuple[bytes, int, bool], TableMap] = {}
        self.codecs = CodecCache()


class StreamDecoder:
    def __init__(self, hints: TypeHints = NO_HINTS, *, checksum: bool | None = None,
                 tables: DecodedTables | None = None) -> None:
        """`tables`: decoded maps and codecs kept from the reader's earlier streams (its
        hints are the decoder's)."""
        self._tables = tables if tables is not None else DecodedTables(hints)
        self.hints = self._tables.hints
        self.fde: FormatDescription | None = None
        self.checksum = bool(checksum)
        self._checksum_fixed = checksum is not None
        self.mariadb = True
        self._raw_tables: dict[int, bytes] = {}
        self.codecs = self._tables.codecs
        self._warned: set[tuple[str, str]] = set()

    # --- state ---------------------------------------------------------------------------

    def format_description(self, data: bytes) -> FormatDescription:
        fde = decode_fde(data)
        self.fde = fde
        if not self._checksum_fixed:
            self.checksum = fde.has_crc
        self.mariadb = fde.is_mariadb
        self._raw_tables.clear()  # table ids are not stable across server restarts
        return fde

    def post_header_len(self, type_code: int) -> int:
        if self.fde is not None and 0 < type_code <= len(self.fde.post_header_lens):
            return self.fde.post_header_lens[type_code - 1]
        return _DEFAULT_POST.get(type_code, 0)

    def body(self, data: bytes, *, checksum: bool | None = None) -> bytes:
        crc = self.checksum if checksum is None else checksum
        end = len(data) - (CRC_LEN if crc else 0)
        if end < HEADER_LEN:
            raise MalformedEvent(f"event of {len(data)} bytes is shorter than its header")
        return data[HEADER_LEN:end]

    # --- typed decoding ------------------------------------------------------------------

    def table_map(self, data: bytes, *, checksum: bool | None = None) -> TableMap:
        """Take a TABLE_MAP event for the rows events that follow, and return it decoded."""
        return self.table(self.remember_table_map(data, checksum=checksum))

    def remember_table_map(self, data: bytes, *, checksum: bool | None = None) -> int:
        """Take a TABLE_MAP event without decoding it (a consumer may never need it);
        returns its table id."""
        body = self.body(data, checksum=checksum)
        size = 4 if self.post_header_len(EventType.TABLE_MAP) == 6 else 6
        if len(body) < size:
            raise MalformedEvent(f"TABLE_MAP of {len(data)} bytes")
        table_id = int.from_bytes(body[:size], "little")
        self._raw_tables[table_id] = body
        return table_id

    def table(self, table_id: int) -> TableMap:
        """The decoded map of a table id the stream has seen (decoded once per map)."""
        body = self._raw_tables.get(table_id)
        if body is None:
            raise MalformedEvent(f"rows event for table id {table_id} without a TABLE_MAP")
        post_header_len = self.post_header_len(EventType.TABLE_MAP)
        maps = self._tables.maps
        key = (body, post_header_len, self.mariadb)
        tm = maps.get(key)
        if tm is None:
            # Servers repeat the same TABLE_MAP for every statement: one decoded object
            # per distinct map keeps its row codecs compiled once.
            tm = TableMap.decode(body, post_header_len=post_header_len,
                                 mariadb=self.mariadb, hints=self.hints)
            if len(maps) > 10000:
                maps.clear()
            maps[key] = tm
            if not tm.has_names and (tm.schema, tm.table) not in self._warned:
                self._warned.add((tm.schema, tm.table))
                log.warning("%s: the primary logs no column names (binlog_row_metadata is "
                            "not FULL); columns are named @1, @2, ...", tm.qualified)
        return tm

    def rows_event(self, data: bytes, *, checksum: bool | None = None) -> RowsEvent:
        typ = data[4]
        return RowsEvent.decode(typ, self.body(data, checksum=checksum),
                                post_header_len=self.post_header_len(typ))

    def table_for(self, ev: RowsEvent) -> TableMap:
        """The table map a rows event refers to."""
        return self.table(ev.table_id)

    def payload_events(self, data: bytes, *, checksum: bool | None = None) -> list[bytes]:
        """The inner events of a MySQL TRANSACTION_PAYLOAD (no CRCs)."""
        payload = compression.decode_payload(self.body(data, checksum=checksum))
        return list(payload.events())

    def uncompressed_query(self, data: bytes, *, checksum: bool | None = None) -> bytes:
        """A MariaDB QUERY_COMPRESSED event as the QUERY event it stands for (no CRC)."""
        body = self.body(data, checksum=checksum)
        post = self.post_header_len(EventType.QUERY_COMPRESSED) or 13
        if len(body) < post:
            raise MalformedEvent("QUERY_COMPRESSED shorter than its post-header")
        db_len = body[8]
        sv_len = int.from_bytes(body[11:13], "little")
        start = post + sv_len + db_len + 1
        if start > len(body):
            raise MalformedEvent("QUERY_COMPRESSED ends inside its status variables")
        text = compression.uncompress_block(body[start:], "QUERY_COMPRESSED")
        new_body = body[:start] + text
        head = bytearray(data[:HEADER_LEN])
        head[4] = EventType.QUERY
        head[9:13] = (HEADER_LEN + len(new_body)).to_bytes(4, "little")
        return bytes(head) + new_body
