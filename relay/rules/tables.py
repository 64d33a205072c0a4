"""Which tables an event touches, and MariaDB's wildcard table rules over them.

Patterns are those of `replicate_wild_do_table` / `replicate_wild_ignore_table`:
`db.table` with `%` (any run of characters) and `_` (any one character), `\\` escaping
either; matched case-insensitively, as MariaDB matches them. A rules list decides like
MariaDB's `Rpl_filter::tables_ok`: per table, a match of a do-pattern keeps the event, a
match of an ignore-pattern drops it; with do-patterns and no match anywhere, the event is
dropped; with only ignore-patterns, it is kept.

Row events name their table (the table map). A statement names the tables it touches:
they are read from its text with sqlglot's MySQL dialect and qualified with the
statement's default schema. Statements about a whole schema (CREATE DATABASE ...) and
statements sqlglot cannot take apart count as touching their schema: a pattern matches
them when its schema part matches and its table part is `%`.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

log = logging.getLogger("relay.rules")
# sqlglot logs a note for every statement it falls back to parsing as a Command.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

# A schema as a whole (a statement about a schema, or one whose tables are unknown).
WHOLE_SCHEMA = None


_ONE = object()   # `_`: any one character
_RUN = object()   # `%`: any run of characters


class LikePattern:
    """A MySQL LIKE pattern: `%` any run of characters, `_` any one, `\\` escaping the
    next character; case-insensitive, tested against the whole string.

    Hand-written instead of a regex: a pattern comes from clients (SHOW ... LIKE, the
    tap's tables), and a regex of many `%` backtracks exponentially on a near miss (the
    fuzzer's `LIKE '%%%%...%x%%...'` took seconds). The two-pointer match here is
    O(len(pattern) * len(text)) at worst."""

    __slots__ = ("_tokens", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        tokens: list[object] = []
        i = 0
        while i < len(pattern):
            c = pattern[i]
            if c == "\\" and i + 1 < len(pattern):
                tokens.append(pattern[i + 1].lower())
                i += 2
                continue
            if c == "%":
                if not tokens or tokens[-1] is not _RUN:  # a run of % is one %
                    tokens.append(_RUN)
            else:
                tokens.append(_ONE if c == "_" else c.lower())
            i += 1
        self._tokens = tokens

    def fullmatch(self, text: str) -> bool:
        tokens, s = self._tokens, text.lower()
        i = j = 0
        star, mark = -1, 0
        while i < len(s):
            if j < len(tokens) and (tokens[j] is _ONE or tokens[j] == s[i]):
                i += 1
                j += 1
            elif j < len(tokens) and tokens[j] is _RUN:
                star, mark = j, i
                j += 1
            elif star >= 0:  # let the last % take one more character
                j = star + 1
                mark += 1
                i = mark
            else:
                return False
        while j < len(tokens) and tokens[j] is _RUN:
            j += 1
        return j == len(tokens)

    match = fullmatch  # LIKE always tests the whole string

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LikePattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"LikePattern({self.pattern!r})"


def _split(pattern: str) -> tuple[str, str]:
    """`db.table` at the first unescaped dot."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == ".":
            return pattern[:i], pattern[i + 1 :]
        i += 1
    raise ValueError(f"table pattern {pattern!r} has no '.': write it as schema.table "
                     "(% and _ are wildcards)")


@dataclass(frozen=True)
class TablePattern:
    text: str
    schema: LikePattern
    table: LikePattern
    any_table: bool          # the table part matches everything

    @classmethod
    def parse(cls, text: str) -> TablePattern:
        schema, table = _split(text)
        return cls(text, LikePattern(schema), LikePattern(table),
                   bool(table) and set(table) == {"%"})

    @property
    def literal_table(self) -> str | None:
        """The table part, lower-cased, when it has no wildcard (None when it has)."""
        out, i, text = [], 0, self.table.pattern
        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 2
                continue
            if c in "%_":
                return None
            out.append(c)
            i += 1
        return "".join(out).lower() or None

    def matches(self, schema: str, table: str | None) -> bool:
        if not self.schema.fullmatch(schema):
            return False
        if table is WHOLE_SCHEMA:
            return self.any_table
        return bool(self.table.fullmatch(table))


@dataclass(frozen=True)
class TableRules:
    do: tuple[TablePattern, ...] = ()
    ignore: tuple[TablePattern, ...] = ()

    @classmethod
    def parse(cls, do: list[str] | tuple[str, ...] = (),
              ignore: list[str] | tuple[str, ...] = ()) -> TableRules:
        return cls(tuple(TablePattern.parse(p) for p in do),
                   tuple(TablePattern.parse(p) for p in ignore))

    def keeps(self, tables: list[tuple[str, str | None]]) -> bool:
        """MariaDB's decision for an event touching `tables` ((schema, table-or-None))."""
        for schema, table in tables:
            if self.do and any(p.matches(schema, table) for p in self.do):
                return True
            if self.ignore and any(p.matches(schema, table) for p in self.ignore):
                return False
        return not self.do


_SCHEMA_LEVEL = re.compile(r"^\s*(?:/\*.*?\*/\s*)*(CREATE|DROP|ALTER)\s+(DATABASE|SCHEMA)\b",
                           re.IGNORECASE | re.DOTALL)
# Comments before a statement's first word (not MySQL's executable /*! ... */ ones).
_LEAD = r"^((?:\s+|/\*(?![!M]).*?\*/|(?:--\s|#)[^\n]*(?:\n|$))*)"
# DML with the modifiers sqlglot's MySQL dialect misreads (it takes `UPDATE LOW_PRIORITY
# users` for a table LOW_PRIORITY aliased users, and fails on REPLACE and INSERT DELAYED):
# the tables are read from the statement without them, REPLACE as INSERT.
_DML_HEAD = re.compile(_LEAD + r"(INSERT|REPLACE|UPDATE|DELETE)"
                       r"((?:\s+(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|QUICK|IGNORE))*)\b",
                       re.IGNORECASE | re.DOTALL)
_NAME = r"(`(?:[^`]|``)+`|[\w$]+)"
# LOAD DATA as a binlog carries it (EXECUTE_LOAD_QUERY): sqlglot keeps it as a Command.
_LOAD = re.compile(_LEAD + r"LOAD\s+(?:DATA|XML)\s+(?:(?:LOW_PRIORITY|CONCURRENT)\s+)?"
                   r"(?:LOCAL\s+)?INFILE\s+'(?:[^'\\]|\\.|'')*'\s+(?:(?:REPLACE|IGNORE)\s+)?"
                   r"INTO\s+TABLE\s+" + _NAME + r"(?:\s*\.\s*" + _NAME + r")?",
                   re.IGNORECASE | re.DOTALL)


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


_SET_STATEMENT = re.compile(_LEAD + r"SET\s+STATEMENT\b", re.IGNORECASE | re.DOTALL)


def _after_set_statement(text: str) -> str:
    """MariaDB's `SET STATEMENT var=value[, ...] FOR <statement>` as the statement after
    FOR (the variables hold for it alone); other text as it is. The FOR is found among
    the statement's tokens, outside parentheses, so a value holding " FOR " (a string)
    is not taken for it."""
    while _SET_STATEMENT.match(text):
        try:
            import sqlglot
            from sqlglot import TokenType

            tokens = sqlglot.tokenize(text, read="mysql")
        except Exception:
            return text
        depth = 0
        for tok in tokens[2:]:  # (SET STATEMENT)
            if tok.token_type == TokenType.L_PAREN:
                depth += 1
            elif tok.token_type == TokenType.R_PAREN:
                depth -= 1
            elif tok.token_type == TokenType.FOR and depth == 0:
                text = text[tok.end + 1 :]
                break
        else:
            return text  # no FOR: not a statement that runs one
    return text


def _readable(text: str) -> str:
    """The statement as the parser should read it: the one a SET STATEMENT runs, DML
    without the modifiers sqlglot misreads, REPLACE as INSERT."""
    text = _after_set_statement(text)
    head = _DML_HEAD.match(text)
    if head:
        verb = "INSERT" if head.group(2).upper() == "REPLACE" else head.group(2)
        text = head.group(1) + verb + text[head.end():]
    return text


@functools.lru_cache(maxsize=8)
def _tree(text: str) -> object | None:
    """sqlglot's tree of a statement (read by `_readable`); None when it cannot take it
    apart (a parse error, or a statement it keeps as an opaque Command). Cached for the
    few statements last read only (statement_targets, then statement_tables, read the
    same one): a tree is many times its text."""
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(text, read="mysql")
    except Exception:
        return None
    return None if tree is None or isinstance(tree, exp.Command) else tree


def _load_table(text: str, default_schema: str) -> tuple[str, str] | None:
    load = _LOAD.match(text)
    if load is None:
        return None
    first, second = load.group(2), load.group(3)
    if second is None:
        return (default_schema, _unquote(first))
    return (_unquote(first), _unquote(second))


@functools.lru_cache(maxsize=4096)
def statement_tables(text: str, default_schema: str) -> tuple[tuple[str, str | None], ...]:
    """The (schema, table) pairs a statement touches; (schema, None) for a statement about
    a whole schema or one whose tables cannot be read (then: its default schema)."""
    text = _after_set_statement(text)
    m = _SCHEMA_LEVEL.match(text)
    if m:
        name = _schema_name(text)
        return ((name or default_schema, WHOLE_SCHEMA),)
    loaded = _load_table(text, default_schema)
    if loaded is not None:
        return (loaded,)
    from sqlglot import exp

    tree = _tree(_readable(text))
    if not isinstance(tree, exp.Expression):
        return ((default_schema, WHOLE_SCHEMA),)
    found = []
    for t in tree.find_all(exp.Table):
        if t.name:
            found.append((t.db or default_schema, t.name))
    return tuple(found) or ((default_schema, WHOLE_SCHEMA),)


@functools.lru_cache(maxsize=4096)
def statement_targets(text: str, default_schema: str) -> tuple[tuple[str, str], ...] | None:
    """The tables a data statement writes (INSERT/REPLACE's table, the tables an UPDATE
    sets columns of, the tables a DELETE deletes from, LOAD DATA's table), as MariaDB's
    replication filters judge a statement (`Rpl_filter::tables_ok` looks at the tables
    being updated only: `INSERT INTO kept SELECT ... FROM ignored` replicates). None when
    the statement is none of those or cannot be read: judge it by `statement_tables`."""
    text = _after_set_statement(text)
    loaded = _load_table(text, default_schema)
    if loaded is not None:
        return (loaded,)
    from sqlglot import exp

    tree = _tree(_readable(text))
    if isinstance(tree, exp.Insert):
        target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
        if isinstance(target, exp.Table) and target.name:
            return ((target.db or default_schema, target.name),)
        return None
    if not isinstance(tree, (exp.Update, exp.Delete)):
        return None
    # The tables the statement names (with their aliases), then those it writes.
    named: dict[str, tuple[str, str]] = {}
    order: list[tuple[str, str]] = []
    using = tree.args.get("using")
    using = using if isinstance(using, list) else []
    first = 0  # how many of `order` the statement's first table list holds
    for root in (tree.this, *using):
        if not isinstance(root, exp.Table):
            continue
        for t in (root, *(j.this for j in root.args.get("joins") or [])):
            if isinstance(t, exp.Table) and t.name:
                pair = (t.db or default_schema, t.name)
                order.append(pair)
                named.setdefault(t.alias_or_name.lower(), pair)
                named.setdefault(t.name.lower(), pair)
        first = first or len(order)
    if not order:
        return None
    if isinstance(tree, exp.Delete):
        listed = tree.args.get("tables") or []
        if not listed:  # DELETE FROM t ...; DELETE FROM t1, t2 USING ...: the FROM list
            return tuple(dict.fromkeys(order[:first] if using else order[:1]))
        out = [named.get(t.name.lower()) if not t.db else (t.db, t.name)
               for t in listed if isinstance(t, exp.Table)]
    else:
        if len(set(order)) == 1:
            return (order[0],)
        out = []
        for assignment in tree.expressions:
            column = assignment.this if isinstance(assignment, exp.EQ) else None
            qualifier = column.table if isinstance(column, exp.Column) else ""
            out.append(named.get(qualifier.lower()) if qualifier else None)
    if not out or any(t is None for t in out):
        return tuple(dict.fromkeys(order))  # (a name it cannot place: all it names)
    return tuple(dict.fromkeys(t for t in out if t is not None))


def _schema_name(text: str) -> str | None:
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(text, read="mysql")
        table = tree.find(exp.Table) if tree is not None else None
        return table.name if table is not None else None
    except Exception:
        return None


def statement_names(text: str, default_schema: str) -> frozenset[tuple[str, str]]:
    """Every name a statement's text holds outside its strings and comments, as
    (schema, name): qualified where it follows `schema.`, and with the default schema
    too. A superset of the tables it touches (columns and aliases come along), read
    without a parser: what a rule that must not miss a table checks besides
    `statement_tables` (a parser can misread a statement; the tokens are still there)."""
    try:
        import sqlglot
        from sqlglot import TokenType

        tokens = sqlglot.tokenize(text, read="mysql")
    except Exception:
        return frozenset()
    names = (TokenType.VAR, TokenType.IDENTIFIER)
    out = set()
    for i, tok in enumerate(tokens):
        if tok.token_type in names:
            out.add((default_schema, tok.text))
            if i >= 2 and tokens[i - 1].token_type == TokenType.DOT \
                    and tokens[i - 2].token_type in names:
                out.add((tokens[i - 2].text, tok.text))
    return frozenset(out)
