"""Python hooks: user modules the rule chain calls with a read-only view of each event.

A hook module has a function per hook point it serves (`receive`, `send`, `tap`):

    def send(event: EventView, ctx: HookContext) -> EventView | Replacement | None: ...

It returns the event to keep it as it is, `event.replace(...)` to change its statement
text, schema, table or row values, or None to drop it. `ctx` tells the hook point, the
client, the position, and gives counters and gauges that appear in /metrics as
`relay_hook_<name>` with a `hook` label.

`event.kind` is a `ViewKind`, a str: "insert", "update", "delete" (a rows event) or
"query" (a statement); `ctx.point` is the hook point's name, "receive", "send" or "tap".

A hook runs under a time budget. Past it, a watchdog raises HookTimeout inside the hook
(at its next Python instruction), and the rule's `on_error` applies, as for a hook that
raises or returns something else.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import ModuleType
from typing import TYPE_CHECKING, Any

from relay.binlog.constants import RowKind
from relay.binlog.position import Position

if TYPE_CHECKING:
    from relay.binlog.rowcodec import RowImage


class HookTimeout(BaseException):
    """Raised (by the watchdog, asynchronously) inside a hook that overran its budget.

    A BaseException, not an Exception, so that a hook's own `except Exception:` cannot
    swallow it and run on. It never leaves relay.rules: `HookRule.call` turns it into a
    HookError (the rule's on_error then applies), wherever in the call it arrives, even
    after the hook returned and before the watchdog let go of the call."""


class ViewKind(StrEnum):
    """What an `EventView` shows: a rows event (the values of `RowKind`) or a statement.
    A str (StrEnum), so hooks compare it with "insert", "query" ... as documented."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    QUERY = "query"

    @classmethod
    def of(cls, kind: RowKind) -> ViewKind:
        """The view kind of a rows event of this kind."""
        return cls(kind.value)


@dataclass(frozen=True)
class Replacement:
    """What a hook puts in place of the event: each field left as None stays as it was.
    `rows`: one (before, after) pair per row, each image a dict by column name or a
    sequence in the image's column order (None where the kind has no such image)."""

    text: str | None = None
    schema: str | None = None
    table: str | None = None
    rows: Sequence[tuple[Any, Any]] | None = None


class EventView:
    """A read-only view of one event for a hook.

    kind: a ViewKind (a str): "insert", "update", "delete" (a rows event) or "query"
          (a statement)
    gtid, server_id, timestamp: the transaction's
    schema, table: the table (rows) or the default schema (query; table None)
    statement: the query text, or the SQL the server annotated a rows event with
    position: where the event is
    rows: the rows as (before, after) RowImage pairs, decoded when first asked for
    """

    __slots__ = ("_rows", "_rows_loader", "gtid", "kind", "position", "schema",
                 "server_id", "statement", "table", "timestamp")

    def __init__(self, kind: ViewKind, *, gtid: str | None, server_id: int, timestamp: datetime,
                 schema: str, table: str | None, statement: str | None, position: Position,
                 rows_loader: Callable[[], list[tuple[RowImage | None, RowImage | None]]]
                 | None = None) -> None:
        self.kind = kind
        self.gtid = gtid
        self.server_id = server_id
        self.timestamp = timestamp
        self.schema = schema
        self.table = table
        self.statement = statement
        self.position = position
        self._rows_loader = rows_loader
        self._rows: list[tuple[RowImage | None, RowImage | None]] | None = None

    @property
    def rows(self) -> list[tuple[RowImage | None, RowImage | None]]:
        if self._rows is None:
            self._rows = self._rows_loader() if self._rows_loader is not None else []
        return self._rows

    @property
    def rows_loaded(self) -> bool:
        return self._rows is not None

    def replace(self, *, text: str | None = None, schema: str | None = None,
                table: str | None = None,
                rows: Sequence[tuple[Any, Any]] | None = None) -> Replacement:
        return Replacement(text, schema, table, rows)

    def __repr__(self) -> str:
        what = f"{self.schema}.{self.table}" if self.table else self.schema
        return f"<EventView {self.kind} {what} at {self.position}>"


# --- metrics for hooks ----------------------------------------------------------------------

_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,48}$")
MAX_SERIES = 1000  # per hook: label values must stay bounded (a table name, not a row id)


