"""TABLE_MAP events: the table a rows event refers to, and how to read its columns.

`TableMap.decode` reads the event body, including the optional metadata that
`binlog_row_metadata=MINIMAL|FULL` adds (signedness, charsets, column names, ENUM/SET
members, geometry types, primary key, visibility). `encode` writes it back byte for byte;
`renamed` gives a copy under another schema or table name.

Some types leave no trace in the binlog: MariaDB writes UUID, INET4 and INET6 as
BINARY(16/4/16), JSON as LONGTEXT, and its pre-10.1.2 TIME/DATETIME/TIMESTAMP with
fractional seconds without their precision. `TypeHints` supply those (from the user, or
from the primary's information_schema); a column with a hint decodes to its real type.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from relay.binlog import charsets
from relay.binlog.coltypes import (
    CHARACTER_MARIADB,
    CHARACTER_MYSQL,
    ENUM_OR_SET,
    NUMERIC,
    ColumnType,
    read_meta,
    string_real_type,
)
from relay.errors import MalformedEvent

log = logging.getLogger("relay.binlog")

# Optional metadata field types.
SIGNEDNESS = 1
DEFAULT_CHARSET = 2
COLUMN_CHARSET = 3
COLUMN_NAME = 4
SET_STR_VALUE = 5
ENUM_STR_VALUE = 6
GEOMETRY_TYPE = 7
SIMPLE_PRIMARY_KEY = 8
PRIMARY_KEY_WITH_PREFIX = 9
ENUM_AND_SET_DEFAULT_CHARSET = 10
ENUM_AND_SET_COLUMN_CHARSET = 11
COLUMN_VISIBILITY = 12
VECTOR_DIMENSIONALITY = 13

HINT_TYPES = ("uuid", "inet4", "inet6", "json", "datetime", "time", "timestamp")


@dataclass(frozen=True, slots=True)
class Column:
    index: int
    name: str                 # from COLUMN_NAME, or "@<n>" (1-based) when not written
    type: int                 # real type: ENUM and SET resolved from STRING
    meta: int
    nullable: bool
    unsigned: bool = False
    collation: int | None = None
    members: tuple[str, ...] | None = None   # ENUM / SET values, 1-based in the row image
    geometry_type: int | None = None
    visible: bool = True
    hint: str | None = None   # "uuid", "inet4", "inet6", "json", "datetime(3)", ...

    @property
    def type_name(self) -> str:
        try:
            return ColumnType(self.type).name
        except ValueError:
            return f"TYPE_{self.type}"

    @property
    def fsp(self) -> int:
        """Fraction digits of a temporal column's values (DATETIME(3): 3): the metadata
        of the MySQL 5.6 types, a hint for MariaDB's older hires format; else 0."""
        if self.type in _TYPES_WITH_FSP:
            return self.meta
        kind = _OLD_TEMPORALS.get(self.type)
        return (hint_fsp(self.hint, kind) or 0) if kind is not None else 0


_TYPES_WITH_FSP = frozenset(map(int, (ColumnType.DATETIME2, ColumnType.TIMESTAMP2,
                                       ColumnType.TIME2)))
_OLD_TEMPORALS: dict[int, str] = {ColumnType.DATETIME: "datetime", ColumnType.TIME: "time",
                                  ColumnType.TIMESTAMP: "timestamp"}


def hint_fsp(hint: str | None, kind: str) -> int | None:
    """N of a "datetime(N)" hint for a column of `kind` (0 without digits), None when
    the hint is not of that kind."""
    if not hint or not hint.startswith(kind):
        return None
    rest = hint[len(kind):].strip()
    if rest.startswith("(") and rest.endswith(")"):
        return int(rest[1:-1])
    return 0


