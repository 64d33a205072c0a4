"""The log's worker: one thread that runs its blocking file work in order (fsync under the
sync policy, the syncs and index write of a new segment, truncation, closing files), and
reports back on the event loop.

The policy (per transaction with group commit, on an interval, or off) decides when an
fsync runs; `on_durable(position)` is called on the loop once a position is durable, and
only what it reported is shown to readers or acknowledged (design invariant 4). A failed
fsync is not retried and never reported durable: the page cache may have dropped the
pages it could not write (after EIO, Linux marks them clean), so the log's bytes past the
last durable position cannot be trusted. `on_failure` gets a LogWriteError naming the file
and errno, and the worker publishes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from relay.binlog.position import LogPosition
from relay.config import SyncMode, SyncPolicy
from relay.errors import LogWriteError
from relay.relaylog import fileio

log = logging.getLogger("relay.relaylog")

T = TypeVar("T")


@dataclass(frozen=True)
class SyncTarget:
    """A committed end to make durable: the file it is in and its position."""

    fd: int
    path: str
    position: LogPosition


class Syncer:
    """Runs fsync and other blocking file work on one worker thread, in submission order."""

    def __init__(self, policy: SyncPolicy, on_durable: Callable[[LogPosition], None],
                 on_failure: Callable[[LogWriteError], None],
                 observe: Callable[[float], None] | None = None) -> None:
        self.policy = policy
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._observe = observe
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-fsync")
        self._inflight = False
        self._closed = False
        self._worker_failure: tuple[BaseException, str, str] | None = None
        self._wanted: SyncTarget | None = None
        self._last_sync = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.failed = False

    # --- the committed end, under the policy -------------------------------------------------

    def request(self, target: SyncTarget) -> None:
        """Ask that `target` become durable (group commit: one fsync covers every request
        made while another ran)."""
        if self.failed or self._closed:
            return
        if self.policy.mode is SyncMode.OFF:
            self._on_durable(target.position)
            return
        self._wanted = target
        if self._inflight:
            return
        if self.policy.mode is SyncMode.INTERVAL:
            due = self._last_sync + self.policy.interval - time.monotonic()
            if due > 0:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(due, self._kick)
                return
        self._kick()

    def _kick(self) -> None:
        self._timer = None
        if self._inflight or self._wanted is None or self.failed:
            return
        target, self._wanted = self._wanted, None
        self._inflight = True
        fut = asyncio.get_running_loop().run_in_executor(
            self._pool, self._on_worker, lambda: _timed_fsync(target), target.path, "fsync")
        fut.add_done_callback(lambda f: self._synced(f, target))

    def _on_worker(self, job: Callable[[], T], path: str, what: str,
                   fails_log: bool = True) -> T:
        """Run `job` on the worker; a failure is also noted there, so `close` knows of it
        before the loop has run the job's callback."""
        try:
            return job()
        except BaseException as exc:
            if fails_log and self._worker_failure is None:
                self._worker_failure = (exc, path, what)
            raise

    def _synced(self, fut: asyncio.Future[float], target: SyncTarget) -> None:
        self._inflight = False
        if self._closed or self.failed:
            # A job before this fsync failed (a rotation's syncs, a truncation): nothing
            # after it may become durable, whatever this fsync says.
            return
        self._last_sync = time.monotonic()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._fail(exc, target.path, "fsync")
            return
        if self._observe is not None:
            self._observe(fut.result())
        self._on_durable(target.position)
        if self._wanted is not None:
            self.request(self._wanted)

    # --- ordered jobs -------------------------------------------------------------------------

    def forget_pending(self) -> None:
        """A job submitted next makes every pending request durable itself (a rotation
        syncs the sealed segment): drop them, so no fsync runs on a file it closes."""
        self._wanted = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def submit(self, job: Callable[[], T], *, what: str, path: str,
               then: Callable[[T], None] | None = None,
               fails_log: bool = True) -> asyncio.Future[T]:
        """Run `job` on the worker after everything submitted before it; `then` runs on the
        loop with its result. A failure is the log's failure (reported, never raised into
        the loop's exception handler) unless `fails_log` is off (a purge's index write:
        its caller undoes it); the returned future also carries it."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._on_worker, job, path,
                                                         what, fails_log)

        def done(f: asyncio.Future[T]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                if fails_log:
                    self._fail(exc, path, what)
            elif then is not None and not self.failed:
                then(f.result())
        fut.add_done_callback(done)
        return fut

    def _fail(self, exc: BaseException, path: str, what: str) -> None:
        if self.failed:
            return
        self.failed = True
        errno = exc.errno if isinstance(exc, OSError) else None
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        error = LogWriteError(path, errno, f"{what} failed: {reason}"
                              + (f" (errno {errno})" if errno is not None else ""))
        log.error("%s; the relay log stops taking events (readers keep what was durable)",
                  error)
        self._on_failure(error)

    def close(self) -> None:
        """Wait for the work in flight. A success it reports after this is dropped (the
        appender's close syncs the rest); a failure is the log's failure now."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._pool.shutdown(wait=True)
        if self._worker_failure is not None:  # its callback will not run before the close
            self._fail(*self._worker_failure)


def _timed_fsync(target: SyncTarget) -> float:
    t0 = time.perf_counter()
    fileio.fsync(target.fd)
    return time.perf_counter() - t0
