"""The list of segments: names in order, their numbers, and the size of each sealed one.

The list is a tuple, replaced (never changed in place) when a segment starts, so a thread
that took `names` reads a consistent copy. Sizes of sealed segments are kept here (set at
recovery and at sealing), so no one stats the files to learn them, and so are the times
they were sealed (what retention by age reads). Retention drops the oldest names
(`drop_oldest`); the list is replaced then too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from relay.relaylog.naming import segment_name, segment_number
from relay.relaylog.segfile import open_segment, stored_path


@dataclass(frozen=True)
class Dropped:
    names: list[str]
    sizes: dict[str, int]
    disk: dict[str, int]
    at: dict[str, float]
    compressed: set[str]


class SegmentList:
    def __init__(self, directory: str, basename: str) -> None:
        self.directory = directory
        self.basename = basename
        self.names: tuple[str, ...] = ()
        self._numbers: dict[str, int] = {}
        self._sealed_sizes: dict[str, int] = {}
        self._sealed_at: dict[str, float] = {}
        self._disk_sizes: dict[str, int] = {}  # compressed ones are smaller
        self._compressed: set[str] = set()
        # The newest segment the index may name: one whose start the log's worker made
        # durable. Only that worker moves it (after writing the index), so an index it
        # writes never names a segment whose syncs have not run.
        self.indexed = 0

    def load(self, names: list[str], *, last_sealed: bool = False) -> None:
        """The segments recovery found (every one but the last is sealed, and the last
        too when recovery found its closing ROTATE). Built aside and swapped in at once:
        reader threads may look up sizes meanwhile (a re-open after a full disk)."""
        sealed = names if last_sealed else names[:-1]
        sizes: dict[str, int] = {}
        disk: dict[str, int] = {}
        at: dict[str, float] = {}
        compressed: set[str] = set()
        for n in sealed:
            path = self.path_of(n)
            stored = stored_path(path)
            st = os.stat(stored)
            if stored == path:
                sizes[n] = st.st_size
            else:  # compressed: its own size is in its footer
                f = open_segment(path)
                sizes[n] = f.size
                f.close()
                compressed.add(n)
            disk[n] = st.st_size
            at[n] = st.st_mtime
        self._sealed_sizes, self._disk_sizes, self._sealed_at = sizes, disk, at
        self._compressed = compressed
        self._numbers = {n: segment_number(n) for n in names}
        self.names = tuple(names)
        self.indexed = self.number_of(names[-1]) if names else 0

    def index_names(self, upto: int | None = None) -> list[str]:
        """What the index file lists now (the worker's view: see `indexed`)."""
        upto = self.indexed if upto is None else upto
        return [n for n in self.names if self.number_of(n) <= upto]

    def __bool__(self) -> bool:
        return bool(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> str:
        return self.names[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._numbers

    def path_of(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def number_of(self, name: str) -> int:
        number = self._numbers.get(name)
        return segment_number(name) if number is None else number

    @property
    def last(self) -> str:
        return self.names[-1]

    @property
    def current_number(self) -> int:
        return self.number_of(self.names[-1]) if self.names else 0

    def next_name(self) -> str:
        return segment_name(self.basename, self.current_number + 1 if self.names else 1)

    def add(self, name: str) -> None:
        self._numbers[name] = segment_number(name)
        self.names = (*self.names, name)

    def sealed(self, name: str, size: int) -> None:
        self._sealed_sizes[name] = size
        self._disk_sizes[name] = size
        self._sealed_at[name] = time.time()

    def compressed(self, name: str, stored: int) -> None:
        """`name` is stored compressed now, in `stored` bytes."""
        if name in self._disk_sizes:
            self._disk_sizes[name] = stored
            self._compressed.add(name)

    def is_compressed(self, name: str) -> bool:
        return name in self._compressed

    def disk_size(self, name: str) -> int | None:
        """Bytes a sealed segment takes on disk (None for the open one)."""
        return self._disk_sizes.get(name)

    def sealed_at(self, name: str) -> float | None:
        """When a sealed segment got its last byte (its file's mtime); None if open."""
        return self._sealed_at.get(name)

    def drop_oldest(self, names: list[str]) -> Dropped:
        """Retention removes these, the oldest sealed segments (the files go after): out
        of `names` first, so no reader thread finds a listed segment without its size.
        Returns what `restore_oldest` needs if the removal cannot be completed."""
        if list(self.names[: len(names)]) != names or len(names) >= len(self.names):
            raise ValueError(f"not the oldest sealed segments: {names}")
        dropped = Dropped(names, {n: self._sealed_sizes[n] for n in names},
                          {n: self._disk_sizes.get(n, 0) for n in names},
                          {n: self._sealed_at.get(n, 0.0) for n in names},
                          {n for n in names if n in self._compressed})
        self.names = self.names[len(names):]
        for name in names:
            self._numbers.pop(name, None)
            self._sealed_sizes.pop(name, None)
            self._disk_sizes.pop(name, None)
            self._sealed_at.pop(name, None)
            self._compressed.discard(name)
        return dropped

    def restore_oldest(self, dropped: Dropped) -> None:
        """Put back what `drop_oldest` took (its index write failed: the files stay)."""
        for name in dropped.names:
            self._numbers[name] = segment_number(name)
        self._sealed_sizes.update(dropped.sizes)
        self._disk_sizes.update(dropped.disk)
        self._sealed_at.update(dropped.at)
        self._compressed |= dropped.compressed
        self.names = (*dropped.names, *self.names)

    def sealed_size(self, name: str) -> int | None:
        """The size of a sealed segment; None for the open one (or an unknown name)."""
        return self._sealed_sizes.get(name)

    def after(self, name: str) -> str | None:
        names = self.names
        try:
            i = names.index(name)
        except ValueError:
            return None
        return names[i + 1] if i + 1 < len(names) else None

    def sealed_bytes(self) -> int:
        """Bytes the sealed segments take on disk."""
        return sum(self._disk_sizes.values())
