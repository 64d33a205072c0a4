#!/usr/bin/env python3
"""How fast each client library reads a table's rows into the process: the ways past
PyMySQL's pure-Python parsing for the snapshot's reads (issue 33).

    pip install mysqlclient connectorx   # the contenders (not relay dependencies;
                                         # mysqlclient builds against libmariadb-dev)
    python bench/snapshot_readers.py [--rows 1000000] [--chunk-rows 65536]

Fills bench.orders on a sandbox MariaDB primary (tap_spark.py's table: INT key, INT,
VARCHAR(40), DECIMAL(12,2), DATETIME) and reads it in primary-key chunks, the snapshot's
query shape, each reader in its own process, alternating, best of --repeat:

  pymysql      PyMySQL, streaming cursor, conversions off (the server's text as bytes):
               what relay/tap/snapshot.py does today
  mysqlclient  the C client (MySQLdb), streaming cursor, conversions off (bytes)
  connectorx   connectorx.read_sql into an Arrow table (Rust; typed columns)
  relay        relay's reader: PyMySQL's connection (login policy, TLS), the rows parsed
               in blocks by the text_rows kernel (relay/tap/textresult.py), as bytes
  pymysql-json the JSON images of the rows, as the executors wrote them before the
               kernels: PyMySQL's rows, then the generated writer (json_row_writer)
  relay-json   the JSON images as the executors write them now: json_text_rows

It prints rows/s per reader and the reader process's CPU seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.tap_spark import fill
from relay.testing.mariadb import MariaDB

_READER = r"""
import os, resource, sys, time
import pymysql, pymysql.cursors
name, port, user, password, rows, chunk = sys.argv[1:7]
port, rows, chunk = int(port), int(rows), int(chunk)
query = ("SELECT id, k, note, amount, at FROM bench.orders WHERE id > {lo} AND id <= {hi} "
         "ORDER BY id")
t0 = time.perf_counter()
got = 0
if name == "pymysql":
    import pymysql, pymysql.cursors
    from pymysql.converters import encoders
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password,
                           use_unicode=False, conv=dict(encoders))  # (no decoders)
    for lo in range(0, rows, chunk):
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(query.format(lo=lo, hi=lo + chunk))
            while batch := cur.fetchmany(1000):
                got += len(batch)
elif name in ("relay", "relay-json", "pymysql-json"):
    # relay's own reader: PyMySQL's connection (login, TLS), the rows by the kernels
    sys.path.insert(0, os.getcwd())
    from relay.tap.json_images import JsonImages
    from relay.tap.snapshot import SourceSpec, describe, json_row_writer, json_text_plan
    source = SourceSpec.parse(f"mysql://{user}:{password}@127.0.0.1:{port}?ssl-mode=DISABLED",
                              default_address=None, user=None, password=None,
                              password_env=None)
    conn = source.connect()
    spec = describe(conn, "bench", "orders")
    plan, write = json_text_plan(spec), json_row_writer(spec)
    for lo in range(0, rows, chunk):
        sql = query.format(lo=lo, hi=lo + chunk)
        if name == "pymysql-json":  # the executor's JSON path before the kernels
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(sql)
                while batch := cur.fetchmany(4096):
                    got += len(list(map(write, batch)))
            continue
        result = conn.text_result(sql, (), "bench")
        if name == "relay":
            for batch in result.rows():
                got += len(batch)
        else:
            images = JsonImages()
            while n := result.json_into(images, *plan, write, 8192):
                got += n
                if len(images) >= 8192:
                    images.array()
elif name == "mysqlclient":
    import MySQLdb, MySQLdb.cursors
    conn = MySQLdb.connect(host="127.0.0.1", port=port, user=user, password=password,
                           conv={}, use_unicode=False)
    for lo in range(0, rows, chunk):
        cur = conn.cursor(MySQLdb.cursors.SSCursor)
        cur.execute(query.format(lo=lo, hi=lo + chunk))
        while batch := cur.fetchmany(1000):
            got += len(batch)
        cur.close()
elif name == "connectorx":
    import connectorx as cx
    url = f"mysql://{user}:{password}@127.0.0.1:{port}/bench"
    for lo in range(0, rows, chunk):
        got += cx.read_sql(url, query.format(lo=lo, hi=lo + chunk), return_type="arrow").num_rows
took = time.perf_counter() - t0
use = resource.getrusage(resource.RUSAGE_SELF)
print(got, took, use.ru_utime + use.ru_stime)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-rows", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-readers-")
    server = MariaDB(base_dir=os.path.join(work, "primary"))
    try:
        server.start()
        fill(server, args.rows)
        server.execute_many([f"GRANT SELECT ON bench.* TO '{server.repl_user}'@'%'"])
        names = ["pymysql", "relay", "mysqlclient", "connectorx", "pymysql-json", "relay-json"]
        best: dict[str, tuple[float, float]] = {}
        for i in range(args.repeat):
            for name in names:
                res = subprocess.run([sys.executable, "-c", _READER, name, str(server.port),
                                      server.repl_user, server.repl_password,
                                      str(args.rows), str(args.chunk_rows)],
                                     capture_output=True, text=True)
                if res.returncode:
                    print(f"  {name}: failed: {res.stderr.strip()[-300:]}", flush=True)
                    continue
                got, took, cpu = res.stdout.split()
                if int(got) != args.rows:
                    raise SystemExit(f"{name} read {got} rows, not {args.rows}")
                print(f"  round {i + 1}: {name:12s} {float(took):6.2f} s, "
                      f"CPU {float(cpu):5.2f} s", flush=True)
                if name not in best or float(took) < best[name][0]:
                    best[name] = (float(took), float(cpu))
        print(f"\n{'reader':14s}{'rows/s':>12s}{'CPU s':>8s}")
        for name, (took, cpu) in best.items():
            print(f"{name:14s}{args.rows / took:12,.0f}{cpu:8.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
