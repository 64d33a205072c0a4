"""What one client set in its session (user and system variables, database, character
set): what the relay's answers and its dumps read of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.binlog.charsets import charset_name


@dataclass
class SessionVars:
    """What one client SET in its session."""

    user_vars: dict[str, str | None] = field(default_factory=dict)
    system: dict[str, str] = field(default_factory=dict)   # SET @@session.x / SET x
    database: str | None = None
    connection_id: int = 0
    user: str = ""          # the account and the client's host, for USER() / CURRENT_USER()
    host: str = ""
    admin: bool = False     # the account's `admin`: it sees and may KILL every connection
    collation: int = 33     # the connection's collation: the handshake's, then SET NAMES
    tls_cipher: str = ""    # SHOW STATUS LIKE 'Ssl_cipher' (empty: a plain connection)
    tls_version: str = ""

    @property
    def charset(self) -> str:
        """The connection's character set name (what metadata look-ups run in)."""
        return charset_name(self.collation) or "utf8mb4"

    @property
    def checksum(self) -> str | None:
        return self.user_vars.get("master_binlog_checksum") or self.user_vars.get(
            "source_binlog_checksum")

    @property
    def heartbeat_ns(self) -> int:
        raw = self.user_vars.get("master_heartbeat_period") or self.user_vars.get(
            "source_heartbeat_period") or "0"
        try:
            return int(float(raw))
        except ValueError:
            return 0

    @property
    def capability(self) -> int:
        try:
            return int(self.user_vars.get("mariadb_slave_capability") or 0)
        except ValueError:
            return 0

    @property
    def semi_sync_slave(self) -> bool:
        """The client asked for semi-sync framing (`SET @rpl_semi_sync_slave = 1`)."""
        value = self.user_vars.get("rpl_semi_sync_slave") or self.user_vars.get(
            "rpl_semi_sync_replica")
        return value not in (None, "", "0")
