"""The relay's operations, wired: one Prometheus registry (built here and passed in: no
global state), the fsync histogram the relay log observes, the event loop's lag probe,
readiness and /status over the running parts, and the HTTP endpoint that serves them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from relay.ops.collector import RelayCollector
from relay.ops.http import AdminServer
from relay.ops.parts import LoopLag, RelayParts
from relay.ops.status import Readiness, readiness, status_document
from relay.tls import ServerTls

FSYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Operations:
    """Metrics, readiness and /status of one relay, and their endpoint (`http`)."""

    def __init__(self, *, ready_max_lag: float, ready_grace: float,
                 credentials: tuple[str, str] | None = None,
                 tls: ServerTls | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.fsync_seconds = Histogram("relay_relaylog_fsync_seconds",
                                       "time one fsync of a relay log segment took",
                                       registry=self.registry, buckets=FSYNC_BUCKETS)
        self.loop_lag = LoopLag()
        self.ready_max_lag = ready_max_lag
        self.ready_grace = ready_grace
        self.parts: RelayParts | None = None     # set once by bind()
        self.http = AdminServer(self, credentials=credentials, tls=tls)

    def bind(self, parts: RelayParts) -> None:
        self.parts = parts
        self.registry.register(RelayCollector(parts))

    def readiness(self) -> Readiness:
        if self.parts is None:
            return Readiness(False, ["starting"])
        return readiness(self.parts, self.ready_max_lag, self.ready_grace)

    def status(self) -> dict[str, Any]:
        """A one-screen summary for `relay status` (JSON at /status)."""
        if self.parts is None:
            return {"state": "starting"}
        return status_document(self.parts, self.readiness())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
