"""Durable storage: binlog-format segments, index, GTID index, recovery and cursors."""
