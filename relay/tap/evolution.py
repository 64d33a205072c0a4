"""A table whose columns change under a typed read (ALTER TABLE mid-stream).

A typed query has one Spark schema, taken when it starts. Each row change carries the
version of the table map it was written under (`schema_version`: a fingerprint of its
columns' names and MySQL types), and a row whose columns differ from the query's is
handled by the query's `schemaEvolution` mode, never converted into a wrong value:

- `fail` (the default): any change a Spark column would show (a column added, dropped,
  renamed or given another Spark type) stops the query, naming the columns and where.
- `add_columns`: the query's schema is the union of every version of the table the
  relay log holds and of the table as the primary has it now (dropped and renamed-away
  columns stay in it, NULL in rows written without them). A column added after the
  query started stops it with an error saying to restart: the restarted query's schema
  has it. A column that changed its Spark type stops it for good (use `json`).
- `json`: columns that match keep their types; the values of columns the schema does not
  have, or has with another type, go to the image's `__rescued` field as a JSON object
  (the JSON form's text of each value).

A change that leaves the Spark types alone (VARCHAR(10) to VARCHAR(20), a new default)
only gives the rows a new `schema_version`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from relay.binlog.tablemap import Column, TableMap
from relay.errors import RelayError

RESCUED = "__rescued"
SparkTypeOf = Callable[[Column], str]


class SchemaEvolution(Enum):
    FAIL = "fail"
    ADD_COLUMNS = "add_columns"
    JSON = "json"


class SchemaChanged(RelayError):
    code = "schema_changed"


class ColumnsAdded(SchemaChanged):
    """Columns were added after an add_columns query started: the query, started again,
    has them (a job that restarts its queries, `relay mirror`, tells this one apart)."""

    code = "columns_added"


def schema_version(table: TableMap) -> str:
    """A fingerprint of the table's columns: names, MySQL types and their metadata."""
    ident = [(c.name, c.type, c.meta, c.unsigned, c.collation, c.members, c.geometry_type,
              c.hint) for c in table.columns]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Shape:
    """How rows of one table map fit the query's schema."""

    version: str
    rescued: frozenset[str] = frozenset()   # columns whose values go to __rescued (json)


def union(versions: Sequence[TableMap]) -> TableMap:
    """The newest version's columns, then those of older versions it no longer has (in
    the order they first appear); a column whose Spark type changed keeps the newest.
    A schema only: its raw fields (column types, metadata) are the newest map's, so it
    is never encoded as an event."""
    newest = versions[-1]
    names = {c.name for c in newest.columns}
    extra: list[Column] = []
    for tm in versions[:-1]:
        for c in tm.columns:
            if c.name not in names:
                names.add(c.name)
                extra.append(c)
    if not extra:
        return newest
    n = len(newest.columns)
    columns = (*newest.columns, *(replace(c, index=n + i) for i, c in enumerate(extra)))
    return replace(newest, columns=columns)


class ShapeCheck:
    """The query's schema and mode: `shape(table, where)` judges a row's table map (cached
    per map object: a decoder keeps one per table id)."""

    def __init__(self, schema: TableMap, mode: SchemaEvolution,
                 spark_type: SparkTypeOf) -> None:
        self.schema = schema
        self.mode = mode
        self._spark_type = spark_type
        self.version = schema_version(schema)
        self._types = {c.name: spark_type(c) for c in schema.columns}
        self._seen: dict[int, tuple[TableMap, Shape]] = {}

    def shape(self, table: TableMap, where: str) -> Shape:
        seen = self._seen.get(id(table))
        if seen is not None and seen[0] is table:
            return seen[1]
        shape = self._judge(table, where)
        if len(self._seen) > 1024:
            self._seen.clear()
        self._seen[id(table)] = (table, shape)
        return shape

    def _judge(self, table: TableMap, where: str) -> Shape:
        version = schema_version(table)
        if version == self.version:
            return Shape(version)
        row = {c.name: self._spark_type(c) for c in table.columns}
        added = [n for n in row if n not in self._types]
        dropped = [n for n in self._types if n not in row]
        retyped = [f"{n} {self._types[n]} -> {row[n]}" for n in row
                   if n in self._types and row[n] != self._types[n]]
        if not (added or dropped or retyped):
            return Shape(version)  # nothing a Spark column shows (a longer VARCHAR, ...)
        what = "; ".join(part for part in (
            f"new columns {', '.join(added)}" if added else "",
            f"columns gone {', '.join(dropped)}" if dropped else "",
            f"types changed {', '.join(retyped)}" if retyped else "") if part)
        head = f"{table.qualified} changed its columns {where} ({what})"
        if self.mode is SchemaEvolution.JSON:
            return Shape(version, frozenset(added) | {n for n in row if n in self._types
                                                     and row[n] != self._types[n]})
        if self.mode is SchemaEvolution.ADD_COLUMNS:
            if retyped:
                raise SchemaChanged(f"{head}: add_columns does not change a column's type; "
                                    "read it with schemaEvolution=json, or in a new query")
            if added:
                raise ColumnsAdded(f"{head}: restart the query, its schema then has the "
                                   "new columns (rows written without them hold NULL)")
            return Shape(version)
        raise SchemaChanged(f"{head}; the query's typed schema has the old ones. Read on with "
                            "schemaEvolution=add_columns (the schema follows added and "
                            "dropped columns after a restart) or schemaEvolution=json "
                            "(values that do not fit go to __rescued), or with images=json")
