"""Queries to a primary (not its dump stream): one client for the upstream's control
queries, the metadata forwarder and, next, the tap's snapshot reads."""
