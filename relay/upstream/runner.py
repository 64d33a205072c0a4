"""The upstream task: choose a source, resume from the relay's GTID state, reconnect with
backoff and jitter, and move to the next source after `failover_after` of failure."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field

from relay.binlog.gtid import GtidState
from relay.errors import FatalUpstreamError, RelayError, UpstreamError
from relay.relaylog.log import RelayLog
from relay.upstream.control import PrimaryInfo, inspect_primary
from relay.upstream.ingest import Ingest
from relay.upstream.session import Session, SessionSettings
from relay.upstream.source import Source

log = logging.getLogger("relay.upstream")


@dataclass(frozen=True)
class UpstreamSettings:
    sources: tuple[Source, ...]
    start: str
    server_id: int
    heartbeat_period: float = 5.0
    read_timeout: float = 15.0
    connect_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 10.0
    max_retries: int = 0          # consecutive failed attempts before giving up; 0 = never
    failover_after: float = 30.0


REASONS = ("ended", "fatal", "upstream", "protocol", "io")


@dataclass
class UpstreamStatus:
    connected: bool = False
    active_source: str = ""
    primary_version: str = ""
    primary_server_id: int = 0
    # Why each upstream connection ended; a fixed set of labels, all exported from the start.
    reconnects: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    last_error: str = ""
    disconnected_since: float = field(default_factory=time.time)


class Upstream:
    def __init__(self, settings: UpstreamSettings, relay_log: RelayLog) -> None:
        self.settings = settings
        self.log = relay_log
        self.ingest = Ingest(relay_log)
        self.status = UpstreamStatus()
        self._session: Session | None = None

    def start_state(self, info: PrimaryInfo) -> GtidState:
        if self.log.segments:
            return self.log.state.copy()
        start = self.settings.start
        if start == "current":
            return info.gtid_binlog_pos
        if start == "earliest":
            return info.earliest
        return GtidState.parse(start)

    async def run(self) -> None:
        s = self.settings
        index = 0
        failures = 0
        failing_since: float | None = None
        while True:
            source = s.sources[index]
            self.status.active_source = source.address
            received_before = self.ingest.stats.events
            reason = "ended"
            try:
                info = await inspect_primary(source, timeout=s.connect_timeout)
                if info.server_id == s.server_id:
                    raise FatalUpstreamError(
                        f"{source}: the primary's server_id is {info.server_id}, the same as "
                        "[relay] server_id; give the relay a unique server_id")
                self.status.primary_version = info.version
                self.status.primary_server_id = info.server_id
                state = self.start_state(info)
                if not self.log.segments:
                    self.log.state = state.copy()  # the first segment's GTID_LIST says so
                session = Session(source, SessionSettings(
                    s.server_id, s.heartbeat_period, s.connect_timeout, s.read_timeout),
                    self.ingest)
                self._session = session
                self.status.connected = True
                await session.run(state)
                log.info("%s ended the stream", source)
            except FatalUpstreamError as exc:
                reason = "fatal"
                self.status.last_error = str(exc)
                log.error("%s", exc)
            except (UpstreamError, RelayError, OSError) as exc:
                reason = ("upstream" if isinstance(exc, UpstreamError)
                          else "io" if isinstance(exc, OSError) else "protocol")
                self.status.last_error = str(exc)
                log.warning("%s", exc)
            finally:
                if self.status.connected:
                    self.status.disconnected_since = time.time()
                self.status.connected = False
                self._session = None
            self.status.reconnects[reason] = self.status.reconnects.get(reason, 0) + 1
            if self.ingest.stats.events > received_before:
                failures, failing_since = 0, None
            failures += 1
            now = time.monotonic()
            failing_since = failing_since or now
            if s.max_retries and failures > s.max_retries:
                raise FatalUpstreamError(
                    f"giving up after {s.max_retries} failed attempts "
                    f"([upstream] max_retries): {self.status.last_error}")
            if len(s.sources) > 1 and now - failing_since >= s.failover_after:
                index = (index + 1) % len(s.sources)
                failing_since = now
                log.warning("failing over to %s", s.sources[index])
            delay = min(s.retry_max, s.retry_initial * 2 ** min(failures - 1, 16))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
