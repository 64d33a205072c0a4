"""Example hook: tag and count events per table.

Counts every event that goes to a client by table and kind, as the metric
`relay_hook_events_total{hook, table, kind}` in /metrics, and tags each statement with a
comment saying which client received it through which relay (the comment shows in the
replica's binlog and in SHOW PROCESSLIST while the statement runs):

    [[rules]]
    name = "count"
    at = "send"
    hook = "examples/hooks/count_by_table.py"

Tables are a bounded set (the schema), so they make a safe label; never label by row
values.
"""

from __future__ import annotations

from typing import Any


def send(event: Any, ctx: Any) -> Any:
    table = f"{event.schema}.{event.table}" if event.table else event.schema or "(none)"
    ctx.counter("events", table=table, kind=event.kind).inc()
    if event.kind == "query":
        return event.replace(text=f"/* relay: {ctx.client or 'client'} */ {event.statement}")
    return event


def receive(event: Any, ctx: Any) -> Any:
    """The same count for what the relay stores (no tag: the relay log keeps statements
    as the primary wrote them)."""
    table = f"{event.schema}.{event.table}" if event.table else event.schema or "(none)"
    ctx.counter("stored", table=table, kind=event.kind).inc()
    return event
