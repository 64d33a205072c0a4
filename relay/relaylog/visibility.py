"""What readers may see of the relay log: the visible end (the last committed transaction
end the sync policy made durable) and the GTID position there.

The writer notes the commits of each batch (`note_commits`); the worker publishes durable positions
(`publish`, on the event loop). Waiters (`wait_beyond`) wake when the end moves, or have
their pusher send what came without waking (a dump at the log's end), and listeners
(semi-sync acknowledgements) hear of every move.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Callable

from relay.binlog.gtid import GtidPosition, GtidState, TxnId
from relay.binlog.position import LogPosition

log = logging.getLogger("relay.relaylog")


class Visibility:
    def __init__(self) -> None:
        self.visible: LogPosition = (0, 0)
        self.state: GtidPosition = GtidState()  # at `visible`
        # (where a batch's last commit ends, the batch's transactions), oldest first
        self._pending: collections.deque[tuple[LogPosition, list[TxnId]]] = collections.deque()
        self._listeners: list[Callable[[LogPosition], None]] = []
        # One future per waiting reader and its deadline, resolved (True) when the end
        # moves: what asyncio.Event plus asyncio.timeout do, at a third of their cost
        # (every follower waits once a transaction). One timer for all the deadlines, at
        # the earliest: a follower's deadline (its heartbeat period) is nearly always
        # later than one armed already, so a wait arms none.
        self._waiters: dict[asyncio.Future[bool], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        # Waiters that send what came themselves, at the move, instead of being woken:
        # the pusher, and the wait's period (each push starts it again, as a send does a
        # heartbeat's)
        self._pushers: dict[asyncio.Future[bool],
                            tuple[Callable[[], bool], float, asyncio.AbstractEventLoop]] = {}

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
        waiters, self._waiters = self._waiters, {}
        pushers = self._pushers
        for waiter in waiters:
            if waiter.done():
                continue
            pusher = pushers.get(waiter)
            if pusher is not None and _pushed(pusher[0]):
                # it sent what came: it waits on, for a whole period from now
                self._waiters[waiter] = pusher[2].time() + pusher[1]
            else:
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

    async def wait_beyond(self, position: LogPosition, timeout: float | None = None,
                          push: Callable[[], bool] | None = None) -> bool:
        """Wait until the visible end moves past `position`; False on timeout. `push`:
        called at each move, on the loop, instead of waking this wait: it sends what
        came and answers True (the wait goes on), or False to have the wait end (True).
        A follower at the log's end then costs no task switch a transaction."""
        if self.visible > position:
            return True
        loop = asyncio.get_running_loop()
        deadline = math.inf if timeout is None else loop.time() + timeout
        while self.visible <= position:
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiters[waiter] = deadline
            if push is not None:
                self._pushers[waiter] = (push, math.inf if timeout is None else timeout, loop)
            if deadline < math.inf and (deadline < self._timer_at
                                        or loop is not self._timer_loop):
                self._arm(loop, deadline)
            try:
                if not await waiter:
                    return False
            finally:
                self._waiters.pop(waiter, None)  # (timed out or cancelled: not waiting)
                if push is not None:
                    del self._pushers[waiter]
        return True

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._timer_loop = when, loop
        self._timer = loop.call_at(when, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer: the waiters whose deadline passed get False; it is armed again at
        the earliest deadline left."""
        self._timer, self._timer_at = None, math.inf
        now = loop.time() + 0.001  # (a timer may fire up to the clock's resolution early)
        earliest = math.inf
        for waiter, deadline in list(self._waiters.items()):
            if deadline <= now:
                if not waiter.done():
                    waiter.set_result(False)
            elif deadline < earliest:
                earliest = deadline
        if earliest < math.inf:
            self._arm(loop, earliest)


def _pushed(push: Callable[[], bool]) -> bool:
    """A pusher's answer; one that fails is woken instead, and its own loop meets the
    error (the move goes on to the other readers and to the writer that published it)."""
    try:
        return push()
    except Exception:
        log.exception("a reader failed to send what came at a move; it reads on its own")
        return False
