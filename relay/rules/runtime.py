"""The rule set in force: compiled from config, swapped on reload, asked for chains.

Streams hold a chain and the version it came from; at a transaction boundary they ask
whether the version moved and take the new chain then, so a reload never cuts a
transaction in two. Counters: each stream's chain counts its own events; the totals
per hook point and rule add the finished streams' counts to the live ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from relay.config import RuleEntry, RulePoint
from relay.rules.chain import (
    POINTS,
    Chain,
    FilterRule,
    Rule,
    RuleSet,
    RuleSpec,
    RuleStats,
    spec_of,
)
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


Totals = dict[tuple[RulePoint, str], RuleStats]


def _check(point: RulePoint) -> RulePoint:
    if not isinstance(point, RulePoint):  # a str would match no rule, silently
        raise TypeError(f"a hook point is a RulePoint, not {point!r}")
    return point


def _add(totals: Totals, live: _Live) -> None:
    """Add the counts of a chain's configured rules to `totals`."""
    for name, st in live.chain.rule_stats()[: live.counted]:
        totals.setdefault((live.point, name), RuleStats()).add(st)


class Rules:
    def __init__(self, specs: Sequence[RuleSpec] = (), metrics: HookMetrics | None = None) -> None:
        """Raises ValueError for a rule that does not compile."""
        self.metrics = metrics or HookMetrics()
        self.ruleset = RuleSet(specs, self.metrics)
        self.version = 1
        self._lock = threading.Lock()
        self._live: dict[int, _Live] = {}
        self._done: Totals = {}

    @classmethod
    def from_entries(cls, entries: Iterable[RuleEntry],
                     metrics: HookMetrics | None = None) -> Rules:
        """The rules of config `[[rules]]` entries (ValueError as `spec_of` and compiling
        raise it)."""
        return cls([spec_of(e) for e in entries], metrics)

    def replace(self, specs: Sequence[RuleSpec]) -> None:
        """Compile `specs` (raising on any error: the old set stays) and put them in force."""
        new = RuleSet(specs, self.metrics)
        with self._lock:
            self.ruleset = new
            self.version += 1

    def has(self, point: RulePoint) -> bool:
        _check(point)
        return any(s.at is point for s in self.ruleset.specs)

    def table_selection(self, patterns: Sequence[str]) -> list[Rule]:
        """A reader's own choice of tables (do_tables patterns, named "tables"), as rules
        for `chain(..., extra=...)`; ValueError for a pattern that does not parse."""
        return [FilterRule(RuleSpec("tables", RulePoint.TAP, do_tables=tuple(patterns)))]

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
            out: Totals = {}
            for key, st in self._done.items():
                out[key] = RuleStats()
                out[key].add(st)
            for live in self._live.values():
                _add(out, live)
            return out

    def describe(self) -> dict[RulePoint, list[str]]:
        return self.ruleset.describe()


__all__ = ["POINTS", "ChainHandle", "Rules", "Totals"]
