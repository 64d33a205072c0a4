"""START SLAVE UNTIL master_gtid_pos, the primary's side (MariaDB).

A MariaDB replica with a GTID UNTIL condition sets @slave_until_gtid before its GTID dump
and relies on the primary to stop: the primary sends each listed domain's groups up to and
including that domain's GTID, skips the groups of domains not listed (or already
reached), and once every domain is reached ends the group in progress, sends a GTID_LIST
flagged "until reached" and ends the dump (EOF). The replica's IO thread stops on that
event, and its SQL thread once it has applied everything before it. Rules, as MariaDB's
dump thread has them (sql/sql_repl.cc):

- a group of the domain with the UNTIL GTID's server id and a number at or past it
  reaches the domain; a number past it (the GTID itself is not in the log) is skipped;
- a group of another server id in the domain is sent and reaches nothing;
- a domain reached before the dump's start is dropped at once; with none left, the dump
  ends right after its header. The primary reads the start file's GTID_LIST (each
  server's last GTID of each domain) and every group it skips before the replica's
  position by the same rule as later groups: so an UNTIL GTID of server 1 is reached
  before a start at `0-2-50` when server 1's `0-1-30` is behind it, though the start
  names server 2 (`GtidStart.passed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from relay.binlog.gtid import Gtid, GtidState

# In a GTID_LIST's count field: the UNTIL position is reached (MariaDB's
# Gtid_list_log_event::FLAG_UNTIL_REACHED).
FLAG_UNTIL_REACHED = 1 << 28


class StopAfter(Enum):
    STANDALONE = "standalone"    # the last reaching group is a lone statement
    TRANSACTION = "transaction"  # ... a transaction: its XID or COMMIT ends it


class UntilGtid:
    def __init__(self, until: GtidState, passed: Iterable[Gtid]) -> None:
        """`passed`: the GTIDs before the dump's start (GtidStart.passed), in order."""
        self.pending = {g.domain: g for g in until}
        for g in passed:
            if (mine := self.pending.get(g.domain)) is not None \
                    and g.server_id == mine.server_id and g.seq >= mine.seq:
                del self.pending[g.domain]
        self.stop_after: StopAfter | None = None if self.pending else StopAfter.STANDALONE

    @property
    def reached(self) -> bool:
        """Every domain reached: the dump ends after the group in progress."""
        return self.stop_after is not None

    def admits(self, g: Gtid, standalone: bool) -> bool:
        """Whether the group `g` opens is sent (and note the domain it reaches)."""
        until = self.pending.get(g.domain)
        if until is None:
            return False  # a domain the replica did not list, or one already reached
        if g.server_id != until.server_id or g.seq < until.seq:
            return True
        del self.pending[g.domain]
        if not self.pending:
            self.stop_after = StopAfter.STANDALONE if standalone else StopAfter.TRANSACTION
        return g.seq == until.seq
