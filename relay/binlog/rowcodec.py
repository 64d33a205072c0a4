"""Row images of one table <-> tuples of Python values.

A `RowCodec` is built once per (table map, column bitmap, wanted columns) and reused for
every row. Its decoder is Python source generated for that exact column layout and
compiled once: runs of fixed-width columns become one `struct.unpack_from` call, the
rest one inline expression per column, and a row without NULLs takes a branch with no
per-column NULL tests. Columns that are not wanted are skipped by their width, not
decoded. This is where the row codec's speed comes from (see bench/row_decode.py); the
generated code holds only names the codec made itself, never names from the binlog.

Bad bytes surface as MalformedEvent: the caller checks that each row ends inside its
event, and every exception a bad value can raise inside the decoder is translated.
"""

from __future__ import annotations

import codecs
import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from relay import kernels
from relay.binlog import charsets, jsonb
from relay.binlog import values as V
from relay.binlog.coltypes import ColumnType, string_real_type
from relay.binlog.plans import ValuesPlan, values_steps
from relay.binlog.tablemap import Column, TableMap, hint_fsp
from relay.errors import MalformedEvent

T = ColumnType


class RowImage(tuple):  # type: ignore[type-arg]
    """One row image: a tuple of values. `columns` names them (the table map's column
    names, or "@1", "@2", ... when the primary did not log names); a MINIMAL image
    holds only the columns the server logged."""

    __slots__ = ()
    columns: tuple[str, ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[self.columns.index(name)]
        except ValueError:
            return default

    def asdict(self) -> dict[str, Any]:
        return dict(zip(self.columns, self, strict=True))


_STRUCT_CODES = {
    (T.TINY, False): "b", (T.TINY, True): "B", (T.SHORT, False): "h", (T.SHORT, True): "H",
    (T.LONG, False): "i", (T.LONG, True): "I", (T.LONGLONG, False): "q",
    (T.LONGLONG, True): "Q", (T.FLOAT, False): "f", (T.FLOAT, True): "f",
    (T.DOUBLE, False): "d", (T.DOUBLE, True): "d",
}


@dataclass
class _Plan:
    """How one column is stored: fixed width with a struct code, fixed width with a
    decode expression, or a length prefix and a converter."""

    size: int | None = None            # fixed width in bytes
    code: str | None = None            # struct code (fixed width, no conversion)
    expr: str | None = None            # decode expression over buf at {p} (fixed width)
    prefix: int = 0                    # variable width: bytes of the little-endian length
    conv: str | None = None            # variable width: expression over the raw bytes {r}
    lines: Callable[[str, str, str], list[str]] | None = None  # fixed width: statements
    #                                    decoding into v at offset p, temporaries t
    encode: Callable[[Any], bytes] | None = None


class _Namespace:
    """Names the generated code refers to: helper modules and per-column constants."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {**V.INLINE_NAMES, "V": V, "J": jsonb, "json": json,
                                   "int_from": int.from_bytes,
                                   "_cm": codecs.charmap_decode,
                                   "frozenset": frozenset}
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_c{self._n}"
        self.ns[name] = value
        return name


def _plan(col: Column, ns: _Namespace, json_diff: bool = False) -> _Plan:
    """The storage plan of one column (`json_diff`: a JSON column sent as diffs)."""
    t, meta = col.type, col.meta
    if t in (T.TINY, T.SHORT, T.LONG, T.LONGLONG, T.FLOAT, T.DOUBLE):
        code = _STRUCT_CODES[(T(t), col.unsigned)]
        size = struct.calcsize("<" + code)
        if t in (T.FLOAT, T.DOUBLE):
            fmt = "<" + code
            return _Plan(size=size, code=code, encode=struct.Struct(fmt).pack)
        return _Plan(size=size, code=code, encode=partial(V.encode_int, nbytes=size,
                                                          unsigned=col.unsigned))
    if t == T.INT24:
        fn = "V.uint24" if col.unsigned else "V.int24"
        return _Plan(size=3, expr=f"{fn}(buf, {{p}})",
                     encode=partial(V.encode_int, nbytes=3, unsigned=col.unsigned))
    if t == T.YEAR:
        return _Plan(size=1, expr="V.year_value(buf[{p}])", encode=V.encode_year)
    if t == T.NEWDECIMAL:
        prec, scale = meta >> 8, meta & 0xFF
        size = V.decimal_size(prec, scale)
        return _Plan(size=size, lines=partial(V.decimal_lines, prec, scale),
                     encode=partial(V.encode_decimal, precision=prec, scale=scale))
    if t == T.BIT:
        nbits = (meta >> 8) * 8 + (meta & 0xFF)
        size = (nbits + 7) // 8
        return _Plan(size=size, expr=f"int_from(buf[{{p}}:{{p}} + {size}], 'big')",
                     encode=partial(V.encode_bit, nbytes=size))
    if t in (T.DATE, T.NEWDATE):
        return _Plan(size=3, expr="V.date_value(buf, {p})", encode=V.encode_date)
    if t == T.DATETIME2:
        return _Plan(size=5 + V.frac_size(meta),
                     lines=partial(V.temporal_lines, "datetime2", meta),
                     encode=partial(V.encode_datetime2, fsp=meta))
    if t == T.TIMESTAMP2:
        return _Plan(size=4 + V.frac_size(meta),
                     lines=partial(V.temporal_lines, "timestamp2", meta),
                     encode=partial(V.encode_timestamp2, fsp=meta))
    if t == T.TIME2:
        return _Plan(size=3 + V.frac_size(meta), lines=partial(V.temporal_lines, "time2", meta),
                     encode=partial(V.encode_time2, fsp=meta))
    if t in (T.DATETIME, T.TIME, T.TIMESTAMP):
        return _old_temporal(col)
    if t in (T.VARCHAR, T.VAR_STRING):
        return _string(col, ns, 1 if meta < 256 else 2, meta)
    if t == T.STRING:
        _rt, maxlen = string_real_type(meta)
        return _string(col, ns, 1 if maxlen < 256 else 2, maxlen, char=True)
    if t == T.ENUM:
        size = meta & 0xFF
        if size not in (1, 2):
            raise MalformedEvent(f"ENUM column {col.name} has pack length {size}")
        read = "buf[{p}]" if size == 1 else "(buf[{p}] | buf[{p} + 1] << 8)"
        if col.members is None:
            return _Plan(size=size, expr=read,
                         encode=partial(V.encode_int, nbytes=size, unsigned=True))
        table = ns.const(("", *col.members))
        index = {m: i for i, m in enumerate(col.members, 1)}
        return _Plan(size=size, expr=f"{table}[{read}]",
                     encode=partial(_encode_enum, nbytes=size, index=index))
    if t == T.SET:
        size = meta & 0xFF
        if not 1 <= size <= 8:
            raise MalformedEvent(f"SET column {col.name} has pack length {size}")
        read = f"int_from(buf[{{p}}:{{p}} + {size}], 'little')"
        if col.members is None:
            return _Plan(size=size, expr=read,
                         encode=partial(V.encode_int, nbytes=size, unsigned=True))
        members = ns.const(col.members)
        limit = ns.const(1 << len(col.members))
        bit_of = {m: 1 << i for i, m in enumerate(col.members)}
        return _Plan(size=size, expr=f"V_set({read}, {members}, {limit})",
                     encode=partial(_encode_set, nbytes=size, bits=bit_of))
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB):
        if not 1 <= meta <= 4:
            raise MalformedEvent(f"BLOB column {col.name} has pack length {meta}")
        return _blob(col, ns, meta)
    if t == T.JSON:
        if json_diff:
            return _Plan(prefix=meta, conv="J.decode_diffs({r})", encode=jsonb.encode_diffs)
        return _Plan(prefix=meta, conv="J.decode({r})", encode=jsonb.encode)
    if t == T.GEOMETRY:
        return _Plan(prefix=meta or 4, conv="V.geometry_value({r})", encode=V.encode_geometry)
    if t == T.VECTOR:
        return _Plan(prefix=meta or 4, conv="V.vector_value({r})", encode=V.encode_vector)
    raise MalformedEvent(f"column {col.name}: cannot decode column type {col.type_name}")


def _old_temporal(col: Column) -> _Plan:
    kind = {T.DATETIME: "datetime", T.TIME: "time", T.TIMESTAMP: "timestamp"}[T(col.type)]
    fsp = hint_fsp(col.hint, kind)
    if fsp:
        # MariaDB's 5.3 format with fractional seconds; only a hint gives its precision.
        size = V.hires_size(kind, fsp)
        return _Plan(size=size, expr=f"V.{kind}_hires_value(buf, {{p}}, {fsp})",
                     encode=partial(getattr(V, f"encode_{kind}_hires"), fsp=fsp))
    size = {"datetime": 8, "time": 3, "timestamp": 4}[kind]
    return _Plan(size=size, expr=f"V.{kind}_old_value(buf, {{p}})",
                 encode=getattr(V, f"encode_{kind}_old"))


def _text_conv(col: Column, ns: _Namespace) -> tuple[str | None, Callable[[Any], bytes]]:
    """(converter over raw bytes `r`, encoder) for a character column: str when its
    character set is known and not binary, bytes otherwise."""
    cs = charsets.codec_of(col.collation) if col.collation is not None else None
    if cs is None:
        return None, bytes
    codec, errors = cs
    encode = partial(_encode_text, codec=codec, errors=errors)
    table = charsets.decoding_table(codec, errors)
    if table is not None:  # single-byte: one C call, no codec lookup
        return f"_cm({{r}}, None, {ns.const(table)})[0]", encode
    return f"{{r}}.decode({codec!r}, {errors!r})", encode


def _string(col: Column, ns: _Namespace, prefix: int, maxlen: int,
            char: bool = False) -> _Plan:
    hint = col.hint
    if hint in ("uuid", "inet4", "inet6"):
        return _Plan(prefix=prefix, conv=f"V.{hint}_value({{r}})", encode=_encode_fixed_binary)
    conv, enc = _text_conv(col, ns)
    if conv is None and char and col.collation == charsets.BINARY:
        # BINARY(n): the row image drops trailing zero bytes; SELECT shows them.
        return _Plan(prefix=prefix, conv=f"{{r}}.ljust({maxlen}, b'\\0')",
                     encode=_encode_fixed_binary)
    if conv is not None and char:
        # CHAR(n): the row image drops trailing spaces, so does SELECT.
        return _Plan(prefix=prefix, conv=conv, encode=partial(_encode_char, encode=enc))
    return _Plan(prefix=prefix, conv=conv, encode=enc)


def _blob(col: Column, ns: _Namespace, prefix: int) -> _Plan:
    conv, enc = _text_conv(col, ns)
    if col.hint == "json":
        if conv is None:
            conv = "{r}.decode('utf-8')"
        return _Plan(prefix=prefix, conv=f"J_text({conv})",
                     encode=partial(_encode_json_text, encode=enc))
    return _Plan(prefix=prefix, conv=conv, encode=enc)


def _encode_enum(value: str | int, nbytes: int, index: dict[str, int]) -> bytes:
    return V.encode_int(index[value] if isinstance(value, str) else value, nbytes, True)


def _encode_set(value: Iterable[str] | int, nbytes: int, bits: dict[str, int]) -> bytes:
    mask = value if isinstance(value, int) else sum(bits[m] for m in set(value))
    return V.encode_int(mask, nbytes, True)


def _encode_text(value: str | bytes, codec: str, errors: str) -> bytes:
    return value.encode(codec, errors) if isinstance(value, str) else bytes(value)


def _encode_char(value: str | bytes, encode: Callable[[Any], bytes]) -> bytes:
    return encode(value.rstrip(" ") if isinstance(value, str) else value)


def _encode_fixed_binary(value: Any) -> bytes:
    """BINARY(n) and MariaDB's UUID / INET4 / INET6: trailing zero bytes are not logged."""
    raw = value.bytes if hasattr(value, "bytes") else getattr(value, "packed", value)
    return bytes(raw).rstrip(b"\0")


def _json_text(text: str) -> Any:
    value = json.loads(text)
    return jsonb.JSON_NULL if value is None else value


def _encode_json_text(value: Any, encode: Callable[[Any], bytes]) -> bytes:
    if value is jsonb.JSON_NULL:
        value = None
    return encode(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


def _set_value(mask: int, members: tuple[str, ...], limit: int) -> frozenset[str]:
    if mask >= limit:
        raise MalformedEvent(f"SET value 0x{mask:x} has bits beyond its {len(members)} members")
    return frozenset(m for i, m in enumerate(members) if mask >> i & 1)


def _read_len(prefix: int, p: str) -> str:
    if prefix == 1:
        return f"buf[{p}]"
    if prefix == 2:
        return f"(buf[{p}] | buf[{p} + 1] << 8)"
    if prefix == 3:
        return f"(buf[{p}] | buf[{p} + 1] << 8 | buf[{p} + 2] << 16)"
    return f"int_from(buf[{p}:{p} + 4], 'little')"


class RowCodec:
    """Decode and encode the row images of `table` that hold the columns in `present`
    (indexes into the table's columns). `wanted` limits what decode returns."""

    def __init__(self, table: TableMap, present: Sequence[int],
                 wanted: frozenset[str] | None = None,
                 partial_json: frozenset[int] = frozenset()) -> None:
        self.table = table
        self.present = tuple(present)
        ns = _Namespace()
        ns.ns["V_set"] = _set_value
        ns.ns["J_text"] = _json_text
        cols = [table.columns[i] for i in self.present]
        self.plans = [_plan(c, ns, c.index in partial_json) for c in cols]
        keep = [wanted is None or c.name in wanted for c in cols]
        self.columns = tuple(c.name for c, k in zip(cols, keep, strict=True) if k)
        self.image = type(f"Row_{table.table}", (RowImage,),
                          {"__slots__": (), "columns": self.columns})
        # The row_values kernel's plan, for images of every column (None: the generated
        # decoder alone; used only when the compiled kernels are loaded: the pure twin is
        # slower than the generated decoder)
        self.values_plan: ValuesPlan | None = None
        if kernels.IMPLEMENTATION is kernels.Implementation.COMPILED and wanted is None \
                and not partial_json and self.present == tuple(range(len(table.columns))):
            self.values_plan = values_steps(table)
        self.null_bytes = (len(cols) + 7) // 8
        # decoder(buf, pos) -> (image, end): the generated function itself, no wrapper.
        self.decoder: Callable[[bytes, int], tuple[RowImage, int]] = self._compile(ns, keep)

    def decode(self, buf: bytes, pos: int) -> tuple[RowImage, int]:
        """One row image at `pos` of `buf` (the rows part of one event): (image, end)."""
        return self.decoder(buf, pos)

    def encode(self, values: Sequence[Any]) -> bytes:
        """A row image from values in `present` order (None is NULL)."""
        if len(values) != len(self.plans):
            raise ValueError(f"{self.table.qualified}: {len(values)} values for "
                             f"{len(self.plans)} columns")
        # Unused bits of the NULL bitmap: MariaDB writes them set, MySQL 8 clear.
        nulls = (1 << (self.null_bytes * 8)) - 1 if self.table.mariadb else \
            (1 << len(self.plans)) - 1
        out = []
        for i, (plan, v) in enumerate(zip(self.plans, values, strict=True)):
            if v is None:
                continue
            nulls &= ~(1 << i)
            assert plan.encode is not None
            raw = plan.encode(v)
            if plan.size is not None:
                if len(raw) != plan.size:
                    raise ValueError(f"{self.table.qualified}.{self.columns[i]}: encoded "
                                     f"{len(raw)} bytes, the column holds {plan.size}")
                out.append(raw)
            else:
                if len(raw) >= 1 << (8 * plan.prefix):
                    raise ValueError(f"{self.table.qualified}: value of {len(raw)} bytes too "
                                     f"long for a {plan.prefix}-byte length")
                out.append(len(raw).to_bytes(plan.prefix, "little") + raw)
        return nulls.to_bytes(self.null_bytes, "little") + b"".join(out)

    # --- code generation -----------------------------------------------------------------

    def _compile(self, ns: _Namespace, keep: list[bool]) -> Callable[[bytes, int], Any]:
        nb = self.null_bytes
        used = (1 << len(self.plans)) - 1
        out_vars = [f"v{i}" for i, k in enumerate(keep) if k]
        cls = ns.const(self.image)
        trailing = "," if len(out_vars) == 1 else ""
        ret = f"return tuple.__new__({cls}, ({', '.join(out_vars)}{trailing})), p"
        lines = ["def decode(buf, p):"]
        if nb == 0:
            lines.append("    nb = 0")
        elif nb == 1:
            lines.append("    nb = buf[p]")
        else:
            lines.append(f"    nb = int_from(buf[p:p + {nb}], 'little')")
        lines.append(f"    p += {nb}")
        lines.append(f"    if not nb & {used}:")
        lines += ["        " + ln for ln in self._body(ns, keep, nullable=False)]
        lines.append("        " + ret)
        lines += ["    " + ln for ln in self._body(ns, keep, nullable=True)]
        lines.append("    " + ret)
        src = "\n".join(lines)
        self.source = src  # for the curious: the generated decoder
        code = compile(src, f"<row codec {self.table.qualified}>", "exec")
        exec(code, ns.ns)
        return ns.ns["decode"]  # type: ignore[no-any-return]

    def _body(self, ns: _Namespace, keep: list[bool], *, nullable: bool) -> list[str]:
        """Decode statements for all columns. Without NULLs, fixed-width columns are read
        at offsets known at generation time and `p` moves once per variable-width column
        (runs of struct-decodable ones take one unpack call); with NULLs each column tests
        its bit and moves `p` itself."""
        lines: list[str] = []
        off = 0  # bytes from p, known statically (no-NULL path)
        i = 0
        n = len(self.plans)
        while i < n:
            plan = self.plans[i]
            if nullable:
                lines.append(f"if nb & {1 << i}:")
                lines.append(f"    v{i} = None")
                lines.append("else:")
                lines += ["    " + b for b in self._column(ns, i, keep[i], "p", advance=True)]
                i += 1
                continue
            at = f"p + {off}" if off else "p"
            if plan.code is not None:
                # A run of struct-decodable columns: one unpack call.
                j = i
                fmt = "<"
                names = []
                size = 0
                while j < n and self.plans[j].code is not None:
                    q = self.plans[j]
                    assert q.code is not None and q.size is not None
                    if keep[j]:
                        fmt += q.code
                        names.append(f"v{j}")
                    else:
                        fmt += f"{q.size}x"
                    size += q.size
                    j += 1
                if names:
                    s = ns.const(struct.Struct(fmt).unpack_from)
                    lines.append(f"{', '.join(names)}{',' if len(names) == 1 else ''} = "
                                 f"{s}(buf, {at})")
                off += size
                i = j
                continue
            lines += self._column(ns, i, keep[i], at, advance=False)
            if plan.size is not None:
                off += plan.size
            else:
                off = 0  # _column moved p past the value
            i += 1
        if off:
            lines.append(f"p += {off}")
        return lines

    def _column(self, ns: _Namespace, i: int, keep: bool, at: str, *,
                advance: bool) -> list[str]:
        """Statements decoding column i at offset expression `at`. A variable-width column
        always moves p past itself; a fixed-width one only with `advance`."""
        plan = self.plans[i]
        v = f"v{i}"
        if plan.size is not None:
            out = []
            if keep:
                if plan.code is not None:
                    s = ns.const(struct.Struct("<" + plan.code).unpack_from)
                    out.append(f"{v}, = {s}(buf, {at})")
                elif plan.lines is not None:
                    out += plan.lines(v, f"({at})", f"_{i}")
                else:
                    assert plan.expr is not None
                    out.append(f"{v} = {plan.expr.format(p=at)}")
            if advance:
                out.append(f"p += {plan.size}")
            return out
        k = plan.prefix
        lines = [f"n = {_read_len(k, at)}"]
        start = f"{at} + {k}"
        if keep:
            raw = f"buf[{start}:{start} + n]"
            lines.append(f"{v} = {plan.conv.format(r=raw)}" if plan.conv else f"{v} = {raw}")
        lines.append(f"p = {start} + n")
        return lines
