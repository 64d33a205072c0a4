"""The relay as a semi-synchronous primary for its replicas (replication-protocol.md 9).

A client that sets `@rpl_semi_sync_slave = 1` before its dump gets every event packet as
`0x00, 0xEF, flag, event`; with `[downstream] semi_sync` on, the flag asks for an
acknowledgement (0x01) on the event that ends each transaction, and the replica answers
on the same socket with a packet of its own: `0xEF, int<8> end position, file name`.

`SemiSyncPrimary` (one per downstream server) keeps what the relay reports as a semi-sync
primary: `Rpl_semi_sync_master_clients`, `_yes_tx` (transactions acknowledged, each counted
once whichever replica acknowledged it first) and `_no_tx` (transactions a semi-sync
replica was asked to acknowledge and no replica did before it went away). `ReplicaAcks`
is one dump's part: the positions it asked about and the acknowledgements it read.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from relay.binlog.position import LogPosition
from relay.errors import RemoteProtocolError
from relay.relaylog.naming import segment_number
from relay.relaylog.replica_acks import ReplicaAckBoard
from relay.wire.dumpstream import SEMI_SYNC_MAGIC

_ACK_POS = struct.Struct("<Q")


def parse_ack(payload: bytes) -> tuple[str, int]:
    """A replica's acknowledgement packet: (segment name, end position)."""
    if len(payload) < 9 or payload[0] != SEMI_SYNC_MAGIC:
        raise RemoteProtocolError(f"not a semi-sync acknowledgement: {payload[:16].hex()}")
    name = payload[9:].decode("utf-8", "replace")
    try:
        segment_number(name)
    except ValueError:
        raise RemoteProtocolError(f"a semi-sync acknowledgement of {name!r}, which is no "
                                  "segment of the relay's") from None
    return name, _ACK_POS.unpack_from(payload, 1)[0]


@dataclass
class SemiSyncPrimary:
    enabled: bool = False         # [downstream] semi_sync: ask replicas for acknowledgements
    board: ReplicaAckBoard | None = None  # the relay log's: where acknowledgements go
    clients: int = 0              # dumps with semi-sync negotiated, now
    yes_tx: int = 0
    no_tx: int = 0
    acks: int = 0                 # acknowledgement packets read, all replicas
    refused_acks: int = 0         # of positions beyond what was sent to that replica
    acked: LogPosition = (0, 0)      # the furthest position any replica acknowledged

    def open(self, key: int = 0) -> ReplicaAcks:
        """A dump with semi-sync negotiated begins (`key`: its connection id)."""
        self.clients += 1
        return ReplicaAcks(self, key)

    def status(self) -> dict[str, str]:
        """The semi-sync status variables a primary shows, as the relay's own, under
        MariaDB's (and MySQL's old plugin's) names and MySQL 8.0.26+'s."""
        out = {}
        for prefix in ("Rpl_semi_sync_master_", "Rpl_semi_sync_source_"):
            out.update({
                f"{prefix}status": "ON" if self.enabled else "OFF",
                f"{prefix}clients": str(self.clients),
                f"{prefix}yes_tx": str(self.yes_tx),
                f"{prefix}no_tx": str(self.no_tx),
            })
        return out


class ReplicaAcks:
    """One semi-sync dump: what it was asked to acknowledge, what it acknowledged."""

    def __init__(self, primary: SemiSyncPrimary, key: int = 0) -> None:
        self.primary = primary
        self.key = key
        self.pending: deque[LogPosition] = deque()
        self.requested = 0
        self.acks = 0
        self.refused = 0          # acknowledgements of positions it was never sent
        self.last_ack = ""        # "file:position" of the last acknowledgement
        self.sent: LogPosition = (0, 0)   # the furthest transaction end it was asked about
        self.closed = False
        self.on_board = True      # its positions are the relay log's (no send rules)

    @property
    def ask(self) -> bool:
        """Whether transaction ends ask this replica for an acknowledgement."""
        return self.primary.enabled

    def request(self, segment: str, end: int) -> None:
        at = (segment_number(segment), end)
        self.pending.append(at)
        self.sent = max(self.sent, at)
        self.requested += 1

    def acknowledged(self, name: str, end: int) -> None:
        """An acknowledgement read from the replica (as `parse_ack` gives it): every
        transaction it was asked about up to that position is acknowledged."""
        primary = self.primary
        at = (segment_number(name), end)
        if at > self.sent:
            # No replica can have received what was never sent to it: a forged or broken
            # acknowledgement must not count toward semi_sync_wait_for_replicas.
            self.refused += 1
            primary.refused_acks += 1
            return
        self.acks += 1
        self.last_ack = f"{name}:{end}"
        primary.acks += 1
        pending = self.pending
        while pending and pending[0] <= at:
            if pending.popleft() > primary.acked:
                primary.yes_tx += 1
        primary.acked = max(primary.acked, at)
        if primary.board is not None and self.on_board:
            primary.board.report(self.key, at)

    def holds(self, name: str, end: int) -> None:
        """The replica already holds every transaction up to here (a MySQL replica's
        GTID set: they were skipped, not sent): for the relay's own acknowledgement it
        counts as acknowledged, as MySQL's dump thread reports skipped events."""
        at = (segment_number(name), end)
        self.sent = max(self.sent, at)
        primary = self.primary
        if primary.board is not None and self.on_board:
            primary.board.report(self.key, at)

    def close(self) -> None:
        """The dump ended: what it still owed and no other replica acknowledged is no_tx."""
        if self.closed:
            return
        self.closed = True
        primary = self.primary
        primary.clients -= 1
        primary.no_tx += sum(1 for p in self.pending if p > primary.acked)
        self.pending.clear()
        if primary.board is not None:
            primary.board.forget(self.key)
