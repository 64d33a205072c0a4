"""Rules compiled (`Rule` and a subclass per `RuleKind`), by `compile_rule`.

A compiled rule answers an `Outcome` per table (`table`, decided once per table map and
cached by the engine), per statement (`query`), per rows event (`rows`, only for rules
that look at more than the table) and for annotations. Only masks and hooks decode rows.

Where a rule is a confidentiality boundary (masks, filters, hooks that may change rows)
it must hold for every byte a client gets, not only for rows events:
- Annotations (MariaDB's ANNOTATE_ROWS, MySQL's ROWS_QUERY) carry the statement's text,
  values included, beside the rows it made: a chain with a mask, a filter or a hook drops
  them all (`annotation`), whatever table the statement names. Telling an annotation
  that is safe to keep would take parsing every statement's text on the hot path, and a
  filter's kept rows may come from a statement whose text holds a hidden table's values
  (`INSERT INTO kept SELECT ... FROM hidden WHERE secret = '...'`, an UPDATE over a
  join); a hook may have changed or dropped rows the annotation still shows. Renames
  and drop_events hide nothing: their chains keep annotations.
- A statement-format event that may change data (DML in a MIXED or STATEMENT binlog, LOAD
  DATA) carries its values in SQL text no mask reaches: a mask or filter rule whose
  tables it touches, or which cannot tell its tables, refuses it (`StatementRefused`,
  the stream stops) unless the rule says `on_statement = "drop"` (it is dropped). Which
  tables a statement touches is read from its text (statement_tables; a mask also checks
  every name in it, statement_names); when a rule names its tables without wildcards, a
  statement whose text holds none of those names flows without being parsed. A view,
  trigger or routine that reaches a masked table under another name is not seen: only a
  ROW binlog holds such rules for every write.
  DDL, account statements and transaction framing are not data and flow as before.
  A statement holding an executable comment (`/*! */`, `/*M! */`), which the server
  runs and the parser here skips, counts as one whose tables cannot be read.
- At the receive point a filter routes (RoutingFilter): what the relay stores, decided as
  MariaDB's replication filters decide (a statement by the tables it writes, annotations
  kept), so a MIXED primary's statements never stop the ingest; the boundary a
  downstream user meets is drawn by send and tap rules. A mask at receive stays
  fail-closed (it stops the ingest at a statement on its tables).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from relay.binlog.constants import RowKind
from relay.config import MaskKind, OnStatement, RulePoint
from relay.errors import HookError, StatementRefused
from relay.rules import hooks as H
from relay.rules.mask import ColumnMask, MaskError
from relay.rules.model import (
    POINTS,
    Outcome,
    QueryWork,
    RowsWork,
    RuleKind,
    RuleSpec,
)
from relay.rules.tables import (
    WHOLE_SCHEMA,
    TablePattern,
    TableRules,
    statement_names,
    statement_tables,
    statement_targets,
)

if TYPE_CHECKING:
    from relay.binlog.rowcodec import RowImage
    from relay.binlog.tablemap import TableMap

KEPT, CHANGED, DROPPED = Outcome.KEPT, Outcome.CHANGED, Outcome.DROPPED


class Rule:
    """A compiled rule. Subclasses decide tables, statements and rows."""

    def __init__(self, spec: RuleSpec) -> None:
        self.spec = spec
        self.name = spec.name

    def applies_to(self, client: str, server_id: int) -> bool:
        if not self.spec.clients:
            return True
        return any(c == server_id if isinstance(c, int) else c == client
                   for c in self.spec.clients)

    def bind(self, client: str) -> Rule:
        """The rule as one client's chain runs it."""
        return self

    def table(self, table: TableMap) -> tuple[Outcome, TableMap]:
        """The outcome for rows of this table, and the table as it leaves."""
        return KEPT, table

    def query(self, work: QueryWork) -> Outcome:
        return KEPT

    def rows(self, work: RowsWork) -> Outcome:
        """Per rows event, for rules that look at more than the table."""
        return KEPT

    def column_masks(self, table: TableMap) -> list[ColumnMask] | None:
        """What rows() does to the rows of `table` when it only replaces column values
        one by one (masks), so the engine may do it on the stored bytes instead of
        decoding and encoding whole rows; None when it does more than that."""
        return None

    def annotation(self) -> Outcome:
        """The outcome for every annotation (ANNOTATE_ROWS / ROWS_QUERY) the chain meets."""
        return KEPT

    def unknown_statement(self, work: QueryWork, why: str) -> Outcome:
        """A data statement whose tables are not known (a LOAD DATA whose file is too
        large to hold until its statement names the table, or of a format before MySQL
        5.0); `why` says which, for an error."""
        return KEPT

    @property
    def judges_statements(self) -> bool:
        """Whether the rule refuses data statements on its tables (masks, filters)."""
        return False

    @property
    def holds_load_files(self) -> bool:
        """Whether LOAD DATA's file is held until its statement names the table (so that
        it goes out only with a statement the rules keep): for rules whose decision must
        cover the file's rows too (masks, filters at send and tap, hooks, a receive
        filter: the relay stores nothing of a table it ignores). Elsewhere the file goes
        out as it comes, and a DELETE_FILE takes a dropped statement's place."""
        return self.judges_statements

    def _refuse(self, work: QueryWork, what: str) -> Outcome:
        """A data statement on this rule's tables: dropped under on_statement = "drop",
        else the stream stops (StatementRefused)."""
        if self.spec.on_statement is OnStatement.DROP:
            return DROPPED
        verb = f" ({work.verb})" if work.verb else ""
        raise StatementRefused(self.name, str(work.position),
                               f"a statement-format event{verb} {what}")

    @property
    def reads_rows(self) -> bool:
        return False

    @property
    def per_event(self) -> bool:
        """Whether `rows` must run for every rows event (not only `table`)."""
        return False

    def per_event_for(self, table: TableMap) -> bool:
        """Whether `rows` must run for the rows events of this table (as this rule sees
        it): a table no rule looks into keeps the whole-transaction fast path."""
        return self.per_event

    @property
    def can_grow_events(self) -> bool:
        """Whether events may come out of this rule larger than they went in."""
        return False


