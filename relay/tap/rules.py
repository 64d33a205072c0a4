"""The rules one tap reader's events go through: the configured tap rules for its user,
then the reader's own choice of tables. The chain is taken from the relay's rule set for
as long as the reader reads (so the configured rules' counts reach the rule metrics) and
given back when it is done."""

from __future__ import annotations

from types import TracebackType

from relay.config import RulePoint
from relay.rules.engine import RuleStream
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
