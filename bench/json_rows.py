"""MySQL JSON columns decoded to Python values: the binary JSON kernel (json_document)
compiled against its pure-Python twin, and rows of a table with a JSON column through
the row codec's generated decoder against the row_values kernel.

    python bench/json_rows.py [--rows 20000] [--runs 5]

The documents are what an orders table holds (an object of a dozen keys: strings,
numbers, a nested address, an array of line items), encoded as MySQL's serializer
encodes them (relay/binlog/jsonb.py, checked against captured server bytes in the unit
tests). Each figure is the best of --runs. Rows:

  generated + pure JSON      the row codec's generated decoder, documents by the pure twin
                             (what a table with a JSON column cost before the compiled
                             json_document)
  generated + compiled JSON  the generated decoder, documents by the compiled kernel
  row_values                 the row_values kernel (CALL step for the JSON column)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import relay.kernels as kernels
from relay.binlog import jsonb
from relay.binlog.describe import ColumnDescription, table_map
from relay.binlog.plans import values_steps
from relay.binlog.rowcodec import RowCodec
from relay.kernels import pure


def document(i: int) -> dict[str, Any]:
    return {"order": i, "customer": f"customer-{i % 977}",
            "status": ("new", "paid", "sent")[i % 3],
            "total": Decimal(i % 10000) / 100, "paid": i % 2 == 0, "weight": i / 7,
            "address": {"street": f"{i % 300} Rue de la Paix", "city": "Zürich",
                        "zip": f"{i % 9999:04d}"},
            "items": [{"sku": f"SKU-{(i + k) % 5000}", "qty": 1 + k, "price": 9.99 * (k + 1)}
                      for k in range(1 + i % 4)],
            "note": None if i % 5 else "leave at the door"}


def best(runs: int, work: Callable[[], int]) -> float:
    """The best items per second of `runs` runs of `work` (which returns its items)."""
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = work()
        rates.append(n / (time.perf_counter() - t0))
    return max(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    compiled = kernels.compiled_kernels()
    if compiled is None or kernels.IMPLEMENTATION is not kernels.Implementation.COMPILED:
        raise SystemExit(f"the compiled kernels are not loaded: {kernels.REASON}")
    docs = [jsonb.encode(document(i)) for i in range(args.rows)]
    print(f"{args.rows} documents, {sum(map(len, docs)) / len(docs):.0f} bytes on average; "
          f"best of {args.runs}")

    def documents(twin: Any) -> Callable[[], int]:
        def run() -> int:
            for raw in docs:
                twin.json_document(raw, jsonb.JsonUInt, jsonb.decode_opaque,
                                   jsonb.json_decimal)
            return len(docs)
        return run

    pure_docs = best(args.runs, documents(pure))
    compiled_docs = best(args.runs, documents(compiled))
    print(f"\njson_document, documents/s: pure {pure_docs:,.0f}, compiled {compiled_docs:,.0f} "
          f"({compiled_docs / pure_docs:.1f}x)")

    columns = [ColumnDescription("id", "bigint", "bigint(20)", False, 19, 0, None, None, None),
               ColumnDescription("doc", "json", "json", True, None, None, None, None, None),
               ColumnDescription("at", "datetime", "datetime(6)", False, None, None, 6, None,
                                 None),
               ColumnDescription("qty", "int", "int(11)", False, 10, 0, None, None, None)]
    table = table_map("shop", "orders", columns, ["id"], mariadb=False)
    codec = RowCodec(table, range(len(columns)))
    start = datetime(2026, 1, 1)
    values = [[i, jsonb.decode(docs[i]), start + timedelta(seconds=i), i % 100]
              for i in range(args.rows)]
    # rows events of 50 rows each (what a server writes for a multi-row INSERT of small
    # documents); each event's images are kept until the next, as a reader keeps them
    encoded = [codec.encode(v) for v in values]
    events = [b"".join(encoded[i : i + 50]) for i in range(0, len(encoded), 50)]
    steps = values_steps(table)
    assert steps is not None and codec.values_plan is not None
    plan, charmaps, members, calls = steps

    def generated() -> int:
        n, decode = 0, codec.decoder
        for data in events:
            p = 0
            out: list[tuple[Any, ...]] = []
            while p < len(data):
                image, p = decode(data, p)
                out.append(image)
            n += len(out)
        return n

    def by_kernel() -> int:
        n = 0
        for data in events:
            out: list[tuple[Any, ...]] = []
            n += kernels.row_values(data, 0, len(data), plan, charmaps, members, 1, out,
                                    codec.image, calls)
        assert n == args.rows
        return n

    chosen = kernels.json_document
    jsonb_module: Any = kernels  # (jsonb calls kernels.json_document: the pure twin for one run)
    jsonb_module.json_document = pure.json_document
    try:
        before = best(args.runs, generated)
    finally:
        jsonb_module.json_document = chosen
    after = best(args.runs, generated)
    kernel = best(args.runs, by_kernel)
    print("\nrows/s of (BIGINT, JSON, DATETIME(6), INT), decoding alone, 50 rows an event:")
    print(f"  generated + pure JSON      {before:>12,.0f}")
    print(f"  generated + compiled JSON  {after:>12,.0f}  ({after / before:.1f}x)")
    print(f"  row_values                 {kernel:>12,.0f}  ({kernel / before:.1f}x)")


if __name__ == "__main__":
    main()