def _literal_names(patterns: Sequence[TablePattern]) -> tuple[str, ...] | None:
    """The table names of patterns that name their tables without wildcards (None when
    one has a wildcard): a statement whose text holds none of them touches none of their
    tables (but through a view or trigger), which a substring test tells at once."""
    names = [p.literal_table for p in patterns]
    return None if any(n is None for n in names) else tuple(n for n in names if n)


def _names_none_of(names: tuple[str, ...] | None, text: str) -> bool:
    if names is None:
        return False
    low = text.lower()
    return not any(n in low for n in names)


def _executable_comment(text: str) -> bool:
    """Whether a statement holds MySQL's or MariaDB's executable comment (`/*! ... */`,
    `/*M! ... */`): the server runs what is inside, the parser here reads it as a comment,
    so a table named there (`INSERT INTO /*!app.*/users ...`) would not be seen."""
    return "/*!" in text or "/*M!" in text


class HidingRule(Rule):
    """A rule that hides data (a filter, a mask): the client gets no annotation (the
    original SQL, values and all) and no data statement on its tables."""

    def annotation(self) -> Outcome:
        return DROPPED  # (see the module's docstring)

    def unknown_statement(self, work: QueryWork, why: str) -> Outcome:
        return self._refuse(work, why)

    @property
    def judges_statements(self) -> bool:
        return True


class _TableFilter(Rule):
    """do_tables / ignore_tables: MariaDB's decision per table map."""

    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.rules = TableRules.parse(spec.do_tables, spec.ignore_tables)

    def table(self, table: TableMap) -> tuple[Outcome, TableMap]:
        return (KEPT if self.rules.keeps([(table.schema, table.table)]) else DROPPED), table

    def _routed(self, work: QueryWork) -> Outcome:
        """A statement as MariaDB's replication filters judge it: by the tables it writes
        (a data statement whose targets can be read) or by every table it names."""
        tables = (statement_targets(work.text, work.schema) if work.data else None) \
            or statement_tables(work.text, work.schema)
        return KEPT if self.rules.keeps(list(tables)) else DROPPED


class FilterRule(_TableFilter, HidingRule):
    """A filter at send or tap: a confidentiality boundary, so a data statement is judged
    by every table it names and fails closed (see the module's docstring)."""

    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        # With ignore patterns only, a statement naming none of their tables keeps.
        self._hidden = None if self.rules.do else _literal_names(self.rules.ignore)

    def query(self, work: QueryWork) -> Outcome:
        if not work.data:  # DDL: MariaDB's decision over its tables, as before
            return KEPT if self.rules.keeps(list(statement_tables(work.text, work.schema))) \
                else DROPPED
        if _names_none_of(self._hidden, work.text):  # (before any parsing: the point of it)
            return KEPT
        if _executable_comment(work.text):
            return self._refuse(work, "whose tables cannot be read (an executable comment "
                                      "/*! */ may name them)")
        tables = statement_tables(work.text, work.schema)
        if any(t is WHOLE_SCHEMA for _, t in tables):
            return self._refuse(work, "whose tables cannot be read")
        kept = [self.rules.keeps([t]) for t in tables]
        if all(kept):
            return KEPT
        if not any(kept):  # all of it hidden: nothing of it goes out, as for its rows
            return DROPPED
        # Kept and hidden tables in one statement: its text may carry a hidden table's
        # values, and a replica could not run it without the hidden tables.
        return self._refuse(work, "touches tables this rule keeps and tables it hides")


