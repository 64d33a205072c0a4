"""The rules of one tap user, for everything the tap answers it.

`ReaderRules`: the rules one tap reader's events go through (fetch, subscribe): the
configured tap rules for its user, then the reader's own choice of tables. The chain is
taken from the relay's rule set for as long as the reader reads (so the configured rules'
counts reach the rule metrics) and given back when it is done.

`UserRules`: the same configured rules for the commands that send no events: which tables
the user may know of (schema, snapshot_save, snapshot_load), which tables' values the
rules change (a snapshot, read from the primary, would bypass them), and streams that
count (plan) and hash (checksum) a range as a fetch would send it to that user. Their
chains are the rule set's, not the live ones: what they see is not counted in the rule
metrics (no event is served), though a hook in them runs as it would for a fetch.
"""

from __future__ import annotations

from types import TracebackType

from relay.binlog.tablemap import TableMap
from relay.config import RulePoint
from relay.rules.chain import Chain, MaskRule, Outcome, Rule, RuleKind
from relay.rules.engine import RuleStream
from relay.rules.mask import MaskError
from relay.rules.runtime import ChainHandle, Rules


class ReaderRules:
    def __init__(self, rules: Rules, user: str, tables: list[str] | None) -> None:
        """Raises ValueError for a table pattern that does not parse."""
        self._rules = rules
        extra = rules.table_selection(tables) if tables else []
        self._handle: ChainHandle | None = None
        if extra or rules.has(RulePoint.TAP):
            self._handle = rules.chain(RulePoint.TAP, user, extra=extra)

    def stream(self) -> RuleStream | None:
        """A stream through the chain (None: the reader takes every event as stored)."""
        if self._handle is None or not self._handle.chain:
            return None
        return RuleStream(self._handle.chain)

    def __enter__(self) -> ReaderRules:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._rules.release(self._handle.chain)
            self._handle = None


def _changes_counts(rule: Rule) -> bool:
    """Whether a rule can change how many rows get through: filters and hooks, and drops
    of row events (masks and renames never do)."""
    kind = rule.spec.kind
    return kind in (RuleKind.FILTER, RuleKind.HOOK) or (kind is RuleKind.DROP
                                                         and rule.per_event)


class UserRules:
    def __init__(self, rules: Rules, user: str) -> None:
        self.user = user
        self._rules: list[Rule] = (rules.ruleset.chain(RulePoint.TAP, user).rules
                                   if rules.has(RulePoint.TAP) else [])
        # For counting: the rules up to the last that can change the count (a rename
        # before a filter decides what that filter sees), without masks.
        last = max((i for i, r in enumerate(self._rules) if _changes_counts(r)), default=-1)
        self._counting = [r for r in self._rules[: last + 1]
                          if r.spec.kind is not RuleKind.MASK]

    def keeps(self, schema: str, table: str) -> bool:
        """Whether rows of `schema`.`table` get through to this user, decided by name as the
        chain's table stage decides (renames first, filters on the name they leave). A
        rule that fails on the table keeps it from the user."""
        out = TableMap(0, 0, schema, table, (), b"", b"", b"", b"")
        for rule in self._rules:
            try:
                outcome, out = rule.table(out)
            except (MaskError, ValueError):  # (e.g. a rename past 255 bytes: a stream
                return False                     # would stop with a rules error)
            if outcome is Outcome.DROPPED:
                return False
        return True

    def changes_values(self, schema: str, table: str) -> str | None:
        """The rule that may change the values of `schema`.`table`'s rows for this user
        (None: none does): a mask of one of its columns (the table named as the chain
        names it there, after the renames before it), or any hook (a hook may rewrite any
        row, whatever its table: fail closed). A table the rules hide is `keeps`'s to
        answer (None here once a rule drops it)."""
        out = TableMap(0, 0, schema, table, (), b"", b"", b"", b"")
        for rule in self._rules:
            if rule.spec.kind is RuleKind.HOOK or (
                    isinstance(rule, MaskRule) and rule.masks_table(out.schema, out.table)):
                return rule.name
            try:
                outcome, out = rule.table(out)
            except (MaskError, ValueError):
                return rule.name
            if outcome is Outcome.DROPPED:
                return None
        return None

    def counting(self) -> RuleStream | None:
        """A stream that lets through as many rows as this user's fetch gets (None: as
        many as the log holds)."""
        return RuleStream(Chain(self._counting)) if self._counting else None

    def hashing(self) -> RuleStream | None:
        """A stream through all of this user's rules (None: none apply)."""
        return RuleStream(Chain(self._rules)) if self._rules else None
