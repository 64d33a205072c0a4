"""Example hook: a replica whose table has another name.

The replica keeps `shop.orders` as `shop.orders_v2`. Rows events of the table are sent
under the new name (the table map is renamed), and statements that name the table
(DDL: ALTER TABLE orders ..., TRUNCATE shop.orders) are rewritten to the new name.

    [[rules]]
    name = "orders-v2"
    at = "send"
    clients = ["reporting"]          # the replica's login
    hook = "examples/hooks/renamed_table.py"

Edit RENAMES for your tables. Names inside a statement are matched as whole words, bare
(`orders`, when the statement runs in the schema) or qualified (`shop.orders`, with or
without backquotes).
"""

from __future__ import annotations

import re
from typing import Any

RENAMES = {("shop", "orders"): "orders_v2"}


def _pattern(schema: str, table: str) -> re.Pattern[str]:
    q = r"`?"
    return re.compile(rf"(?<![\w`.])(?:{q}{re.escape(schema)}{q}\.)?{q}{re.escape(table)}{q}"
                      r"(?![\w`])", re.IGNORECASE)


_PATTERNS = {key: (_pattern(*key), new) for key, new in RENAMES.items()}


def send(event: Any, ctx: Any) -> Any:
    if event.kind == "query":
        text = event.statement
        for (schema, _table), (pattern, new) in _PATTERNS.items():
            if schema != event.schema and f"{schema}." not in text.lower():
                continue
            text = pattern.sub(lambda m, s=schema, n=new: f"`{s}`.`{n}`"
                               if "." in m.group(0) else f"`{n}`", text)
        return event if text == event.statement else event.replace(text=text)
    new_name = RENAMES.get((event.schema, event.table))
    if new_name is None:
        return event
    return event.replace(table=new_name)
