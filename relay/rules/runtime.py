"""The rule set in force: compiled from config, swapped on reload, asked for chains.

Streams hold a chain and the version it came from; at a transaction boundary they ask
whether the version moved and take the new chain then, so a reload never cuts a
transaction in two. Counters: each stream's chain counts its own events; the totals
per hook point and rule add the finished streams' counts to the live ones.

A relay without rules never compiles any: the rule machinery (and the hooks' imports)
loads at the first rule, chain or description asked for, not at start-up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config import RuleEntry, RulePoint

if TYPE_CHECKING:
    from relay.rules.chain import Chain, Rule, RuleSet, RuleSpec, RuleStats
    from relay.rules.hooks import HookMetrics


@dataclass(frozen=True)
class ChainHandle:
    version: int
    chain: Chain


@dataclass(frozen=True)
class _Live:
    point: RulePoint
    chain: Chain
    counted: int      # the chain's first rules, the configured ones (not a caller's extra)


Totals = dict[tuple[RulePoint, str], "RuleStats"]


def _check(point: RulePoint) -> RulePoint:
    if not isinstance(point, RulePoint):  # a str would match no rule, silently
        raise TypeError(f"a hook point is a RulePoint, not {point!r}")
    return point


def _add(totals: Totals, live: _Live) -> None:
    """Add the counts of a chain's configured rules to `totals`."""
    from relay.rules.chain import RuleStats

    for name, st in live.chain.rule_stats()[: live.counted]:
        totals.setdefault((live.point, name), RuleStats()).add(st)


class Rules:
    def __init__(self, specs: Sequence[RuleSpec] = (), metrics: HookMetrics | None = None) -> None:
        """Raises ValueError for a rule that does not compile."""
        self._metrics = metrics
        self._ruleset: RuleSet | None = self._compile(specs) if specs else None
        self.version = 1
        self._lock = threading.Lock()
        self._live: dict[int, _Live] = {}
        self._done: Totals = {}

    @property
    def metrics(self) -> HookMetrics:
        if self._metrics is None:
            from relay.rules.hooks import HookMetrics

            self._metrics = HookMetrics()
        return self._metrics

    @property
    def ruleset(self) -> RuleSet:
        if self._ruleset is None:  # none configured yet: an empty set, made when asked for
            self._ruleset = self._compile(())
        return self._ruleset

    def _compile(self, specs: Sequence[RuleSpec]) -> RuleSet:
        from relay.rules.chain import RuleSet

        return RuleSet(specs, self.metrics)

    @classmethod
    def from_entries(cls, entries: Iterable[RuleEntry],
                     metrics: HookMetrics | None = None) -> Rules:
        """The rules of config `[[rules]]` entries (ValueError as `spec_of` and compiling
        raise it)."""
        entries = list(entries)
        if not entries:
            return cls((), metrics)
        from relay.rules.chain import spec_of

        return cls([spec_of(e) for e in entries], metrics)

    def replace(self, specs: Sequence[RuleSpec]) -> None:
        """Compile `specs` (raising on any error: the old set stays) and put them in force."""
        new = self._compile(specs)
        with self._lock:
            self._ruleset = new
            self.version += 1

    def replace_entries(self, entries: Iterable[RuleEntry]) -> None:
        """`replace` with the rules of config `[[rules]]` entries."""
        from relay.rules.chain import spec_of

        self.replace([spec_of(e) for e in entries])

    def has(self, point: RulePoint) -> bool:
        _check(point)
        current = self._ruleset
        return current is not None and any(s.at is point for s in current.specs)

    def table_selection(self, patterns: Sequence[str]) -> list[Rule]:
        """A reader's own choice of tables (do_tables patterns, named "tables"), as rules
        for `chain(..., extra=...)`; ValueError for a pattern that does not parse."""
        from relay.rules.chain import RuleSpec, TableSelection

        return [TableSelection(RuleSpec("tables", RulePoint.TAP, do_tables=tuple(patterns)))]

    def chain(self, point: RulePoint, client: str = "", server_id: int = 0, *,
              extra: Sequence[Rule] = ()) -> ChainHandle:
        """The chain of the rules in force at `point` for a client (a user name, or a
        replica's server id), then `extra`; its counts reach `totals` (the configured
        rules' only) until `release`."""
        with self._lock:
            chain = self.ruleset.chain(_check(point), client, server_id, extra)
            self._live[id(chain)] = _Live(point, chain, len(chain.rules) - len(extra))
            return ChainHandle(self.version, chain)

    def release(self, chain: Chain) -> None:
        """A stream is done with `chain`: keep its counts in the totals."""
        with self._lock:
            live = self._live.pop(id(chain), None)
            if live is not None:
                _add(self._done, live)

    def totals(self) -> Totals:
        """Per hook point and rule name, the counts of finished and live streams."""
        with self._lock:
            from relay.rules.chain import RuleStats

            out: Totals = {}
            for key, st in self._done.items():
                out[key] = RuleStats()
                out[key].add(st)
            for live in self._live.values():
                _add(out, live)
            return out

    def describe(self) -> dict[RulePoint, list[str]]:
        return self.ruleset.describe()


__all__ = ["ChainHandle", "Rules", "Totals"]
