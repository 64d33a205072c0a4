"""The kernels in pure Python: the specification of each, and what runs where the compiled
module (`compiled.pyx`) was not built or `RELAY_PURE_PYTHON=1` asks for it.

Every function here has a compiled twin of the same signature (`protocol.Kernels` is
that signature, and mypy holds both modules to it); tests feed both the same bytes and
require the same output, the same returned state and the same errors. A kernel is a
function over buffers: bytes in, bytes appended to an output buffer and a few plain
values out, no object of the caller's touched, so a twin can be checked against it.
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any

from relay.errors import MalformedEvent
from relay.kernels.protocol import (
    CleanKind,
    ColumnStep,
    EventKind,
    PlanStep,
    Replacer,
    SpliceMode,
    TextStep,
)

Buffer = bytes | bytearray | memoryview

HEADER_LEN = 19                # a binlog event header
MAX_EVENT_SIZE = 1 << 31       # larger than any server writes: a size past it is corrupt
MAX_PACKET = 0xFFFFFF          # a protocol packet's largest payload
EVENT = 1 << 64                # one event, in a packed tally entry (bytes below bit 64)

_HEAD = struct.Struct("<IB4xB4xII")  # length + seq, OK byte, event type, size, log_pos
_PKT_HEAD = struct.Struct("<IB")     # length + seq, then the OK byte
_SIZE = struct.Struct("<I").unpack_from


def impossible_size(size: int, offset: int) -> MalformedEvent:
    """The error every walk by the size field raises for a size no event can have."""
    return MalformedEvent(f"impossible event size {size}", offset=offset)


def check_seq(seq: int) -> None:
    if not 0 <= seq <= 255:
        raise ValueError(f"sequence id {seq} is not a byte")


def check_pos(pos: int) -> None:
    if pos < 0:
        raise ValueError(f"negative offset {pos}")


def whole_events(buf: Buffer, start: int, end: int) -> int:
    """Where the whole events of buf[start:end] end, walked by the size field (`start`
    when not even one fits): a relay log cursor's read cut at an event boundary. A size
    no event can have raises MalformedEvent at its offset; `end` past the buffer,
    ValueError."""
    return checked_events(buf, start, end, 0)[0]


def checked_events(buf: Buffer, start: int, end: int, crc_len: int) -> tuple[int, int]:
    """Walk the whole events of buf[start:end] checking each one's size and, with
    `crc_len` 4, its CRC32: (where the whole events that hold end, the offset of the first
    whose CRC32 does not hold or -1). A size no event can have raises MalformedEvent at its
    offset; an event cut by `end` is left (the first value stops before it). An import
    checks every event of an archive with it. (The caller takes a FORMAT_DESCRIPTION whose
    CRC was computed with the in-use flag clear, as a server writes it, itself.)"""
    check_pos(start)
    if end > len(buf):
        raise ValueError(f"end {end} is past the buffer ({len(buf)} bytes)")
    if crc_len not in (0, 4):
        raise ValueError(f"crc_len {crc_len}: 0 or 4")
    mv = memoryview(buf)
    try:
        pos = start
        while end - pos >= HEADER_LEN:
            size = _SIZE(buf, pos + 9)[0]
            if size < HEADER_LEN + crc_len or size > MAX_EVENT_SIZE:
                raise impossible_size(size, pos)
            if pos + size > end:
                break
            if crc_len and zlib.crc32(mv[pos : pos + size - 4]) != _SIZE(buf, pos + size - 4)[0]:
                return pos, pos
            pos += size
        return pos, -1
    finally:
        mv.release()


def frame_stored(out: bytearray, buf: Buffer, seq: int,
                 omit: int = -1) -> tuple[int, int, int]:
    """Append the whole events of `buf` (back to back, as the relay log stores them) to
    `out` as dump packets: length and sequence id, the OK byte, the event; an event of
    16 MiB or more split over packets as the protocol splits any payload. Events of type
    `omit` (-1: none) are passed over, not framed. Returns (next sequence id, where the
    last whole event ends (0: none fits), where the last framed one starts or -1). An
    event that does not fit is left for the caller's next read; a size no event can
    have raises MalformedEvent at its offset, after the events before it were framed."""
    check_seq(seq)
    n = len(buf)
    mv = memoryview(buf)
    pack = _PKT_HEAD.pack
    pos = 0
    last = -1
    try:
        while n - pos >= HEADER_LEN:
            size = _SIZE(buf, pos + 9)[0]
            if size < HEADER_LEN or size > MAX_EVENT_SIZE:
                raise impossible_size(size, pos)
            end = pos + size
            if end > n:
                break
            if buf[pos + 4] == omit:
                pos = end
                continue
            if size + 1 >= MAX_PACKET:
                seq = frame_large(out, b"\0", mv[pos:end], seq)
            else:
                out += pack((size + 1) | (seq << 24), 0)
                out += mv[pos:end]
                seq = (seq + 1) & 0xFF
            last, pos = pos, end
    finally:
        mv.release()
    return seq, pos, last


def frame_large(out: bytearray, head: bytes, event: Buffer, seq: int) -> int:
    """Append `head` + `event` as one payload of 16 MiB or more: packets of 16 MiB - 1
    each, then a shorter one (empty when the payload is a multiple), as MySQL splits it.
    Returns the next sequence id."""
    payload = memoryview(bytearray(head) + event)
    pos = 0
    while True:
        chunk = payload[pos : pos + MAX_PACKET]
        out += len(chunk).to_bytes(3, "little")
        out.append(seq)
        out += chunk
        seq = (seq + 1) & 0xFF
        pos += len(chunk)
        if len(chunk) < MAX_PACKET:
            return seq


def read_dump(buf: Buffer, pos: int, seq: int, last_pos: int, plain: bytes,
              tally: list[int], out: bytearray, marks: list[int]) -> tuple[int, int, int]:
    """The dump stream's common case, from `pos` in `buf`: whole one-event packets in
    sequence (no semi-sync header, under 16 MiB). Appends each packet's event to `out`,
    appends to `marks` the offset in `out` of each event whose type is not plain
    (`plain[type]` is 0) or whose log_pos does not follow `last_pos` + its size, and adds
    each event to `tally` (packed: events above bit 64, bytes below). Stops before the
    first packet that is not such a one (cut short, out of sequence, an ERR or EOF, a
    larger event): the caller reads that one its own way. Returns (pos, seq, last_pos)
    where it stopped."""
    check_seq(seq)
    check_pos(pos)
    if len(plain) != 256:
        raise ValueError("plain: one byte per event type (256)")
    if len(tally) != 256:
        raise ValueError("tally: one entry per event type (256)")
    n = len(buf)
    mv = memoryview(buf)
    head = _HEAD.unpack_from
    limit = MAX_PACKET - 1  # an event this large continues in the next packet
    seqbits = seq << 24
    try:
        while n - pos >= 22:
            lenseq, ok, typ, size, log_pos = head(buf, pos)
            end = pos + 5 + size
            # One comparison checks both the length (the event and its OK byte) and the
            # sequence id.
            if lenseq != seqbits | (size + 1) or ok or end > n \
                    or not HEADER_LEN <= size < limit:
                break
            seqbits = (seqbits + 0x1000000) & 0xFF000000
            if not plain[typ] or log_pos != last_pos + size:
                marks.append(len(out))
            last_pos = log_pos
            tally[typ] += size + EVENT
            out += mv[pos + 5 : end]
            pos = end
    finally:
        mv.release()
    return pos, seqbits >> 24, last_pos


# The scan's kinds and plan steps as plain ints (an enum member costs the loop a lookup).
PLAIN, GTID, XID = int(EventKind.PLAIN), int(EventKind.GTID), int(EventKind.XID)
BEGIN, REWRITE, COMMIT = int(PlanStep.BEGIN), int(PlanStep.REWRITE), int(PlanStep.COMMIT)
_EVENT = struct.Struct("<IBIII").unpack_from  # timestamp, type, server_id, size, log_pos
_GTID_BODY = struct.Struct("<QIB").unpack_from  # seq_no, domain_id, flags2


def scan_ingest(data: Buffer, pos: int, marks: list[int] | None, mi: int, kinds: bytes,
                wend: int, in_group: bool, inline_gtid: bool, segment_size: int,
                plan: list[tuple[int, ...]]) -> tuple[int, int, int, bool]:
    """The ingest's walk over a batch of whole events from `pos`: what the relay log's
    appender must do, as a plan, for the events that need no Python of their own.
    `wend` is where the relay log's segment ends (each event's log_pos should be its
    end there), `marks` (with the batch's end as the last entry; None: visit every event)
    the dump reader's marks, from index `mi`: between two marks all events are plain
    and placed right after each other, so a transaction's run is taken whole.

    Appends to `plan`, in order: (BEGIN, pos, domain, server_id, seq_no, flags2, wend
    before it, timestamp) for a MariaDB GTID that opens a transaction (only while
    `inline_gtid`), (REWRITE, pos, end, log_pos) for an event not at its place,
    (COMMIT, pos, wend) after an XID that ends one. Stops at the batch's end, before an
    event the caller handles itself (another type, a plain event outside a transaction, a
    size that cannot be), or right after a commit that fills the segment
    (`wend >= segment_size`). Returns (pos, mi, wend, in_group) where it stopped."""
    check_pos(pos)
    check_pos(mi)
    if len(kinds) != 256:
        raise ValueError("kinds: one byte per event type (256)")
    n = len(data)
    while n - pos >= HEADER_LEN:
        ts, typ, server_id, size, log_pos = _EVENT(data, pos)
        end = pos + size
        if size < HEADER_LEN or end > n:
            break
        kind = kinds[typ]
        closes = False
        if kind == PLAIN:
            if not in_group:
                break
        elif kind == GTID and not in_group and inline_gtid and size >= 32:
            seq_no, domain, flags2 = _GTID_BODY(data, pos + HEADER_LEN)
            plan.append((BEGIN, pos, domain, server_id, seq_no, flags2, wend, ts))
            in_group = True
        elif kind == XID and in_group:
            in_group = False
            closes = True
        else:
            break
        wend += size
        if log_pos != wend:
            plan.append((REWRITE, pos, end, wend))
        elif marks is not None and in_group:
            # Placed as it came: so are the plain events up to the next mark.
            while mi < len(marks) and marks[mi] <= pos:
                mi += 1
            if mi < len(marks) and end <= marks[mi] <= n:
                wend += marks[mi] - end
                end = marks[mi]
        pos = end
        if closes:
            plan.append((COMMIT, pos, wend))
            if wend >= segment_size:
                break
    return pos, mi, wend, in_group


_C_GTID, _C_TABLE_MAP, _C_ROWS = int(CleanKind.GTID), int(CleanKind.TABLE_MAP), int(CleanKind.ROWS)
_C_ANNOTATION, _C_XID = int(CleanKind.ANNOTATION), int(CleanKind.XID)
_C_MYSQL_GTID, _C_QUERY = int(CleanKind.MYSQL_GTID), int(CleanKind.QUERY)
_QUERY_POST_HEADER = 13  # thread id, exec time, schema length, error code, status length
FL_STANDALONE = 0x01       # a MariaDB GTID's flags2: the group is one statement, no XID
MAX_CLEAN_TABLES = 16      # tables one transaction may map and still be taken whole


def _is_begin(chunk: Buffer, pos: int, size: int, crc_len: int) -> bool:
    """Whether the QUERY event at `pos` (whole, `size` bytes) is the statement BEGIN."""
    body = pos + HEADER_LEN
    if size < HEADER_LEN + _QUERY_POST_HEADER + 1 + crc_len:
        return False
    status = chunk[body + 11] | chunk[body + 12] << 8  # then the schema name and a NUL
    start = body + _QUERY_POST_HEADER + status + chunk[body + 8] + 1
    end = pos + size - crc_len
    return end - start == 5 and bytes(chunk[start:end]) == b"BEGIN"


def scan_clean(chunk: Buffer, pos: int, kinds: bytes, id_size: int, crc_len: int,
               table_map: Callable[[int, int], int], known: dict[bytes, int],
               drop_annotations: bool, cuts: list[int]) -> tuple[int, int]:
    """The rules' walk over whole transactions from `pos` (between transactions) that
    their chain leaves as they are but for annotations, so that a run of them goes out as
    one slice of stored bytes. Such a transaction opens with a MariaDB GTID that is not
    standalone, or a MySQL GTID followed by the statement BEGIN (`crc_len`: the bytes of
    an event's checksum, 4 or 0), and holds only: table maps that `table_map(start, end)`
    judges untouched (it returns the table id, or -1: not so; `known` holds the ids it
    gave by table map body, the bytes between header and checksum: a body found there is
    not judged again, and each one judged untouched is added), rows events of tables
    mapped so in the same transaction (at most 16 of them), annotations; an XID ends it.
    Returns (where the last such transaction ends: `pos` when none, the events of them the
    chain saw: rows and annotations) and, with `drop_annotations`, appends each of their
    annotations' start and end to `cuts`. Stops before the first transaction it cannot
    take whole (the caller looks at that one itself), or where the chunk ends inside one."""
    check_pos(pos)
    if len(kinds) != 256:
        raise ValueError("kinds: one byte per event type (256)")
    if not 4 <= id_size <= 6 or crc_len not in (0, 4):
        raise ValueError(f"table id size {id_size}, checksum length {crc_len}")
    n = len(chunk)
    entered = 0
    while n - pos >= HEADER_LEN:
        size = _SIZE(chunk, pos + 9)[0]
        opener = kinds[chunk[pos + 4]]
        if not HEADER_LEN <= size <= n - pos:
            break
        p = pos + size
        if opener == _C_GTID:
            if size < HEADER_LEN + 13 or chunk[pos + HEADER_LEN + 12] & FL_STANDALONE:
                break
        elif opener == _C_MYSQL_GTID:
            if n - p < HEADER_LEN or kinds[chunk[p + 4]] != _C_QUERY:
                break
            size = _SIZE(chunk, p + 9)[0]
            if not HEADER_LEN <= size <= n - p or not _is_begin(chunk, p, size, crc_len):
                break
            p += size
        else:
            break
        tables: list[int] = []
        seen = 0
        mark = len(cuts)
        closed = False
        while n - p >= HEADER_LEN:
            size = _SIZE(chunk, p + 9)[0]
            if not HEADER_LEN <= size <= n - p:
                break
            kind = kinds[chunk[p + 4]]
            end = p + size
            if kind == _C_ROWS:
                if size < HEADER_LEN + id_size or int.from_bytes(
                        chunk[p + HEADER_LEN : p + HEADER_LEN + id_size], "little") \
                        not in tables:
                    break
                seen += 1
            elif kind == _C_TABLE_MAP:
                if len(tables) == MAX_CLEAN_TABLES:
                    break
                body = bytes(chunk[p + HEADER_LEN : max(p + HEADER_LEN, end - crc_len)])
                tid = known.get(body, -1)
                if tid < 0:
                    tid = table_map(p, end)
                    if tid < 0:
                        break
                    known[body] = tid
                tables.append(tid)
            elif kind == _C_ANNOTATION:
                seen += 1
                if drop_annotations:
                    cuts += (p, end)
            elif kind == _C_XID:
                closed = True
                p = end
                break
            else:
                break
            p = end
        if not closed:
            del cuts[mark:]
            break
        entered += seen
        pos = p
    return pos, entered


PREFIXED = 0x80  # a row layout byte: a length prefix of (byte & 0x7F) bytes, else a width


def splice_rows(rows: Buffer, images: list[tuple[bytes, bytes]],
                replace: list[tuple[Replacer | None, ...]]) -> tuple[bytes, bool]:
    """Rows of a rows event (the part after its column bitmaps) with some columns'
    values replaced and every other byte as it was: what a mask costs without decoding
    and encoding the columns it leaves alone. `images` gives each image of a row in turn
    (one; an UPDATE's two: before, after) as (layout, masked), one byte per column in the
    image: the layout byte is the column's width (under 128), or PREFIXED | the bytes of
    its length prefix (1 to 4); the masked byte is a SpliceMode, and
    `replace[image][column]` is then the column's replacer, which returns what takes the
    value's place, or None for NULL. Returns (the new rows,
    whether any value changed). A value or NULL bitmap that runs past the rows raises
    MalformedEvent at its offset; a new value longer than its prefix holds, OverflowError;
    arguments no table has, ValueError."""
    check_splice(images, replace)
    n = len(rows)
    out = bytearray()
    changed = False
    pos = 0
    while pos < n:
        for k, (layout, masked) in enumerate(images):
            calls = replace[k]
            cols = len(layout)
            nb = (cols + 7) // 8
            if nb > n - pos:
                raise MalformedEvent("a row's NULL bitmap runs past the event", offset=pos)
            nulls = bytearray(rows[pos : pos + nb])
            pos += nb
            values = bytearray()
            for i in range(cols):
                if nulls[i >> 3] >> (i & 7) & 1:
                    continue
                width = layout[i]
                start = pos
                plen = 0
                if width & PREFIXED:
                    plen = width & 0x7F
                    if plen > n - pos:
                        raise MalformedEvent("a value's length runs past the event",
                                             offset=pos)
                    width = plen + int.from_bytes(rows[pos : pos + plen], "little")
                if width > n - pos:
                    raise MalformedEvent("a value runs past the event", offset=pos)
                pos += width
                mode = masked[i]
                if not mode:
                    values += rows[start:pos]
                    continue
                raw = bytes(rows[start + plen if mode == SpliceMode.VALUE else start : pos])
                new = calls[i](raw)  # type: ignore[misc]  # (checked: one per masked column)
                if new is None:
                    nulls[i >> 3] |= 1 << (i & 7)
                    changed = True
                    continue
                if mode == SpliceMode.VALUE:
                    if len(new) >> (8 * plen):
                        raise OverflowError(f"a masked value of {len(new)} bytes is longer "
                                            f"than its {plen}-byte length prefix holds")
                    values += len(new).to_bytes(plen, "little")
                values += new
                changed = changed or new != raw
            out += nulls
            out += values
    return bytes(out), changed


def check_splice(images: list[tuple[bytes, bytes]],
                 replace: list[tuple[Replacer | None, ...]]) -> None:
    """splice_rows' arguments as both twins take them (ValueError otherwise)."""
    if not any(layout for layout, _masked in images):
        raise ValueError("images: at least one column")
    if len(replace) != len(images):
        raise ValueError("replace: one tuple of replacers per image")
    for (layout, masked), calls in zip(images, replace, strict=True):
        if len(masked) != len(layout) or len(calls) != len(layout):
            raise ValueError("images: one masked byte and one replacer per column")
        for width, mode, call in zip(layout, masked, calls, strict=True):
            if width & PREFIXED and width & 0x7F > 4:
                raise ValueError("images: a length prefix is of 1 to 4 bytes")
            if mode > SpliceMode.VALUE or (mode and call is None) \
                    or (mode == SpliceMode.VALUE and not width & PREFIXED):
                raise ValueError("images: a masked column has a replacer, and only a column "
                                 "with a length prefix is replaced by value")


# --- row images into Arrow column buffers (the typed tap) -------------------------------------

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_DAY_US = 86_400_000_000
_MAX_TEXT = (1 << 31) - 1          # int32 offsets
_OUT_WIDTH = {ColumnStep.YEAR: 2, ColumnStep.FLOAT: 4, ColumnStep.DOUBLE: 8,
              ColumnStep.DECIMAL: 16, ColumnStep.DATE: 4, ColumnStep.DATETIME2: 8,
              ColumnStep.TIMESTAMP2: 8}


class _NotConverted(Exception):
    """A value decode_columns leaves to the row codec."""


class _Saved:
    """The arguments both row-image kernels check, and the sinks as they were (sizes, and
    the validity bytes earlier rows share with new ones) for restoring them on -1."""

    def __init__(self, name: str, data: Buffer, pos: int, end: int,
                 sinks: list[list[bytearray]], rows: list[int], per_sink: int) -> None:
        if not 0 <= pos <= end <= len(data):
            raise ValueError(f"{name}: pos and end must lie within the data")
        if not sinks or len(rows) != len(sinks) or any(n < 0 for n in rows):
            raise ValueError(f"{name}: one row count (not negative) per sink")
        if any(len(sink) != per_sink for sink in sinks):
            raise ValueError(f"{name}: {per_sink} buffers in each sink")
        self.sinks, self.rows = sinks, rows
        self.sizes = [[len(b) for b in sink] for sink in sinks]
        self.shared = [[b[rows[k] >> 3] if i % 3 == 0 and len(b) > rows[k] >> 3 else None
                        for i, b in enumerate(sink)] for k, sink in enumerate(sinks)]

    def restore(self) -> None:
        for k, sink in enumerate(self.sinks):
            for buf, size, byte in zip(sink, self.sizes[k], self.shared[k], strict=True):
                del buf[size:]
                if byte is not None:
                    buf[self.rows[k] >> 3] = byte


def _set_bit(validity: bytearray, row: int, valid: bool) -> None:
    while len(validity) <= row >> 3:
        validity.append(0)
    if valid:
        validity[row >> 3] |= 1 << (row & 7)
    else:
        validity[row >> 3] &= ~(1 << (row & 7)) & 0xFF


def _frac(data: Buffer, p: int, fsp: int) -> int:
    if fsp == 0:
        return 0
    if fsp <= 2:
        return data[p] * 10000
    if fsp <= 4:
        return ((data[p] << 8) | data[p + 1]) * 100
    return (data[p] << 16) | (data[p + 1] << 8) | data[p + 2]


def _decimal(raw: bytearray, precision: int, scale: int) -> int:
    """The unscaled value of MySQL's binary DECIMAL (base-10^9 groups, big-endian, the top
    bit set for a positive value, every bit inverted for a negative one)."""
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    intg = precision - scale
    groups = ([intg % 9] if intg % 9 else []) + [9] * (intg // 9 + scale // 9) + \
        ([scale % 9] if scale % 9 else [])
    value, p = 0, 0
    for digits in groups:
        size = _DIG2BYTES[digits]
        group = int.from_bytes(raw[p : p + size], "big")
        if group >= 10**digits:  # not a decimal the server writes: the codec's to judge
            raise _NotConverted
        value = value * 10**digits + group
        p += size
    return -value if negative else value


def _stored_size(step: int, a: int, c: int) -> int:
    """The bytes a non-NULL value of a fixed-size step takes in the row image."""
    return {ColumnStep.INT: a, ColumnStep.YEAR: 1, ColumnStep.FLOAT: 4, ColumnStep.DOUBLE: 8,
            ColumnStep.DECIMAL: c, ColumnStep.DATE: 3,
            ColumnStep.DATETIME2: 5 + (a + 1) // 2,
            ColumnStep.TIMESTAMP2: 4 + (a + 1) // 2, ColumnStep.TIME2: 3 + (a + 1) // 2,
            ColumnStep.ENUM: a, ColumnStep.BIT: a, ColumnStep.SET: a}[ColumnStep(step)]


def _date(raw: bytes) -> date:
    v = int.from_bytes(raw[:3], "little")
    try:
        return date(v >> 9, (v >> 5) & 15, v & 31)
    except ValueError:
        raise _NotConverted from None  # a zero date: the codec gives InvalidTemporal


def _datetime2(raw: bytes, fsp: int) -> datetime:
    v = int.from_bytes(raw[:5], "big") - 0x8000000000
    ymd, hms = v >> 17, v & 0x1FFFF
    ym = ymd >> 5
    try:
        return datetime(ym // 13, ym % 13, ymd & 31, hms >> 12, (hms >> 6) & 63, hms & 63,
                        _frac(raw, 5, fsp))
    except ValueError:
        raise _NotConverted from None


def _column_value(step: int, a: int, b: int, c: int, data: Buffer, p: int, end: int,
                  charmaps: tuple[bytes, ...] = ()) -> tuple[bytes, int]:
    """(the value's bytes in its Arrow column, the offset after it) for one non-NULL value;
    TEXT: its bytes (the caller writes the offset)."""
    if step == ColumnStep.TEXT:
        if p + a > end:
            raise _NotConverted
        n = int.from_bytes(data[p : p + a], "little")
        p += a
        if p + n > end:
            raise _NotConverted
        raw = bytes(data[p : p + n])
        if b == 1:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _NotConverted from None
        elif b == 2:
            charmap = charmaps[c]
            raw = b"".join(charmap[4 * x + 1 : 4 * x + 1 + charmap[4 * x]] for x in raw)
        elif c and n < c:
            raw = raw.ljust(c, b"\0")
        return raw, p + n
    size = _stored_size(step, a, c)
    if p + size > end:
        raise _NotConverted
    raw = bytes(data[p : p + size])
    if step == ColumnStep.INT:
        value = int.from_bytes(raw, "little", signed=bool(b))
        return value.to_bytes(c, "little", signed=True), p + size
    if step == ColumnStep.YEAR:
        return (1900 + raw[0] if raw[0] else 0).to_bytes(2, "little"), p + size
    if step == ColumnStep.FLOAT or step == ColumnStep.DOUBLE:
        bits = int.from_bytes(raw, "little")
        if (step == ColumnStep.FLOAT and (bits >> 23) & 0xFF == 0xFF) or \
                (step == ColumnStep.DOUBLE and (bits >> 52) & 0x7FF == 0x7FF):
            raise _NotConverted  # NaN or an infinity: no server stores one
        return raw, p + size
    if step == ColumnStep.DECIMAL:
        return _decimal(bytearray(raw), a, b).to_bytes(16, "little", signed=True), p + size
    if step == ColumnStep.DATE:
        day = _date(raw)
        return (day.toordinal() - _EPOCH_DAY).to_bytes(4, "little", signed=True), p + size
    if step == ColumnStep.DATETIME2:
        when = _datetime2(raw, a)
        us = (when.toordinal() - _EPOCH_DAY) * _DAY_US + \
            ((when.hour * 60 + when.minute) * 60 + when.second) * 1_000_000 + when.microsecond
        return us.to_bytes(8, "little", signed=True), p + size
    sec, us = int.from_bytes(raw[:4], "big"), _frac(raw, 4, a)  # TIMESTAMP2
    if sec == 0 and us == 0:
        raise _NotConverted  # the zero timestamp
    return (sec * 1_000_000 + us).to_bytes(8, "little", signed=True), p + size


# Plans already checked, by identity (a caller makes a plan once per table and passes the
# same tuples with every event: checking one costs more than a small event's rows).
_CHECKED: dict[tuple[int, int, int, int, int, bool],
               tuple[tuple[int, ...], tuple[bytes, ...], object, object]] = {}


def check_plan(plan: tuple[int, ...], charmaps: tuple[bytes, ...],
               max_precision: int = 38,
               members: tuple[tuple[str, ...], ...] | None = None,
               calls: tuple[Callable[[bytes], Any], ...] = (), documents: bool = False,
               ) -> None:
    """Refuse a plan no table has (both twins call this first): what each step's
    arguments may be is in ColumnStep (TIME2, ENUM, BIT, SET and CALL only with
    `members`: row_values'; JSON only with `documents`: the JSON writers').
    A charmap is 256 entries of four bytes: the length (1-3) of the byte's character in
    UTF-8, then those bytes."""
    key = (id(plan), id(charmaps), max_precision, id(members), id(calls), documents)
    known = _CHECKED.get(key)
    if known is not None and known[0] is plan and known[1] is charmaps \
            and known[2] is members and known[3] is calls:
        return
    _check_plan(plan, charmaps, max_precision, members, calls, documents)
    if len(_CHECKED) >= 1024:
        _CHECKED.clear()
    _CHECKED[key] = (plan, charmaps, members, calls)


def _check_plan(plan: tuple[int, ...], charmaps: tuple[bytes, ...], max_precision: int,
                members: tuple[tuple[str, ...], ...] | None,
                calls: tuple[Callable[[bytes], Any], ...], documents: bool) -> None:
    if members is not None and not all(type(names) is tuple and
                                       all(type(name) is str for name in names)
                                       for names in members):
        raise ValueError("row_values: members are tuples of str")
    if type(calls) is not tuple or not all(callable(call) for call in calls):
        raise ValueError("row_values: calls are a tuple of callables")
    for charmap in charmaps:
        if len(charmap) != 1024 or any(not 1 <= charmap[i] <= 3 for i in range(0, 1024, 4)):
            raise ValueError("decode_columns: a charmap is 256 UTF-8 characters of 1-3 bytes")
    if not plan or len(plan) % 4:
        raise ValueError("decode_columns: four ints per column")
    for j in range(0, len(plan), 4):
        step, a, b, c = plan[j : j + 4]
        if step == ColumnStep.INT:
            ok = a in (1, 2, 3, 4, 8) and c in (1, 2, 4, 8, 16) and b in (0, 1) and \
                (c > a or (c == a and b == 1))
        elif step == ColumnStep.DECIMAL:
            ok = 0 < a <= max_precision and 0 <= b <= a and c == _decimal_size(a, b)
        elif step in (ColumnStep.DATETIME2, ColumnStep.TIMESTAMP2):
            ok = 0 <= a <= 6
        elif step == ColumnStep.TEXT:
            ok = 1 <= a <= 4 and ((b == 0 and 0 <= c <= 255) or (b == 1 and c == 0) or
                                  (b == 2 and 0 <= c < len(charmaps)))
        elif step == ColumnStep.TIME2:
            ok = (members is not None or documents) and 0 <= a <= 6 and b == c == 0
        elif step in (ColumnStep.ENUM, ColumnStep.SET):
            ok = members is not None and a in ((1, 2) if step == ColumnStep.ENUM else
                                               range(1, 9)) and (
                (b == 0 and c == 0) or (b == 1 and 0 <= c < len(members)))
        elif step == ColumnStep.BIT:
            ok = (members is not None or documents) and 1 <= a <= 8 and b == c == 0
        elif step == ColumnStep.CALL:
            ok = members is not None and 1 <= a <= 4 and b == 0 and 0 <= c < len(calls)
        elif step in (ColumnStep.JSON, ColumnStep.GEOMETRY):
            ok = documents and 1 <= a <= 4 and b == c == 0
        else:
            ok = step in (ColumnStep.YEAR, ColumnStep.FLOAT, ColumnStep.DOUBLE, ColumnStep.DATE)
        if not ok:
            raise ValueError(f"decode_columns: no column is stored as {plan[j : j + 4]}")


def _decimal_size(precision: int, scale: int) -> int:
    intg = precision - scale
    return (intg // 9) * 4 + _DIG2BYTES[intg % 9] + (scale // 9) * 4 + _DIG2BYTES[scale % 9]


def decode_columns(data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                   charmaps: tuple[bytes, ...], sinks: list[list[bytearray]],
                   rows: list[int]) -> int:
    """The row images of a rows event, from `pos` to `end`, into Arrow column buffers (the
    typed tap). `plan` has four ints per column the images hold (a ColumnStep and its
    arguments); `charmaps` are the tables recoding single-byte character sets. Each row
    holds len(sinks) images (an UPDATE's: before, after), image k going to sinks[k]: three
    buffers per column, its validity bitmap, its values (for TEXT: int32 offsets, the
    first already there) and its text bytes, after the rows[k] rows already there. NULL
    values are zeros (TEXT: an empty string) with a clear bit.

    Returns the rows decoded, or -1 where anything is not what the plan converts (a zero
    date, text that is not UTF-8, a value running past `end`, ...): the caller decodes the
    event with the row codec instead, which names what is wrong, and the sinks are left as
    they were."""
    check_plan(plan, charmaps)
    ncols = len(plan) // 4
    saved = _Saved("decode_columns", data, pos, end, sinks, rows, 3 * ncols)
    nulls_len = (ncols + 7) // 8
    done = 0
    try:
        while pos < end:
            for k, sink in enumerate(sinks):
                row = rows[k] + done
                if pos + nulls_len > end:
                    raise _NotConverted
                nulls = data[pos : pos + nulls_len]
                p = pos + nulls_len
                for j in range(ncols):
                    step, a, b, c = plan[4 * j : 4 * j + 4]
                    validity, values, text = sink[3 * j : 3 * j + 3]
                    null = nulls[j >> 3] >> (j & 7) & 1
                    _set_bit(validity, row, not null)
                    if step == ColumnStep.TEXT:
                        if not null:
                            raw, p = _column_value(step, a, b, c, data, p, end, charmaps)
                            text += raw
                            if len(text) > _MAX_TEXT:
                                raise _NotConverted
                        values += len(text).to_bytes(4, "little")
                    elif null:
                        values += bytes(c if step == ColumnStep.INT else
                                        _OUT_WIDTH[ColumnStep(step)])
                    else:
                        raw, p = _column_value(step, a, b, c, data, p, end)
                        values += raw
                pos = p
            done += 1
    except _NotConverted:
        saved.restore()
        return -1
    return done


# --- row images as JSON objects (the tap's JSON form) ------------------------------------------

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)


def _fraction(us: int, fsp: int) -> str:
    return "." + f"{us:06d}"[:fsp] if fsp else ""


def _json_value(step: int, a: int, b: int, c: int, data: Buffer, p: int, end: int,
                charmaps: tuple[bytes, ...]) -> tuple[str, int]:
    """(one non-NULL value as JSON text, the offset after it): relay/binlog/jsonvalue.py's
    form, as the tap's generated JSON writer writes it (relay/tap/arrow.py json_writer)."""
    if step == ColumnStep.TEXT:
        raw, p = _column_value(step, a, b, c, data, p, end, charmaps)
        if b == 0:  # bytes (BINARY(n) padded): base64
            return '"' + base64.b64encode(raw).decode("ascii") + '"', p
        return encode_basestring(raw.decode("utf-8")), p
    if step == ColumnStep.JSON:
        raw, p = _column_value(ColumnStep.TEXT, a, 0, 0, data, p, end)
        return _document_text(raw), p
    if step == ColumnStep.GEOMETRY:   # the SRID, then the WKB
        raw, p = _column_value(ColumnStep.TEXT, a, 0, 0, data, p, end)
        if len(raw) < 4:
            raise _NotConverted  # (the codec's MalformedEvent)
        return '{"srid":' + str(int.from_bytes(raw[:4], "little")) + ',"wkb":"' + \
            base64.b64encode(raw[4:]).decode("ascii") + '"}', p
    size = _stored_size(step, a, c)
    if p + size > end:
        raise _NotConverted
    raw = bytes(data[p : p + size])
    if step == ColumnStep.INT:
        return str(int.from_bytes(raw, "little", signed=bool(b))), p + size
    if step == ColumnStep.YEAR:
        return str(1900 + raw[0] if raw[0] else 0), p + size
    if step == ColumnStep.BIT:
        return str(int.from_bytes(raw, "big")), p + size
    if step == ColumnStep.TIME2:  # the server's text, with the column's digits
        t = _time2(raw, a)
        us = abs(t // timedelta(microseconds=1))
        secs = us // 1_000_000
        text = f"{'-' if t < timedelta(0) else ''}{secs // 3600:02d}:" \
            f"{secs % 3600 // 60:02d}:{secs % 60:02d}"
        return '"' + text + ("." + f"{us % 1_000_000:06d}"[:a] if a else "") + '"', p + size
    if step == ColumnStep.FLOAT or step == ColumnStep.DOUBLE:
        _column_value(step, a, b, c, data, p, end)  # NaN and infinities: not converted
        return repr(struct.unpack("<f" if step == ColumnStep.FLOAT else "<d", raw)[0]), \
            p + size
    if step == ColumnStep.DECIMAL:
        unscaled = _decimal(bytearray(raw), a, b)  # (checks the groups)
        negative = unscaled < 0  # (a zero with the sign bit clear: the codec's 0)
        digits = str(abs(unscaled))
        if b:
            digits = digits.rjust(b + 1, "0")
            digits = digits[:-b] + "." + digits[-b:]
        return '"' + str(Decimal(("-" if negative else "") + digits)) + '"', p + size
    if step == ColumnStep.DATE:
        return '"' + _date(raw).isoformat() + '"', p + size
    if step == ColumnStep.DATETIME2:
        when = _datetime2(raw, a)
        return '"' + when.isoformat(timespec="seconds") + _fraction(when.microsecond, a) + \
            '"', p + size
    sec, us = int.from_bytes(raw[:4], "big"), _frac(raw, 4, a)  # TIMESTAMP2
    if sec == 0 and us == 0:
        raise _NotConverted
    when = _EPOCH_UTC + timedelta(seconds=sec, microseconds=us)
    return '"' + when.replace(tzinfo=None).isoformat(timespec="seconds") + \
        _fraction(when.microsecond, a) + '+00:00"', p + size


def _json_image(data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                charmaps: tuple[bytes, ...], keys: tuple[bytes, ...]) -> tuple[bytes, int]:
    """One row image at `pos` (NULL bitmap, values) as a JSON object, and the offset after
    it; _NotConverted for what the plan does not write."""
    ncols = len(plan) // 4
    nulls_len = (ncols + 7) // 8
    if pos + nulls_len > end:
        raise _NotConverted
    nulls = data[pos : pos + nulls_len]
    p = pos + nulls_len
    parts = []
    for j in range(ncols):
        step, a, b, c = plan[4 * j : 4 * j + 4]
        if nulls[j >> 3] >> (j & 7) & 1:
            value = "null"
        else:
            value, p = _json_value(step, a, b, c, data, p, end, charmaps)
        parts.append(keys[j] + value.encode("utf-8"))
    return b"".join(parts) + b"}", p


def json_images(data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                charmaps: tuple[bytes, ...], keys: tuple[bytes, ...],
                sinks: list[list[bytearray]], rows: list[int]) -> int:
    """The row images of a rows event, from `pos` to `end`, as JSON objects in an Arrow
    string column (the tap's JSON form): `plan` and `charmaps` as for decode_columns
    (DECIMAL up to 65 digits; TEXT with a binary character set as base64), `keys[j]` the
    bytes before column j's value (its name: '{"id":', ',"v":'); each image k goes to
    sinks[k] = [validity bitmap, int32 offsets (the first already there), text], after
    its rows[k] rows. Returns the rows decoded, or -1 (sinks as they were) for what the
    plan does not convert, as decode_columns."""
    check_plan(plan, charmaps, max_precision=65, documents=True)
    ncols = len(plan) // 4
    if len(keys) != ncols:
        raise ValueError("json_images: one key per column")
    saved = _Saved("json_images", data, pos, end, sinks, rows, 3)
    done = 0
    try:
        while pos < end:
            for k, (validity, offsets, text) in enumerate(sinks):
                row = rows[k] + done
                image, p = _json_image(data, pos, end, plan, charmaps, keys)
                text += image
                if len(text) > _MAX_TEXT:
                    raise _NotConverted
                offsets += len(text).to_bytes(4, "little")
                _set_bit(validity, row, True)
                pos = p
            done += 1
    except _NotConverted:
        saved.restore()
        return -1
    return done


# --- text result sets (the snapshot's reads) -------------------------------------------------
# A row of a text result set is one packet (3-byte length, sequence byte) holding each
# column's value as a length-encoded string, or 0xFB for NULL. The kernels stop, and leave
# to the caller, at what is not one whole row packet: too few bytes, a row of several
# packets (a payload of 0xFFFFFF bytes), the EOF (0xFE, under 9 bytes) or error (0xFF)
# packet that ends the rows, and a packet that is not a row of `ncols` values (the
# caller's own parse names it).

_NULL_VALUE = 0xFB


def _row_packet(data: Buffer, pos: int, end: int) -> tuple[int, int] | None:
    """(payload start, payload end) of the packet at pos when it is whole, has one
    packet's payload, and is neither EOF nor an error; else None."""
    if end - pos < 4:
        return None
    n = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
    if n == MAX_PACKET or end - pos - 4 < n:
        return None
    p = pos + 4
    if n and (data[p] == 0xFF or (data[p] == 0xFE and n < 9)):
        return None
    return p, p + n


def text_values(data: Buffer, p: int, stop: int, ncols: int,
                 ) -> list[tuple[int, int] | None] | None:
    """Where each of the row's `ncols` values lies ((start, end), None for NULL), or None
    when the payload is not exactly such a row."""
    spans: list[tuple[int, int] | None] = []
    for _ in range(ncols):
        if p >= stop:
            return None
        first = data[p]
        if first == _NULL_VALUE:
            spans.append(None)
            p += 1
            continue
        if first < 0xFB:
            n, p = first, p + 1
        elif first == 0xFF:
            return None
        else:
            width = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
            if stop - p - 1 < width:
                return None
            n = int.from_bytes(data[p + 1 : p + 1 + width], "little")
            p += 1 + width
        if n > stop - p:
            return None
        spans.append((p, p + n))
        p += n
    return spans if p == stop else None


def text_rows(data: Buffer, pos: int, end: int, ncols: int,
              out: list[tuple[bytes | None, ...]], limit: int) -> int:
    """Rows of a text result set from `pos` (before `end`), each a tuple of its values'
    bytes (None for NULL), appended to `out`, at most `limit`: returns the position after
    the last row taken (see above for where it stops)."""
    check_pos(pos)
    if end > len(data) or pos > end:
        raise ValueError("text_rows: pos and end must lie within the data")
    if ncols < 1:
        raise ValueError("text_rows: a row has columns")
    taken = 0
    while taken < limit:
        packet = _row_packet(data, pos, end)
        if packet is None:
            break
        spans = text_values(data, *packet, ncols)
        if spans is None:
            break
        out.append(tuple(None if s is None else bytes(data[s[0] : s[1]]) for s in spans))
        pos = packet[1]
        taken += 1
    return pos


_INT_TEXT = re.compile(rb"-?[0-9]+")
_DECIMAL_TEXT = re.compile(rb"-?[0-9]+(\.[0-9]+)?")
_DATE_TEXT = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATETIME_TEXT = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}"
                            rb"(\.[0-9]{1,6})?")


def _plain_day(v: bytes) -> bool:
    """A day the text can be copied for: no zero part, and no day past the 28th (those
    may be invalid: the converter decides)."""
    return v[:4] != b"0000" and v[5:7] != b"00" and v[8:10] != b"00" and v[8:10] <= b"28"


def _json_text(step: int, v: bytes) -> bytes:
    if step == TextStep.INT:  # str(int(v)), without int()'s limit on digits
        if _INT_TEXT.fullmatch(v):
            number = v.lstrip(b"-").lstrip(b"0") or b"0"
            return b"-" + number if v[:1] == b"-" and number != b"0" else number
    elif step == TextStep.TEXT:
        try:
            return encode_basestring(v.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            pass
    elif step == TextStep.BASE64:
        return b'"' + base64.b64encode(v) + b'"'
    elif step == TextStep.DECIMAL:
        if _DECIMAL_TEXT.fullmatch(v) and not v.lstrip(b"-").startswith(b"0.000000"):
            return b'"' + v + b'"'
    elif step == TextStep.DATE:
        if _DATE_TEXT.fullmatch(v) and _plain_day(v):
            return b'"' + v + b'"'
    elif step in (TextStep.DATETIME, TextStep.TIMESTAMP) and \
            _DATETIME_TEXT.fullmatch(v) and _plain_day(v):
        zone = b"+00:00" if step == TextStep.TIMESTAMP else b""
        return b'"' + v[:10] + b"T" + v[11:] + zone + b'"'
    raise _NotConverted


def json_text_rows(data: Buffer, pos: int, end: int, plan: tuple[int, ...],
                   keys: tuple[bytes, ...], sink: list[bytearray], row: int,
                   limit: int) -> tuple[int, int]:
    """Rows of a text result set from `pos` as JSON object text in an Arrow string column
    (the tap's JSON form of a snapshot's rows): `plan` has a TextStep per column, `keys`
    the bytes before each value ('{"id":', ',"v":'), `sink` is [validity bitmap, int32
    offsets (the first already there), text] holding `row` rows. At most `limit` rows;
    stops where text_rows stops, and at a row with a value its step does not write (the
    caller writes that row). Returns (the position after the last row taken, rows)."""
    check_pos(pos)
    if end > len(data) or pos > end:
        raise ValueError("json_text_rows: pos and end must lie within the data")
    if not plan or len(keys) != len(plan) or any(
            not isinstance(s, int) or s not in _TEXT_STEPS for s in plan):
        raise ValueError("json_text_rows: a step of TextStep and a key for each column")
    if len(sink) != 3 or row < 0:
        raise ValueError("json_text_rows: a sink of three buffers and its row count")
    validity, offsets, text = sink
    taken = 0
    while taken < limit:
        packet = _row_packet(data, pos, end)
        if packet is None:
            break
        spans = text_values(data, *packet, len(plan))
        if spans is None:
            break
        try:
            image = b"".join(keys[j] + (b"null" if s is None else _json_text(
                plan[j], bytes(data[s[0] : s[1]]))) for j, s in enumerate(spans)) + b"}"
        except _NotConverted:
            break
        if len(text) + len(image) > _MAX_TEXT:
            break
        text += image
        offsets += len(text).to_bytes(4, "little")
        _set_bit(validity, row + taken, True)
        pos = packet[1]
        taken += 1
    return pos, taken


_TEXT_STEPS = frozenset(TextStep)


# --- relay changes' lines: a binlog file's row changes as JSON lines ---------------------------
# The kernel takes a transaction whole when it has exactly the common form: a MariaDB GTID
# (not STANDALONE) or a MySQL GTID / ANONYMOUS_GTID and the query BEGIN; then table maps,
# rows events of tables this transaction mapped, annotations; then an XID or the query
# COMMIT. Between transactions it steps over ROTATE, STOP, heartbeats, BINLOG_CHECKPOINT,
# GTID_LIST and PREVIOUS_GTIDS. It stops before anything else (a FORMAT_DESCRIPTION, a
# DDL, a checksum that does not match, a transaction not whole before `end`), and the
# caller's general path (relay/binlog/changes.py) takes that transaction.

_LINE_XID, _LINE_QUERY, _LINE_TABLE_MAP = 16, 2, 19
_LINE_GTID, _LINE_MYSQL_GTID, _LINE_ANONYMOUS_GTID = 162, 33, 34
_LINE_BETWEEN = frozenset({3, 4, 27, 35, 41, 161, 163})   # STOP, ROTATE, HEARTBEAT, ...
_LINE_ANNOTATIONS = frozenset({29, 160})                  # ROWS_QUERY, ANNOTATE_ROWS
# rows event type: (0 insert / 1 update / 2 delete, v2 header, the kernel writes its images)
_LINE_ROWS = {23: (0, False, True), 24: (1, False, True), 25: (2, False, True),
              30: (0, True, True), 31: (1, True, True), 32: (2, True, True),
              39: (1, True, False),                                     # PARTIAL_UPDATE_ROWS
              166: (0, False, False), 167: (1, False, False), 168: (2, False, False),
              169: (0, True, False), 170: (1, True, False), 171: (2, True, False)}
LINE_OPS = (b',"op":"insert"', b',"op":"update"', b',"op":"delete"')
MAX_LINE_TABLES = 64  # tables one transaction may map and still be taken
_ID_SIZE = 6


def _event_at(data: Buffer, p: int, end: int, crc_len: int) -> tuple[int, int] | None:
    """(type, size) of the whole event at p, its checksum right; None otherwise."""
    if end - p < HEADER_LEN:
        return None
    size = _SIZE(data, p + 9)[0]
    if size < HEADER_LEN + crc_len or size > end - p:
        return None
    if crc_len and zlib.crc32(data[p : p + size - 4]) != _SIZE(data, p + size - 4)[0]:
        return None
    return data[p + 4], size


def _iso_utc(us: int) -> bytes | None:
    """datetime.fromtimestamp's UTC isoformat of `us` microseconds past the epoch."""
    try:
        when = _EPOCH_UTC + timedelta(microseconds=us)
    except OverflowError:
        return None
    return when.isoformat().encode("ascii")


def _line_head(data: Buffer, p: int, size: int, typ: int, crc_len: int) -> bytes | None:
    """A transaction's fields from its GTID event: '{"gtid":..,"server_id":..,
    "timestamp":..' (None: not a form the kernel takes)."""
    ts, server_id = _SIZE(data, p)[0], _SIZE(data, p + 5)[0]
    body = p + HEADER_LEN
    body_end = p + size - crc_len
    if typ == _LINE_GTID:
        if body_end - body < 13 or data[body + 12] & FL_STANDALONE:
            return None
        seq, domain, _flags = _GTID_BODY(data, body)
        gtid = f'"{domain}-{server_id}-{seq}"'.encode()
        us = ts * 1_000_000
    else:
        if body_end - body < 25:
            return None
        if typ == _LINE_MYSQL_GTID:
            sid = bytes(data[body + 1 : body + 17]).hex()
            gno = struct.unpack_from("<Q", data, body + 17)[0]
            gtid = (f'"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}'
                    f':{gno}"').encode()
        else:
            gtid = b"null"
        us = ts * 1_000_000
        if body_end - (body + 42) >= 7:
            commit = int.from_bytes(data[body + 42 : body + 49], "little") & ((1 << 55) - 1)
            if commit:
                us = commit
    when = _iso_utc(us)
    if when is None:
        return None
    return b'{"gtid":' + gtid + b',"server_id":' + str(server_id).encode() + \
        b',"timestamp":"' + when + b'"'


def _query_body(data: Buffer, p: int, size: int, crc_len: int) -> bytes | None:
    body = p + HEADER_LEN
    if size < HEADER_LEN + _QUERY_POST_HEADER + 1 + crc_len:
        return None
    start = body + _QUERY_POST_HEADER + (data[body + 11] | data[body + 12] << 8) + \
        data[body + 8] + 1
    stop = p + size - crc_len
    return bytes(data[start:stop]) if start <= stop else None


def _rows_header(data: Buffer, p: int, size: int, crc_len: int, v2: bool,
                 update: bool) -> tuple[int, int, bool, int] | None:
    """(table id, where the rows start, whether every image holds every one of the
    event's columns, their count) of a rows event; None for a header that runs past the
    event."""
    end = p + size - crc_len
    q = p + HEADER_LEN
    if end - q < _ID_SIZE + 2:
        return None
    table_id = int.from_bytes(data[q : q + _ID_SIZE], "little")
    q += _ID_SIZE + 2
    if v2:
        if end - q < 2:
            return None
        extra = data[q] | data[q + 1] << 8
        if extra < 2 or extra > end - q:
            return None
        q += extra
    if q >= end:
        return None
    first = data[q]
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first, 0)
    if first == 0xFB or first == 0xFF or end - q < 1 + width:
        return None
    ncols = int.from_bytes(data[q + 1 : q + 1 + width], "little") if width else first
    q += 1 + width
    nb = (ncols + 7) >> 3
    full = True
    for _ in range(2 if update else 1):
        if end - q < nb:
            return None
        bits = int.from_bytes(data[q : q + nb], "little")
        full = full and bits & ((1 << ncols) - 1) == (1 << ncols) - 1
        q += nb
    return table_id, q, full and ncols > 0, ncols


def change_lines(data: Buffer, pos: int, end: int, crc_len: int, state: list[Any],
                 table_map: Callable[[int, int], tuple[Any, ...] | None],
                 images: Callable[[int, int, tuple[Any, ...]],
                                  list[tuple[bytes | None, bytes | None]]],
                 out: bytearray, at: bytes, limit: int) -> int:
    """`relay changes`' JSON lines of the transactions in data[pos:end] (the comment
    above says which the kernel takes), appended to `out`: '{"gtid":..,"server_id":..,
    "timestamp":..' `at` (',"file":"NAME","pos":') the rows event's offset, ',"row":'
    the row's index in its event, ',"op":..', the table's names (',"schema":..,"table":..,
    "before":'), the before-image, ',"after":', the after-image, '}\\n'.

    `table_map(p, size)` gives the entry of the table map event at p, or None to stop
    before its transaction: (table id, columns, plan or None, charmaps, keys, names or
    None to write no lines for the table, the map's body). The kernel keeps the entries
    in state[3] ({table id: entry}) and asks again only for a map whose body changed.
    A rows event the plan does not write whole (no plan, images of some columns, a
    compressed or partial event, a value the plan leaves) is given to `images(p, size,
    entry)`, which returns its (before, after) JSON images. After an event that leaves
    `out` at `limit` bytes or more it returns inside the transaction: state[0] is then
    where to go on, state[1] the transaction's end, state[2] its fields; the next call
    passes that position. state[4] is the size `out` had when the transaction being
    written began (0 when it was resumed): a caller whose callback raised keeps the lines
    before it, those of whole transactions. Returns where it stopped (state[0] 0 between
    transactions)."""
    check_pos(pos)
    if end > len(data) or pos > end:
        raise ValueError("change_lines: pos and end must lie within the data")
    if crc_len not in (0, 4) or len(state) != 5 or type(state[3]) is not dict:
        raise ValueError("change_lines: a checksum length of 0 or 4 and a state of five")
    if type(out) is not bytearray or type(at) is not bytes:
        raise TypeError("change_lines: out is a bytearray, at bytes")
    tables: dict[int, tuple[Any, ...]] = state[3]
    if state[0]:
        if state[0] != pos or not pos < state[1] <= end or \
                not _resumable(data, pos, state[1], tables):
            raise ValueError("change_lines: resume where the last call stopped")
        state[4] = 0
        pos = _write_lines(data, pos, state[1], crc_len, state[2], tables, images, out, at,
                           limit, state)
        if state[0]:
            return pos
    while pos < end:
        got = _event_at(data, pos, end, crc_len)
        if got is None:
            return pos
        typ, size = got
        if typ in _LINE_BETWEEN:
            pos += size
            continue
        if typ not in (_LINE_GTID, _LINE_MYSQL_GTID, _LINE_ANONYMOUS_GTID):
            return pos
        head = _line_head(data, pos, size, typ, crc_len)
        if head is None:
            return pos
        state[4] = len(out)
        tx_end = _takes(data, pos, end, crc_len, typ, size, tables, table_map)
        if tx_end < 0:
            return pos
        pos = _write_lines(data, pos + size, tx_end, crc_len, head, tables, images, out, at,
                           limit, state)
        if state[0]:
            return pos
    return pos


def _takes(data: Buffer, pos: int, end: int, crc_len: int, typ: int, size: int,
           tables: dict[int, tuple[Any, ...]],
           table_map: Callable[[int, int], tuple[Any, ...] | None]) -> int:
    """The end of the transaction opened at pos when the kernel takes it whole, else -1."""
    p = pos + size
    if typ != _LINE_GTID:  # MySQL: the query BEGIN next
        got = _event_at(data, p, end, crc_len)
        if got is None or got[0] != _LINE_QUERY or not _is_begin(data, p, got[1], crc_len):
            return -1
        p += got[1]
    mapped: set[int] = set()
    while True:
        got = _event_at(data, p, end, crc_len)
        if got is None:
            return -1
        typ, size = got
        if typ == _LINE_XID:
            return p + size
        if typ == _LINE_QUERY:
            return p + size if _query_body(data, p, size, crc_len) == b"COMMIT" else -1
        if typ == _LINE_TABLE_MAP:
            if size < HEADER_LEN + _ID_SIZE + crc_len:
                return -1
            tid = int.from_bytes(data[p + HEADER_LEN : p + HEADER_LEN + _ID_SIZE], "little")
            body = bytes(data[p + HEADER_LEN : p + size - crc_len])
            entry = tables.get(tid)
            if tid in mapped:  # mapped again: the same table, or the general path's
                if entry is None or entry[6] != body:
                    return -1
            elif entry is None or entry[6] != body:
                if len(mapped) == MAX_LINE_TABLES:
                    return -1
                entry = table_map(p, size)
                if entry is None:
                    return -1
                _check_entry(entry)
                if entry[0] != tid:
                    return -1
                tables[tid] = entry
            elif len(mapped) == MAX_LINE_TABLES:
                return -1
            mapped.add(tid)
        elif typ in _LINE_ROWS:
            if size < HEADER_LEN + _ID_SIZE + crc_len or int.from_bytes(
                    data[p + HEADER_LEN : p + HEADER_LEN + _ID_SIZE], "little") not in mapped:
                return -1
        elif typ not in _LINE_ANNOTATIONS:
            return -1
        p += size


def _check_entry(entry: Any) -> None:
    if type(entry) is not tuple or len(entry) < 7 or type(entry[6]) is not bytes or \
            (entry[5] is not None and type(entry[5]) is not bytes):
        raise ValueError("change_lines: an entry of (table id, columns, plan, charmaps, "
                         "keys, names, body, ...)")


def _resumable(data: Buffer, p: int, tx_end: int, tables: dict[int, tuple[Any, ...]]) -> bool:
    """Whether the events from p to tx_end are whole and their rows events' tables known
    (what the first call checked, held again: the state is the caller's)."""
    while p < tx_end:
        if tx_end - p < HEADER_LEN:
            return False
        size = _SIZE(data, p + 9)[0]
        if size < HEADER_LEN or size > tx_end - p:
            return False
        if data[p + 4] in _LINE_ROWS and (size < HEADER_LEN + _ID_SIZE or int.from_bytes(
                data[p + HEADER_LEN : p + HEADER_LEN + _ID_SIZE], "little") not in tables):
            return False
        p += size
    return True


def _write_lines(data: Buffer, p: int, tx_end: int, crc_len: int, head: bytes,
                 tables: dict[int, tuple[Any, ...]],
                 images: Callable[[int, int, tuple[Any, ...]],
                                  list[tuple[bytes | None, bytes | None]]],
                 out: bytearray, at: bytes, limit: int, state: list[Any]) -> int:
    """The lines of a transaction taken whole, from p (after its opening events)."""
    state[0] = 0
    while p < tx_end:
        typ, size = data[p + 4], _SIZE(data, p + 9)[0]
        shape = _LINE_ROWS.get(typ)
        if shape is not None:
            tid = int.from_bytes(data[p + HEADER_LEN : p + HEADER_LEN + _ID_SIZE], "little")
            entry = tables[tid]
            if entry[5] is not None:
                _event_lines(data, p, size, crc_len, shape, head, entry, images, out, at)
        p += size
        if len(out) >= limit and p < tx_end:
            state[0], state[1], state[2] = p, tx_end, head
            return p
    return p


def _event_lines(data: Buffer, p: int, size: int, crc_len: int, shape: tuple[int, bool, bool],
                 head: bytes, entry: tuple[Any, ...],
                 images: Callable[[int, int, tuple[Any, ...]],
                                  list[tuple[bytes | None, bytes | None]]],
                 out: bytearray, at: bytes) -> None:
    kind, v2, plain = shape
    pairs: list[tuple[bytes | None, bytes | None]] | None = None
    header = _rows_header(data, p, size, crc_len, v2, kind == 1)
    if plain and entry[2] is not None and header is not None and header[2] \
            and header[3] == entry[1]:
        pairs = _plan_images(data, header[1], p + size - crc_len, kind, entry)
    if pairs is None:
        pairs = images(p, size, entry)
    prefix = head + at + str(p).encode() + b',"row":'
    middle = LINE_OPS[kind] + entry[5]
    for i, (before, after) in enumerate(pairs):
        out += prefix + str(i).encode() + middle + (b"null" if before is None else before) + \
            b',"after":' + (b"null" if after is None else after) + b"}\n"


def _plan_images(data: Buffer, q: int, end: int, kind: int, entry: tuple[Any, ...]
                 ) -> list[tuple[bytes | None, bytes | None]] | None:
    """The event's images written by the entry's plan; None for a value it does not write
    (or an event whose columns are not the table's)."""
    _tid, ncols, plan, charmaps, keys = entry[:5]
    check_plan(plan, charmaps, max_precision=65, documents=True)
    if len(keys) != len(plan) // 4:
        raise ValueError("change_lines: one key per column")
    if any(type(key) is not bytes for key in keys):
        raise TypeError("change_lines: the keys are bytes")
    if len(plan) // 4 != ncols:
        return None
    pairs: list[tuple[bytes | None, bytes | None]] = []
    try:
        while q < end:
            first, q = _json_image(data, q, end, plan, charmaps, keys)
            if kind == 1:
                second, q = _json_image(data, q, end, plan, charmaps, keys)
                pairs.append((first, second))
            else:
                pairs.append((None, first) if kind == 0 else (first, None))
    except _NotConverted:
        return None
    return pairs


# --- row images as Python values (the row codec's, for full images of planned tables) ------

def _time2(raw: bytes, fsp: int) -> timedelta:
    """TIME(fsp) in MySQL 5.6's packed form (the row codec's time2): negative values with
    a fraction borrow one from the integer part, as the server writes them."""
    if fsp >= 5:
        packed = int.from_bytes(raw[:6], "big") - 0x800000000000
    elif fsp == 0:
        packed = (int.from_bytes(raw[:3], "big") - 0x800000) << 24
    else:
        nb, scale = (1, 10000) if fsp <= 2 else (2, 100)
        whole = int.from_bytes(raw[: 3 + nb], "big")
        intpart, frac = (whole >> (8 * nb)) - 0x800000, whole & ((1 << (8 * nb)) - 1)
        if intpart < 0 and frac:
            intpart += 1
            frac -= 1 << (8 * nb)
        packed = (intpart << 24) + frac * scale
    size = -packed if packed < 0 else packed
    hms = size >> 24
    sec = ((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63)
    us = size & 0xFFFFFF
    return timedelta(0, -sec, -us) if packed < 0 else timedelta(0, sec, us)


def _python_value(step: int, a: int, b: int, c: int, data: Buffer, p: int, end: int,
                  charmaps: tuple[bytes, ...], members: tuple[tuple[str, ...], ...] = (),
                  calls: tuple[Callable[[bytes], Any], ...] = ()) -> tuple[Any, int]:
    """(one non-NULL value as the row codec decodes it, the offset after it)."""
    if step == ColumnStep.TEXT:
        raw, p = _column_value(step, a, b, c, data, p, end, charmaps)
        return (raw.decode("utf-8") if b else raw), p
    if step == ColumnStep.CALL:  # (its bytes as they are: TEXT's first way)
        raw, p = _column_value(ColumnStep.TEXT, a, 0, 0, data, p, end)
        try:
            value = calls[c](raw)
        except Exception:  # (the codec raises its own error, naming the column)
            raise _NotConverted from None
        if value is None:
            raise _NotConverted
        return value, p
    size = _stored_size(step, a, c)
    if p + size > end:
        raise _NotConverted
    raw = bytes(data[p : p + size])
    if step == ColumnStep.INT:
        return int.from_bytes(raw, "little", signed=bool(b)), p + size
    if step == ColumnStep.YEAR:
        return (1900 + raw[0] if raw[0] else 0), p + size
    if step == ColumnStep.FLOAT or step == ColumnStep.DOUBLE:
        _column_value(step, a, b, c, data, p, end)  # NaN and infinities: not converted
        return struct.unpack("<f" if step == ColumnStep.FLOAT else "<d", raw)[0], p + size
    if step == ColumnStep.DECIMAL:
        text, _ = _json_value(step, a, b, c, data, p, end, charmaps)
        return Decimal(text[1:-1]), p + size
    if step == ColumnStep.DATE:
        return _date(raw), p + size
    if step == ColumnStep.DATETIME2:
        return _datetime2(raw, a), p + size
    if step == ColumnStep.TIME2:
        return _time2(raw, a), p + size
    if step == ColumnStep.ENUM:
        number = int.from_bytes(raw, "little")
        if not b:
            return number, p + size
        if number > len(members[c]):
            raise _NotConverted  # (the codec's IndexError: a malformed event)
        return (members[c][number - 1] if number else ""), p + size
    if step == ColumnStep.BIT:
        return int.from_bytes(raw, "big"), p + size
    if step == ColumnStep.SET:
        mask = int.from_bytes(raw, "little")
        if not b:
            return mask, p + size
        names = members[c]
        if mask >> len(names):
            raise _NotConverted  # (the codec's MalformedEvent: bits past the names)
        return frozenset(m for i, m in enumerate(names) if mask >> i & 1), p + size
    sec, us = int.from_bytes(raw[:4], "big"), _frac(raw, 4, a)  # TIMESTAMP2
    if sec == 0 and us == 0:
        raise _NotConverted  # the zero timestamp
    return _EPOCH_UTC + timedelta(seconds=sec, microseconds=us), p + size


def row_values(data: Buffer, pos: int, end: int, plan: tuple[int, ...],
               charmaps: tuple[bytes, ...], members: tuple[tuple[str, ...], ...],
               images: int, out: list[tuple[Any, ...]],
               image: type[tuple[Any, ...]] = tuple,
               calls: tuple[Callable[[bytes], Any], ...] = ()) -> int:
    """The rows of a rows event from `pos` to `end` as the row codec's Python values: each
    row `images` (1, or 2 for an UPDATE) images of every column, each an instance of
    `image` (tuple or a subclass: the table's RowImage class) appended to `out`; `plan`
    and `charmaps` as for json_images (DECIMAL up to 65 digits), and TIME2, ENUM, BIT,
    SET and CALL steps (an ENUM's or a SET's names in `members`, a CALL's converters in
    `calls`). Returns the rows decoded, or -1 (`out` as it was) for what the plan does not
    convert."""
    check_plan(plan, charmaps, max_precision=65, members=members, calls=calls)
    if not 0 <= pos <= end <= len(data):
        raise ValueError("row_values: pos and end must lie within the data")
    if images not in (1, 2):
        raise ValueError("row_values: one or two images a row")
    if not (isinstance(image, type) and issubclass(image, tuple)):
        raise ValueError("row_values: image is a tuple or a subclass of tuple")
    ncols = len(plan) // 4
    nulls_len = (ncols + 7) // 8
    mark = len(out)
    done = 0
    try:
        while pos < end:
            for _ in range(images):
                if pos + nulls_len > end:
                    raise _NotConverted
                nulls = data[pos : pos + nulls_len]
                p = pos + nulls_len
                values: list[Any] = []
                for j in range(ncols):
                    if nulls[j >> 3] >> (j & 7) & 1:
                        values.append(None)
                        continue
                    step, a, b, c = plan[4 * j : 4 * j + 4]
                    value, p = _python_value(step, a, b, c, data, p, end, charmaps, members,
                                             calls)
                    values.append(value)
                out.append(tuple.__new__(image, values))
                pos = p
            done += 1
    except _NotConverted:
        del out[mark:]
        return -1
    return done


# --- MySQL's binary JSON documents ----------------------------------------------------------
# The value types of the format (MySQL's json_binary.h); relay/binlog/jsonb.py encodes them.
_J_SMALL_OBJECT, _J_LARGE_OBJECT, _J_SMALL_ARRAY, _J_LARGE_ARRAY = 0, 1, 2, 3
_J_LITERAL, _J_INT16, _J_UINT16, _J_INT32, _J_UINT32, _J_INT64, _J_UINT64 = range(4, 11)
_J_DOUBLE, _J_STRING, _J_OPAQUE = 11, 12, 15
_J_NEWDECIMAL = 246  # an opaque scalar's field type: (precision, scale, binary DECIMAL)
_J_MAX_DEPTH = 100   # containers a server nests at most (JSON_DOCUMENT_MAX_DEPTH)
_J_SCALARS = {_J_INT16: struct.Struct("<h"), _J_UINT16: struct.Struct("<H"),
              _J_INT32: struct.Struct("<i"), _J_UINT32: struct.Struct("<I"),
              _J_INT64: struct.Struct("<q"), _J_UINT64: struct.Struct("<Q"),
              _J_DOUBLE: struct.Struct("<d")}
_J_UNSIGNED = (_J_UINT16, _J_UINT32, _J_UINT64)


def json_document(data: Buffer, uint: Callable[[int], int],
                  opaque: Callable[[int, bytes], Any],
                  decimal: Callable[[str, int], Any]) -> Any:
    """A whole binary JSON document (its type byte, then its value; not empty) as Python
    values: dict, list, str, int, float, bool, None for JSON's null; an unsigned integer
    as `uint(value)`, a DECIMAL as `decimal(its text as str(Decimal) writes it, its
    precision)`, another opaque scalar (a date, ...) or a DECIMAL whose bytes no server
    writes as `opaque(field type, bytes)`. Bad bytes raise MalformedEvent("binary JSON:
    ...").
    A document's values never share bytes, so a document of n bytes has fewer than n
    values: one with more (containers whose entries point at one another) is bad, and
    costs no more than its size to refuse."""
    try:
        return _Document(data, uint, opaque, decimal).value(data[0], 1, len(data))
    except (IndexError, struct.error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _document_bad(str(exc) or type(exc).__name__) from exc


def _opaque_decimal_text(raw: bytes) -> str | None:
    """The text of a DECIMAL opaque scalar (its precision, scale, then MySQL's binary
    DECIMAL) as str(Decimal) writes it, or None for bytes no server writes."""
    if len(raw) < 2:
        return None
    precision, scale = raw[0], raw[1]
    if not (0 < precision <= 65 and scale <= precision) or \
            len(raw) - 2 != _decimal_size(precision, scale):
        return None
    try:
        text, _ = _json_value(ColumnStep.DECIMAL, precision, scale, len(raw) - 2, raw, 2,
                              len(raw), ())
    except _NotConverted:
        return None
    return text[1:-1]


def _document_bad(msg: str) -> MalformedEvent:
    return MalformedEvent(f"binary JSON: {msg}")


class _Document:
    """One document's decoding: its bytes, what makes its scalars, the values left."""

    def __init__(self, data: Buffer, uint: Callable[[int], int],
                 opaque: Callable[[int, bytes], Any],
                 decimal: Callable[[str, int], Any]) -> None:
        self.data = data
        self.uint = uint
        self.opaque = opaque
        self.decimal = decimal
        self.values_left = len(data)

    def spend(self, n: int) -> None:
        """Count n entries, or n bytes of strings, keys and opaque scalars: a document's
        values never share bytes, so it has no more of them than bytes, and one that has
        (entries pointing at one child, or at one long string) costs no more than its
        size to refuse."""
        self.values_left -= n
        if self.values_left < 0:
            raise _document_bad("more values than the document has bytes")

    def varlen(self, pos: int) -> tuple[int, int]:
        n = 0
        shift = 0
        for i in range(5):
            b = self.data[pos + i]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n, pos + i + 1
            shift += 7
        raise _document_bad("variable-length integer longer than 5 bytes")

    def value(self, typ: int, pos: int, end: int) -> Any:
        data = self.data
        if typ <= _J_LARGE_ARRAY:
            return self.container(typ, pos, end)
        if typ == _J_LITERAL:
            b = data[pos]
            if b > 2:
                raise _document_bad(f"unknown literal {b}")
            return (None, True, False)[b]
        scalar = _J_SCALARS.get(typ)
        if scalar is not None:  # (read within the document, not only within `end`)
            value = scalar.unpack_from(data, pos)[0]
            return self.uint(value) if typ in _J_UNSIGNED else value
        if typ == _J_STRING:
            n, p = self.varlen(pos)
            if p + n > end:
                raise _document_bad("string runs past the document")
            self.spend(n)
            return str(data[p : p + n], "utf-8")
        if typ == _J_OPAQUE:
            ftype = data[pos]
            n, p = self.varlen(pos + 1)
            if p + n > end:
                raise _document_bad("opaque value runs past the document")
            self.spend(n)
            raw = bytes(data[p : p + n])
            text = _opaque_decimal_text(raw) if ftype == _J_NEWDECIMAL else None
            return self.opaque(ftype, raw) if text is None else self.decimal(text, raw[0])
        raise _document_bad(f"unknown value type {typ}")

    def container(self, typ: int, base: int, end: int) -> Any:
        data = self.data
        large = typ in (_J_LARGE_OBJECT, _J_LARGE_ARRAY)
        off = _J_SCALARS[_J_UINT32] if large else _J_SCALARS[_J_UINT16]
        off_size = off.size
        count = off.unpack_from(data, base)[0]
        size = off.unpack_from(data, base + off_size)[0]
        if base + size > end:
            raise _document_bad(f"container of {size} bytes runs past the document")
        self.spend(count)
        obj_end = base + size
        pos = base + 2 * off_size
        keys: list[str] = []
        if typ in (_J_SMALL_OBJECT, _J_LARGE_OBJECT):
            for _ in range(count):
                koff = off.unpack_from(data, pos)[0]
                klen = _J_SCALARS[_J_UINT16].unpack_from(data, pos + off_size)[0]
                if base + koff + klen > obj_end:
                    raise _document_bad("object key runs past its object")
                self.spend(klen)
                keys.append(str(data[base + koff : base + koff + klen], "utf-8"))
                pos += off_size + 2
        items = []
        for _ in range(count):
            vtype = data[pos]
            if vtype in (_J_LITERAL, _J_INT16, _J_UINT16) or \
                    (large and vtype in (_J_INT32, _J_UINT32)):  # inlined in its entry
                items.append(self.value(vtype, pos + 1, obj_end))
            else:
                voff = off.unpack_from(data, pos + 1)[0]
                if base + voff >= obj_end:
                    raise _document_bad("value offset past its container")
                items.append(self.value(vtype, base + voff, obj_end))
            pos += 1 + off_size
        if typ in (_J_SMALL_OBJECT, _J_LARGE_OBJECT):
            return dict(zip(keys, items, strict=True))
        return items


class _DecimalText(str):
    """A document's DECIMAL, as its text (written quoted)."""


def _no_opaque(ftype: int, raw: bytes) -> Any:
    raise _NotConverted  # (a date, a time, ...: the generated writer's)


def document_text(raw: bytes) -> str | None:
    """_document_text, or None for what it does not write (the compiled twin's way out
    for a document its fast path does not take whole)."""
    try:
        return _document_text(raw)
    except _NotConverted:
        return None


def _document_text(raw: bytes) -> str:
    """The JSON text of a binary JSON document as relay/binlog/jsonvalue.py writes its
    value (json.dumps, compact, UTF-8 as it is; an empty document, JSON_EMPTY, as "");
    _NotConverted for what only that writer writes: an opaque scalar other than a
    DECIMAL, a NaN or infinity, deeper than 100 containers, bad bytes."""
    if not raw:
        return '""'
    try:
        value = _Document(raw, int, _no_opaque, lambda text, _p: _DecimalText(text)).value(
            raw[0], 1, len(raw))
    except (MalformedEvent, IndexError, struct.error, ValueError, UnicodeDecodeError,
            RecursionError):
        raise _NotConverted from None
    out: list[str] = []
    _write_document(value, out, 0)
    return "".join(out)


def _write_document(value: Any, out: list[str], depth: int) -> None:
    if isinstance(value, dict):
        if depth >= _J_MAX_DEPTH:
            raise _NotConverted
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            out.append(("," if i else "") + encode_basestring(k) + ":")
            _write_document(v, out, depth + 1)
        out.append("}")
    elif isinstance(value, list):
        if depth >= _J_MAX_DEPTH:
            raise _NotConverted
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _write_document(v, out, depth + 1)
        out.append("]")
    elif value is None:
        out.append("null")
    elif value is True or value is False:
        out.append("true" if value else "false")
    elif isinstance(value, _DecimalText):
        out.append('"' + value + '"')
    elif isinstance(value, str):
        out.append(encode_basestring(value))
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _NotConverted  # (json.dumps writes NaN and Infinity; a server stores none)
        out.append(float.__repr__(value))
    else:
        out.append(int.__repr__(value))
