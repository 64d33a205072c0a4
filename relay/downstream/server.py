"""DownstreamServer: accepts clients, one ClientSession task each, connection limits, and
the reaping of an old dump session when a replica reconnects with the same server_id."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from relay.binlog.events import decode_fde
from relay.downstream.answers import Answers, Err, Ok, Process, Replica, Rows, Upstream
from relay.downstream.session import ClientSession
from relay.relaylog.log import RelayLog
from relay.rules.runtime import NO_RULES, Rules
from relay.wire.auth import native_password_hash
from relay.wire.packets import frame
from relay.wire.replies import build_err

log = logging.getLogger("relay.downstream")


@dataclass(frozen=True)
class DownstreamSettings:
    host: str
    port: int
    users: dict[str, str]          # name -> password
    server_id: int
    max_clients: int = 256
    write_timeout: float = 30.0
    handshake_timeout: float = 10.0
    catchup_wait: float = 60.0
    forward_metadata: bool = True
    forward_timeout: float = 10.0


class DownstreamServer:
    def __init__(self, relay_log: RelayLog, settings: DownstreamSettings,
                 upstream_version: Callable[[], str] = lambda: "",
                 rules: Rules = NO_RULES,
                 upstream: Callable[[], Upstream | None] = lambda: None,
                 forwarder: Callable[[str, float, str], Awaitable[Rows | Err]] | None = None,
                 ) -> None:
        self.log = relay_log
        self.settings = settings
        self.rules = rules
        # Send rules run here, off the event loop (one thread per core is plenty: the
        # work is Python, and hooks wait on nothing).
        self.rules_executor = ThreadPoolExecutor(max_workers=4,
                                                 thread_name_prefix="relay-rules")
        self.relay_server_id = settings.server_id
        self.users = {name: native_password_hash(pw.encode())
                      for name, pw in settings.users.items()}
        self._upstream_version = upstream_version
        self.sessions: set[ClientSession] = set()
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self.forwarder = forwarder
        self.answers = Answers(relay_log, server_id=settings.server_id,
                               version=self.version, replicas=self.replicas,
                               processes=self.processes,
                               upstream=upstream, port=settings.port,
                               hostname=socket.gethostname(),
                               forward_metadata=settings.forward_metadata)
        self.rejected = 0
        self.accepted = 0

    def version(self) -> str:
        """The primary's version, so replicas see the flavour they expect."""
        if self.log.fde is not None:
            return decode_fde(self.log.fde).server_version
        return self._upstream_version().removeprefix("5.5.5-") or "10.11.0-MariaDB-relay"

    def greeting_version(self) -> str:
        v = self.version()
        # MariaDB servers prefix 5.5.5- for old clients; MariaDB clients strip it again.
        return f"5.5.5-{v}" if "mariadb" in v.lower() else v

    def processes(self) -> list[Process]:
        now = time.monotonic()
        return [Process(s.conn_id, s.user, s.peer, s.vars.database,
                        "Binlog Dump" if s.dump is not None else "Sleep",
                        int(now - s.command_since),
                        "Master has sent all binlog to slave; waiting for more updates"
                        if s.dump is not None else None)
                for s in self.sessions if s.user]

    def replicas(self) -> list[Replica]:
        return [s.replica for s in self.sessions if s.replica is not None and s.dump]

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.settings.host, self.settings.port, limit=1 << 20)
        log.info("serving replicas on %s:%d", self.settings.host, self.port)

    async def close(self) -> None:
        self.rules_executor.shutdown(wait=False, cancel_futures=True)
        if self._server is not None:
            self._server.close()
        for s in list(self.sessions):
            if s.task is not None:
                s.task.cancel()
        for s in list(self.sessions):
            if s.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await s.task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.sessions) >= self.settings.max_clients:
            self.rejected += 1
            data, _ = frame(build_err(1040, "Too many connections", "08004"), 0)
            writer.write(data)
            writer.transport.abort()
            return
        self.accepted += 1
        writer.transport.set_write_buffer_limits(high=1 << 20)
        session = ClientSession(self, reader, writer, next(self._ids))
        # Its own task, so that reaping or shutdown cancels the session and not the
        # stream server's callback.
        session.task = asyncio.create_task(session.run(), name=f"client-{session.conn_id}")
        self.sessions.add(session)
        try:
            await asyncio.wait({session.task})
        finally:
            self.sessions.discard(session)

    async def forward(self, sql: str, charset: str) -> Rows | Err:
        """A read-only metadata statement, answered by the primary in the client's
        character set."""
        if self.forwarder is None:
            return Err(2013, "relay has no primary to forward this to", "HY000")
        return await self.forwarder(sql, self.settings.forward_timeout, charset)

    def kill(self, conn_id: int, query_only: bool) -> Ok | Err:
        """KILL [CONNECTION | QUERY] id: a client's connection (a dump ends with it)."""
        for s in self.sessions:
            if s.conn_id == conn_id and s.task is not None:
                if query_only and s.dump is None:
                    return Ok()  # nothing runs long on a relay connection but a dump
                log.info("%s: killed by KILL %d", s, conn_id)
                s.task.cancel()
                return Ok()
        return Err(1094, f"Unknown thread id: {conn_id}", "HY000")

    async def reap(self, server_id: int, keep: ClientSession) -> None:
        """A replica reconnected: end its older dump session (a "zombie" dump)."""
        for s in list(self.sessions):
            if s is not keep and s.dump is not None and s.replica is not None \
                    and s.replica.server_id == server_id and s.task is not None:
                log.info("%s: replaced by a new connection with the same server_id", s)
                s.task.cancel()
