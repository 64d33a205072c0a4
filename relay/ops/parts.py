"""What the operations endpoints read: the relay's running parts, and what the metrics,
readiness and /status all derive from them (the event loop's lag, the replication lag)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relay.downstream.server import DownstreamServer
    from relay.relaylog.log import RelayLog
    from relay.relaylog.retention import Retention
    from relay.rules.runtime import Rules
    from relay.tap.server import TapServer
    from relay.upstream.runner import Upstream


class LoopLag:
    """How late the event loop wakes a sleeper: the loop's own latency."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.last = 0.0
        self.max_recent = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval)
            self.last = max(0.0, loop.time() - t0 - self.interval)
            self.max_recent = max(self.max_recent * 0.9, self.last)


@dataclass(frozen=True)
class RelayParts:
    """The parts a running relay is made of, as the app built them (read, never changed
    here)."""

    relay_log: RelayLog
    upstream: Upstream
    downstream: DownstreamServer | None
    loop_lag: LoopLag
    rules: Rules | None = None
    tap: TapServer | None = None
    retention: Retention | None = None

    def lag_seconds(self) -> float:
        """How far the relay log is behind the primary, from event timestamps and
        heartbeats: a heartbeat after the last transaction means nothing is pending."""
        stats = self.upstream.ingest.stats
        now = time.time()
        connected = self.upstream.status.connected
        if connected and stats.last_heartbeat_at >= stats.last_event_at:
            return 0.0
        if stats.last_event_ts == 0:
            return 0.0 if connected else now - self.upstream.status.disconnected_since
        return max(0.0, now - stats.last_event_ts)
