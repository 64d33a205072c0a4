"""DownstreamServer: accepts clients, one ClientSession task each (owned by the session
registry), connection limits, and the context every session gets."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from relay.downstream.answers import Answers, PrimarySnapshot
from relay.downstream.auth import Authenticator
from relay.downstream.connection import PacketConnection
from relay.downstream.context import DownstreamSettings, MetadataQuery, SessionContext
from relay.downstream.registry import SessionRegistry
from relay.downstream.replies import Err, Rows
from relay.downstream.semisync import SemiSyncPrimary
from relay.downstream.session import ClientSession
from relay.logins import LoginGuard
from relay.mysql.metadata import MetadataStats
from relay.net import SocketListener
from relay.relaylog.log import RelayLog
from relay.relaylog.retention import Retention, RetentionPolicy
from relay.rules.runtime import Rules
from relay.tls import ServerTls
from relay.wire.replies import build_err

log = logging.getLogger("relay.downstream")

__all__ = ["DownstreamServer", "DownstreamSettings"]


async def _no_primary(sql: str, charset: str) -> Rows | Err:
    return Err(2013, "relay has no primary to ask", "HY000")


class DownstreamServer:
    def __init__(self, relay_log: RelayLog, settings: DownstreamSettings, *,
                 rules: Rules | None = None,
                 primary: Callable[[], PrimarySnapshot | None] = lambda: None,
                 lookup: MetadataQuery | None = None,
                 metadata: MetadataStats | None = None,
                 retention: Retention | None = None) -> None:
        self.settings = settings
        self.metadata = metadata  # the metadata client's counts, for /status and metrics
        self.registry = SessionRegistry()
        # Send rules run here, off the event loop (one thread per core is plenty: the
        # work is Python, and hooks wait on nothing).
        self._rules_executor = ThreadPoolExecutor(max_workers=4,
                                                  thread_name_prefix="relay-rules")
        self.semi_sync = SemiSyncPrimary(settings.semi_sync, relay_log.replica_acks)
        self.answers = Answers(relay_log, server_id=settings.server_id,
                               sessions=self.registry, primary=primary, port=settings.port,
                               hostname=socket.gethostname(),
                               forward_metadata=settings.forward_metadata,
                               metadata_max_rows=settings.metadata_max_rows,
                               semi_sync=self.semi_sync, rules=rules)
        self.tls = (ServerTls(settings.tls, "[downstream.tls]")
                    if settings.tls is not None or settings.generate_certificate else None)
        self.logins = LoginGuard(settings.max_connect_errors, settings.host_block_time)
        self.auth = Authenticator(settings.accounts, tls=self.tls, guard=self.logins,
                                  connections_of=self.registry.connections_of,
                                  handshake_timeout=settings.handshake_timeout)
        self.context = SessionContext(
            relay_log, settings, self.auth, self.answers, self.registry, lookup or _no_primary,
            rules if rules is not None else Rules(), self._rules_executor, self.semi_sync,
            retention if retention is not None else Retention(relay_log, RetentionPolicy()))
        self._ids = itertools.count(1)
        self._listener = SocketListener(self._accept)

    @property
    def port(self) -> int:
        return self._listener.port

    async def start(self) -> None:
        await self._listener.open(self.settings.host, self.settings.port)
        log.info("serving replicas on %s:%d", self.settings.host, self.port)
        if self.tls is not None and self.tls.generated:
            log.info("TLS on the SQL port with a certificate made at start (no "
                     "[downstream.tls]), SHA-256 fingerprint %s: MariaDB 11.4+ replicas "
                     "verify it through their password", self.tls.fingerprint.hex(":").upper())

    async def close(self) -> None:
        self._listener.stop()
        await self.registry.close()
        await self._listener.closed()
        self._rules_executor.shutdown(wait=False, cancel_futures=True)

    async def _accept(self, sock: socket.socket) -> None:
        conn = PacketConnection(sock=sock)
        if len(self.registry) >= self.settings.max_clients:
            self.registry.rejected += 1
            conn.send([build_err(1040, "Too many connections", "08004")])
            await conn.close(clean=True, timeout=1.0)
            return
        session = ClientSession(self.context, conn, next(self._ids))
        # Its own task, so that reaping or shutdown cancels the session and not the
        # stream server's callback; the registry owns it, this callback awaits it.
        task = asyncio.create_task(session.run(), name=f"client-{session.conn_id}")
        self.registry.add(session, task)
        failed = False
        try:
            await asyncio.wait({task})
            failed = not task.cancelled() and task.exception() is not None
            if failed:
                log.error("%s: session task failed: %r", session, task.exception())
        finally:
            self.registry.discard(session, failed=failed)
            # Closes it if the session did not (a cancelled handshake).
            await conn.close(clean=False, timeout=1.0)