class RoutingFilter(_TableFilter):
    """A filter at receive: what the relay stores, as MariaDB's replication filters
    (replicate_wild_*_table) decide it: a statement by the tables it writes (or, when
    those cannot be read, every table it names, and by its default schema when none can
    be read), annotations kept. It routes; it is not a boundary a downstream user meets
    (send and tap filters are: FilterRule)."""

    def query(self, work: QueryWork) -> Outcome:
        return self._routed(work)

    @property
    def holds_load_files(self) -> bool:
        return self.spec.at is RulePoint.RECEIVE  # (one stream: the ingest)


class TableSelection(RoutingFilter):
    """A tap reader's own choice of tables (a do_tables filter named "tables"): what the
    reader asked for, not a boundary the configuration draws (the configured tap rules
    are), so it judges statements as MariaDB's replication filters do and keeps
    annotations."""


class RenameRule(Rule):
    """replicate_rewrite_db: the schema of table maps and the default schema of
    statements; names inside statement text are left as they are."""

    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.mapping = dict(spec.rename_schema)

    def table(self, table: TableMap) -> tuple[Outcome, TableMap]:
        new = self.mapping.get(table.schema)
        if new is None:
            return KEPT, table
        return CHANGED, table.renamed(schema=new)

    def query(self, work: QueryWork) -> Outcome:
        new = self.mapping.get(work.schema)
        if new is None:
            return KEPT
        work.schema = new
        return CHANGED

    @property
    def can_grow_events(self) -> bool:
        return any(len(b.encode()) > len(a.encode()) for a, b in self.mapping.items())


class DropRule(Rule):
    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.kinds = frozenset(spec.drop_events)

    def query(self, work: QueryWork) -> Outcome:
        if "query" in self.kinds or (work.ddl and "ddl" in self.kinds):
            return DROPPED
        return KEPT

    def rows(self, work: RowsWork) -> Outcome:
        return DROPPED if work.kind.value in self.kinds else KEPT  # (kinds: EVENT_KINDS)

    def annotation(self) -> Outcome:
        return DROPPED if "annotate" in self.kinds else KEPT

    @property
    def per_event(self) -> bool:
        return not self.kinds.isdisjoint(k.value for k in RowKind)


class MaskRule(HidingRule):
    def __init__(self, spec: RuleSpec) -> None:
        """Raises ValueError for a column that is not schema.table.column and MaskError
        for a hash whose key is not set."""
        super().__init__(spec)
        self.targets = []
        for m in spec.masks:
            schema, _, rest = m.column.partition(".")
            table, _, column = rest.rpartition(".")
            if not schema or not table or not column:
                raise ValueError(f"mask column {m.column!r} should be schema.table.column")
            self.targets.append((TablePattern.parse(f"{schema}.{table}"),
                                 re.compile(column.replace("%", ".*"), re.IGNORECASE), m))
        self.keys = {m.key_env: m.key() for m in spec.masks if m.kind is MaskKind.HASH}
        self._plans: dict[tuple[Any, ...], list[ColumnMask]] = {}
        self._names = _literal_names([pattern for pattern, _c, _m in self.targets])

    def _plan(self, table: TableMap) -> list[ColumnMask]:
        key = (table.schema, table.table, table.table_id, table.column_types, table.optional)
        plan = self._plans.get(key)
        if plan is None:
            plan = []
            for pattern, column, m in self.targets:
                if pattern.matches(table.schema, table.table):
                    plan += [ColumnMask(m, c, self.keys.get(m.key_env, b""))
                             for c in table.columns if column.fullmatch(c.name)]
            if len(self._plans) > 4096:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def table(self, table: TableMap) -> tuple[Outcome, TableMap]:
        self._plan(table)  # fail early (MaskError) on a mask that cannot apply
        return KEPT, table

    def column_masks(self, table: TableMap) -> list[ColumnMask] | None:
        return self._plan(table)

    def masks_table(self, schema: str, table: str) -> bool:
        return any(pattern.matches(schema, table) for pattern, _c, _m in self.targets)

    def query(self, work: QueryWork) -> Outcome:
        if not work.data or _names_none_of(self._names, work.text):
            return KEPT
        if _executable_comment(work.text):
            return self._refuse(work, "whose tables cannot be read (an executable comment "
                                      "/*! */ may name them)")
        tables = statement_tables(work.text, work.schema)
        if any(t is WHOLE_SCHEMA for _, t in tables):
            return self._refuse(work, "whose tables cannot be read")
        names = statement_names(work.text, work.schema)
        if any(self.masks_table(s, t) for s, t in (*tables, *names) if t is not None):
            return self._refuse(work, "touches a table this rule masks")
        return KEPT

    def rows(self, work: RowsWork) -> Outcome:
        plan = self._plan(work.table_for(self))
        if not plan:
            return KEPT
        rows = work.rows if work.rows is not None else [
            (b, a) for b, a in work.load_rows()]
        changed = False
        out = []
        for before, after in rows:
            nb, cb = _mask_image(before, plan)
            na, ca = _mask_image(after, plan)
            changed = changed or cb or ca
            out.append((nb, na))
        work.rows = out
        if changed:
            work.rows_changed = True
        return CHANGED if changed else KEPT

    @property
    def reads_rows(self) -> bool:
        return True

    @property
    def per_event(self) -> bool:
        return True

    def per_event_for(self, table: TableMap) -> bool:
        return bool(self._plan(table))  # (rows() keeps the rows of other tables as they are)

    @property
    def can_grow_events(self) -> bool:
        return any(m.kind is not MaskKind.NULL for m in self.spec.masks)


