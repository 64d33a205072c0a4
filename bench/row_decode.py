"""Rows per second decoded to Python values: relay's row codec vs python-mysql-replication,
the same events from the same primary.

    pip install mysql-replication     # the contender (not a relay dependency)
    python bench/row_decode.py [--rows 100000] [--runs 3] [--server mysql-9.7]

Starts a sandbox MariaDB 10.11 primary (binlog_row_metadata=FULL; `--server mysql-9.7`: a
MySQL 9.7 primary from its Debian root, scripts/build-roots, with one more family: MySQL's
binary JSON documents and a POINT), fills one table per type family with server-generated
rows (one statement per 1000 rows), and reads the inserts back three ways, each timed
separately:

  relay/file   relay's file:// source and change stream over the primary's binlog file
  relay/live   relay's mysql:// source: the replica protocol plus decoding
  pymysqlrepl  python-mysql-replication's BinLogStreamReader over the replica protocol

Every value of every row is materialised (relay: the decoded tuples; pymysqlrepl: its
`rows` list). Per type family it also times the decoding alone: relay's RowsEvent.rows()
against python-mysql-replication's `rows` property, the same work on the same events.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from collections import Counter
from collections.abc import Callable

from relay.binlog.changes import RowsStatement
from relay.sources import open_source
from relay.testing.builds import build
from relay.testing.mariadb import MariaDB

FAMILIES = {
    "ints": ("a TINYINT, b SMALLINT, c MEDIUMINT, d INT, e BIGINT, f INT UNSIGNED, "
             "g BIGINT UNSIGNED, h YEAR",
             "seq % 100, seq % 30000, seq * 7, seq * 1000, seq * 100000000, seq, seq * 3, "
             "1901 + seq % 200"),
    "decimals": ("a DECIMAL(10,2), b DECIMAL(20,6), c DECIMAL(65,30), d DOUBLE, e FLOAT",
                 "seq / 7, seq * 1.000001, seq / 3, seq / 11, seq / 13"),
    "temporal": ("a DATE, b DATETIME, c DATETIME(6), d TIMESTAMP(3) NULL, e TIME(2)",
                 "'2024-01-01' + INTERVAL seq % 3000 DAY, "
                 "'2024-01-01' + INTERVAL seq SECOND, "
                 "'2024-01-01' + INTERVAL seq * 1001 MICROSECOND, "
                 "'2024-01-01' + INTERVAL seq * 13 MICROSECOND, "
                 "SEC_TO_TIME(seq % 86400)"),
    "strings": ("a VARCHAR(50) CHARACTER SET utf8mb4, b CHAR(20), "
                "c VARCHAR(255) CHARACTER SET latin1, d TEXT CHARACTER SET utf8mb4",
                "CONCAT('name-', seq, '-é'), LPAD(seq, 12, '0'), REPEAT('x', 40 + seq % 60), "
                "REPEAT('texte ü ', 12)"),
    "mixed": ("name VARCHAR(64) CHARACTER SET utf8mb4, price DECIMAL(12,2), at DATETIME(6), "
              "qty INT, flag TINYINT, state ENUM('new','paid','sent'), note TEXT",
              "CONCAT('customer ', seq), seq / 100, '2024-01-01' + INTERVAL seq SECOND, "
              "seq % 1000, seq % 2, ELT(1 + seq % 3, 'new', 'paid', 'sent'), "
              "REPEAT('n', seq % 200)"),
    "flags": ("a BIT(1), b BIT(12), c BIT(64), d SET('r','w','x','s'), "
              "e SET('a','b','c','d','e','f','g','h','i','j','k','l','m','n','o','p'), f INT",
              "seq % 2, seq % 4096, seq * 1000003, seq % 16, seq % 65536, seq"),
}


# MySQL's own (documents as an orders table holds them, with a nested object and an array)
MYSQL_FAMILIES = {
    "json": ("doc JSON, at POINT",
             "JSON_OBJECT('order', seq, 'customer', CONCAT('customer-', seq % 977), "
             "'status', ELT(1 + seq % 3, 'new', 'paid', 'sent'), 'total', seq / 100, "
             "'paid', seq % 2 = 0, 'address', JSON_OBJECT('street', CONCAT(seq % 300, "
             "' Rue de la Paix'), 'city', 'Zürich'), 'items', JSON_ARRAY(JSON_OBJECT("
             "'sku', CONCAT('SKU-', seq % 5000), 'qty', 1 + seq % 4), JSON_OBJECT('sku', "
             "'SKU-1', 'qty', 2)), 'note', IF(seq % 5, NULL, 'leave at the door')), "
             "POINT(seq % 360, seq % 90)"),
}


def families(server: MariaDB) -> dict[str, tuple[str, str]]:
    return {**FAMILIES, **MYSQL_FAMILIES} if server.mysql else FAMILIES


def fill(server: MariaDB, rows: int) -> str:
    server.execute_many(["FLUSH BINARY LOGS", "CREATE DATABASE bench"])
    with contextlib.closing(server.root("bench")) as conn, conn.cursor() as cur:
        if server.mysql:  # (no sequence engine: a table of the numbers, not logged)
            cur.execute("SET sql_log_bin = 0")
            cur.execute("CREATE TABLE numbers (seq BIGINT PRIMARY KEY)")
            for lo in range(1, rows + 1, 1000):
                cur.execute("INSERT INTO numbers WITH RECURSIVE n(seq) AS (SELECT %s UNION "
                            "ALL SELECT seq + 1 FROM n WHERE seq < %s) SELECT seq FROM n",
                            (lo, min(lo + 999, rows)))
            cur.execute("SET sql_log_bin = 1")
        for name, (cols, exprs) in families(server).items():
            cur.execute(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, {cols})")
            for lo in range(1, rows + 1, 1000):
                hi = min(lo + 999, rows)
                source = f"numbers WHERE seq BETWEEN {lo} AND {hi}" if server.mysql else \
                    f"seq_{lo}_to_{hi}"
                cur.execute(f"INSERT INTO {name} SELECT seq, {exprs} FROM {source}")
            conn.commit()
    return server.binlog_files()[-1]


def timed(label: str, run: Callable[[], Counter[str]]) -> dict[str, float]:
    gc.collect()
    t0 = time.perf_counter()
    counts = run()
    total = time.perf_counter() - t0
    return {"label": label, "seconds": total, **{k: float(v) for k, v in counts.items()}}  # type: ignore[dict-item]


def relay_reader(uri: str, per_family: dict[str, float]) -> Callable[[], Counter[str]]:
    def run() -> Counter[str]:
        counts: Counter[str] = Counter()
        for tx in open_source(uri).transactions():
            for st in tx.statements():
                if not isinstance(st, RowsStatement) or st.table.schema != "bench":
                    continue
                fam = st.table.table
                t0 = time.perf_counter()
                n = 0
                for ch in st.changes():
                    assert ch.after is not None and len(ch.after)
                    n += 1
                per_family[fam] = per_family.get(fam, 0.0) + time.perf_counter() - t0
                counts[fam] += n
        return counts
    return run


def codec_only(path: str) -> dict[str, float]:
    """Seconds in RowsEvent.rows() per family: the codec, nothing around it."""
    from relay.binlog.constants import EventType
    from relay.binlog.decoder import StreamDecoder
    from relay.binlog.file import iter_file_events
    from relay.binlog.rows import ROWS_TYPES

    decoder = StreamDecoder()
    seconds: dict[str, float] = {}
    with open(path, "rb") as f:
        for raw in iter_file_events(f):
            typ = raw.data[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                decoder.format_description(raw.data)
            elif typ == EventType.TABLE_MAP:
                decoder.remember_table_map(raw.data)
            elif typ in ROWS_TYPES:
                rev = decoder.rows_event(raw.data)
                table = decoder.table_for(rev)
                if table.schema != "bench":
                    continue
                t0 = time.perf_counter()
                rev.rows(table, decoder.codecs)
                seconds[table.table] = seconds.get(table.table, 0.0) + time.perf_counter() - t0
    return seconds


def pymysqlrepl_reader(server: MariaDB, log_file: str,
                       per_family: dict[str, float]) -> Callable[[], Counter[str]]:
    import os

    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    # Its non-blocking mode reconnects and starts over at the end of a MariaDB binlog (it
    # sends no file name): read blocking, up to the end position of the filled file.
    end = os.path.getsize(server.binlog_path(log_file))

    def run() -> Counter[str]:
        counts: Counter[str] = Counter()
        stream = BinLogStreamReader(
            connection_settings={"host": "127.0.0.1", "port": server.port,
                                 "user": server.repl_user, "password": server.repl_password},
            server_id=77001, blocking=True, resume_stream=True, log_file=log_file,
            log_pos=4, end_log_pos=end, only_events=[WriteRowsEvent], only_schemas=["bench"],
            freeze_schema=True, enable_logging=False, is_mariadb=not server.mysql)
        try:
            for ev in stream:
                t0 = time.perf_counter()
                rows = ev.rows
                assert all(r["values"] for r in rows)
                per_family[ev.table] = per_family.get(ev.table, 0.0) + time.perf_counter() - t0
                counts[ev.table] += len(rows)
        finally:
            stream.close()
        return counts
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000, help="rows per type family")
    ap.add_argument("--runs", type=int, default=1, help="runs of each reader (the fastest counts)")
    ap.add_argument("--server", default=None,
                    help="a server build (relay/testing/builds.py): mysql-9.7, mariadb-11.8")
    args = ap.parse_args()
    server = MariaDB(options={"max_binlog_size": "1G"}) if args.server is None else \
        MariaDB(build=build(args.server), options={"max_binlog_size": "1G"})
    server.start()
    try:
        server.execute_many([f"GRANT SELECT ON *.* TO '{server.repl_user}'@'%'"])
        t0 = time.perf_counter()
        log_file = fill(server, args.rows)
        print(f"filled {len(families(server))} tables x {args.rows} rows in "
              f"{time.perf_counter() - t0:.1f}s; binlog {log_file}")
        decode: dict[str, dict[str, float]] = {"relay/file": {}, "relay/live": {},
                                               "pymysqlrepl": {}}
        codec = min((codec_only(server.binlog_path(log_file)) for _ in range(3)),
                    key=lambda d: sum(d.values()))
        readers: list[tuple[str, Callable[[dict[str, float]], Callable[[], Counter[str]]]]] = [
            ("relay/file", lambda d: relay_reader(f"file://{server.binlog_path(log_file)}", d)),
            ("relay/live", lambda d: relay_reader(
                f"mysql://{server.repl_user}:{server.repl_password}@127.0.0.1:{server.port}"
                "?start=earliest&hints=off"
                # (a sandbox MySQL without TLS: its caching_sha2 login takes the RSA key)
                + ("&get-server-public-key=true" if server.mysql else ""), d)),
        ]
        try:
            import pymysqlreplication  # noqa: F401
            readers.append(("pymysqlrepl",
                            lambda d: pymysqlrepl_reader(server, log_file, d)))
        except ImportError:
            print("python-mysql-replication is not installed: pip install mysql-replication")
        # Each reader `--runs` times, the runs interleaved; the fastest run of each counts
        # (with its per-family split): this machine's speed moves between runs
        runs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {}
        for _ in range(args.runs):
            for label, make in readers:
                per_family: dict[str, float] = {}
                runs.setdefault(label, []).append((timed(label, make(per_family)), per_family))
        results = []
        for label, tried in runs.items():
            best, decode[label] = min(tried, key=lambda r: r[0]["seconds"])
            results.append(best)
    finally:
        server.cleanup()
    names = list(families(server))
    total = len(names) * args.rows
    print(f"\n{'reader':<12} {'total s':>8} {'rows/s':>10}")
    for r in results:
        print(f"{r['label']:<12} {r['seconds']:8.2f} {total / r['seconds']:10.0f}")
    print("\nrows/s per type family while iterating that family's changes (reading included)")
    print(f"{'family':<10}" + "".join(f"{k:>14}" for k in decode))
    for fam in names:
        rates = {k: (args.rows / v[fam] if v.get(fam) else 0.0) for k, v in decode.items()}
        print(f"{fam:<10}" + "".join(f"{rates[k]:14.0f}" for k in decode))
    print("\nrows/s of the decoding alone: relay RowsEvent.rows() (best of 3) vs "
          "python-mysql-replication's `rows`")
    print(f"{'family':<10}{'relay codec':>14}{'pymysqlrepl':>14}{'ratio':>8}")
    for fam in names:
        mine = args.rows / codec[fam] if codec.get(fam) else 0.0
        theirs = args.rows / decode["pymysqlrepl"][fam] if decode["pymysqlrepl"].get(fam) \
            else 0.0
        ratio = mine / theirs if theirs else 0.0
        print(f"{fam:<10}{mine:14.0f}{theirs:14.0f}{ratio:7.1f}x")
    if len(results) == 3:
        speedup = results[2]["seconds"] / results[1]["seconds"]
        print(f"\nend to end, live vs live: relay {speedup:.1f}x faster than "
              "python-mysql-replication")


if __name__ == "__main__":
    main()
