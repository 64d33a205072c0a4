"""Metadata look-ups: what the SQL surface asks the primary for, composed by the relay.

A client's statement never reaches the primary as text. It is parsed (sqlglot, MySQL
dialect), held to an allow-list and regenerated, so what the primary runs is what the
relay read: an executable comment (`/*! ... */`, `/*M! ... */`), which sqlglot reads as a
comment and MariaDB and MySQL run as code, is gone from the regenerated text, and the
regenerated text must parse back to the same tree. What is allowed:

- SELECT over a fixed set of information_schema tables (`TABLES_ALLOWED`) with columns,
  literals, comparisons, boolean logic and the functions in `_NODES`: no subquery, no
  union or CTE, no variable, no other function (no SLEEP, BENCHMARK, LOAD_FILE,
  EXTRACTVALUE), no locking clause or hint, at most `max_rows` rows;
- SHOW DATABASES / [FULL] TABLES / TABLE STATUS / COLLATION / CHARACTER SET [LIKE] and
  SHOW CREATE TABLE / VIEW / DATABASE, composed from the names the client gave (quoted
  by the relay); a SHOW's WHERE is never sent: it is evaluated here, on the answer's rows;
- SHOW [FULL] COLUMNS / INDEX and DESCRIBE, composed as information_schema SELECTs with
  the SHOW's column names (on MariaDB those SHOWs need SELECT on the table; the
  information_schema tables need only REFERENCES, which reads no rows).

The primary then runs the look-up as the metadata account, which needs no SELECT at all
(relay/mysql/metadata.py): the allow-list and the account are two fences, not one.

Hand-written on top of sqlglot: no library checks a statement against a whitelist of
node types and regenerates it; sqlglot gives the tree and the generator.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from relay.downstream.replies import Err, Lookup, Rows
from relay.downstream.sessionvars import SessionVars
from relay.rules.tables import LikePattern
from relay.wire.replies import ColumnDef

INFORMATION_SCHEMA = "information_schema"
# information_schema tables with metadata only (names, types, keys, character sets): no
# table holds row values, the primary's connections (PROCESSLIST) or its variables.
TABLES_ALLOWED = frozenset({
    "SCHEMATA", "TABLES", "COLUMNS", "STATISTICS", "KEY_COLUMN_USAGE", "TABLE_CONSTRAINTS",
    "REFERENTIAL_CONSTRAINTS", "CHECK_CONSTRAINTS", "VIEWS", "PARTITIONS", "CHARACTER_SETS",
    "COLLATIONS", "COLLATION_CHARACTER_SET_APPLICABILITY", "ENGINES",
})
# The node types a look-up's tree may hold; anything else is refused, naming it.
_NODES: frozenset[type[exp.Expression]] = frozenset({
    exp.Select, exp.From, exp.Join, exp.Table, exp.TableAlias, exp.Identifier, exp.Column,
    exp.Star, exp.Alias, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg, exp.Not,
    exp.And, exp.Or, exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.Is, exp.In, exp.Like, exp.Between, exp.Where, exp.Group, exp.Having, exp.Order,
    exp.Ordered, exp.Limit, exp.Offset, exp.Distinct, exp.Count, exp.Min, exp.Max, exp.Sum,
    exp.Avg, exp.Lower, exp.Upper, exp.Concat, exp.ConcatWs, exp.Coalesce, exp.Case,
    exp.If, exp.Cast, exp.DataType, exp.Length, exp.Substring, exp.GroupConcat, exp.Add,
    exp.Sub, exp.Mul, exp.Div,
})
# A SELECT's clauses a look-up may have (sqlglot's argument names).
_SELECT_ARGS = frozenset({"expressions", "from", "from_", "joins", "where", "group",
                          "having", "order", "limit", "offset", "distinct"})
_SHOW_LISTS = {"DATABASES", "TABLES", "TABLE STATUS", "COLLATION", "CHARACTER SET"}
_SHOW_CREATE = {"CREATE TABLE", "CREATE VIEW", "CREATE DATABASE"}
SHOWS = frozenset({*_SHOW_LISTS, *_SHOW_CREATE, "COLUMNS", "INDEX"})
# The SHOW spellings sqlglot leaves as raw commands, in the words it parses.
_SYNONYMS = [(("FULL", "FIELDS"), "FULL COLUMNS"), (("FIELDS",), "COLUMNS"),
             (("INDEXES",), "INDEX"), (("KEYS",), "INDEX"),
             (("CREATE", "SCHEMA"), "CREATE DATABASE")]

Value = str | bytes | None   # a value of a look-up's answer: the server's bytes
Finish = Callable[[list[ColumnDef], list[list[Value]]], Rows | Err]


def refused(what: str) -> Err:
    return Err(1235, f"relay does not forward {what} to its primary: metadata look-ups are "
                     "SELECTs of information_schema's metadata tables (columns, literals, "
                     "comparisons; no subqueries, variables or other functions) and SHOW "
                     "DATABASES / TABLES / COLUMNS / INDEX / CREATE TABLE / TABLE STATUS",
               "42000")


def canonical_show(text: str) -> str | None:
    """A SHOW sqlglot keeps as a raw command (SHOW FIELDS, SHOW KEYS, SHOW CREATE SCHEMA)
    in the spelling it parses; None when it is none of them."""
    try:
        tokens = sqlglot.tokenize(text, read="mysql")
    except TokenError:
        return None
    words = [t.text.upper() for t in tokens[:3]]
    if not words or words[0] != "SHOW":
        return None
    for spelling, canonical in _SYNONYMS:
        if tuple(words[1 : 1 + len(spelling)]) == spelling:
            end = tokens[len(spelling)].end + 1
            return f"SHOW {canonical}{text[end:]}"
    return None


class Lookups:
    """Look-ups for one flavour of primary, within `max_rows`."""

    SHOWS = SHOWS

    def __init__(self, *, mariadb: bool = True, max_rows: int = 10_000) -> None:
        self.mariadb = mariadb
        self.max_rows = max_rows

    # --- SELECT -------------------------------------------------------------------------------

    def select(self, tree: exp.Select, session: SessionVars) -> Lookup | Err:
        problem = _disallowed(tree)
        if problem is not None:
            return refused(problem)
        tree = tree.copy()
        for table in tree.find_all(exp.Table):
            if table.catalog:
                return refused(f"a table named with a catalog ({table.sql('mysql')})")
            db = table.db or (session.database or "")
            if db.lower() != INFORMATION_SCHEMA:
                return Err(1235, "relay holds no tables (it serves the binlog); SELECT from "
                                 "information_schema is forwarded to the primary", "42000")
            if table.name.upper() not in TABLES_ALLOWED:
                return refused(f"information_schema.{table.name} (it answers "
                               f"{', '.join(sorted(TABLES_ALLOWED))})")
            table.set("db", exp.to_identifier(INFORMATION_SCHEMA))
        limit = tree.args.get("limit")
        bound = _int_literal(limit.expression) if limit is not None else None
        if bound is None or bound > self.max_rows:
            # one row more than allowed: the answer says whether the cap cut it
            tree.set("limit", exp.Limit(expression=exp.Literal.number(self.max_rows + 1)))
        sql = _regenerate(tree)
        if sql is None:
            return refused("a statement whose regenerated text reads differently")
        return Lookup(sql)

    # --- SHOW ---------------------------------------------------------------------------------

    def show(self, tree: exp.Show, session: SessionVars) -> Lookup | Err:
        what = str(tree.this or "").upper()
        full = bool(tree.args.get("full"))
        like = tree.args.get("like")
        where = tree.args.get("where")
        if like is not None and not (isinstance(like, exp.Literal) and like.is_string):
            return refused("a SHOW ... LIKE that is not a string")
        if where is not None:
            problem = _local_problem(where.this)
            if problem is not None:
                return Err(1235, f"relay evaluates a SHOW's WHERE itself and cannot evaluate "
                                 f"{problem}: compare columns with literals (=, <>, LIKE, IN, "
                                 "IS NULL, AND, OR, NOT)", "42000")
        local = _where_filter(where.this) if where is not None else None
        pattern = f" LIKE {_string(like.name)}" if like is not None else ""
        target = tree.args.get("target")
        db_arg = tree.args.get("db")
        db = (db_arg.name if isinstance(db_arg, exp.Expression) else str(db_arg or "")) or None
        if what == "DATABASES":
            return Lookup(f"SHOW DATABASES{pattern}", finish=local)
        if what == "COLLATION":
            return Lookup(f"SHOW COLLATION{pattern}", finish=local)
        if what == "CHARACTER SET":
            return Lookup(f"SHOW CHARACTER SET{pattern}", finish=local)
        if what in ("TABLES", "TABLE STATUS"):
            schema = db or session.database
            if not schema:
                return Err(1046, "No database selected", "3D000")
            kind = "FULL TABLES" if what == "TABLES" and full else what
            return Lookup(f"SHOW {kind} FROM {_name(schema)}{pattern}", finish=local)
        if what == "CREATE DATABASE":
            name = _target_name(target)
            if not name:
                return refused("SHOW CREATE DATABASE without a name")
            return Lookup(f"SHOW CREATE DATABASE {_name(name)}")
        table = _target_name(target)
        schema = db or (target.args.get("db") if isinstance(target, exp.Table) else None) \
            or session.database
        if isinstance(schema, exp.Expression):
            schema = schema.name
        if not table:
            return refused(f"SHOW {what} without a table")
        if not schema:
            return Err(1046, "No database selected", "3D000")
        if what in ("CREATE TABLE", "CREATE VIEW"):
            return Lookup(f"SHOW {what} {_name(schema)}.{_name(table)}")
        if what == "COLUMNS":
            return self.columns(str(schema), table, full=full,
                                like=like.name if like is not None else None, where=local)
        if what == "INDEX":
            return self.index(str(schema), table, where=local)
        return refused(f"SHOW {what}")

    def describe(self, tree: exp.Describe, session: SessionVars) -> Lookup | Err:
        target = tree.this
        if not isinstance(target, exp.Table) or tree.args.get("kind"):
            return refused("EXPLAIN of a statement")
        schema = target.db or session.database
        if not schema:
            return Err(1046, "No database selected", "3D000")
        return self.columns(schema, target.name, full=False, like=None, where=None)

    def columns(self, schema: str, table: str, *, full: bool, like: str | None,
                where: Finish | None) -> Lookup:
        """SHOW [FULL] COLUMNS as information_schema.COLUMNS gives it, in the SHOW's names
        (the column definitions are the same: MariaDB answers both from one table)."""
        picks = [("COLUMN_NAME", "Field"), ("COLUMN_TYPE", "Type")]
        if full:
            picks.append(("COLLATION_NAME", "Collation"))
        picks += [("IS_NULLABLE", "Null"), ("COLUMN_KEY", "Key"),
                  ("COLUMN_DEFAULT", "Default"), ("EXTRA", "Extra")]
        if full:
            picks += [("PRIVILEGES", "Privileges"), ("COLUMN_COMMENT", "Comment")]
        sql = (f"SELECT {_picks(picks)} FROM information_schema.COLUMNS "
               f"WHERE {_in_table(schema, table)} ORDER BY ORDINAL_POSITION")
        fix = _show_default if self.mariadb else None
        field_like = LikePattern(like) if like is not None else None

        def finish(defs: list[ColumnDef], rows: list[list[Value]]) -> Rows | Err:
            if fix is not None:
                at = next(i for i, d in enumerate(defs) if d.name == "Default")
                rows = [[*r[:at], fix(r[at]), *r[at + 1:]] for r in rows]
            if field_like is not None:
                rows = [r for r in rows if field_like.fullmatch(_text(r[0]))]
            return where(defs, rows) if where is not None else Rows(
                [d.name for d in defs], rows, defs)

        return Lookup(sql, exists=_table_exists(schema, table), missing=_no_table(schema, table),
                      finish=finish)

    def index(self, schema: str, table: str, *, where: Finish | None) -> Lookup:
        """SHOW INDEX as information_schema.STATISTICS gives it (in the table's key order,
        as SHOW INDEX lists them), in the SHOW's names and the flavour's columns."""
        picks = [("TABLE_NAME", "Table"), ("NON_UNIQUE", "Non_unique"),
                 ("INDEX_NAME", "Key_name"), ("SEQ_IN_INDEX", "Seq_in_index"),
                 ("COLUMN_NAME", "Column_name"), ("COLLATION", "Collation"),
                 ("CARDINALITY", "Cardinality"), ("SUB_PART", "Sub_part"),
                 ("PACKED", "Packed"), ("NULLABLE", "Null"), ("INDEX_TYPE", "Index_type"),
                 ("COMMENT", "Comment"), ("INDEX_COMMENT", "Index_comment")]
        picks += [("IGNORED", "Ignored")] if self.mariadb else [
            ("IS_VISIBLE", "Visible"), ("EXPRESSION", "Expression")]
        sql = (f"SELECT {_picks(picks)} FROM information_schema.STATISTICS "
               f"WHERE {_in_table(schema, table)}")
        return Lookup(sql, exists=_table_exists(schema, table), missing=_no_table(schema, table),
                      finish=where)


# --- checks ---------------------------------------------------------------------------------

def _disallowed(tree: exp.Select) -> str | None:
    """What in `tree` a look-up may not hold, in words; None when all of it may."""
    extra = sorted(k for k, v in tree.args.items() if v not in (None, False, [], "")
                   and k not in _SELECT_ARGS)
    if extra:
        return f"a SELECT with {', '.join(extra)}"
    for node in tree.walk():
        if isinstance(node, exp.Select) and node is not tree:
            return "a subquery"
        if type(node) not in _NODES:
            return repr(node.sql("mysql", comments=False)[:80])
        if isinstance(node, exp.Join) and node.args.get("using") is None and \
                node.args.get("on") is None and node.args.get("kind") not in (None, "CROSS"):
            return "a join without ON or USING"
    return None


def _regenerate(tree: exp.Expression) -> str | None:
    """The tree as MySQL text without comments, if it parses back to the same tree."""
    sql = tree.sql("mysql", comments=False)
    try:
        again = sqlglot.parse_one(sql, read="mysql")
    except (ParseError, TokenError):
        return None
    return sql if again == tree else None


def _int_literal(node: exp.Expression | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.is_int:
        return int(node.this)
    return None


def _string(value: str) -> str:
    return exp.Literal.string(value).sql("mysql")


def _name(value: str) -> str:
    return exp.to_identifier(value, quoted=True).sql("mysql")


def _target_name(target: Any) -> str:
    if isinstance(target, exp.Expression):
        return str(target.name)
    return str(target or "")


def _picks(picks: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{column} AS {_name(alias)}" for column, alias in picks)


def _in_table(schema: str, table: str) -> str:
    return f"TABLE_SCHEMA = {_string(schema)} AND TABLE_NAME = {_string(table)}"


def _table_exists(schema: str, table: str) -> str:
    return f"SELECT 1 FROM information_schema.TABLES WHERE {_in_table(schema, table)}"


def _no_table(schema: str, table: str) -> Err:
    return Err(1146, f"Table '{schema}.{table}' doesn't exist", "42S02")


def _text(value: Value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


_QUOTED = re.compile(rb"^'(.*)'$", re.DOTALL)


def _show_default(value: Value) -> Value:
    """MariaDB's information_schema.COLUMNS quotes a string default ('x''y') and writes a
    NULL default as NULL; SHOW COLUMNS shows the value itself (x'y) and SQL NULL."""
    if isinstance(value, str):
        value = value.encode()
    if value is None or value == b"NULL":
        return None
    m = _QUOTED.match(value)
    return m.group(1).replace(b"''", b"'") if m else value


# --- a SHOW's WHERE, here ---------------------------------------------------------------------

_LOCAL_NODES = (exp.Paren, exp.And, exp.Or, exp.Not, exp.Column, exp.Identifier,
                exp.Literal, exp.Null, exp.EQ, exp.NEQ, exp.Like, exp.In, exp.Is)


def _local_problem(node: exp.Expression) -> str | None:
    for n in node.walk():
        if not isinstance(n, _LOCAL_NODES):
            return repr(n.sql("mysql", comments=False)[:80])
    return None


def _where_filter(condition: exp.Expression) -> Finish:
    def finish(defs: list[ColumnDef], rows: list[list[Value]]) -> Rows | Err:
        names = [d.name for d in defs]
        kept = []
        for row in rows:
            verdict = evaluate(condition, dict(zip(names, (None if v is None else _text(v)
                                                          for v in row), strict=True)))
            if isinstance(verdict, Err):
                return verdict
            if verdict:
                kept.append(row)
        return Rows(names, kept, defs)
    return finish


def evaluate(node: exp.Expression, row: dict[str, str | None]) -> Any:
    """A WHERE condition over one row of a SHOW (its columns by name, any case)."""
    if isinstance(node, exp.Paren):
        return evaluate(node.this, row)
    if isinstance(node, (exp.And, exp.Or)):
        a, b = evaluate(node.this, row), evaluate(node.expression, row)
        for x in (a, b):
            if isinstance(x, Err):
                return x
        return bool(a and b) if isinstance(node, exp.And) else bool(a or b)
    if isinstance(node, exp.Not):
        a = evaluate(node.this, row)
        return a if isinstance(a, Err) else not a
    if isinstance(node, exp.Column):
        for k, v in row.items():
            if k.lower() == node.name.lower():
                return v
        return Err(1054, f"Unknown column '{node.name}' in 'where clause'", "42S22")
    if isinstance(node, exp.Literal):
        return str(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Is):
        a = evaluate(node.this, row)
        return a if isinstance(a, Err) else a is None
    if isinstance(node, (exp.EQ, exp.NEQ, exp.Like)):
        a, b = evaluate(node.this, row), evaluate(node.expression, row)
        for x in (a, b):
            if isinstance(x, Err):
                return x
        if a is None or b is None:
            return False
        if isinstance(node, exp.Like):
            return LikePattern(str(b)).fullmatch(str(a))
        same = str(a).lower() == str(b).lower()
        return same if isinstance(node, exp.EQ) else not same
    if isinstance(node, exp.In):
        a = evaluate(node.this, row)
        if isinstance(a, Err):
            return a
        options = [evaluate(e, row) for e in node.expressions]
        for o in options:
            if isinstance(o, Err):
                return o
        return a is not None and any(str(a).lower() == str(o).lower() for o in options)
    return Err(1235, f"relay cannot evaluate {node.sql('mysql')[:80]!r} in a SHOW ... WHERE",
               "42000")
