"""SnapshotRegistry: the snapshots readers run through the tap, kept by the relay.

A reader (the Spark driver) plans a snapshot's chunks and saves the plan here; the
offsets it checkpoints then name the snapshot and a chunk number only, and a restarted
driver loads the same plan. Executors report each chunk they delivered; the progress per
table is what /status, /metrics and `relay status` show. Each snapshot is a msgpack file
in `<log dir>/tap-snapshots/`, replaced atomically (relaylog.atomic) on every change; the
re-snapshots asked for (and the request tokens honoured) are in requests.msgpack beside
them.

Owners: a snapshot and a re-snapshot request belong to the tap user that made them (its
namespace: the user's name, or ANONYMOUS on a tap without users); the server lets only
that user see or change them. Each owner may keep `max_per_user` snapshots that are not
finished (every chunk reported) and `max_bytes_per_user` bytes of saved plans: a save
beyond either is refused (TapError "quota"). Finished snapshots do not count, but they
are dropped, oldest first, when keeping them would put their owner's files over either
bound: what one user keeps on disk is bounded whatever it saves. Re-snapshot requests
are bounded too: `max_requests_per_user` subscribers with requests or honoured tokens
(TapError "quota" for one more; `forget` frees one), MAX_PLAN_TABLES table patterns each.
Plans are checked (check_plan) when saved and when loaded: one kept on disk that does not
check is set aside as .bad.

Snapshots and requests saved by a relay before owners have none (`owner` None). `load`
gives them to the namespace it is told to adopt them into (the tap's only namespace);
otherwise they stay ownerless, which no user can load, change or drop (the operator still
sees them), ownerless snapshots go once older than `legacy_ttl`, and ownerless requests
go at once.
Blocking: the tap server calls it in its worker threads; a lock orders the writers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from relay.relaylog.atomic import write_atomically
from relay.tap.protocol import TapError

log = logging.getLogger("relay.tap")
MAX_PLAN_BYTES = 16 << 20   # a request carrying a plan: ~100 bytes a chunk
REQUESTS_FILE = "requests.msgpack"
STALE = -1                  # a chunk's "rows" when its table changed columns since the plan
MAX_TOKENS = 100            # re-snapshot tokens remembered per subscriber
ANONYMOUS = ""              # the one namespace of a tap without users
MAX_PER_USER = 16           # [tap] max_snapshots_per_user
MAX_BYTES_PER_USER = 64 << 20   # [tap] max_snapshot_bytes_per_user
MAX_REQUESTS_PER_USER = 64  # [tap] max_subscribers_per_user: subscribers with requests
# A plan's bounds (check_plan). Tables: their names label /metrics series (three a table of
# each snapshot kept), so a plan names at most MAX_PLAN_TABLES distinct ones, each of at
# most MAX_NAME characters of the Basic Multilingual Plane without control characters, as
# MySQL's and MariaDB's identifiers are. Chunks: a chunk with its keys takes 16 bytes on
# the wire at the least, so a plan within MAX_PLAN_BYTES has at most MAX_PLAN_CHUNKS.
MAX_PLAN_TABLES = 1024
MAX_PLAN_CHUNKS = MAX_PLAN_BYTES // 16
MAX_NAME = 64


def _name_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "not a string"
    if not 0 < len(value) <= MAX_NAME:
        return f"{len(value)} characters (1 to {MAX_NAME})"
    if any(ord(c) < 32 or ord(c) == 127 or ord(c) > 0xFFFF for c in value):
        return "a control character, or one beyond the Basic Multilingual Plane"
    return None


def check_plan(tables: Any, chunks: Any) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """(tables, chunks) when they make a snapshot's plan, else ValueError saying what is
    wrong, as a reader sends a plan (TableSpec.to_wire() of each table, Chunk.to_wire() of
    each chunk) and as it is kept: a list of tables, each a map with a schema and table
    name (see MAX_NAME; no two the same), key column names, "unique" and its columns; a
    list of chunks, each [index, table, lo, hi] with an index no other chunk has, the
    table's place in the list of tables, and lo and hi key values (lists) or nil. At most
    MAX_PLAN_TABLES tables and MAX_PLAN_CHUNKS chunks."""
    if not isinstance(tables, list) or not isinstance(chunks, list):
        raise ValueError("tables and chunks are lists")
    if len(tables) > MAX_PLAN_TABLES:
        raise ValueError(f"{len(tables)} tables: a snapshot copies at most "
                         f"{MAX_PLAN_TABLES} (split the tables between queries)")
    if len(chunks) > MAX_PLAN_CHUNKS:
        raise ValueError(f"{len(chunks)} chunks: a plan holds at most {MAX_PLAN_CHUNKS} "
                         "(make them larger: snapshotChunkRows)")
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(tables):
        if not isinstance(t, dict):
            raise ValueError(f"table {i} is not a map")
        for key in ("schema", "table"):
            problem = _name_problem(t.get(key))
            if problem is not None:
                raise ValueError(f"table {i}: its {key} name is {problem}")
        pair = (t["schema"], t["table"])
        if pair in seen:
            raise ValueError(f"table {i}: {pair[0]}.{pair[1]} is in the plan twice")
        seen.add(pair)
        keys, columns = t.get("keys"), t.get("columns")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) \
                or not isinstance(t.get("unique"), bool):
            raise ValueError(f"table {i}: keys is a list of column names, unique a boolean")
        if not isinstance(columns, list) or not all(
                isinstance(c, list) and len(c) in (3, 4) and isinstance(c[0], str)
                for c in columns):
            raise ValueError(f"table {i}: columns is a list of [name, type, binary, fsp]")
    indexes: set[int] = set()
    for i, c in enumerate(chunks):
        if not isinstance(c, list) or len(c) != 4:
            raise ValueError(f"chunk {i} is not [index, table, lo, hi]")
        index, table, lo, hi = c
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"chunk {i}: index {index!r} is not a count")
        if index in indexes:
            raise ValueError(f"chunk {i}: index {index} is another chunk's")
        indexes.add(index)
        if isinstance(table, bool) or not isinstance(table, int) or \
                not 0 <= table < len(tables):
            raise ValueError(f"chunk {index}: table {table!r} is not one of the plan's "
                             f"{len(tables)}")
        if not all(k is None or isinstance(k, list) for k in (lo, hi)):
            raise ValueError(f"chunk {index}: lo and hi are key values (lists) or nil")
    return tables, chunks


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
    owner: str | None = ANONYMOUS  # the tap user whose it is (None: saved before owners)
    size: int = 0                  # bytes of its file (what the per-user bound counts)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "start": self.start,
                "tables": self.tables, "chunks": self.chunks, "created": self.created,
                "done": self.done, "taken": self.taken, "owner": self.owner}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Snapshot:
        """ValueError (or KeyError, TypeError) for a plan check_plan refuses."""
        owner = d.get("owner")  # (absent: saved by a relay before owners)
        check_plan(d["tables"], d["chunks"])
        return cls(str(d["id"]), str(d["name"]), int(d["start"]), list(d["tables"]),
                   list(d["chunks"]), float(d["created"]),
                   {int(k): int(v) for k, v in dict(d["done"]).items()},
                   [str(t) for t in d.get("taken", [])],
                   None if owner is None else str(owner))

    @property
    def table_pairs(self) -> list[tuple[str, str]]:
        return [(str(t["schema"]), str(t["table"])) for t in self.tables]

    @property
    def table_names(self) -> list[str]:
        return [f"{s}.{t}" for s, t in self.table_pairs]

    def has_chunk(self, index: int) -> bool:
        return any(c[0] == index for c in self.chunks)

    @property
    def finished(self) -> bool:
        """Every chunk of the plan reported (delivered, or found stale)."""
        return all(c[0] in self.done for c in self.chunks)

    def _placed(self) -> Iterator[tuple[int, str]]:
        """(index, table name) of each chunk; one that names no table of the plan is left
        out (check_plan refuses such plans: this is what /status and /metrics read, and
        they must answer whatever is kept)."""
        names = self.table_names
        for chunk in self.chunks:
            try:
                index, table = chunk[0], chunk[1]
                if isinstance(table, int) and 0 <= table < len(names):
                    yield index, names[table]
            except (TypeError, IndexError, KeyError):
                continue

    def stale_tables(self) -> list[str]:
        """Tables with a chunk that found their columns changed (copied again later)."""
        return sorted({name for index, name in self._placed()
                       if self.done.get(index) == STALE})

    def progress(self) -> dict[str, dict[str, int]]:
        """Per table: chunks planned and done, rows delivered."""
        out = {name: {"chunks": 0, "chunks_done": 0, "rows": 0} for name in self.table_names}
        for index, name in self._placed():
            entry = out[name]
            entry["chunks"] += 1
            if index in self.done:
                entry["chunks_done"] += 1
                entry["rows"] += max(0, self.done[index])
        return out


Requests = dict[str, dict[str, list[str]]]   # owner -> subscriber -> table patterns/tokens


class SnapshotRegistry:
    def __init__(self, directory: str, *, max_per_user: int = MAX_PER_USER,
                 max_bytes_per_user: int = MAX_BYTES_PER_USER,
                 max_requests_per_user: int = MAX_REQUESTS_PER_USER) -> None:
        self.directory = os.path.join(directory, "tap-snapshots")
        self.max_per_user = max_per_user
        self.max_bytes_per_user = max_bytes_per_user
        self.max_requests_per_user = max_requests_per_user
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}
        self._requests: Requests = {}     # owner -> subscriber -> table patterns
        self._honoured: Requests = {}     # owner -> subscriber -> request tokens

    def load(self, adopt: str | None = ANONYMOUS, legacy_ttl: float | None = None) -> None:
        """Read the snapshots a previous run kept (an unreadable file is set aside).
        Ownerless ones (saved before owners) become `adopt`'s; with `adopt` None they stay
        ownerless, and go once older than `legacy_ttl` seconds."""
        if not os.path.isdir(self.directory):
            return
        self._load_requests(adopt)
        for entry in sorted(os.listdir(self.directory)):
            if not entry.endswith(".msgpack") or entry == REQUESTS_FILE:
                continue
            path = os.path.join(self.directory, entry)
            try:
                with open(path, "rb") as f:
                    data = f.read()
                snap = Snapshot.from_wire(msgpack.unpackb(data, raw=False,
                                                          strict_map_key=False))
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
                log.warning("tap snapshot %s is unreadable (%s): set aside as .bad", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(path, path + ".bad")
                continue
            snap.size = len(data)
            if snap.owner is None:
                if adopt is not None:
                    snap.owner = adopt
                    self._write(snap)
                elif legacy_ttl is not None and time.time() - snap.created > legacy_ttl:
                    log.info("tap snapshot %s of %s, saved before snapshots had owners, is "
                             "older than [tap] subscriber_ttl: dropped", snap.id, snap.name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    continue
            self._snapshots[snap.id] = snap

    def create(self, name: str, start: int, tables: list[dict[str, Any]],
               chunks: list[list[Any]], taken: list[str] | None = None, *,
               owner: str = ANONYMOUS) -> Snapshot:
        """Keep a plan for `owner`; TapError("quota") when its snapshots that are not
        finished would be more than max_per_user, or their bytes more than
        max_bytes_per_user (its finished ones are dropped first, oldest first, as far as
        the new one needs their room)."""
        snap = Snapshot(uuid.uuid4().hex[:16], name, start, tables, chunks,
                        taken=list(taken or []), owner=owner)
        data = self._encode(snap)
        snap.size = len(data)
        with self._lock:
            mine = sorted((s for s in self._snapshots.values() if s.owner == owner),
                          key=lambda s: s.created)
            running = [s for s in mine if not s.finished]
            if len(running) + 1 > self.max_per_user:
                raise TapError("quota", f"{owner or 'the tap'} keeps {len(running)} unfinished "
                                        f"snapshots, the most a user may ([tap] "
                                        f"max_snapshots_per_user = {self.max_per_user}): "
                                        "finish or drop one first")
            used = sum(s.size for s in running)
            if used + snap.size > self.max_bytes_per_user:
                raise TapError("quota", f"a plan of {snap.size} bytes beside the "
                                        f"{used} bytes of {owner or 'the tap'}'s unfinished "
                                        "snapshots is more than a user may keep ([tap] "
                                        "max_snapshot_bytes_per_user = "
                                        f"{self.max_bytes_per_user})")
            finished = [s for s in mine if s.finished]
            total = used + sum(s.size for s in finished)
            while finished and (len(running) + len(finished) + 1 > self.max_per_user
                                or total + snap.size > self.max_bytes_per_user):
                old = finished.pop(0)
                total -= old.size
                self._forget_snapshot(old.id)
                log.info("tap: finished snapshot %s of %s dropped to make room for a new one",
                         old.id, old.name)
            self._write_data(snap.id, data)
            self._snapshots[snap.id] = snap
        return snap

    def owned(self, owner: str, snap_id: str) -> Snapshot | None:
        """`owner`'s snapshot `snap_id`; None for another's, as for one that is not."""
        snap = self._snapshots.get(snap_id)
        return snap if snap is not None and snap.owner == owner else None

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
        if taken and snap.owner is not None:
            self.taken(snap.name, taken, owner=snap.owner)
        return True

    def drop(self, snap_id: str) -> bool:
        with self._lock:
            return self._forget_snapshot(snap_id)

    def _forget_snapshot(self, snap_id: str) -> bool:
        snap = self._snapshots.pop(snap_id, None)
        if snap is None:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(snap_id))
        return True

    def snapshot(self) -> list[Snapshot]:
        return list(self._snapshots.values())

    def of(self, owner: str) -> list[Snapshot]:
        return [s for s in self._snapshots.values() if s.owner == owner]

    # Re-snapshots asked for while a subscriber streams: its reader takes them at its
    # next batch. Kept in requests.msgpack with the tokens already honoured per
    # subscriber (a query that asks with an option asks again at each restart: the
    # token makes that one request).
    def request(self, name: str, tables: list[str], token: str | None = None, *,
                owner: str = ANONYMOUS) -> bool:
        """False when `token` was honoured for `name` before (nothing is asked again).
        TapError("quota") when `name` would be one subscriber more with requests or
        tokens than `owner` may have (max_requests_per_user), or its requests would name
        more than MAX_PLAN_TABLES table patterns."""
        with self._lock:
            honoured = self._honoured.get(owner, {})
            if token is not None and token in honoured.get(name, ()):
                return False
            mine = self._requests.get(owner, {})
            if name not in mine and name not in honoured:
                names = len(set(mine) | set(honoured))
                if names >= self.max_requests_per_user:
                    raise TapError("quota", f"{owner or 'the tap'} has re-snapshot requests "
                                            f"of {names} subscribers, the most a user may "
                                            "([tap] max_subscribers_per_user = "
                                            f"{self.max_requests_per_user}): unsubscribe "
                                            f"one before asking for {name!r}")
            wanted = sorted(set(mine.get(name, [])) | set(tables))
            if len(wanted) > MAX_PLAN_TABLES:
                raise TapError("quota", f"{name!r}'s re-snapshot requests would name "
                                        f"{len(wanted)} table patterns, more than a "
                                        f"snapshot copies tables ({MAX_PLAN_TABLES})")
            if token is not None:
                kept = self._honoured.setdefault(owner, {}).setdefault(name, [])
                kept.append(token)
                del kept[:-MAX_TOKENS]
            self._requests.setdefault(owner, {})[name] = wanted
            self._write_requests()
            return True

    def requested(self, name: str, *, owner: str = ANONYMOUS) -> list[str]:
        return list(self._requests.get(owner, {}).get(name, []))

    def taken(self, name: str, tables: list[str], *, owner: str = ANONYMOUS) -> None:
        with self._lock:
            mine = self._requests.get(owner, {})
            left = [t for t in mine.get(name, []) if t not in tables]
            if left:
                mine[name] = left
            else:
                mine.pop(name, None)
            self._write_requests()

    def forget(self, name: str, *, owner: str = ANONYMOUS) -> None:
        """An unsubscribed reader: its requests and tokens go."""
        with self._lock:
            for kept in (self._requests, self._honoured):
                kept.get(owner, {}).pop(name, None)
            self._write_requests()

    def _write_requests(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        requests = {o: n for o, n in self._requests.items() if n}
        honoured = {o: n for o, n in self._honoured.items() if n}
        write_atomically(os.path.join(self.directory, REQUESTS_FILE), msgpack.packb(
            {"owners": True, "requests": requests, "honoured": honoured},
            use_bin_type=True), sync=True)

    def _load_requests(self, adopt: str | None) -> None:
        path = os.path.join(self.directory, REQUESTS_FILE)
        try:
            with open(path, "rb") as f:
                saved = msgpack.unpackb(f.read(), raw=False)
            if saved.get("owners"):
                requests = {str(o): _names_to_lists(n) for o, n in saved["requests"].items()}
                honoured = {str(o): _names_to_lists(n) for o, n in saved["honoured"].items()}
            else:  # saved before owners: subscriber -> list
                old = (_names_to_lists(saved["requests"]), _names_to_lists(saved["honoured"]))
                if adopt is not None:
                    requests, honoured = {adopt: old[0]}, {adopt: old[1]}
                else:
                    requests, honoured = {}, {}
                    if any(old):
                        log.warning("tap re-snapshot requests of %s, asked before requests "
                                    "had owners, are dropped: this tap has several users "
                                    "(a reader asks again at its next start)",
                                    ", ".join(sorted(set(old[0]) | set(old[1]))))
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError,
                msgpack.UnpackException) as exc:
            log.warning("tap re-snapshot requests %s are unreadable (%s): set aside as .bad",
                        path, exc)
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
            return
        self._requests, self._honoured = requests, honoured

    def _path(self, snap_id: str) -> str:
        return os.path.join(self.directory, f"{snap_id}.msgpack")

    @staticmethod
    def _encode(snap: Snapshot) -> bytes:
        data: bytes = msgpack.packb(snap.to_wire(), use_bin_type=True)
        return data

    def _write(self, snap: Snapshot) -> None:
        data = self._encode(snap)
        snap.size = len(data)
        self._write_data(snap.id, data)

    def _write_data(self, snap_id: str, data: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        write_atomically(self._path(snap_id), data, sync=True)


def _names_to_lists(value: Any) -> dict[str, list[str]]:
    """{name: [text, ...]} from a loaded file, or ValueError."""
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise ValueError("not a map of lists")
    return {str(k): [str(t) for t in v] for k, v in value.items()}
