"""The rule set in force: compiled from config, swapped on reload, asked for chains.

Streams hold a chain and the version it came from; at a transaction boundary they ask
whether the version moved and take the new chain then, so a reload never cuts a
transaction in two. Counters: each stream's chain counts its own events; the totals
per hook point and rule add the finished streams' counts to the live ones.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from relay.rules.chain import POINTS, Chain, RuleSet, RuleSpec, RuleStats
from relay.rules.hooks import HookMetrics


@dataclass(frozen=True)
class ChainHandle:
    version: int
    chain: Chain


class Rules:
    def __init__(self, specs: Sequence[RuleSpec] = (), metrics: HookMetrics | None = None) -> None:
        self.metrics = metrics or HookMetrics()
        self.ruleset = RuleSet(specs, self.metrics)
        self.version = 1
        self._lock = threading.Lock()
        self._live: dict[int, tuple[str, Chain]] = {}
        self._done: dict[tuple[str, str], RuleStats] = {}

    def replace(self, specs: Sequence[RuleSpec]) -> None:
        """Compile `specs` (raising on any error: the old set stays) and put them in force."""
        new = RuleSet(specs, self.metrics)
        with self._lock:
            self.ruleset = new
            self.version += 1

    def has(self, point: str) -> bool:
        return any(s.at == point for s in self.ruleset.specs)

    def chain(self, point: str, client: str = "", server_id: int = 0) -> ChainHandle:
        with self._lock:
            chain = self.ruleset.chain(point, client, server_id)
            self._live[id(chain)] = (point, chain)
            return ChainHandle(self.version, chain)

    def release(self, chain: Chain) -> None:
        """A stream is done with `chain`: keep its counts in the totals."""
        with self._lock:
            entry = self._live.pop(id(chain), None)
            if entry is None:
                return
            point, _ = entry
            for name, st in chain.stats.items():
                total = self._done.setdefault((point, name), RuleStats())
                total.kept += st.kept
                total.changed += st.changed
                total.dropped += st.dropped
                total.errors += st.errors

    def totals(self) -> dict[tuple[str, str], RuleStats]:
        with self._lock:
            out = {k: RuleStats(v.kept, v.changed, v.dropped, v.errors)
                   for k, v in self._done.items()}
            for point, chain in self._live.values():
                for name, st in chain.stats.items():
                    t = out.setdefault((point, name), RuleStats())
                    t.kept += st.kept
                    t.changed += st.changed
                    t.dropped += st.dropped
                    t.errors += st.errors
            return out

    def describe(self) -> dict[str, list[str]]:
        return self.ruleset.describe()


NO_RULES = Rules()
__all__ = ["NO_RULES", "POINTS", "ChainHandle", "Rules"]
