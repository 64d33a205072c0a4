"""What readers may see of the relay log: the visible end (the last committed transaction
end the sync policy made durable) and the GTID position there.

The writer notes each commit (`note_commit`); the worker publishes durable positions
(`publish`, on the event loop). Waiters (`wait_beyond`) wake when the end moves, and
listeners (semi-sync acknowledgements) hear of every move.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from relay.binlog.gtid import GtidSet, GtidState, TxnId

Position = tuple[int, int]  # (segment number, byte offset)


class Visibility:
    def __init__(self) -> None:
        self.visible: Position = (0, 0)
        self.state: GtidState | GtidSet = GtidState()  # at `visible`
        self._pending: collections.deque[tuple[Position, TxnId]] = collections.deque()
        self._listeners: list[Callable[[Position], None]] = []
        self._changed = asyncio.Event()

    def reset(self, visible: Position, state: GtidState | GtidSet) -> None:
        """At open: what recovery found is durable."""
        self.visible = visible
        self.state = state.copy()
        self._pending.clear()

    def note_commit(self, position: Position, txn: TxnId) -> None:
        """A transaction ending at `position` was written (not durable yet)."""
        self._pending.append((position, txn))

    def publish(self, position: Position) -> None:
        """`position` is durable: readers may see up to it."""
        if position <= self.visible:
            return
        self.visible = position
        pending = self._pending
        if pending and pending[-1][0] <= position:  # the usual case: all of them
            self.state.update_all(txn for _, txn in pending)
            pending.clear()
        else:
            done = []
            while pending and pending[0][0] <= position:
                done.append(pending.popleft()[1])
            self.state.update_all(done)
        for listener in list(self._listeners):
            listener(position)
        self._changed.set()
        self._changed = asyncio.Event()

    def add_listener(self, listener: Callable[[Position], None]) -> Callable[[], None]:
        """Call `listener` with each new visible end; returns what removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return remove

    async def wait_beyond(self, position: Position, timeout: float | None = None) -> bool:
        """Wait until the visible end moves past `position`; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while self.visible <= position:
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True
