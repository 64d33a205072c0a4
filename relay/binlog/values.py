"""Column values in row images <-> Python values, one pair of functions per storage format.

Every decoder takes `(buf, pos, ...)` and returns the value; the row codec (rowcodec.py)
knows each format's width and calls these from generated code. Encoders return bytes.

Values Python cannot represent come back as `InvalidTemporal`: MySQL's zero dates
('0000-00-00'), dates with a zero month or day, year 0, and days a lenient SQL mode let
through ('2024-02-30'). It keeps the fields, so it encodes back to the same bytes and
prints like the server prints it.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal, InvalidOperation
from typing import Any, NamedTuple

from relay.errors import MalformedEvent

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidTemporal(NamedTuple):
    """A DATE, DATETIME or TIMESTAMP value Python's datetime cannot hold (a zero date, a
    zero month or day, year 0, an impossible day). `kind` is "date", "datetime" or
    "timestamp"; `str()` gives the server's text form."""

    kind: str
    year: int
    month: int
    day: int
    hour: int = 0
    minute: int = 0
    second: int = 0
    microsecond: int = 0
    fsp: int = 0

    def __str__(self) -> str:
        d = f"{self.year:04d}-{self.month:02d}-{self.day:02d}"
        if self.kind == "date":
            return d
        t = f"{d} {self.hour:02d}:{self.minute:02d}:{self.second:02d}"
        if self.fsp:
            t += "." + f"{self.microsecond:06d}"[: self.fsp]
        return t


class Geometry(bytes):
    """A spatial value: the WKB bytes, with the SRID the server stores in front of them."""

    srid: int

    def __new__(cls, wkb: bytes, srid: int = 0) -> Geometry:
        obj = super().__new__(cls, wkb)
        obj.srid = srid
        return obj

    def __repr__(self) -> str:
        return f"Geometry(srid={self.srid}, wkb={bytes(self)!r})"

    def __reduce__(self) -> tuple[type[Geometry], tuple[bytes, int]]:
        return Geometry, (bytes(self), self.srid)


# --- integers ------------------------------------------------------------------------------

def int24(buf: bytes, pos: int) -> int:
    v = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
    return v - 0x1000000 if v & 0x800000 else v


def uint24(buf: bytes, pos: int) -> int:
    return buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)


def year_value(b: int) -> int:
    return 1900 + b if b else 0


def encode_int(value: int, nbytes: int, unsigned: bool) -> bytes:
    try:
        return int(value).to_bytes(nbytes, "little", signed=not unsigned)
    except OverflowError as exc:
        raise ValueError(f"{value} does not fit in {'unsigned ' if unsigned else ''}"
                         f"{nbytes * 8}-bit integer") from exc


def encode_year(value: int) -> bytes:
    if value == 0:
        return b"\0"
    if not 1901 <= value <= 2155:
        raise ValueError(f"YEAR {value} out of range 1901..2155 (or 0)")
    return bytes((value - 1900,))


def encode_bit(value: int, nbytes: int) -> bytes:
    return int(value).to_bytes(nbytes, "big")


# --- DECIMAL -------------------------------------------------------------------------------

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_DECIMAL_CONTEXT = Context(prec=80)  # DECIMAL(65, 30) and more, without rounding