class TypeHints:
    """Real types the binlog does not carry, keyed by schema, table and column name (or
    1-based position, for primaries that write no column names). Values: "uuid",
    "inet4", "inet6", "json", or "datetime(N)" / "time(N)" / "timestamp(N)" for MariaDB's
    old temporal formats with N fractional digits."""

    def __init__(self, hints: Mapping[tuple[str, str, str], str] | None = None) -> None:
        self._hints: dict[tuple[str, str], dict[str, str]] = {}
        for (schema, table, column), hint in (hints or {}).items():
            self.add(schema, table, column, hint)

    def add(self, schema: str, table: str, column: str, hint: str) -> None:
        base = hint.split("(", 1)[0].strip().lower()
        if base not in HINT_TYPES:
            raise ValueError(f"unknown column type hint {hint!r}; use one of "
                             f"{', '.join(HINT_TYPES)}")
        self._hints.setdefault((schema, table), {})[column] = hint.strip().lower()

    @classmethod
    def parse(cls, specs: Iterable[str]) -> TypeHints:
        """From "schema.table.column=type" strings (the CLI's --type option)."""
        hints = cls()
        for spec in specs:
            target, sep, hint = spec.partition("=")
            parts = target.split(".")
            if not sep or len(parts) != 3 or not all(parts):
                raise ValueError(f"type hint {spec!r} should look like schema.table.column=uuid")
            hints.add(parts[0], parts[1], parts[2], hint)
        return hints

    def for_table(self, schema: str, table: str) -> dict[str, str]:
        return self._hints.get((schema, table), {})

    def items(self) -> list[tuple[tuple[str, str, str], str]]:
        return [((s, t, c), h) for (s, t), cols in self._hints.items() for c, h in cols.items()]

    def __bool__(self) -> bool:
        return bool(self._hints)


NO_HINTS = TypeHints()


def read_packed(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """A length-encoded integer (the binlog's "packed" integers)."""
    b = buf[pos]
    if b < 251:
        return b, pos + 1
    if b == 252:
        return buf[pos + 1] | (buf[pos + 2] << 8), pos + 3
    if b == 253:
        return buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16), pos + 4
    if b == 254:
        return struct.unpack_from("<Q", buf, pos + 1)[0], pos + 9
    raise MalformedEvent(f"bad packed integer prefix 0x{b:02x}")


def write_packed(n: int) -> bytes:
    if n < 251:
        return bytes((n,))
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")


