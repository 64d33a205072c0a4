"""Rules as config declares them (`RuleSpec`), compiled (`Rule`), and the chain of rules
a hook point and a client get (`Chain`).

Each rule does one thing: keep/drop tables, rename schemas, drop event kinds, mask
columns, or call a hook. A rule sees the event as the rules before it left it (a rename
before a filter means the filter sees the new name) and answers KEEP, CHANGED or DROP;
the first DROP ends the event's way through the chain. Table decisions are made once per
table map and cached; only masks and hooks that read rows decode them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from relay.binlog.rowcodec import RowImage
from relay.binlog.tablemap import TableMap
from relay.errors import HookError
from relay.rules import hooks as H
from relay.rules.mask import ColumnMask, Mask, MaskError
from relay.rules.tables import TablePattern, TableRules, statement_tables

POINTS = ("receive", "send", "tap")
EVENT_KINDS = ("annotate", "ddl", "query", "insert", "update", "delete")
KEEP, CHANGED, DROP = "kept", "changed", "dropped"


@dataclass(frozen=True)
class RuleSpec:
    """One `[[rules]]` entry of config.toml, validated."""

    name: str
    at: str                                          # receive | send | tap
    clients: tuple[str | int, ...] = ()              # send: users / server ids; tap: names
    on_error: str = "stop"                           # stop | skip
    do_tables: tuple[str, ...] = ()
    ignore_tables: tuple[str, ...] = ()
    rename_schema: tuple[tuple[str, str], ...] = ()
    drop_events: tuple[str, ...] = ()
    masks: tuple[Mask, ...] = ()
    hook: str = ""
    hook_timeout: float = 1.0

    @property
    def kind(self) -> str:
        if self.do_tables or self.ignore_tables:
            return "filter"
        if self.rename_schema:
            return "rename"
        if self.drop_events:
            return "drop"
        if self.masks:
            return "mask"
        return "hook"

    def describe(self) -> str:
        who = f" for {', '.join(map(str, self.clients))}" if self.clients else ""
        if self.kind == "filter":
            what = " ".join([*(f"do {p}" for p in self.do_tables),
                             *(f"ignore {p}" for p in self.ignore_tables)])
        elif self.kind == "rename":
            what = ", ".join(f"{a} -> {b}" for a, b in self.rename_schema)
        elif self.kind == "drop":
            what = "drop " + ", ".join(self.drop_events)
        elif self.kind == "mask":
            what = ", ".join(f"{m.column}={m.kind}" for m in self.masks)
        else:
            what = f"hook {self.hook} (budget {self.hook_timeout:g}s)"
        return f"{self.name} [{self.kind}{who}, on_error={self.on_error}]: {what}"


@dataclass
class RowsWork:
    """A rows event on its way through a chain."""

    kind: str                     # insert / update / delete
    table: TableMap               # as the rules so far name it
    position: Any
    load_rows: Callable[[], list[tuple[RowImage | None, RowImage | None]]]
    columns: tuple[str, ...]      # names of the image columns (before; after for inserts)
    after_columns: tuple[str, ...]
    gtid: str | None = None
    server_id: int = 0
    timestamp: int = 0            # header seconds
    annotation: str | None = None
    rows: list[tuple[Any, Any]] | None = None    # set once decoded or replaced
    rows_changed: bool = False


@dataclass
class QueryWork:
    schema: str
    text: str
    position: Any
    ddl: bool
    gtid: str | None = None
    server_id: int = 0
    timestamp: int = 0


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

    def table(self, table: TableMap) -> tuple[str, TableMap]:
        """KEEP/CHANGED/DROP for rows of this table, and the table as it leaves."""
        return KEEP, table

    def query(self, work: QueryWork) -> str:
        return KEEP

    def rows(self, work: RowsWork) -> str:
        """Per rows event, for rules that look at more than the table."""
        return KEEP

    def annotation(self) -> str:
        return KEEP

    @property
    def reads_rows(self) -> bool:
        return False

    @property
    def per_event(self) -> bool:
        """Whether `rows` must run for every rows event (not only `table`)."""
        return False


class FilterRule(Rule):
    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.rules = TableRules.parse(spec.do_tables, spec.ignore_tables)

    def table(self, table: TableMap) -> tuple[str, TableMap]:
        return (KEEP if self.rules.keeps([(table.schema, table.table)]) else DROP), table

    def query(self, work: QueryWork) -> str:
        return KEEP if self.rules.keeps(list(statement_tables(work.text, work.schema))) else DROP


class RenameRule(Rule):
    """replicate_rewrite_db: the schema of table maps and the default schema of
    statements; names inside statement text are left as they are."""

    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.mapping = dict(spec.rename_schema)

    def table(self, table: TableMap) -> tuple[str, TableMap]:
        new = self.mapping.get(table.schema)
        if new is None:
            return KEEP, table
        return CHANGED, table.renamed(schema=new)

    def query(self, work: QueryWork) -> str:
        new = self.mapping.get(work.schema)
        if new is None:
            return KEEP
        work.schema = new
        return CHANGED


class DropRule(Rule):
    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.kinds = frozenset(spec.drop_events)

    def query(self, work: QueryWork) -> str:
        if "query" in self.kinds or (work.ddl and "ddl" in self.kinds):
            return DROP
        return KEEP

    def rows(self, work: RowsWork) -> str:
        return DROP if work.kind in self.kinds else KEEP

    def annotation(self) -> str:
        return DROP if "annotate" in self.kinds else KEEP

    @property
    def per_event(self) -> bool:
        return bool(self.kinds & {"insert", "update", "delete"})


class MaskRule(Rule):
    def __init__(self, spec: RuleSpec) -> None:
        super().__init__(spec)
        self.targets = []
        for m in spec.masks:
            schema, _, rest = m.column.partition(".")
            table, _, column = rest.rpartition(".")
            if not schema or not table or not column:
                raise ValueError(f"mask column {m.column!r} should be schema.table.column")
            self.targets.append((TablePattern.parse(f"{schema}.{table}"),
                                 re.compile(column.replace("%", ".*"), re.IGNORECASE), m))
        self.keys = {m.key_env: m.key() for m in spec.masks if m.kind == "hash"}
        self._plans: dict[tuple[Any, ...], list[ColumnMask]] = {}

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

    def table(self, table: TableMap) -> tuple[str, TableMap]:
        self._plan(table)  # fail early on a mask that cannot apply
        return KEEP, table

    def rows(self, work: RowsWork) -> str:
        plan = self._plan(work.table)
        if not plan:
            return KEEP
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
        return CHANGED if changed else KEEP

    @property
    def reads_rows(self) -> bool:
        return True

    @property
    def per_event(self) -> bool:
        return True


def _mask_image(image: Any, plan: list[ColumnMask]) -> tuple[Any, bool]:
    if image is None:
        return None, False
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
        self.functions = {point: getattr(self.module, point) for point in POINTS
                          if callable(getattr(self.module, point, None))}
        if spec.at not in self.functions:
            raise ValueError(f"hook module {spec.hook} has no function {spec.at}(event, ctx) "
                             f"for rule {spec.name!r} at {spec.at}")
        self.fn = self.functions[spec.at]
        self.context: H.HookContext | None = None

    def bind(self, client: str) -> HookRule:
        clone = HookRule.__new__(HookRule)
        clone.__dict__.update(self.__dict__)
        clone.context = H.HookContext(self.spec.at, client, self.name, self.metrics)
        return clone

    def call(self, view: H.EventView) -> Any:
        ctx = self.context or H.HookContext(self.spec.at, "", self.name, self.metrics)
        ctx.position = view.position
        token = H.WATCHDOG.enter(self.spec.hook_timeout)
        try:
            result = self.fn(view, ctx)
        except H.HookTimeout:
            raise HookError(self.name, str(view.position),
                            f"hook ran past its time budget of {self.spec.hook_timeout:g}s"
                            ) from None
        except Exception as exc:
            raise HookError(self.name, str(view.position),
                            f"hook raised {type(exc).__name__}: {exc}") from exc
        finally:
            H.WATCHDOG.leave(token)
        if result is None or result is view or isinstance(result, H.Replacement):
            return result
        raise HookError(self.name, str(view.position),
                        f"hook returned {type(result).__name__}; return the event, "
                        "event.replace(...) or None")

    def query(self, work: QueryWork) -> str:
        view = H.EventView("query", gtid=work.gtid, server_id=work.server_id,
                           timestamp=_when(work.timestamp), schema=work.schema, table=None,
                           statement=work.text, position=work.position)
        result = self.call(view)
        if result is None:
            return DROP
        if result is view:
            return KEEP
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
        return CHANGED if changed else KEEP

    def rows(self, work: RowsWork) -> str:
        def load() -> list[tuple[RowImage | None, RowImage | None]]:
            if work.rows is None:
                work.rows = [(b, a) for b, a in work.load_rows()]
            return work.rows
        view = H.EventView(work.kind, gtid=work.gtid, server_id=work.server_id,
                           timestamp=_when(work.timestamp), schema=work.table.schema,
                           table=work.table.table, statement=work.annotation,
                           position=work.position, rows_loader=load)
        result = self.call(view)
        if result is None:
            return DROP
        if result is view:
            return KEEP
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
        return CHANGED if changed else KEEP

    @property
    def reads_rows(self) -> bool:
        return True

    @property
    def per_event(self) -> bool:
        return True


def _when(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _replacement_rows(work: RowsWork, rows: Sequence[tuple[Any, Any]],
                      rule: str) -> list[tuple[Any, Any]]:
    out = []
    for pair in rows:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise HookError(rule, str(work.position),
                            "rows must be (before, after) pairs")
        before = _image(pair[0], work.columns, work, rule)
        after = _image(pair[1], work.after_columns, work, rule)
        if (before is None) != (work.kind == "insert") or (after is None) != (
                work.kind == "delete"):
            want = {"insert": "(None, after)", "update": "(before, after)",
                    "delete": "(before, None)"}[work.kind]
            raise HookError(rule, str(work.position), f"a {work.kind} row is {want}")
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


def compile_rule(spec: RuleSpec, metrics: H.HookMetrics) -> Rule:
    kind = spec.kind
    if kind == "filter":
        return FilterRule(spec)
    if kind == "rename":
        return RenameRule(spec)
    if kind == "drop":
        return DropRule(spec)
    if kind == "mask":
        try:
            return MaskRule(spec)
        except MaskError as exc:
            raise ValueError(str(exc)) from exc
    return HookRule(spec, metrics)


@dataclass
class RuleStats:
    kept: int = 0
    changed: int = 0
    dropped: int = 0
    errors: int = 0


class Chain:
    """The rules one stream runs, in order, with their counters.

    Counting is O(1) per event whatever the chain's length: the chain counts the events
    that enter it and, per rule, those it changed, dropped or failed on; a rule kept
    every event that reached it and that it did not change or drop."""

    def __init__(self, rules: list[Rule] | None = None) -> None:
        self.rules: list[Rule] = rules or []
        n = len(self.rules)
        self.entered = 0
        self.changed = [0] * n
        self.dropped = [0] * n
        self.errors = [0] * n
        self.annotation_drop = next((i for i, r in enumerate(self.rules)
                                     if r.annotation() == DROP), None)

    @property
    def stats(self) -> dict[str, RuleStats]:
        out = {}
        reached = self.entered
        for i, r in enumerate(self.rules):
            out[r.name] = RuleStats(reached - self.changed[i] - self.dropped[i],
                                    self.changed[i], self.dropped[i], self.errors[i])
            reached -= self.dropped[i]
        return out

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def reads_rows(self) -> bool:
        return any(r.reads_rows for r in self.rules)

    def can_grow_events(self) -> bool:
        """Whether events may come out larger than they went in (so file/position
        coordinates of a replica would drift): renames to longer names, constant or hash
        masks, hooks."""
        for r in self.rules:
            if isinstance(r, RenameRule) and any(len(b.encode()) > len(a.encode())
                                                 for a, b in r.mapping.items()):
                return True
            if isinstance(r, MaskRule) and any(m.kind != "null" for m in r.spec.masks):
                return True
            if isinstance(r, HookRule):
                return True
        return False


class RuleSet:
    """Every compiled rule, and the chain for a hook point and client."""

    def __init__(self, specs: Sequence[RuleSpec], metrics: H.HookMetrics | None = None) -> None:
        self.metrics = metrics or H.HookMetrics()
        self.specs = list(specs)
        self.rules = [compile_rule(s, self.metrics) for s in self.specs]

    def chain(self, point: str, client: str = "", server_id: int = 0) -> Chain:
        rules: list[Rule] = []
        for r in self.rules:
            if r.spec.at != point or not r.applies_to(client, server_id):
                continue
            rules.append(r.bind(client) if isinstance(r, HookRule) else r)
        return Chain(rules)

    def describe(self) -> dict[str, list[str]]:
        return {p: [s.describe() for s in self.specs if s.at == p] for p in POINTS}