def decimal_size(precision: int, scale: int) -> int:
    intg = precision - scale
    return (intg // 9) * 4 + _DIG2BYTES[intg % 9] + (scale // 9) * 4 + _DIG2BYTES[scale % 9]


def decimal_value(buf: bytes, pos: int, precision: int, scale: int, size: int) -> Decimal:
    """MySQL's binary DECIMAL: base-10^9 groups big-endian, sign in the top bit (all bits
    inverted for negative numbers)."""
    raw = bytearray(buf[pos : pos + size])
    if len(raw) != size:
        raise MalformedEvent(f"DECIMAL({precision},{scale}) needs {size} bytes")
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    intg = precision - scale
    lead = _DIG2BYTES[intg % 9]
    p = 0
    ipart = 0
    if lead:
        ipart = int.from_bytes(raw[:lead], "big")
        p = lead
    for _ in range(intg // 9):
        ipart = ipart * 1_000_000_000 + int.from_bytes(raw[p : p + 4], "big")
        p += 4
    fpart = 0
    for _ in range(scale // 9):
        fpart = fpart * 1_000_000_000 + int.from_bytes(raw[p : p + 4], "big")
        p += 4
    trail_digits = scale % 9
    if trail_digits:
        tb = _DIG2BYTES[trail_digits]
        fpart = fpart * 10**trail_digits + int.from_bytes(raw[p : p + tb], "big")
    sign = "-" if negative else ""
    if scale:
        return Decimal(f"{sign}{ipart}.{fpart:0{scale}d}")
    return Decimal(f"{sign}{ipart}")


def decimal_lines(precision: int, scale: int, v: str, p: str, t: str) -> list[str]:
    """Statements that decode a DECIMAL(precision, scale) at offset expression `p` into
    variable `v` (temporaries prefixed `t`): the whole value read as one big-endian
    integer, the sign bit and (for negatives) the inversion undone with one XOR, the
    base-10^9 groups combined from shifts and masks. The row codec inlines them."""
    size = decimal_size(precision, scale)
    intg = precision - scale
    parts: list[tuple[int, int]] = []  # (bytes, decimal digits) from the most significant
    if intg % 9:
        parts.append((_DIG2BYTES[intg % 9], intg % 9))
    parts += [(4, 9)] * (intg // 9 + scale // 9)
    if scale % 9:
        parts.append((_DIG2BYTES[scale % 9], scale % 9))
    sign = 0x80 << (8 * (size - 1))
    ones = (1 << (8 * size)) - 1
    m, x = f"{t}m", f"{t}x"
    expr = ""
    shift = 8 * size
    for nbytes, digits in parts:
        shift -= 8 * nbytes
        group = f"(({m} >> {shift}) & {(1 << (8 * nbytes)) - 1})"
        expr = f"({expr}) * {10 ** digits} + {group}" if expr else group

    def scaled(u: str) -> str:
        return f"_D({u}).scaleb({-scale}, _CTX)" if scale else f"_D({u})"
    return [
        f"{x} = _from(buf[{p}:{p} + {size}], 'big')",
        f"if {x} & {sign}:",
        f"    {m} = {x} ^ {sign}",
        f"    {v} = {scaled(expr)}",
        "else:",
        f"    {m} = {x} ^ {ones ^ sign}",
        f"    {v} = {scaled(f'-({expr})')}",
    ]


@functools.lru_cache(maxsize=512)
def decimal_decoder(precision: int, scale: int) -> Callable[[bytes, int], Decimal]:
    """decimal_lines as a function (about three times the speed of decimal_value)."""
    size = decimal_size(precision, scale)
    lines = [f"if len(buf) < p + {size}:",
             f"    raise _bad('DECIMAL({precision},{scale}) needs {size} bytes')",
             *decimal_lines(precision, scale, "r", "p", "_"), "return r"]
    return _function(lines, f"DECIMAL({precision},{scale})")


def _function(lines: list[str], name: str) -> Callable[[bytes, int], Any]:
    ns = dict(INLINE_NAMES)
    src = "def dec(buf, p):\n" + "\n".join("    " + ln for ln in lines)
    exec(compile(src, f"<{name}>", "exec"), ns)
    return ns["dec"]  # type: ignore[no-any-return]


def encode_decimal(value: Decimal | int | str, precision: int, scale: int) -> bytes:
    try:
        d = Decimal(value).quantize(Decimal(1).scaleb(-scale), context=_DECIMAL_CONTEXT)
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a DECIMAL({precision},{scale}) value") from exc
    sign, digits, _exp = d.as_tuple()
    text = "".join(map(str, digits)).rjust(scale + 1, "0")
    ipart, fpart = text[: len(text) - scale], text[len(text) - scale :]
    intg = precision - scale
    ipart = ipart.lstrip("0")
    if len(ipart) > intg:
        raise ValueError(f"{value} does not fit DECIMAL({precision},{scale})")
    ipart = ipart.rjust(intg, "0")
    out = bytearray()
    lead = intg % 9
    if lead:
        out += int(ipart[:lead]).to_bytes(_DIG2BYTES[lead], "big")
    for i in range(lead, intg, 9):
        out += int(ipart[i : i + 9]).to_bytes(4, "big")
    full = scale // 9
    for i in range(full):
        out += int(fpart[i * 9 : i * 9 + 9]).to_bytes(4, "big")
    trail = scale % 9
    if trail:
        out += int(fpart[full * 9 :]).to_bytes(_DIG2BYTES[trail], "big")
    negative = bool(sign) and any(digits)
    if negative:
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


# --- temporal: the MySQL 5.6+ formats (DATETIME2, TIMESTAMP2, TIME2), also MariaDB's ---------

def frac_size(fsp: int) -> int:
    return (fsp + 1) // 2


def _frac(buf: bytes, pos: int, fsp: int) -> int:
    if fsp <= 2:
        return buf[pos] * 10000 if fsp else 0
    if fsp <= 4:
        return ((buf[pos] << 8) | buf[pos + 1]) * 100
    return (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]


def _encode_frac(usec: int, fsp: int) -> bytes:
    if fsp == 0:
        return b""
    if fsp <= 2:
        return bytes((usec // 10000,))
    if fsp <= 4:
        return (usec // 100).to_bytes(2, "big")
    return usec.to_bytes(3, "big")


def _make_datetime(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int,
                   fsp: int) -> datetime | InvalidTemporal:
    try:
        return datetime(y, mo, d, h, mi, s, us)
    except ValueError:
        return InvalidTemporal("datetime", y, mo, d, h, mi, s, us, fsp)


def datetime2_value(buf: bytes, pos: int, fsp: int) -> datetime | InvalidTemporal:
    v = int.from_bytes(buf[pos : pos + 5], "big") - 0x8000000000
    ymd = v >> 17
    ym = ymd >> 5
    hms = v & 0x1FFFF
    us = _frac(buf, pos + 5, fsp) if fsp else 0
    return _make_datetime(ym // 13, ym % 13, ymd & 31, hms >> 12, (hms >> 6) & 63, hms & 63,
                          us, fsp)


def _temporal_fields(value: datetime | InvalidTemporal) -> tuple[int, ...]:
    return (value.year, value.month, value.day, value.hour, value.minute, value.second,
            value.microsecond)


def encode_datetime2(value: datetime | InvalidTemporal, fsp: int) -> bytes:
    y, mo, d, h, mi, s, us = _temporal_fields(value)
    ymd = ((y * 13 + mo) << 5) | d
    hms = (h << 12) | (mi << 6) | s
    return ((ymd << 17 | hms) + 0x8000000000).to_bytes(5, "big") + _encode_frac(us, fsp)


def _frac_expr(fsp: int, p: str, offset: int) -> str:
    if fsp == 0:
        return "0"
    if fsp <= 2:
        return f"buf[{p} + {offset}] * 10000"
    if fsp <= 4:
        return f"((buf[{p} + {offset}] << 8) | buf[{p} + {offset + 1}]) * 100"
    return f"_from(buf[{p} + {offset}:{p} + {offset + 3}], 'big')"


def temporal_lines(kind: str, fsp: int, v: str, p: str, t: str) -> list[str]:
    """Statements that decode a MySQL 5.6+ temporal value ("datetime2", "timestamp2",
    "time2") of precision `fsp` at offset expression `p` into variable `v`, temporaries
    prefixed `t`; the fraction is read inline. The row codec inlines them; the generic
    functions above stay the reference."""
    if kind == "datetime2":
        w, ymd, ym, hms, us = (f"{t}w", f"{t}ymd", f"{t}ym", f"{t}hms", f"{t}us")
        fields = (f"{ym} // 13, {ym} % 13, {ymd} & 31, {hms} >> 12, ({hms} >> 6) & 63, "
                  f"{hms} & 63, {us}")
        return [f"{w} = _from(buf[{p}:{p} + 5], 'big') - 0x8000000000",
                f"{ymd} = {w} >> 17",
                f"{ym} = {ymd} >> 5",
                f"{hms} = {w} & 0x1FFFF",
                f"{us} = {_frac_expr(fsp, p, 5)}",
                "try:",
                f"    {v} = _dt({fields})",
                "except ValueError:",
                f"    {v} = _bad_dt({fields}, {fsp})"]
    if kind == "timestamp2":
        sec, us = f"{t}sec", f"{t}us"
        return [f"{sec} = _from(buf[{p}:{p} + 4], 'big')",
                f"{us} = {_frac_expr(fsp, p, 4)}",
                f"{v} = _EPOCH + _td(0, {sec}, {us}) if {sec} or {us} else _zero_ts({fsp})"]
    if kind == "time2":
        w, a, hms, sec = f"{t}w", f"{t}a", f"{t}hms", f"{t}s"
        head: list[str] = []
        if fsp == 0:
            packed = f"(_from(buf[{p}:{p} + 3], 'big') - 0x800000) << 24"
        elif fsp >= 5:
            packed = f"_from(buf[{p}:{p} + 6], 'big') - 0x800000000000"
        else:
            nb, scale = (1, 10000) if fsp <= 2 else (2, 100)
            x, i, f = f"{t}x", f"{t}i", f"{t}f"
            head = [f"{x} = _from(buf[{p}:{p} + {3 + nb}], 'big')",
                    f"{i} = ({x} >> {8 * nb}) - 0x800000",
                    f"{f} = {x} & {(1 << (8 * nb)) - 1}",
                    f"if {i} < 0 and {f}:",
                    f"    {i} += 1",
                    f"    {f} -= {1 << (8 * nb)}"]
            packed = f"({i} << 24) + {f} * {scale}"
        return [*head,
                f"{w} = {packed}",
                f"{a} = -{w} if {w} < 0 else {w}",
                f"{hms} = {a} >> 24",
                f"{sec} = (({hms} >> 12) & 0x3FF) * 3600 + (({hms} >> 6) & 63) * 60 + "
                f"({hms} & 63)",
                f"{v} = _td(0, -{sec}, -({a} & 0xFFFFFF)) if {w} < 0 else "
                f"_td(0, {sec}, {a} & 0xFFFFFF)"]
    raise ValueError(f"no inline decoder for {kind}")


@functools.lru_cache(maxsize=64)
def temporal_decoder(kind: str, fsp: int) -> Callable[[bytes, int], Any]:
    """temporal_lines as a function."""
    return _function([*temporal_lines(kind, fsp, "r", "p", "_"), "return r"],
                     f"{kind}({fsp})")


def _invalid_datetime(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int,
                      fsp: int) -> InvalidTemporal:
    return InvalidTemporal("datetime", y, mo, d, h, mi, s, us, fsp)


def _zero_timestamp(fsp: int) -> InvalidTemporal:
    return InvalidTemporal("timestamp", 0, 0, 0, fsp=fsp)


def timestamp2_value(buf: bytes, pos: int, fsp: int) -> datetime | InvalidTemporal:
    sec = int.from_bytes(buf[pos : pos + 4], "big")
    us = _frac(buf, pos + 4, fsp) if fsp else 0
    if sec == 0 and us == 0:
        return InvalidTemporal("timestamp", 0, 0, 0, fsp=fsp)
    return _EPOCH + timedelta(seconds=sec, microseconds=us)


def encode_timestamp2(value: datetime | InvalidTemporal, fsp: int) -> bytes:
    if isinstance(value, InvalidTemporal):
        return bytes(4 + frac_size(fsp))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    sec = delta.days * 86400 + delta.seconds
    return sec.to_bytes(4, "big") + _encode_frac(delta.microseconds, fsp)


def _time_from_packed(packed: int) -> timedelta:
    neg = packed < 0
    if neg:
        packed = -packed
    hms = packed >> 24
    us = packed & 0xFFFFFF
    t = timedelta(hours=(hms >> 12) & 0x3FF, minutes=(hms >> 6) & 63, seconds=hms & 63,
                  microseconds=us)
    return -t if neg else t


def time2_value(buf: bytes, pos: int, fsp: int) -> timedelta:
    """TIME(fsp) in MySQL 5.6's packed form; negative values with a fraction borrow one
    from the integer part, as the server writes them."""
    if fsp >= 5:
        return _time_from_packed(int.from_bytes(buf[pos : pos + 6], "big") - 0x800000000000)
    intpart = int.from_bytes(buf[pos : pos + 3], "big") - 0x800000
    if fsp == 0:
        return _time_from_packed(intpart << 24)
    if fsp <= 2:
        frac = buf[pos + 3]
        if intpart < 0 and frac:
            intpart += 1
            frac -= 0x100
        return _time_from_packed((intpart << 24) + frac * 10000)
    frac = (buf[pos + 3] << 8) | buf[pos + 4]
    if intpart < 0 and frac:
        intpart += 1
        frac -= 0x10000
    return _time_from_packed((intpart << 24) + frac * 100)


def _c_mod(a: int, m: int) -> int:
    """C's % (the sign follows the dividend)."""
    r = abs(a) % m
    return -r if a < 0 else r


def encode_time2(value: timedelta, fsp: int) -> bytes:
    neg = value < timedelta(0)
    t = -value if neg else value
    total_us = (t.days * 86400 + t.seconds) * 1_000_000 + t.microseconds
    secs, us = divmod(total_us, 1_000_000)
    h, rem = divmod(secs, 3600)
    mi, s = divmod(rem, 60)
    packed = ((((h << 12) | (mi << 6) | s)) << 24) + us
    if neg:
        packed = -packed
    if fsp >= 5:
        return (packed + 0x800000000000).to_bytes(6, "big")
    head = ((packed >> 24) + 0x800000).to_bytes(3, "big")
    if fsp == 0:
        return head
    frac = _c_mod(packed, 1 << 24)
    if fsp <= 2:
        return head + bytes(((frac // 10000 if frac >= 0 else -((-frac) // 10000)) & 0xFF,))
    f = frac // 100 if frac >= 0 else -((-frac) // 100)
    return head + (f & 0xFFFF).to_bytes(2, "big")


def date_value(buf: bytes, pos: int) -> date | InvalidTemporal:
    v = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
    y, m, d = v >> 9, (v >> 5) & 15, v & 31
    try:
        return date(y, m, d)
    except ValueError:
        return InvalidTemporal("date", y, m, d)


def encode_date(value: date | InvalidTemporal) -> bytes:
    v = (value.year << 9) | (value.month << 5) | value.day
    return v.to_bytes(3, "little")


# --- temporal: the pre-5.6 formats (MySQL 5.5 columns; MariaDB with fsp 0) -----------------

_OLD_FORMAT_HINT = ("; a MariaDB column in the pre-10.1.2 format with fractional seconds? "
                    "Give its precision as a type hint (schema.table.column=datetime(N))")


def time_old_value(buf: bytes, pos: int) -> timedelta:
    v = int24(buf, pos)
    a = abs(v)
    if (a // 100) % 100 > 59 or a % 100 > 59 or a // 10000 > 838:
        raise MalformedEvent(f"TIME value {v} is not HHMMSS{_OLD_FORMAT_HINT}")
    t = timedelta(hours=a // 10000, minutes=(a // 100) % 100, seconds=a % 100)
    return -t if v < 0 else t


def encode_time_old(value: timedelta) -> bytes:
    neg = value < timedelta(0)
    t = -value if neg else value
    secs = t.days * 86400 + t.seconds
    h, rem = divmod(secs, 3600)
    v = h * 10000 + (rem // 60) * 100 + rem % 60
    return (-v if neg else v).to_bytes(3, "little", signed=True)


def datetime_old_value(buf: bytes, pos: int) -> datetime | InvalidTemporal:
    v = int.from_bytes(buf[pos : pos + 8], "little")
    d, t = divmod(v, 1_000_000)
    if (d > 99991231 or (d // 100) % 100 > 12 or d % 100 > 31 or t // 10000 > 23
            or (t // 100) % 100 > 59 or t % 100 > 59):
        raise MalformedEvent(f"DATETIME value {v} is not YYYYMMDDhhmmss{_OLD_FORMAT_HINT}")
    return _make_datetime(d // 10000, (d // 100) % 100, d % 100, t // 10000, (t // 100) % 100,
                          t % 100, 0, 0)


def encode_datetime_old(value: datetime | InvalidTemporal) -> bytes:
    y, mo, d, h, mi, s, _us = _temporal_fields(value)
    v = (y * 10000 + mo * 100 + d) * 1_000_000 + h * 10000 + mi * 100 + s
    return v.to_bytes(8, "little")


def timestamp_old_value(buf: bytes, pos: int) -> datetime | InvalidTemporal:
    sec = int.from_bytes(buf[pos : pos + 4], "little")
    if sec == 0:
        return InvalidTemporal("timestamp", 0, 0, 0)
    return _EPOCH + timedelta(seconds=sec)


def encode_timestamp_old(value: datetime | InvalidTemporal) -> bytes:
    if isinstance(value, InvalidTemporal):
        return bytes(4)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return (delta.days * 86400 + delta.seconds).to_bytes(4, "little")


# --- temporal: MariaDB 5.3 "hires" formats (mysql56_temporal_format=OFF, fsp > 0) ----------
# The table map does not carry their precision; the caller knows it from a column hint.

_SEC_PART_DIGITS = (1, 100000, 10000, 1000, 100, 10, 1)
_POW10 = (1, 10, 100, 1000, 10000, 100000, 1000000)
_HIRES_DATETIME_BYTES = (5, 6, 6, 7, 7, 7, 8)
_HIRES_TIME_BYTES = (3, 4, 4, 5, 5, 5, 6)
_TIME_HIRES_ZERO = 838 * 3600 + 59 * 60 + 59 + 1  # stored value of 00:00:00, in seconds


def hires_size(kind: str, fsp: int) -> int:
    if kind == "datetime":
        return _HIRES_DATETIME_BYTES[fsp]
    if kind == "time":
        return _HIRES_TIME_BYTES[fsp]
    return 4 + frac_size(fsp)  # timestamp: seconds + sec_part, both big-endian


def datetime_hires_value(buf: bytes, pos: int, fsp: int) -> datetime | InvalidTemporal:
    n = _HIRES_DATETIME_BYTES[fsp]
    packed = int.from_bytes(buf[pos : pos + n], "big")
    scale = _SEC_PART_DIGITS[fsp]
    value, frac = divmod(packed, _POW10[fsp]) if fsp else (packed, 0)
    value, s = divmod(value, 60)
    value, mi = divmod(value, 60)
    value, h = divmod(value, 24)
    value, d = divmod(value, 32)
    y, mo = divmod(value, 13)
    return _make_datetime(y, mo, d, h, mi, s, frac * scale, fsp)


def encode_datetime_hires(value: datetime | InvalidTemporal, fsp: int) -> bytes:
    y, mo, d, h, mi, s, us = _temporal_fields(value)
    packed = ((((y * 13 + mo) * 32 + d) * 24 + h) * 60 + mi) * 60 + s
    if fsp:
        packed = packed * _POW10[fsp] + us // _SEC_PART_DIGITS[fsp]
    return packed.to_bytes(_HIRES_DATETIME_BYTES[fsp], "big")


def time_hires_value(buf: bytes, pos: int, fsp: int) -> timedelta:
    n = _HIRES_TIME_BYTES[fsp]
    packed = int.from_bytes(buf[pos : pos + n], "big") - _TIME_HIRES_ZERO * _POW10[fsp]
    neg = packed < 0
    packed = abs(packed)
    secs, frac = divmod(packed, _POW10[fsp]) if fsp else (packed, 0)
    t = timedelta(seconds=secs, microseconds=frac * _SEC_PART_DIGITS[fsp])
    return -t if neg else t


def encode_time_hires(value: timedelta, fsp: int) -> bytes:
    neg = value < timedelta(0)
    t = -value if neg else value
    total_us = (t.days * 86400 + t.seconds) * 1_000_000 + t.microseconds
    secs, us = divmod(total_us, 1_000_000)
    packed = secs * _POW10[fsp] + (us // _SEC_PART_DIGITS[fsp] if fsp else 0)
    if neg:
        packed = -packed
    return (packed + _TIME_HIRES_ZERO * _POW10[fsp]).to_bytes(_HIRES_TIME_BYTES[fsp], "big")


def timestamp_hires_value(buf: bytes, pos: int, fsp: int) -> datetime | InvalidTemporal:
    sec = int.from_bytes(buf[pos : pos + 4], "big")
    n = frac_size(fsp)
    frac = int.from_bytes(buf[pos + 4 : pos + 4 + n], "big")
    if sec == 0 and frac == 0:
        return InvalidTemporal("timestamp", 0, 0, 0, fsp=fsp)
    return _EPOCH + timedelta(seconds=sec, microseconds=frac * _SEC_PART_DIGITS[fsp])


def encode_timestamp_hires(value: datetime | InvalidTemporal, fsp: int) -> bytes:
    n = frac_size(fsp)
    if isinstance(value, InvalidTemporal):
        return bytes(4 + n)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    frac = delta.microseconds // _SEC_PART_DIGITS[fsp] if fsp else 0
    return (delta.days * 86400 + delta.seconds).to_bytes(4, "big") + frac.to_bytes(n, "big")


# --- fixed binary types of MariaDB's type plugins -------------------------------------------

def uuid_value(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw.ljust(16, b"\0"))


def inet4_value(raw: bytes) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(raw.ljust(4, b"\0"))


def inet6_value(raw: bytes) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(raw.ljust(16, b"\0"))


def geometry_value(raw: bytes) -> Geometry:
    if len(raw) < 4:
        raise MalformedEvent(f"geometry value of {len(raw)} bytes has no SRID")
    return Geometry(raw[4:], struct.unpack_from("<I", raw, 0)[0])


def encode_geometry(value: bytes) -> bytes:
    srid = int(getattr(value, "srid", 0))
    return struct.pack("<I", srid) + bytes(value)


def vector_value(raw: bytes) -> list[float]:
    if len(raw) % 4:
        raise MalformedEvent(f"VECTOR value of {len(raw)} bytes is not a float32 array")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def encode_vector(value: list[float]) -> bytes:
    return bytes(struct.pack(f"<{len(value)}f", *value))


# Names the inlined statements (decimal_lines, temporal_lines) refer to.
INLINE_NAMES: dict[str, Any] = {
    "_D": Decimal, "_CTX": _DECIMAL_CONTEXT, "_from": int.from_bytes, "_bad": MalformedEvent,
    "_dt": datetime, "_td": timedelta, "_EPOCH": _EPOCH, "_bad_dt": _invalid_datetime,
    "_zero_ts": _zero_timestamp,
}
