"""The reader registry: every reader of the relay log's segments and the oldest position it
still needs.

Two kinds of entries:
- live readers: a cursor of a downstream dump, a tap range being read, a segment walk;
  registered when they open a segment and moved as they read, gone when closed;
- holds: a named reader that comes back (a tap subscriber's acknowledged position), kept
  across restarts in `<basename>.holds` (replaced atomically, with fsync) and counted
  while it acknowledged within `hold_ttl`.

`floor()` is the oldest position anyone still needs: what retention may purge below.
`snapshot()` is what /status and /metrics show. Thread-safe: the tap reads from its
worker threads, dumps from the loop.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from enum import Enum

from relay.binlog.position import LogPosition
from relay.relaylog.atomic import write_atomically

log = logging.getLogger("relay.relaylog")



class ReaderKind(Enum):
    LIVE = "live"
    HOLD = "hold"


@dataclass(frozen=True)
class ReaderInfo:
    name: str
    kind: ReaderKind
    position: LogPosition
    since: float          # when it registered (live) or last acknowledged (hold)


class ReaderHandle:
    """A live reader's entry: `move` as it reads, `close` when done."""

    __slots__ = ("_registry", "ident", "lost", "name", "position", "since")

    def __init__(self, registry: ReaderRegistry, ident: int, name: str,
                 position: LogPosition) -> None:
        self._registry = registry
        self.ident = ident
        self.name = name
        self.position = position
        self.since = time.time()
        # Set when retention's hard cap removed a segment this reader still needed: what
        # it reads next is gone (the reader's next read raises, naming this).
        self.lost: str | None = None

    def move(self, position: LogPosition) -> None:
        self.position = position  # one reference write: readers of it see old or new

    def close(self) -> None:
        self._registry.unregister(self.ident)


class ReaderRegistry:
    def __init__(self, holds_path: str, epoch: str, *, hold_ttl: float = 7 * 86400.0,
                 sync: bool = True) -> None:
        self.holds_path = holds_path
        self.epoch = epoch
        self.hold_ttl = hold_ttl
        self._sync = sync
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._live: dict[int, ReaderHandle] = {}
        self._ids = itertools.count(1)
        self._holds: dict[str, tuple[LogPosition, float]] = self._load()

    # --- live readers -------------------------------------------------------------------------

    def register(self, name: str, position: LogPosition) -> ReaderHandle:
        handle = ReaderHandle(self, next(self._ids), name, position)
        with self._lock:
            self._live[handle.ident] = handle
        return handle

    def unregister(self, ident: int) -> None:
        with self._lock:
            self._live.pop(ident, None)

    # --- holds ----------------------------------------------------------------------------------

    def hold(self, name: str, position: LogPosition) -> LogPosition:
        """A named reader acknowledged `position` (never moved back): persisted before it
        returns. Blocking: callers on the event loop run it in a thread. Returns the hold."""
        with self._write_lock:
            with self._lock:
                prev = self._holds.get(name)
                kept = max(position, prev[0]) if prev is not None else position
                self._holds[name] = (kept, time.time())
                data = self._encode()
            write_atomically(self.holds_path, data, sync=self._sync)
        return kept

    def release(self, name: str) -> bool:
        """Drop the named hold (an abandoned subscriber): persisted before it returns;
        False when there is none. Blocking, like hold."""
        with self._write_lock:
            with self._lock:
                if self._holds.pop(name, None) is None:
                    return False
                data = self._encode()
            write_atomically(self.holds_path, data, sync=self._sync)
        return True

    def lose_below(self, segment: int, reason: str) -> list[ReaderInfo]:
        """Segments before `segment` are gone although these readers needed them: live ones
        are told (their next read fails), holds are dropped (the subscriber's next request
        there gets a not-in-log error). Returns who lost what. Blocking when a hold goes
        (the holds file is rewritten): callers on the loop run it in a thread."""
        lost: list[ReaderInfo] = []
        with self._write_lock:
            with self._lock:
                for h in self._live.values():
                    if h.position[0] < segment and h.lost is None:
                        h.lost = reason
                        lost.append(ReaderInfo(h.name, ReaderKind.LIVE, h.position, h.since))
                gone = [n for n, (p, _at) in self._holds.items() if p[0] < segment]
                for n in gone:
                    p, at = self._holds.pop(n)
                    lost.append(ReaderInfo(n, ReaderKind.HOLD, p, at))
                data = self._encode() if gone else None
            if data is not None:
                write_atomically(self.holds_path, data, sync=self._sync)
        return lost

    def held(self, name: str) -> LogPosition | None:
        with self._lock:
            entry = self._holds.get(name)
        return entry[0] if entry is not None else None

    def _encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "holds": {
            n: {"segment": p[0], "offset": p[1], "at": at}
            for n, (p, at) in sorted(self._holds.items())}}).encode()

    def _load(self) -> dict[str, tuple[LogPosition, float]]:
        try:
            with open(self.holds_path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s): holds reset", self.holds_path, exc)
            return {}
        if not isinstance(saved, dict) or saved.get("epoch") != self.epoch:
            log.warning("%s belongs to another relay log: holds reset", self.holds_path)
            return {}
        out: dict[str, tuple[LogPosition, float]] = {}
        for name, entry in dict(saved.get("holds", {})).items():
            try:
                out[str(name)] = ((int(entry["segment"]), int(entry["offset"])),
                                  float(entry["at"]))
            except (KeyError, TypeError, ValueError):
                log.warning("%s: hold %r unreadable, dropped", self.holds_path, name)
        return out

    # --- views ----------------------------------------------------------------------------------

    def snapshot(self, now: float | None = None) -> list[ReaderInfo]:
        """Every reader: live ones, and holds acknowledged within hold_ttl."""
        now = time.time() if now is None else now
        with self._lock:
            live = [ReaderInfo(h.name, ReaderKind.LIVE, h.position, h.since)
                    for h in self._live.values()]
            holds = [ReaderInfo(n, ReaderKind.HOLD, p, at) for n, (p, at) in self._holds.items()
                     if now - at <= self.hold_ttl]
        return sorted(live, key=lambda r: r.position) + sorted(holds, key=lambda r: r.position)

    def floor(self, now: float | None = None) -> LogPosition | None:
        """The oldest position a reader still needs; None when no one reads."""
        positions = [r.position for r in self.snapshot(now)]
        return min(positions) if positions else None
