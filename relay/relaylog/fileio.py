"""The relay log's write and fsync seam: every byte of a segment or GTID index goes out
through `write`, every segment sync through `fsync`.

They are `os.write` and `os.fsync`, unless `RELAY_FAULT` is set in the environment: then
they fail as a failing disk does, so the reliability tests (and an operator rehearsing an
incident) see the relay's real handling of an I/O error without a broken disk. The value
is one or more rules separated by `;`, each `write|fsync:ERRNO:after=N`: the call fails
with ERRNO (EIO, ENOSPC, EDQUOT) once N bytes were written (write) or N syncs ran (fsync),
and every call after that fails too. Read once, at import.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

Buffer = bytes | bytearray | memoryview

write: Callable[[int, Buffer], int] = os.write
fsync: Callable[[int], None] = os.fsync


class _Fault:
    def __init__(self, code: int, after: int) -> None:
        self.code = code
        self.after = after
        self.count = 0
        self._lock = threading.Lock()

    def spend(self, amount: int) -> int:
        """Count `amount`; how much of it may still pass (0: fail now)."""
        with self._lock:
            left = max(0, self.after - self.count)
            self.count += amount
            return min(left, amount)

    def error(self) -> OSError:
        return OSError(self.code, os.strerror(self.code))


def parse_faults(spec: str) -> dict[str, _Fault]:
    """`write:EIO:after=1048576;fsync:EIO:after=3` -> {"write": ..., "fsync": ...}."""
    out = {}
    for rule in filter(None, (r.strip() for r in spec.split(";"))):
        try:
            call, name, after = rule.split(":")
            key, _, value = after.partition("=")
            code = getattr(errno, name.upper())
            if call not in ("write", "fsync") or key != "after" or not isinstance(code, int):
                raise ValueError(rule)
            out[call] = _Fault(code, int(value))
        except (ValueError, AttributeError):
            raise ValueError(f"RELAY_FAULT: {rule!r} is not write|fsync:ERRNO:after=N "
                             "(for example write:ENOSPC:after=1048576)") from None
    return out


def _install(spec: str) -> None:
    global write, fsync
    faults = parse_faults(spec)
    if (wf := faults.get("write")) is not None:
        def faulty_write(fd: int, data: Buffer) -> int:
            allowed = wf.spend(len(memoryview(data)))
            if allowed == 0:
                raise wf.error()
            return os.write(fd, memoryview(data)[:allowed])
        write = faulty_write
    if (ff := faults.get("fsync")) is not None:
        def faulty_fsync(fd: int) -> None:
            if ff.spend(1) == 0:
                raise ff.error()
            os.fsync(fd)
        fsync = faulty_fsync


if os.environ.get("RELAY_FAULT"):
    _install(os.environ["RELAY_FAULT"])
