"""relay: an asyncio MySQL/MariaDB replication relay (a binlog server)."""

__version__ = "0.1.0"
