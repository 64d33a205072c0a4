"""The chain of rules a hook point and a client get (`Chain`), with its counters, and every
compiled rule of a configuration (`RuleSet`).

The rules themselves are declared in `model` (RuleSpec, spec_of) and compiled in
`compile` (Rule, compile_rule); their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.config import RulePoint
from relay.errors import StatementRefused
from relay.rules import hooks as H
from relay.rules.compile import (
    DropRule,
    FilterRule,
    HookRule,
    MaskRule,
    RenameRule,
    RoutingFilter,
    Rule,
    TableSelection,
    compile_rule,
)
from relay.rules.model import (
    EVENT_KINDS,
    POINTS,
    Outcome,
    QueryWork,
    RowsWork,
    RuleKind,
    RuleSpec,
    spec_of,
)

__all__ = [
    "EVENT_KINDS", "POINTS", "Chain", "DropRule", "FilterRule", "HookRule", "MaskRule",
    "Outcome", "QueryWork", "RenameRule", "RoutingFilter", "RowsWork", "Rule", "RuleKind",
    "RuleSet", "RuleSpec", "RuleStats", "StatementRefused", "TableSelection", "compile_rule",
    "spec_of",
]


@dataclass
class RuleStats:
    """A rule's counts: events it kept, changed and dropped, and its failures."""

    kept: int = 0
    changed: int = 0
    dropped: int = 0
    errors: int = 0

    def add(self, other: RuleStats) -> None:
        self.kept += other.kept
        self.changed += other.changed
        self.dropped += other.dropped
        self.errors += other.errors


class Chain:
    """The rules one stream runs, in order, with their counters.

    Counting is O(1) per event whatever the chain's length: the chain counts the events
    that enter it and, per rule, those it changed, dropped or failed on; a rule kept
    every event that reached it and that it did not change or drop."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules: list[Rule] = list(rules)
        n = len(self.rules)
        self.entered = 0
        self.changed = [0] * n
        self.dropped = [0] * n
        self.errors = [0] * n
        # The rule that drops annotations (counted as its drops), if any: an explicit
        # drop_events = ["annotate"], or the first mask, filter or hook (compile.py says
        # why those drop them).
        self.annotation_drop = next((i for i, r in enumerate(self.rules)
                                     if r.annotation() is Outcome.DROPPED), None)
        # Whether a rule refuses data statements on its tables.
        self.judges_statements = any(r.judges_statements for r in self.rules)
        # Whether LOAD DATA's file is held until its statement (Rule.holds_load_files).
        self.holds_load_files = any(r.holds_load_files for r in self.rules)
        self.has_hooks = any(isinstance(r, HookRule) for r in self.rules)

    def rule_stats(self) -> list[tuple[str, RuleStats]]:
        """Each rule's name and counts, in chain order."""
        out = []
        reached = self.entered
        for i, r in enumerate(self.rules):
            out.append((r.name, RuleStats(reached - self.changed[i] - self.dropped[i],
                                          self.changed[i], self.dropped[i], self.errors[i])))
            reached -= self.dropped[i]
        return out

    @property
    def stats(self) -> dict[str, RuleStats]:
        return dict(self.rule_stats())

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def reads_rows(self) -> bool:
        return any(r.reads_rows for r in self.rules)

    def can_grow_events(self) -> bool:
        """Whether events may come out larger than they went in (so file/position
        coordinates of a replica would drift): renames to longer names, constant or hash
        masks, hooks."""
        return any(r.can_grow_events for r in self.rules)


class RuleSet:
    """Every compiled rule, and the chain for a hook point and client."""

    def __init__(self, specs: Sequence[RuleSpec], metrics: H.HookMetrics | None = None) -> None:
        """Raises ValueError for a rule that does not compile."""
        self.metrics = metrics or H.HookMetrics()
        self.specs = list(specs)
        self.rules = [compile_rule(s, self.metrics) for s in self.specs]

    def chain(self, point: RulePoint, client: str = "", server_id: int = 0,
              extra: Sequence[Rule] = ()) -> Chain:
        """The rules at `point` that apply to the client, then `extra`."""
        rules = [r.bind(client) for r in self.rules
                 if r.spec.at is point and r.applies_to(client, server_id)]
        return Chain([*rules, *extra])

    def describe(self) -> dict[RulePoint, list[str]]:
        return {p: [s.describe() for s in self.specs if s.at is p] for p in POINTS}
