"""MySQL's binary JSON (the JSON column type of MySQL 5.7+; MariaDB stores JSON as text).

Decoding gives dict / list / str / int / float / bool / None, and for MySQL's "opaque"
scalars Decimal, date, datetime, timedelta or `JsonOpaque`. Encoding follows the server's
serializer (keys sorted by length then bytes, the small layout while offsets fit 16 bits,
scalars inlined where the server inlines them), so a decoded value encodes back to the
same bytes. An unsigned integer decodes as `JsonUInt` so that it keeps its type.

Partial updates (PARTIAL_UPDATE_ROWS_EVENT with binlog_row_value_options=PARTIAL_JSON)
carry diffs instead of documents: `JsonDiff` entries, applied by `apply_diffs`.

Decoding is a kernel (relay/kernels: json_document, compiled with a pure-Python twin);
this module gives it the types it makes and decodes the opaque scalars.

Hand-written: no maintained Python library reads this format outside of replication
clients that bundle their own decoder (decode only, no encoder).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from relay import kernels
from relay.binlog import values as V
from relay.errors import MalformedEvent

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0, 1, 2, 3
LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING = range(4, 13)
OPAQUE = 15
_NULL, _TRUE, _FALSE = 0, 1, 2

# Field types that may appear inside an opaque value.
_T_NEWDECIMAL, _T_DATE, _T_TIME, _T_DATETIME, _T_TIMESTAMP = 246, 10, 11, 12, 7


class _JsonNull:
    """JSON's null as a whole column value, distinct from SQL NULL (None). Inside a
    document JSON null is None, as json.loads gives it."""

    _instance: _JsonNull | None = None

    def __new__(cls) -> _JsonNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "JSON_NULL"

    def __reduce__(self) -> str:
        return "JSON_NULL"


JSON_NULL = _JsonNull()


class _JsonEmpty(str):
    """An empty JSON column value (zero bytes in the row image)."""

    def __repr__(self) -> str:
        return "JSON_EMPTY"


JSON_EMPTY = _JsonEmpty("")


class JsonUInt(int):
    """An integer the server stored as unsigned (uint16/32/64) inside a JSON document."""


class JsonDecimal(Decimal):
    """A DECIMAL inside a JSON document, with the precision the server stored it with
    (which the value alone does not tell: 9.00 may have been DECIMAL(11,2))."""

    precision: int

    def __new__(cls, value: Decimal, precision: int) -> JsonDecimal:
        obj = super().__new__(cls, value)
        obj.precision = precision
        return obj


def json_decimal(text: str, precision: int) -> JsonDecimal:
    """A document's DECIMAL from its text (Decimal's own constructor: JsonDecimal's
    would parse a Decimal made first)."""
    value = Decimal.__new__(JsonDecimal, text)
    value.precision = precision
    return value


@dataclass(frozen=True)
class JsonOpaque:
    """A JSON scalar of a MySQL type JSON has no syntax for (e.g. a BLOB or GEOMETRY)."""

    field_type: int
    data: bytes


@dataclass(frozen=True)
class JsonDiff:
    """One operation of a partial JSON update: op is "replace", "insert" or "remove"."""

    op: str
    path: str
    value: Any = None


@dataclass(frozen=True)
class JsonPartial:
    """The after-image of a JSON column sent as diffs against the before-image."""

    diffs: tuple[JsonDiff, ...]


_OPS = ("replace", "insert", "remove")


def _bad(msg: str) -> MalformedEvent:
    return MalformedEvent(f"binary JSON: {msg}")


# --- decoding ----------------------------------------------------------------------------

def decode(data: bytes) -> Any:
    """A whole binary JSON document; a top-level null is JSON_NULL. Empty bytes (what
    the server logs for a JSON column it could not serialize) are JSON_EMPTY."""
    if not data:
        return JSON_EMPTY
    value = kernels.json_document(data, JsonUInt, decode_opaque, json_decimal)
    return JSON_NULL if value is None else value


def _inlined(vtype: int, large: bool) -> bool:
    if vtype in (LITERAL, INT16, UINT16):
        return True
    return large and vtype in (INT32, UINT32)


def decode_opaque(ftype: int, raw: bytes) -> Any:
    """An opaque scalar of a document (its MySQL field type and bytes) as a Python value."""
    if ftype == _T_NEWDECIMAL and len(raw) >= 2:
        precision, scale = raw[0], raw[1]
        size = V.decimal_size(precision, scale)
        if len(raw) - 2 == size:
            return JsonDecimal(V.decimal_value(raw, 2, precision, scale, size), precision)
    if ftype in (_T_DATE, _T_TIME, _T_DATETIME, _T_TIMESTAMP) and len(raw) == 8:
        packed = struct.unpack("<q", raw)[0]
        if ftype == _T_TIME:
            return _time_from_packed(packed)
        value = _datetime_from_packed(packed)
        if ftype == _T_DATE and isinstance(value, datetime):
            return value.date()
        return value
    return JsonOpaque(ftype, raw)


def _time_from_packed(packed: int) -> timedelta:
    neg = packed < 0
    packed = abs(packed)
    hms = packed >> 24
    us = packed % (1 << 24)
    t = timedelta(hours=(hms >> 12) % (1 << 10), minutes=(hms >> 6) % 64, seconds=hms % 64,
                  microseconds=us)
    return -t if neg else t


def _datetime_from_packed(packed: int) -> datetime | V.InvalidTemporal:
    packed = abs(packed)
    us = packed % (1 << 24)
    ymdhms = packed >> 24
    ymd, hms = ymdhms >> 17, ymdhms % (1 << 17)
    ym = ymd >> 5
    y, mo, d = ym // 13, ym % 13, ymd % (1 << 5)
    h, mi, s = hms >> 12, (hms >> 6) % 64, hms % 64
    try:
        return datetime(y, mo, d, h, mi, s, us)
    except ValueError:
        return V.InvalidTemporal("datetime", y, mo, d, h, mi, s, us, 6)


def decode_diffs(data: bytes) -> JsonPartial:
    """The diff list of a partial JSON update (after the 4-byte length)."""
    diffs = []
    pos = 0
    try:
        while pos < len(data):
            op = data[pos]
            if op > 2:
                raise _bad(f"unknown diff operation {op}")
            plen, pos = _packed_int(data, pos + 1)
            path = data[pos : pos + plen].decode("utf-8")
            pos += plen
            value: Any = None
            if op != 2:
                vlen, pos = _packed_int(data, pos)
                if pos + vlen > len(data) or vlen < 1:
                    raise _bad("diff value runs past the column")
                raw = data[pos : pos + vlen]
                value = kernels.json_document(raw, JsonUInt, decode_opaque, json_decimal)
                pos += vlen
            diffs.append(JsonDiff(_OPS[op], path, value))
    except (IndexError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"partial update: {exc}") from exc
    return JsonPartial(tuple(diffs))


def _packed_int(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    if b < 251:
        return b, pos + 1
    if b == 252:
        return struct.unpack_from("<H", data, pos + 1)[0], pos + 3
    if b == 253:
        return int.from_bytes(data[pos + 1 : pos + 4], "little"), pos + 4
    if b == 254:
        return struct.unpack_from("<Q", data, pos + 1)[0], pos + 9
    raise _bad(f"bad packed integer prefix {b}")


# --- encoding ----------------------------------------------------------------------------

def encode(value: Any) -> bytes:
    """A whole binary JSON document."""
    if value is JSON_EMPTY:
        return b""
    typ, payload = _encode_value(None if value is JSON_NULL else value)
    return bytes((typ,)) + payload


def _encode_value(value: Any) -> tuple[int, bytes]:
    if value is None:
        return LITERAL, bytes((_NULL,))
    if value is True:
        return LITERAL, bytes((_TRUE,))
    if value is False:
        return LITERAL, bytes((_FALSE,))
    if isinstance(value, JsonUInt):
        v = int(value)
        if v < 0:
            raise ValueError(f"JsonUInt {v} is negative")
        if v <= 0xFFFF:
            return UINT16, struct.pack("<H", v)
        if v <= 0xFFFFFFFF:
            return UINT32, struct.pack("<I", v)
        return UINT64, struct.pack("<Q", v)
    if isinstance(value, int):
        if -0x8000 <= value <= 0x7FFF:
            return INT16, struct.pack("<h", value)
        if -0x80000000 <= value <= 0x7FFFFFFF:
            return INT32, struct.pack("<i", value)
        if -(1 << 63) <= value < (1 << 63):
            return INT64, struct.pack("<q", value)
        if value < (1 << 64):
            return UINT64, struct.pack("<Q", value)
        raise ValueError(f"integer {value} does not fit binary JSON")
    if isinstance(value, float):
        return DOUBLE, struct.pack("<d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return STRING, _encode_varlen(len(raw)) + raw
    if isinstance(value, dict):
        return _encode_object(value)
    if isinstance(value, (list, tuple)):
        return _encode_array(list(value))
    if isinstance(value, Decimal):
        return OPAQUE, _opaque_bytes(_T_NEWDECIMAL, _decimal_opaque(value))
    if isinstance(value, datetime):
        return OPAQUE, _opaque_bytes(_T_DATETIME, struct.pack("<q", _pack_datetime(value)))
    if isinstance(value, date):
        return OPAQUE, _opaque_bytes(_T_DATE, struct.pack(
            "<q", _pack_datetime(datetime(value.year, value.month, value.day))))
    if isinstance(value, timedelta):
        return OPAQUE, _opaque_bytes(_T_TIME, struct.pack("<q", _pack_time(value)))
    if isinstance(value, JsonOpaque):
        return OPAQUE, _opaque_bytes(value.field_type, value.data)
    raise ValueError(f"cannot store {type(value).__name__} in binary JSON")


def _encode_varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _opaque_bytes(ftype: int, raw: bytes) -> bytes:
    return bytes((ftype,)) + _encode_varlen(len(raw)) + raw


def _decimal_opaque(value: Decimal) -> bytes:
    _sign, digits, exp = value.as_tuple()
    assert isinstance(exp, int)
    scale = max(-exp, 0)
    precision = max(len(digits), scale + 1) if exp <= 0 else len(digits) + exp
    precision = max(precision, getattr(value, "precision", 0))
    return bytes((precision, scale)) + V.encode_decimal(value, precision, scale)


def _pack_datetime(value: datetime) -> int:
    ymd = ((value.year * 13 + value.month) << 5) | value.day
    hms = (value.hour << 12) | (value.minute << 6) | value.second
    return (((ymd << 17) | hms) << 24) + value.microsecond


def _pack_time(value: timedelta) -> int:
    neg = value < timedelta(0)
    t = -value if neg else value
    secs = t.days * 86400 + t.seconds
    h, rem = divmod(secs, 3600)
    packed = ((((h << 12) | ((rem // 60) << 6) | (rem % 60))) << 24) + t.microseconds
    return -packed if neg else packed


def _sort_key(item: tuple[bytes, Any]) -> tuple[int, bytes]:
    return len(item[0]), item[0]


def _encode_object(obj: dict[str, Any]) -> tuple[int, bytes]:
    items = sorted(((k.encode("utf-8"), v) for k, v in obj.items()), key=_sort_key)
    for large in (False, True):
        out = _layout([k for k, _ in items], [v for _, v in items], large, is_object=True)
        if out is not None:
            return (LARGE_OBJECT if large else SMALL_OBJECT), out
    raise ValueError("JSON object too large")


def _encode_array(arr: list[Any]) -> tuple[int, bytes]:
    for large in (False, True):
        out = _layout([], arr, large, is_object=False)
        if out is not None:
            return (LARGE_ARRAY if large else SMALL_ARRAY), out
    raise ValueError("JSON array too large")


def _layout(keys: list[bytes], vals: list[Any], large: bool, *,
            is_object: bool) -> bytes | None:
    off_size = 4 if large else 2
    limit = 0xFFFFFFFF if large else 0xFFFF
    count = len(vals)
    header = 2 * off_size + (count * (off_size + 2) if is_object else 0) + count * (1 + off_size)
    key_area = b"".join(keys)
    pos = header + len(key_area)
    entries = bytearray()
    payloads = bytearray()
    for v in vals:
        typ, payload = _encode_value(v)
        if _inlined(typ, large):
            entries += bytes((typ,)) + payload.ljust(off_size, b"\0")
        else:
            if pos > limit:
                return None
            entries += bytes((typ,)) + pos.to_bytes(off_size, "little")
            payloads += payload
            pos += len(payload)
    if pos > limit:
        return None
    out = bytearray(count.to_bytes(off_size, "little") + pos.to_bytes(off_size, "little"))
    koff = header
    for k in keys:
        if len(k) > 0xFFFF:
            raise ValueError("JSON key longer than 65535 bytes")
        out += koff.to_bytes(off_size, "little") + len(k).to_bytes(2, "little")
        koff += len(k)
    out += entries + key_area + payloads
    return bytes(out)


def encode_diffs(partial: JsonPartial) -> bytes:
    out = bytearray()
    for d in partial.diffs:
        path = d.path.encode("utf-8")
        out.append(_OPS.index(d.op))
        out += _packed(len(path)) + path
        if d.op != "remove":
            doc = encode(d.value)
            out += _packed(len(doc)) + doc
    return bytes(out)


def _packed(n: int) -> bytes:
    if n < 251:
        return bytes((n,))
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + struct.pack("<Q", n)


# --- applying diffs ----------------------------------------------------------------------

def apply_diffs(document: Any, partial: JsonPartial) -> Any:
    """The after-image document: `document` (the before-image) with the diffs applied, as
    the server applies them (JSON_REPLACE / JSON_INSERT-into-array-or-object /
    JSON_REMOVE at one path each)."""
    import copy

    doc = copy.deepcopy(document)
    for d in partial.diffs:
        legs = parse_path(d.path)
        if not legs:
            if d.op == "remove":
                raise ValueError("cannot remove the root of a JSON document")
            doc = d.value
            continue
        parent = doc
        for leg in legs[:-1]:
            parent = parent[leg]
        last = legs[-1]
        if d.op == "remove":
            del parent[last]
        elif d.op == "replace":
            parent[last] = d.value
        elif isinstance(parent, list) and isinstance(last, int):
            parent.insert(last, d.value)
        else:
            parent[last] = d.value
    return doc


def parse_path(path: str) -> list[str | int]:
    """Legs of a simple MySQL JSON path: `$`, `.key`, `."quoted key"`, `[n]`."""
    p = path.strip()
    if not p.startswith("$"):
        raise ValueError(f"JSON path {path!r} does not start with $")
    i = 1
    legs: list[str | int] = []
    while i < len(p):
        c = p[i]
        if c == ".":
            i += 1
            if i < len(p) and p[i] == '"':
                j = i + 1
                key = []
                while j < len(p) and p[j] != '"':
                    if p[j] == "\\" and j + 1 < len(p):
                        j += 1
                    key.append(p[j])
                    j += 1
                legs.append("".join(key))
                i = j + 1
            else:
                j = i
                while j < len(p) and p[j] not in ".[":
                    j += 1
                legs.append(p[i:j])
                i = j
        elif c == "[":
            j = p.index("]", i)
            legs.append(int(p[i + 1 : j].strip()))
            i = j + 1
        elif c.isspace():
            i += 1
        else:
            raise ValueError(f"cannot parse JSON path {path!r} at {i}")
    return legs
