"""How far the relay's semi-sync replicas acknowledged the relay log: the one piece of
state the downstream (which reads their acknowledgements) and the upstream (which may
hold its own acknowledgement to the primary until N replicas have the transaction) share,
kept here because the relay log is all they share.

Positions are the relay log's own (segment number, end offset); each replica reports the
furthest position it acknowledged, and `watermark(n)` is the furthest position at least
`n` replicas acknowledged. The event loop's only (no locks).
"""

from __future__ import annotations

from collections.abc import Callable

from relay.binlog.position import LogPosition

_NOWHERE: LogPosition = (0, 0)


class ReplicaAckBoard:
    def __init__(self) -> None:
        self._acked: dict[int, LogPosition] = {}   # replica (dump connection id) -> furthest
        self._listeners: list[Callable[[], None]] = []

    def report(self, replica: int, position: LogPosition) -> None:
        """A replica acknowledged everything up to `position`."""
        if position > self._acked.get(replica, _NOWHERE):
            self._acked[replica] = position
            for listener in list(self._listeners):
                listener()

    def forget(self, replica: int) -> None:
        """The replica's dump ended: it acknowledges nothing any more."""
        self._acked.pop(replica, None)

    def watermark(self, n: int) -> LogPosition:
        """The furthest position at least `n` replicas acknowledged ((0, 0): fewer)."""
        if n <= 0:
            raise ValueError("a watermark of zero replicas means nothing")
        ranked = sorted(self._acked.values(), reverse=True)
        return ranked[n - 1] if len(ranked) >= n else _NOWHERE

    def replicas(self) -> int:
        return len(self._acked)

    def add_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` after each report that moves a replica; returns the remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)
