"""The one signature both implementations of the kernels keep: `pure.py` and the compiled
`compiled.pyx` (its `compiled.pyi` states it for mypy). `relay/kernels/__init__.py`
assigns each module to a `Kernels` variable, so a twin whose signature drifts fails the
type check, not a replica at run time."""

from __future__ import annotations

from typing import Protocol

Buffer = bytes | bytearray | memoryview


class Kernels(Protocol):
    def frame_stored(self, out: bytearray, buf: Buffer, seq: int) -> tuple[int, int, int]:
        ...

    def read_dump(self, buf: Buffer, pos: int, seq: int, last_pos: int, plain: bytes,
                  tally: list[int], out: bytearray,
                  marks: list[int]) -> tuple[int, int, int]:
        ...
