"""What readers may see of the relay log: the visible end (the last committed transaction
end the sync policy made durable) and the GTID position there.

The writer notes the commits of each batch (`note_commits`); the worker publishes durable positions
(`publish`, on the event loop). Waiters (`wait_beyond`) wake when the end moves, and
listeners (semi-sync acknowledgements) hear of every move.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from relay.binlog.gtid import GtidPosition, GtidState, TxnId
from relay.binlog.position import LogPosition


class Visibility:
    def __init__(self) -> None:
        self.visible: LogPosition = (0, 0)
        self.state: GtidPosition = GtidState()  # at `visible`
        # (where a batch's last commit ends, the batch's transactions), oldest first
        self._pending: collections.deque[tuple[LogPosition, list[TxnId]]] = collections.deque()
        self._listeners: list[Callable[[LogPosition], None]] = []
        # One future per waiting reader, resolved (True) when the end moves: what
        # asyncio.Event plus asyncio.timeout do, at a third of their cost (every follower
        # waits once a transaction)
        self._waiters: set[asyncio.Future[bool]] = set()

    def reset(self, visible: LogPosition, state: GtidPosition) -> None:
        """At open: what recovery found is durable."""
        self.visible = visible
        self.state = state.copy()
        self._pending.clear()

    def note_commits(self, last: LogPosition, txns: list[TxnId]) -> None:
        """Transactions were written (not durable yet), the last of them ending at `last`;
        a batch becomes visible whole, as the sync policy publishes batch ends."""
        self._pending.append((last, txns))

    def publish(self, position: LogPosition) -> None:
        """`position` is durable: readers may see up to it."""
        if position <= self.visible:
            return
        self.visible = position
        pending = self._pending
        while pending and pending[0][0] <= position:
            self.state.update_all(pending.popleft()[1])
        self._moved(position)

    def _moved(self, position: LogPosition) -> None:
        """Tell the listeners and wake the waiters: the visible end moved to `position`."""
        for listener in list(self._listeners):
            listener(position)
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    def resume_at(self, position: LogPosition, state: GtidPosition) -> None:
        """The writer was re-opened after a failure (a full disk) and found `position`
        durable, never behind `visible`: pending batches are gone (they were discarded)."""
        self._pending.clear()
        if position > self.visible:
            self.visible = position
            self.state = state.copy()
            self._moved(position)

    @property
    def waiting(self) -> int:
        """Readers waiting for the end to move."""
        return len(self._waiters)

    def add_listener(self, listener: Callable[[LogPosition], None]) -> Callable[[], None]:
        """Call `listener` with each new visible end; returns what removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return remove

    async def wait_beyond(self, position: LogPosition, timeout: float | None = None) -> bool:
        """Wait until the visible end moves past `position`; False on timeout."""
        if self.visible > position:
            return True
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.visible <= position:
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiters.add(waiter)
            timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
            try:
                if not await waiter:
                    return False
            finally:
                self._waiters.discard(waiter)  # (timed out or cancelled: no longer waiting)
                if timer is not None:
                    timer.cancel()
        return True


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
