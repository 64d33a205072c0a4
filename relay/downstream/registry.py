"""The downstream sessions: who is connected, what each is doing, and how sessions end.

The registry owns the set of sessions and their tasks. KILL, a replica reconnecting with
the same server_id (its old dump is reaped) and shutdown end a session through it: the
reason is recorded on the session first, then its task is cancelled, and the session logs
one line saying how it ended. `snapshot()` is what /status and /metrics read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from relay.downstream.replies import Err, Ok, Process, Replica

log = logging.getLogger("relay.downstream")


class EndReason(Enum):
    """How a downstream session ended."""

    QUIT = "quit"                       # COM_QUIT
    CLIENT_GONE = "client gone"         # EOF or a reset on its socket
    KILLED = "killed"                   # KILL on the relay's SQL port
    REPLACED = "replaced"               # a newer dump with the same server_id
    SHUTDOWN = "shutdown"               # the relay stops
    DUMP_FINISHED = "dump finished"     # a non-blocking dump reached the end
    DUMP_REFUSED = "dump refused"       # a start position the relay cannot serve
    STREAM_STOPPED = "stream stopped"   # a send rule failed on this stream
    REFUSED = "refused"                 # access denied, no TLS
    TIMEOUT = "timeout"                 # handshake or write timeout
    PROTOCOL = "protocol error"         # the client broke the protocol
    ERROR = "error"                     # a fault of the relay's (logged with a traceback)


@dataclass(frozen=True)
class DumpView:
    segment: str
    position: int
    bytes_sent: int
    last_ts: int


@dataclass(frozen=True)
class SessionInfo:
    conn_id: int
    peer: str
    user: str
    db: str | None
    replica: Replica | None
    dump: DumpView | None
    command_since: float          # monotonic: when the current command began
    state: str = ""               # what a dump does: waiting for the relay, streaming
    semi_sync: AckView | None = None  # a dump with semi-sync negotiated
    tls: str = ""                 # the TLS version of an encrypted connection


@dataclass(frozen=True)
class AckView:
    requested: int                # transaction ends it was asked to acknowledge
    acks: int                     # acknowledgements it sent
    last_ack: str                 # "file:position"
    refused: int = 0              # acknowledgements of what it was never sent


@dataclass(frozen=True)
class Ended:
    """A replica's session that ended: which, how, and where its dump stood."""

    conn_id: int
    user: str
    server_id: int
    reason: EndReason
    segment: str | None           # where its dump stood (None: it never started one)
    position: int | None
    bytes_sent: int
    at: float                     # time.time() when it ended


RECENT_ENDINGS = 32               # replicas' endings /status lists, the newest last


class Member(Protocol):
    """What the registry needs of a session."""

    @property
    def conn_id(self) -> int: ...

    def info(self) -> SessionInfo: ...

    def stopping(self, reason: EndReason, detail: str) -> None:
        """The registry is about to cancel the session, for this reason."""
        ...

    @property
    def end_reason(self) -> EndReason | None: ...


class SessionRegistry:
    def __init__(self) -> None:
        self._members: dict[int, tuple[Member, asyncio.Task[None]]] = {}
        self.ended: dict[EndReason, int] = dict.fromkeys(EndReason, 0)
        self.recent_ended: deque[Ended] = deque(maxlen=RECENT_ENDINGS)  # replicas' only
        self.accepted = 0
        self.rejected = 0
        self.kills_refused = 0   # KILLs of another user's connection by a non-admin
        # semi-sync acknowledgements of the sessions that ended, by server id (a replica's
        # count goes on across its reconnects: a counter that never goes down)
        self.ended_acks: dict[int, int] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._members)

    def connections_of(self, user: str) -> int:
        """Logged-in sessions of `user` (a user's max_connections)."""
        return sum(1 for member, _ in self._members.values() if member.info().user == user)

    def add(self, member: Member, task: asyncio.Task[None]) -> None:
        self.accepted += 1
        self._members[member.conn_id] = (member, task)
        if self._closed:  # accepted just before the listener stopped: ends at once
            member.stopping(EndReason.SHUTDOWN, "")
            # once it runs (queued after its first step), so it closes its connection
            asyncio.get_running_loop().call_soon(task.cancel, EndReason.SHUTDOWN.value)

    def discard(self, member: Member, *, failed: bool = False) -> None:
        """The session's task is done. `failed`: it raised (a fault of the relay's that
        the session did not handle itself), counted as an ERROR ending."""
        if self._members.pop(member.conn_id, None) is None:
            return
        reason = EndReason.ERROR if failed else member.end_reason or EndReason.CLIENT_GONE
        self.ended[reason] += 1
        info = member.info()
        if info.replica is not None and info.semi_sync is not None:
            sid = info.replica.server_id
            self.ended_acks[sid] = self.ended_acks.get(sid, 0) + info.semi_sync.acks
        if info.replica is not None:
            dump = info.dump
            self.recent_ended.append(Ended(
                info.conn_id, info.user, info.replica.server_id, reason,
                dump.segment if dump else None, dump.position if dump else None,
                dump.bytes_sent if dump else 0, time.time()))

    def _stop(self, conn_id: int, reason: EndReason, detail: str) -> bool:
        entry = self._members.get(conn_id)
        if entry is None:
            return False
        member, task = entry
        member.stopping(reason, detail)
        task.cancel(reason.value)
        return True

    def kill(self, conn_id: int, *, query_only: bool, by: str,
             owner: str | None = None) -> Ok | Err:
        """KILL [CONNECTION | QUERY] id: a client's connection (a dump ends with it).
        `owner`: only a connection of that user may be killed (None: any)."""
        entry = self._members.get(conn_id)
        if entry is None:
            return Err(1094, f"Unknown thread id: {conn_id}", "HY000")
        if owner is not None and entry[0].info().user != owner:
            self.kills_refused += 1
            return Err(1095, f"You are not owner of thread {conn_id}", "HY000")
        if query_only and entry[0].info().dump is None:
            return Ok()  # nothing runs long on a relay connection but a dump
        self._stop(conn_id, EndReason.KILLED, f"KILL {conn_id} from {by}")
        return Ok()

    def reap(self, server_id: int, keep: int) -> None:
        """A replica reconnected: end its older dump session (a "zombie" dump)."""
        for member, _ in list(self._members.values()):
            info = member.info()
            if info.conn_id != keep and info.dump is not None and info.replica is not None \
                    and info.replica.server_id == server_id:
                self._stop(info.conn_id, EndReason.REPLACED,
                           f"a new connection (id {keep}) dumps with the same server_id")

    async def close(self) -> None:
        """Shutdown: end every session and wait for each to finish. A session added later
        (its connection was accepted before the listener stopped) is ended as it comes."""
        self._closed = True
        tasks = []
        for conn_id, (_, task) in list(self._members.items()):
            self._stop(conn_id, EndReason.SHUTDOWN, "")
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks)

    # --- views --------------------------------------------------------------------------------

    def snapshot(self) -> list[SessionInfo]:
        return sorted((m.info() for m, _ in self._members.values()), key=lambda i: i.conn_id)

    def replicas(self) -> list[Replica]:
        return [i.replica for i in self.snapshot() if i.replica is not None and i.dump]

    def processes(self) -> list[Process]:
        now = time.monotonic()
        return [Process(i.conn_id, i.user, i.peer, i.db,
                        "Binlog Dump" if i.dump is not None else "Sleep",
                        int(now - i.command_since),
                        "Master has sent all binlog to slave; waiting for more updates"
                        if i.dump is not None else None)
                for i in self.snapshot() if i.user]
