"""Failed logins per client address, as a server's `max_connect_errors`: each failure in a
row slows the next answer to that address (doubling, capped), and past the limit the
address is blocked (error 1129) until `host_block_time` passes, FLUSH HOSTS, or a login
succeeds before it. One owner per server (the SQL port, the tap); its connections report
through it."""

from __future__ import annotations

import time
from dataclasses import dataclass

FIRST_DELAY = 0.05   # s: the second failure in a row waits this long, then it doubles
MAX_DELAY = 2.0


@dataclass
class _Host:
    failures: int = 0
    blocked_until: float = 0.0


class LoginGuard:
    def __init__(self, max_errors: int, block_time: float, *, max_tracked: int = 100_000):
        self.max_errors = max_errors
        self.block_time = block_time
        self._max_tracked = max_tracked
        self._hosts: dict[str, _Host] = {}
        self.failed = 0      # failed logins, all hosts
        self.refused = 0     # connections refused because their host was blocked

    def blocked(self, host: str) -> bool:
        entry = self._hosts.get(host)
        if entry is None or not entry.blocked_until:
            return False
        if time.monotonic() < entry.blocked_until:
            self.refused += 1
            return True
        del self._hosts[host]
        return False

    def failure(self, host: str) -> float:
        """Count a failed login; the delay (s) before its error goes out."""
        self.failed += 1
        entry = self._hosts.get(host)
        if entry is None:
            if len(self._hosts) >= self._max_tracked:  # a flood of addresses
                self._forget_one()
            entry = self._hosts[host] = _Host()
        entry.failures += 1
        if entry.failures >= self.max_errors:
            entry.blocked_until = time.monotonic() + self.block_time
        if entry.failures < 2:
            return 0.0
        return min(FIRST_DELAY * 2.0 ** min(entry.failures - 2, 16), MAX_DELAY)

    def _forget_one(self) -> None:
        """Forget the oldest address that is not blocked (blocks must hold); the oldest
        block only when every entry is one."""
        victim = next((h for h, e in self._hosts.items() if not e.blocked_until),
                      next(iter(self._hosts)))
        del self._hosts[victim]

    def success(self, host: str) -> None:
        self._hosts.pop(host, None)

    def flush(self) -> None:
        """FLUSH HOSTS."""
        self._hosts.clear()

    def blocked_hosts(self) -> list[str]:
        now = time.monotonic()
        return [h for h, e in self._hosts.items() if e.blocked_until > now]