@dataclass(frozen=True)
class TableMap:
    table_id: int
    flags: int
    schema: str
    table: str
    columns: tuple[Column, ...]
    column_types: bytes
    metadata: bytes
    null_bits: bytes
    optional: bytes
    primary_key: tuple[int, ...] = ()
    has_names: bool = False
    id_size: int = 6
    mariadb: bool = True
    schema_raw: bytes = field(default=b"", repr=False)
    table_raw: bytes = field(default=b"", repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @cached_property
    def fsp_by_name(self) -> dict[str, int]:
        """Fraction digits of each temporal column with any (what its JSON text shows)."""
        return {c.name: c.fsp for c in self.columns if c.fsp}

    # --- decoding ------------------------------------------------------------------------

    @classmethod
    def decode(cls, body: bytes | memoryview, *, post_header_len: int = 8,
               mariadb: bool = True, hints: TypeHints = NO_HINTS) -> TableMap:
        body = bytes(body)
        try:
            return cls._decode(body, post_header_len, mariadb, hints)
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise MalformedEvent(f"TABLE_MAP: {exc}") from exc

    @classmethod
    def _decode(cls, body: bytes, post_header_len: int, mariadb: bool,
                hints: TypeHints) -> TableMap:
        id_size = 4 if post_header_len == 6 else 6
        if len(body) < post_header_len + 2:
            raise MalformedEvent(f"TABLE_MAP body of {len(body)} bytes")
        table_id = int.from_bytes(body[:id_size], "little")
        flags = struct.unpack_from("<H", body, id_size)[0]
        pos = post_header_len
        n = body[pos]
        schema_raw = body[pos + 1 : pos + 1 + n]
        pos += n + 2
        n = body[pos]
        table_raw = body[pos + 1 : pos + 1 + n]
        pos += n + 2
        ncols, pos = read_packed(body, pos)
        if ncols > len(body):
            raise MalformedEvent(f"TABLE_MAP claims {ncols} columns in {len(body)} bytes")
        types = body[pos : pos + ncols]
        pos += ncols
        mlen, pos = read_packed(body, pos)
        meta = body[pos : pos + mlen]
        pos += mlen
        nb = (ncols + 7) // 8
        null_bits = body[pos : pos + nb]
        pos += nb
        if len(types) != ncols or len(meta) != mlen or len(null_bits) != nb:
            raise MalformedEvent("TABLE_MAP ends inside its column definitions")
        optional = body[pos:]
        schema = schema_raw.decode("utf-8", "replace")
        table = table_raw.decode("utf-8", "replace")

        # Per-column type and metadata.
        real: list[tuple[int, int]] = []
        mpos = 0
        for t in types:
            if mpos > len(meta):
                raise MalformedEvent("TABLE_MAP metadata shorter than its columns need")
            value, mpos = read_meta(t, meta, mpos)
            rt = t
            if t == ColumnType.STRING:
                rt, _ = string_real_type(value)
            real.append((rt, value))
        if mpos != len(meta):
            raise MalformedEvent(f"TABLE_MAP metadata is {len(meta)} bytes, its columns "
                                 f"use {mpos}")
        opt = _Optional.parse(optional, real, mariadb)
        table_hints = hints.for_table(schema, table) if hints else {}
        columns = []
        for i, (rt, value) in enumerate(real):
            name = opt.names[i] if i < len(opt.names) else f"@{i + 1}"
            columns.append(Column(
                index=i, name=name, type=rt, meta=value,
                nullable=bool(null_bits[i // 8] >> (i % 8) & 1),
                unsigned=opt.unsigned.get(i, False), collation=opt.collations.get(i),
                members=opt.members.get(i), geometry_type=opt.geometry.get(i),
                visible=opt.visible.get(i, True),
                hint=table_hints.get(name) or table_hints.get(str(i + 1))))
        return cls(table_id, flags, schema, table, tuple(columns), types, meta, null_bits,
                   optional, opt.primary_key, bool(opt.names), id_size, mariadb, schema_raw,
                   table_raw)

    # --- encoding ------------------------------------------------------------------------

    def encode(self) -> bytes:
        schema = self.schema_raw or self.schema.encode("utf-8")
        table = self.table_raw or self.table.encode("utf-8")
        return b"".join((
            self.table_id.to_bytes(self.id_size, "little"),
            struct.pack("<H", self.flags),
            bytes((len(schema),)), schema, b"\0",
            bytes((len(table),)), table, b"\0",
            write_packed(len(self.column_types)), self.column_types,
            write_packed(len(self.metadata)), self.metadata,
            self.null_bits, self.optional))

    def renamed(self, schema: str | None = None, table: str | None = None) -> TableMap:
        out = self
        if schema is not None:
            raw = schema.encode("utf-8")
            if len(raw) > 255:
                raise ValueError(f"schema name {schema!r} is longer than 255 bytes")
            out = replace(out, schema=schema, schema_raw=raw)
        if table is not None:
            raw = table.encode("utf-8")
            if len(raw) > 255:
                raise ValueError(f"table name {table!r} is longer than 255 bytes")
            out = replace(out, table=table, table_raw=raw)
        return out


@dataclass
class _Optional:
    names: list[str] = field(default_factory=list)
    unsigned: dict[int, bool] = field(default_factory=dict)
    collations: dict[int, int] = field(default_factory=dict)
    members: dict[int, tuple[str, ...]] = field(default_factory=dict)
    geometry: dict[int, int] = field(default_factory=dict)
    visible: dict[int, bool] = field(default_factory=dict)
    primary_key: tuple[int, ...] = ()

    @classmethod
    def parse(cls, data: bytes, real: list[tuple[int, int]], mariadb: bool) -> _Optional:
        out = cls()
        fields: dict[int, bytes] = {}
        pos = 0
        while pos < len(data):
            ftype = data[pos]
            flen, pos = read_packed(data, pos + 1)
            if pos + flen > len(data):
                raise MalformedEvent(f"TABLE_MAP optional metadata field {ftype} runs past "
                                     "the event")
            fields[ftype] = data[pos : pos + flen]
            pos += flen
        types = [rt for rt, _ in real]
        character = CHARACTER_MARIADB if mariadb else CHARACTER_MYSQL
        numeric_cols = [i for i, t in enumerate(types) if t in NUMERIC]
        char_cols = [i for i, t in enumerate(types) if t in character]
        enum_set_cols = [i for i, t in enumerate(types) if t in ENUM_OR_SET]
        if SIGNEDNESS in fields:
            bits = fields[SIGNEDNESS]
            for k, i in enumerate(numeric_cols):
                if k // 8 < len(bits):
                    out.unsigned[i] = bool(bits[k // 8] & (0x80 >> (k % 8)))
        out.collations.update(_charsets(fields.get(DEFAULT_CHARSET),
                                        fields.get(COLUMN_CHARSET), char_cols))
        out.collations.update(_charsets(fields.get(ENUM_AND_SET_DEFAULT_CHARSET),
                                        fields.get(ENUM_AND_SET_COLUMN_CHARSET),
                                        enum_set_cols))
        if COLUMN_NAME in fields:
            raw = fields[COLUMN_NAME]
            p = 0
            while p < len(raw):
                n, p = read_packed(raw, p)
                out.names.append(raw[p : p + n].decode("utf-8"))
                p += n
            if len(out.names) != len(types):
                raise MalformedEvent(f"TABLE_MAP names {len(out.names)} columns, has "
                                     f"{len(types)}")
        for ftype, kind in ((SET_STR_VALUE, ColumnType.SET), (ENUM_STR_VALUE, ColumnType.ENUM)):
            if ftype in fields:
                cols = [i for i, t in enumerate(types) if t == kind]
                for i, members in zip(cols, _str_lists(fields[ftype]), strict=False):
                    cs = charsets.codec_of(out.collations.get(i, 0) or 0)
                    codec, errors = cs if cs else ("utf-8", "replace")
                    out.members[i] = tuple(m.decode(codec, errors) for m in members)
        if GEOMETRY_TYPE in fields:
            raw = fields[GEOMETRY_TYPE]
            cols = [i for i, t in enumerate(types) if t == ColumnType.GEOMETRY]
            p = 0
            for i in cols:
                if p >= len(raw):
                    break
                out.geometry[i], p = read_packed(raw, p)
        if SIMPLE_PRIMARY_KEY in fields:
            out.primary_key = _key_columns(fields[SIMPLE_PRIMARY_KEY], with_prefix=False)
        elif PRIMARY_KEY_WITH_PREFIX in fields:
            out.primary_key = _key_columns(fields[PRIMARY_KEY_WITH_PREFIX], with_prefix=True)
        if COLUMN_VISIBILITY in fields:
            bits = fields[COLUMN_VISIBILITY]
            for i in range(len(types)):
                if i // 8 < len(bits):
                    out.visible[i] = bool(bits[i // 8] & (0x80 >> (i % 8)))
        return out


def _key_columns(raw: bytes, *, with_prefix: bool) -> tuple[int, ...]:
    """The primary key's column indexes (each followed by a prefix length, unused here,
    in the WITH_PREFIX form)."""
    keys = []
    p = 0
    while p < len(raw):
        k, p = read_packed(raw, p)
        if with_prefix:
            _prefix, p = read_packed(raw, p)
        keys.append(k)
    return tuple(keys)


def _charsets(default: bytes | None, per_column: bytes | None,
              cols: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    if default is not None:
        base, p = read_packed(default, 0)
        overrides: dict[int, int] = {}
        while p < len(default):
            idx, p = read_packed(default, p)
            coll, p = read_packed(default, p)
            overrides[idx] = coll
        for k, i in enumerate(cols):
            out[i] = overrides.get(k, base)
    elif per_column is not None:
        p = 0
        for i in cols:
            if p >= len(per_column):
                break
            out[i], p = read_packed(per_column, p)
    return out


def _str_lists(raw: bytes) -> list[list[bytes]]:
    lists = []
    p = 0
    while p < len(raw):
        count, p = read_packed(raw, p)
        items = []
        for _ in range(count):
            n, p = read_packed(raw, p)
            items.append(raw[p : p + n])
            p += n
        lists.append(items)
    return lists