def _mask_image(image: Any, plan: list[ColumnMask]) -> tuple[Any, bool]:
    if image is None:
        return None, False
    from relay.binlog.rowcodec import RowImage

    names = image.columns if isinstance(image, RowImage) else None
    values = list(image)
    changed = False
    for cm in plan:
        if names is None or cm.col.name not in names:
            continue
        k = names.index(cm.col.name)
        new = cm.apply(values[k])
        if new != values[k] or type(new) is not type(values[k]):
            values[k] = new
            changed = True
    if not changed:
        return image, False
    return type(image)(values), True


class HookRule(Rule):
    def __init__(self, spec: RuleSpec, metrics: H.HookMetrics) -> None:
        super().__init__(spec)
        self.metrics = metrics
        try:
            self.module = H.load_hook_module(spec.hook)
        except Exception as exc:  # the module's own errors too: all say "cannot load"
            raise ValueError(f"rule {spec.name!r}: hook module {spec.hook} cannot be loaded: "
                             f"{type(exc).__name__}: {exc}") from exc
        self.functions = {point: getattr(self.module, point.value) for point in POINTS
                          if callable(getattr(self.module, point.value, None))}
        if spec.at not in self.functions:
            raise ValueError(f"hook module {spec.hook} has no function {spec.at.value}(event, "
                             f"ctx) for rule {spec.name!r} at {spec.at.value}")
        self.fn = self.functions[spec.at]
        self.context: H.HookContext | None = None

    def bind(self, client: str) -> HookRule:
        clone = copy.copy(self)
        clone.context = H.HookContext(self.spec.at.value, client, self.name, self.metrics)
        return clone

    def call(self, view: H.EventView) -> Any:
        """The hook's answer for `view`, under the watchdog. Whatever the hook raises, and
        a HookTimeout wherever it arrives (in the hook, or in `leave` before the watchdog
        takes it back), comes out as a HookError."""
        ctx = self.context or H.HookContext(self.spec.at.value, "", self.name, self.metrics)
        ctx.position = view.position
        try:
            try:
                H.WATCHDOG.enter(self.spec.hook_timeout)
                result = self.fn(view, ctx)
            finally:
                H.WATCHDOG.leave()
        except H.HookTimeout:
            H.WATCHDOG.leave()  # when it arrived inside the first leave
            raise HookError(self.name, str(view.position),
                            f"hook ran past its time budget of {self.spec.hook_timeout:g}s"
                            ) from None
        except Exception as exc:
            raise HookError(self.name, str(view.position),
                            f"hook raised {type(exc).__name__}: {exc}") from exc
        if result is None or result is view or isinstance(result, H.Replacement):
            return result
        raise HookError(self.name, str(view.position),
                        f"hook returned {type(result).__name__}; return the event, "
                        "event.replace(...) or None")

    def query(self, work: QueryWork) -> Outcome:
        view = H.EventView(H.ViewKind.QUERY, gtid=work.gtid, server_id=work.server_id,
                           timestamp=_when(work.timestamp), schema=work.schema, table=None,
                           statement=work.text, position=work.position)
        result = self.call(view)
        if result is None:
            return DROPPED
        if result is view:
            return KEPT
        if result.rows is not None or result.table is not None:
            raise HookError(self.name, str(work.position),
                            "a statement's replacement takes text and schema only")
        changed = False
        if result.text is not None and result.text != work.text:
            work.text = result.text
            changed = True
        if result.schema is not None and result.schema != work.schema:
            work.schema = result.schema
            changed = True
        return CHANGED if changed else KEPT

    def annotation(self) -> Outcome:
        # A hook may change or drop rows the annotation would still show (it sees the
        # annotation's text itself, as its event's statement).
        return DROPPED

    def rows(self, work: RowsWork) -> Outcome:
        def load() -> list[tuple[RowImage | None, RowImage | None]]:
            if work.rows is None:
                work.rows = [(b, a) for b, a in work.load_rows()]
            return work.rows
        view = H.EventView(H.ViewKind.of(work.kind), gtid=work.gtid,
                           server_id=work.server_id, timestamp=_when(work.timestamp),
                           schema=work.table.schema, table=work.table.table,
                           statement=work.annotation, position=work.position,
                           rows_loader=load)
        result = self.call(view)
        if result is None:
            return DROPPED
        if result is view:
            return KEPT
        if result.text is not None:
            raise HookError(self.name, str(work.position),
                            "a rows event's replacement takes schema, table and rows")
        changed = False
        if (result.schema is not None and result.schema != work.table.schema) or (
                result.table is not None and result.table != work.table.table):
            work.table = work.table.renamed(schema=result.schema, table=result.table)
            changed = True
        if result.rows is not None:
            work.rows = _replacement_rows(work, result.rows, self.name)
            work.rows_changed = True
            changed = True
        return CHANGED if changed else KEPT

    @property
    def reads_rows(self) -> bool:
        return True

    @property
    def per_event(self) -> bool:
        return True

    @property
    def can_grow_events(self) -> bool:
        return True

    @property
    def holds_load_files(self) -> bool:
        return True


