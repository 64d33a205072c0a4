"""The relay as a primary: an asyncio server for replicas and replication clients."""
