"""The upstream: connect to a primary as a replica and feed its binlog into the relay log."""