def _when(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


_ROW_SHAPE = {RowKind.INSERT: "(None, after)", RowKind.UPDATE: "(before, after)",
              RowKind.DELETE: "(before, None)"}


def _replacement_rows(work: RowsWork, rows: Sequence[tuple[Any, Any]],
                      rule: str) -> list[tuple[Any, Any]]:
    out = []
    for pair in rows:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise HookError(rule, str(work.position),
                            "rows must be (before, after) pairs")
        before = _image(pair[0], work.columns, work, rule)
        after = _image(pair[1], work.after_columns, work, rule)
        if (before is None) != (work.kind is RowKind.INSERT) or (after is None) != (
                work.kind is RowKind.DELETE):
            raise HookError(rule, str(work.position),
                            f"a {work.kind.value} row is {_ROW_SHAPE[work.kind]}")
        out.append((before, after))
    return out


def _image(value: Any, columns: tuple[str, ...], work: RowsWork, rule: str) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        missing = [c for c in columns if c not in value]
        extra = [k for k in value if k not in columns]
        if missing or extra:
            raise HookError(rule, str(work.position),
                            f"row image names {sorted(extra)} not in the event, misses "
                            f"{missing}")
        return tuple(value[c] for c in columns)
    values = tuple(value)
    if len(values) != len(columns):
        raise HookError(rule, str(work.position),
                        f"row image of {len(values)} values for {len(columns)} columns")
    return values


def _compile_mask(spec: RuleSpec, metrics: H.HookMetrics) -> Rule:
    try:
        return MaskRule(spec)
    except MaskError as exc:  # a compile error, as every other rule's: ValueError
        raise ValueError(str(exc)) from exc


_COMPILE: dict[RuleKind, Callable[[RuleSpec, H.HookMetrics], Rule]] = {
    RuleKind.FILTER: lambda spec, _metrics: (RoutingFilter(spec) if spec.at is RulePoint.RECEIVE
                                              else FilterRule(spec)),
    RuleKind.RENAME: lambda spec, _metrics: RenameRule(spec),
    RuleKind.DROP: lambda spec, _metrics: DropRule(spec),
    RuleKind.MASK: _compile_mask,
    RuleKind.HOOK: HookRule,
}


def compile_rule(spec: RuleSpec, metrics: H.HookMetrics) -> Rule:
    """The rule `spec` declares; ValueError when it cannot run (a bad pattern or mask
    column, a hash key not set, a hook module that does not load)."""
    return _COMPILE[spec.kind](spec, metrics)
