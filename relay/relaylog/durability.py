"""The fsync policy: per transaction (group commit), on an interval, or off.

fsync runs on one worker thread, never on the event loop. The log asks `request(target)`
after each flush; `durable` is the last position the policy made durable, and only
that is shown to readers (invariant 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

Position = tuple[int, int]  # (segment number, byte offset)


@dataclass(frozen=True)
class SyncPolicy:
    mode: str  # "transaction" | "interval" | "off"
    interval: float = 0.0

    @classmethod
    def parse(cls, text: str) -> SyncPolicy:
        text = text.strip().lower()
        if text in ("transaction", "off"):
            return cls(text)
        m = re.fullmatch(r"interval:(\d+(?:\.\d+)?)(ms|s)", text)
        if m:
            value = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
            if value <= 0:
                raise ValueError("sync interval must be positive")
            return cls("interval", value)
        raise ValueError(f"unknown sync policy {text!r}: use \"transaction\", "
                         "\"interval:100ms\" (or any ms/s value) or \"off\"")


class Syncer:
    """Runs fsync on a worker thread and reports durability back on the loop."""

    def __init__(self, policy: SyncPolicy, on_durable: Callable[[Position], None],
                 observe: Callable[[float], None] | None = None) -> None:
        self.policy = policy
        self._on_durable = on_durable
        self._observe = observe
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-fsync")
        self._inflight = False
        self._wanted: tuple[int, Position] | None = None  # (fd, target)
        self._last_sync = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def request(self, fd: int, target: Position) -> None:
        """Ask that `target` (a committed end in the segment behind `fd`) become durable."""
        if self.policy.mode == "off":
            self._on_durable(target)
            return
        self._wanted = (fd, target)
        if self._inflight:
            return  # group commit: the next fsync covers everything written meanwhile
        if self.policy.mode == "interval":
            due = self._last_sync + self.policy.interval - time.monotonic()
            if due > 0:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(due, self._kick)
                return
        self._kick()

    def _kick(self) -> None:
        self._timer = None
        if self._inflight or self._wanted is None:
            return
        fd, target = self._wanted
        self._wanted = None
        self._inflight = True
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, self._fsync, fd)
        fut.add_done_callback(lambda f: self._done(f, target))

    def _fsync(self, fd: int) -> float:
        t0 = time.perf_counter()
        # OSError: the segment was sealed and closed meanwhile (and fsynced then).
        with contextlib.suppress(OSError):
            os.fsync(fd)
        return time.perf_counter() - t0

    def _done(self, fut: asyncio.Future[float], target: Position) -> None:
        self._inflight = False
        self._last_sync = time.monotonic()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            if self._observe is not None:
                self._observe(fut.result())
            self._on_durable(target)
        if self._wanted is not None:
            self.request(*self._wanted)

    def run_blocking(self, fn: Callable[[], None]) -> asyncio.Future[None]:
        """Run other blocking file work (close, fsync of a sealed segment) in order."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._pool.shutdown(wait=True)