class HookMetrics:
    """Counters and gauges hooks create; the metrics layer reads `snapshot()`."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()

    def _key(self, hook: str, kind: str, name: str,
             labels: dict[str, Any]) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        if not _NAME.match(name) or any(not _NAME.match(k) for k in labels):
            raise ValueError(f"metric and label names are [a-zA-Z_][a-zA-Z0-9_]*: {name!r}, "
                             f"{sorted(labels)}")
        key = (hook, kind, name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        if key not in self._values and sum(
                1 for k in self._values if k[0] == hook) >= MAX_SERIES:
            raise ValueError(f"hook {hook!r} has {MAX_SERIES} metric series already; label "
                             "values must come from a small set")
        return key

    def add(self, hook: str, name: str, labels: dict[str, Any], amount: float) -> None:
        with self._lock:
            key = self._key(hook, "counter", name, labels)
            self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, hook: str, name: str, labels: dict[str, Any], value: float) -> None:
        with self._lock:
            self._values[self._key(hook, "gauge", name, labels)] = float(value)

    def snapshot(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        with self._lock:
            return [(hook, kind, name, dict(labels), v)
                    for (hook, kind, name, labels), v in self._values.items()]


class _Counter:
    def __init__(self, store: HookMetrics, hook: str, name: str, labels: dict[str, Any]):
        self._args = (store, hook, name, labels)

    def inc(self, amount: float = 1.0) -> None:
        store, hook, name, labels = self._args
        if amount < 0:
            raise ValueError("a counter only goes up")
        store.add(hook, name, labels, amount)


class _Gauge:
    def __init__(self, store: HookMetrics, hook: str, name: str, labels: dict[str, Any]):
        self._args = (store, hook, name, labels)

    def set(self, value: float) -> None:
        store, hook, name, labels = self._args
        store.set(hook, name, labels, value)


class HookContext:
    """What a hook knows besides the event: where it runs and a place for its metrics."""

    def __init__(self, point: str, client: str, hook: str, metrics: HookMetrics) -> None:
        self.point = point        # "receive", "send" or "tap"
        self.client = client      # the downstream client or tap subscription ("" at receive)
        self.hook = hook          # the rule's name
        self.position: Position | None = None
        self._metrics = metrics

    def counter(self, name: str, **labels: Any) -> _Counter:
        return _Counter(self._metrics, self.hook, name, labels)

    def gauge(self, name: str, **labels: Any) -> _Gauge:
        return _Gauge(self._metrics, self.hook, name, labels)


# --- loading ----------------------------------------------------------------------------------

def load_hook_module(spec: str) -> ModuleType:
    """A hook module by dotted name (on sys.path) or by file path; loaded afresh, so a
    reload picks up edits."""
    if spec.endswith(".py") or "/" in spec:
        name = f"relay_hook_{abs(hash(spec))}"
        module_spec = importlib.util.spec_from_file_location(name, spec)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load hook file {spec}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    if spec in sys.modules:
        return importlib.reload(sys.modules[spec])
    return importlib.import_module(spec)


# --- the watchdog -------------------------------------------------------------------------------

class Watchdog:
    """Raises HookTimeout in a thread whose hook call overran its deadline. One thread
    watches every call; entering and leaving a call is a dict update under a lock. A
    thread makes one call at a time: `enter` before it, `leave` after it."""

    def __init__(self, tick: float = 0.005) -> None:
        self._calls: dict[int, tuple[int, float]] = {}   # thread id -> (token, deadline)
        self._fired: dict[int, int] = {}                # thread id -> token it fired for
        self._lock = threading.Lock()
        self._busy = threading.Condition(self._lock)
        self._tick = tick
        self._token = 0
        self._thread: threading.Thread | None = None

    def _ensure_running(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="relay-hook-watchdog")
            self._thread.start()

    def enter(self, budget: float) -> None:
        """The calling thread starts a call that may run `budget` seconds."""
        with self._lock:
            self._token += 1
            self._calls[threading.get_ident()] = (self._token, time.monotonic() + budget)
            self._ensure_running()
            self._busy.notify()

    def leave(self) -> None:
        """The calling thread's call is over: stop watching it and take back a HookTimeout
        fired for it that has not arrived yet. Idempotent: call it again where a timeout
        that arrived inside the first call is caught."""
        tid = threading.get_ident()
        with self._lock:
            call = self._calls.pop(tid, None)
            fired = self._fired.pop(tid, None)
        if call is not None and fired == call[0]:
            # The exception may still be pending: take it back before it hits our code.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._calls:
                    self._busy.wait()  # idle: no call to watch
            time.sleep(self._tick)
            now = time.monotonic()
            with self._lock:
                for tid, (token, deadline) in list(self._calls.items()):
                    if now >= deadline and self._fired.get(tid) != token:
                        self._fired[tid] = token
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(tid), ctypes.py_object(HookTimeout))


WATCHDOG = Watchdog()
