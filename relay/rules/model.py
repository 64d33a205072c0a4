"""Rules as config declares them (`RuleSpec`, built from a config entry by `spec_of`), the
vocabulary they share (`RuleKind`, `Outcome`), and the events on their way through a
chain (`RowsWork`, `QueryWork`).

Each rule does one thing: keep/drop tables (filter), rename schemas, drop event kinds,
mask columns, or call a hook. A rule sees the event as the rules before it left it and
answers an `Outcome`: KEPT, CHANGED or DROPPED; the first DROPPED ends the event's way
through the chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from relay.binlog.constants import RowKind
from relay.config import OnError, OnStatement, RuleEntry, RulePoint
from relay.rules.mask import Mask
from relay.rules.tables import TablePattern

if TYPE_CHECKING:
    from relay.binlog.rowcodec import RowImage
    from relay.binlog.tablemap import TableMap

POINTS: tuple[RulePoint, ...] = tuple(RulePoint)
EVENT_KINDS = ("annotate", "ddl", "query", "insert", "update", "delete")  # drop_events


class RuleKind(Enum):
    """The one thing a rule does."""

    FILTER = "filter"      # do_tables / ignore_tables
    RENAME = "rename"      # rename_schema
    DROP = "drop"          # drop_events
    MASK = "mask"          # masks
    HOOK = "hook"          # hook


class Outcome(Enum):
    """What a rule did to an event (RuleStats counts them under the same names)."""

    KEPT = "kept"
    CHANGED = "changed"
    DROPPED = "dropped"


@dataclass(frozen=True)
class RuleSpec:
    """One `[[rules]]` entry of config.toml, validated (see `spec_of`)."""

    name: str
    at: RulePoint
    clients: tuple[str | int, ...] = ()              # send: users / server ids; tap: names
    on_error: OnError = OnError.STOP
    do_tables: tuple[str, ...] = ()
    ignore_tables: tuple[str, ...] = ()
    rename_schema: tuple[tuple[str, str], ...] = ()
    drop_events: tuple[str, ...] = ()                # of EVENT_KINDS
    masks: tuple[Mask, ...] = ()
    hook: str = ""
    hook_timeout: float = 1.0
    # A statement-format event on a table this rule masks or filters: stop or drop.
    on_statement: OnStatement = OnStatement.STOP

    def __post_init__(self) -> None:
        # A caller still passing "send" or "skip" would match no hook point: say so.
        if not isinstance(self.at, RulePoint) or not isinstance(self.on_error, OnError) \
                or not isinstance(self.on_statement, OnStatement):
            raise TypeError(f"rule {self.name!r}: at is a RulePoint, on_error an OnError and "
                            f"on_statement an OnStatement (got {self.at!r}, "
                            f"{self.on_error!r}, {self.on_statement!r})")

    @property
    def kind(self) -> RuleKind:
        if self.do_tables or self.ignore_tables:
            return RuleKind.FILTER
        if self.rename_schema:
            return RuleKind.RENAME
        if self.drop_events:
            return RuleKind.DROP
        if self.masks:
            return RuleKind.MASK
        return RuleKind.HOOK

    def describe(self) -> str:
        who = f" for {', '.join(map(str, self.clients))}" if self.clients else ""
        what = _DESCRIBE[self.kind](self)
        stmt = (f", on_statement={self.on_statement.value}"
                if self.on_statement is not OnStatement.STOP else "")
        return (f"{self.name} [{self.kind.value}{who}, on_error={self.on_error.value}{stmt}]: "
                f"{what}")


def _describe_filter(spec: RuleSpec) -> str:
    return " ".join([*(f"do {p}" for p in spec.do_tables),
                     *(f"ignore {p}" for p in spec.ignore_tables)])


def _describe_rename(spec: RuleSpec) -> str:
    return ", ".join(f"{a} -> {b}" for a, b in spec.rename_schema)


def _describe_drop(spec: RuleSpec) -> str:
    return "drop " + ", ".join(spec.drop_events)


def _describe_mask(spec: RuleSpec) -> str:
    return ", ".join(f"{m.column}={m.kind.value}" for m in spec.masks)


def _describe_hook(spec: RuleSpec) -> str:
    return f"hook {spec.hook} (budget {spec.hook_timeout:g}s)"


_DESCRIBE: dict[RuleKind, Callable[[RuleSpec], str]] = {
    RuleKind.FILTER: _describe_filter,
    RuleKind.RENAME: _describe_rename,
    RuleKind.DROP: _describe_drop,
    RuleKind.MASK: _describe_mask,
    RuleKind.HOOK: _describe_hook,
}


def spec_of(entry: RuleEntry) -> RuleSpec:
    """The rule a `[[rules]]` entry declares. Its table patterns are checked here (config
    cannot parse them): a bad one raises ValueError naming the rule, the key and the
    pattern's problem."""
    for key, patterns in (("do_tables", entry.do_tables),
                          ("ignore_tables", entry.ignore_tables)):
        for p in patterns:
            try:
                TablePattern.parse(p)
            except ValueError as exc:
                raise ValueError(f"rule {entry.name!r}: {key}: {exc}") from None
    return RuleSpec(
        name=entry.name, at=entry.at, clients=tuple(entry.clients), on_error=entry.on_error,
        do_tables=tuple(entry.do_tables), ignore_tables=tuple(entry.ignore_tables),
        rename_schema=tuple(entry.rename_schema.items()),
        drop_events=tuple(entry.drop_events),
        masks=tuple(Mask(m.column, m.with_, m.value, m.key_env or "") for m in entry.mask),
        hook=entry.hook or "", hook_timeout=entry.hook_timeout,
        on_statement=entry.on_statement)


@dataclass
class RowsWork:
    """A rows event on its way through a chain."""

    kind: RowKind
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
    # The table as each rule (by id) saw it at the table stage: a rule before a rename
    # judges the rows under the names it matched the table by.
    seen: dict[int, TableMap] = field(default_factory=dict)

    def table_for(self, rule: object) -> TableMap:
        """The table as `rule` saw it at the table stage (else as the rules name it now)."""
        return self.seen.get(id(rule), self.table)


@dataclass
class QueryWork:
    """A statement (QUERY, QUERY_COMPRESSED or LOAD DATA's EXECUTE_LOAD_QUERY event) on
    its way through a chain. `data`: it may change rows of tables (DML in a MIXED or
    STATEMENT binlog, LOAD DATA), so its text may carry row values no mask reaches;
    framing, DDL and account statements are not data."""

    schema: str
    text: str
    position: Any
    ddl: bool
    gtid: str | None = None
    server_id: int = 0
    timestamp: int = 0
    data: bool = True
    verb: str = ""               # its first word (INSERT, LOAD ...): errors name it

