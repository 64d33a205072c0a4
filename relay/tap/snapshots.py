"""SnapshotRegistry: the snapshots readers run through the tap, kept by the relay.

A reader (the Spark driver) plans a snapshot's chunks and saves the plan here; the
offsets it checkpoints then name the snapshot and a chunk number only, and a restarted
driver loads the same plan. Executors report each chunk they delivered; the progress per
table is what /status, /metrics and `relay status` show. Each snapshot is a msgpack file
in `<log dir>/tap-snapshots/`, replaced atomically (relaylog.atomic) on every change; the
re-snapshots asked for (and the request tokens honoured) are in requests.msgpack beside
them.
Blocking: the tap server calls it in its worker threads; a lock orders the writers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack

from relay.relaylog.atomic import write_atomically

log = logging.getLogger("relay.tap")
MAX_PLAN_BYTES = 16 << 20   # a request carrying a plan: ~100 bytes a chunk
REQUESTS_FILE = "requests.msgpack"
STALE = -1                  # a chunk's "rows" when its table changed columns since the plan
MAX_TOKENS = 100            # re-snapshot tokens remembered per subscriber


@dataclass
class Snapshot:
    id: str
    name: str                      # the subscriber it belongs to
    start: int                     # the tap position the stream part starts at
    tables: list[dict[str, Any]]   # TableSpec.to_wire() of each table
    chunks: list[list[Any]]        # Chunk.to_wire() of each chunk, in order
    created: float = field(default_factory=time.time)
    # chunk index -> rows delivered, or STALE: its table changed columns since the plan
    # (nothing delivered; the table is copied again by a re-snapshot)
    done: dict[int, int] = field(default_factory=dict)
    # re-snapshot requests this snapshot takes, marked taken when its first chunk is
    # delivered (a plan whose driver died before it ran leaves them asked for)
    taken: list[str] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "start": self.start,
                "tables": self.tables, "chunks": self.chunks, "created": self.created,
                "done": self.done, "taken": self.taken}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Snapshot:
        return cls(str(d["id"]), str(d["name"]), int(d["start"]), list(d["tables"]),
                   list(d["chunks"]), float(d["created"]),
                   {int(k): int(v) for k, v in dict(d["done"]).items()},
                   [str(t) for t in d.get("taken", [])])

    def stale_tables(self) -> list[str]:
        """Tables with a chunk that found their columns changed (copied again later)."""
        names = [f"{t['schema']}.{t['table']}" for t in self.tables]
        return sorted({names[int(c[1])] for c in self.chunks
                       if self.done.get(int(c[0])) == STALE})

    def progress(self) -> dict[str, dict[str, int]]:
        """Per table: chunks planned and done, rows delivered."""
        out: dict[str, dict[str, int]] = {}
        names = [f"{t['schema']}.{t['table']}" for t in self.tables]
        for name in names:
            out[name] = {"chunks": 0, "chunks_done": 0, "rows": 0}
        for chunk in self.chunks:
            index, table = int(chunk[0]), int(chunk[1])
            entry = out[names[table]]
            entry["chunks"] += 1
            if index in self.done:
                entry["chunks_done"] += 1
                entry["rows"] += max(0, self.done[index])
        return out


class SnapshotRegistry:
    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, "tap-snapshots")
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}
        self._requests: dict[str, list[str]] = {}     # subscriber -> table patterns
        self._honoured: dict[str, list[str]] = {}     # subscriber -> request tokens

    def load(self) -> None:
        """Read the snapshots a previous run kept (an unreadable file is set aside)."""
        if not os.path.isdir(self.directory):
            return
        self._load_requests()
        for entry in sorted(os.listdir(self.directory)):
            if not entry.endswith(".msgpack") or entry == REQUESTS_FILE:
                continue
            path = os.path.join(self.directory, entry)
            try:
                with open(path, "rb") as f:
                    snap = Snapshot.from_wire(msgpack.unpackb(f.read(), raw=False,
                                                              strict_map_key=False))
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
                log.warning("tap snapshot %s is unreadable (%s): set aside as .bad", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(path, path + ".bad")
                continue
            self._snapshots[snap.id] = snap

    def create(self, name: str, start: int, tables: list[dict[str, Any]],
               chunks: list[list[Any]], taken: list[str] | None = None) -> Snapshot:
        snap = Snapshot(uuid.uuid4().hex[:16], name, start, tables, chunks,
                        taken=list(taken or []))
        with self._lock:
            self._write(snap)
            self._snapshots[snap.id] = snap
        return snap

    def get(self, snap_id: str) -> Snapshot | None:
        return self._snapshots.get(snap_id)

    def chunk_done(self, snap_id: str, chunk: int, rows: int) -> bool:
        """Record a delivered chunk (a retried task reports it again: the last count
        stands; STALE for one that found its table changed); False for an unknown
        snapshot. The first one marks the re-snapshot requests it takes as taken."""
        with self._lock:
            snap = self._snapshots.get(snap_id)
            if snap is None:
                return False
            snap.done[chunk] = rows
            taken, snap.taken = snap.taken, []
            self._write(snap)
        if taken:
            self.taken(snap.name, taken)
        return True

    def drop(self, snap_id: str) -> bool:
        with self._lock:
            snap = self._snapshots.pop(snap_id, None)
            if snap is None:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(snap_id))
            return True

    def snapshot(self) -> list[Snapshot]:
        return list(self._snapshots.values())

    # Re-snapshots asked for while a subscriber streams: its reader takes them at its
    # next batch. Kept in requests.msgpack with the tokens already honoured per
    # subscriber (a query that asks with an option asks again at each restart: the
    # token makes that one request).
    def request(self, name: str, tables: list[str], token: str | None = None) -> bool:
        """False when `token` was honoured for `name` before (nothing is asked again)."""
        with self._lock:
            if token is not None:
                honoured = self._honoured.setdefault(name, [])
                if token in honoured:
                    return False
                honoured.append(token)
                del honoured[:-MAX_TOKENS]
            self._requests[name] = sorted(set(self._requests.get(name, [])) | set(tables))
            self._write_requests()
            return True

    def requested(self, name: str) -> list[str]:
        return list(self._requests.get(name, []))

    def taken(self, name: str, tables: list[str]) -> None:
        with self._lock:
            left = [t for t in self._requests.get(name, []) if t not in tables]
            if left:
                self._requests[name] = left
            else:
                self._requests.pop(name, None)
            self._write_requests()

    def forget(self, name: str) -> None:
        """An unsubscribed reader: its requests and tokens go."""
        with self._lock:
            self._requests.pop(name, None)
            self._honoured.pop(name, None)
            self._write_requests()

    def _write_requests(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        write_atomically(os.path.join(self.directory, REQUESTS_FILE), msgpack.packb(
            {"requests": self._requests, "honoured": self._honoured}, use_bin_type=True),
            sync=True)

    def _load_requests(self) -> None:
        path = os.path.join(self.directory, REQUESTS_FILE)
        try:
            with open(path, "rb") as f:
                saved = msgpack.unpackb(f.read(), raw=False)
            requests, honoured = (_names_to_lists(saved["requests"]),
                                  _names_to_lists(saved["honoured"]))
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            log.warning("tap re-snapshot requests %s are unreadable (%s): set aside as .bad",
                        path, exc)
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
            return
        self._requests, self._honoured = requests, honoured

    def _path(self, snap_id: str) -> str:
        return os.path.join(self.directory, f"{snap_id}.msgpack")

    def _write(self, snap: Snapshot) -> None:
        os.makedirs(self.directory, exist_ok=True)
        write_atomically(self._path(snap.id), msgpack.packb(snap.to_wire(), use_bin_type=True),
                         sync=True)


def _names_to_lists(value: Any) -> dict[str, list[str]]:
    """{name: [text, ...]} from a loaded file, or ValueError."""
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise ValueError("not a map of lists")
    return {str(k): [str(t) for t in v] for k, v in value.items()}

