#!/usr/bin/env python3
"""What send rules cost: a replica's catch-up through ten schema/table rules against
pass-through, and the rate of masking one column of the busiest table.

    python bench/rules_send.py [--size 100] [--runs 3]

Builds a binlog of --size MB on a sandbox primary (one-row transactions into b.small and
bulk transactions into b.wide), lets the relay mirror it, then times a real MariaDB
replica's IO thread fetching everything through the relay as three users, interleaved,
best of --runs:

  plain   no rules: the stored bytes as they are (the pass-through path)
  ten     ten filter rules that keep everything (every table map is judged, every event
          goes through the chain)
  mask    one rule hashing b.wide.payload (every row of the busiest table is decoded,
          masked and encoded again)

and, offline, how many rows per second the mask chain alone processes (one core).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from downstream_fanout import cpu_seconds, io_catch_up, wait
from relay_throughput import build_binlog

from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.file import iter_file_events
from relay.binlog.position import Position
from relay.binlog.rows import ROWS_TYPES
from relay.config import MaskKind, RulePoint
from relay.relaylog.naming import read_index
from relay.rules.chain import RuleSpec
from relay.rules.engine import RuleStream
from relay.rules.mask import Mask
from relay.rules.runtime import Rules
from relay.testing.mariadb import MariaDB, free_port

KEY = "RELAY_BENCH_MASK_KEY"
TEN = "\n".join(
    f'[[rules]]\nname = "r{i}"\nat = "send"\nclients = ["ten"]\n'
    f'ignore_tables = ["nosuch{i}.%"]\n' for i in range(9)
) + '[[rules]]\nname = "keep-b"\nat = "send"\nclients = ["ten"]\ndo_tables = ["b.%", "mysql.%"]\n'
MASK = ('[[rules]]\nname = "mask"\nat = "send"\nclients = ["mask"]\n[[rules.mask]]\n'
        f'column = "b.wide.payload"\nwith = "hash"\nkey_env = "{KEY}"\n')


def start_relay(work: str, primary: MariaDB, port: int) -> subprocess.Popen[bytes]:
    cfg = os.path.join(work, "relay.toml")
    users = "".join(f'[[downstream.users]]\nname = "{u}"\npassword = "pw"\n'
                    for u in ("plain", "ten", "mask"))
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{work}/relay"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{primary.url}"]\nstart = "earliest"\n'
                f'heartbeat_period = "1s"\nread_timeout = "5s"\n'
                f'[relaylog]\nsync = "off"\nsegment_size = "1GiB"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n{users}{TEN}{MASK}')
    env = dict(os.environ, **{KEY: "bench-key"})
    return subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                            stdout=subprocess.DEVNULL, stderr=open(f"{work}/relay.log", "wb"),
                            env=env)


def relay_state(port: int) -> str:
    import pymysql

    try:
        with pymysql.connect(host="127.0.0.1", port=port, user="plain", password="pw",
                             connect_timeout=2) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            return str(cur.fetchone()[0])
    except pymysql.err.MySQLError:
        return ""


def mask_rate(data_dir: str) -> tuple[int, float]:
    """Rows of b.wide masked per second by the chain alone, over the stored log (read into
    memory first, so only the chain is timed)."""
    os.environ[KEY] = "bench-key"
    events = []
    for name in read_index(data_dir, "relay-bin"):
        with open(os.path.join(data_dir, name), "rb") as f:
            events += [(raw.data, Position(name, raw.offset))
                       for raw in iter_file_events(f, verify_crc=False)]
    rows = 0
    counter = StreamDecoder()
    for data, _ in events:
        if data[4] == EventType.FORMAT_DESCRIPTION:
            counter.format_description(data)
        elif data[4] == EventType.TABLE_MAP:
            counter.remember_table_map(data)
        elif data[4] in ROWS_TYPES:
            rev = counter.rows_event(data)
            if counter.table_for(rev).table == "wide":
                rows += len(rev.rows(counter.table_for(rev), counter.codecs))
    rules = Rules([RuleSpec("mask", RulePoint.SEND, masks=(
        Mask("b.wide.payload", MaskKind.HASH, key_env=KEY),))])
    stream = RuleStream(rules.chain(RulePoint.SEND).chain)
    t0 = time.perf_counter()
    for data, pos in events:
        stream.feed(data, pos)
    return rows, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100, help="binlog size in MB")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-rules-")
    primary = MariaDB(base_dir=os.path.join(work, "primary"),
                      options={"max_binlog_size": "1G"})
    primary.start()
    port = free_port()
    relay = None
    try:
        print(f"building a {args.size} MB binlog ...", flush=True)
        build_binlog(primary, args.size)
        target = primary.gtid_binlog_pos()
        relay = start_relay(work, primary, port)
        wait(lambda: relay_state(port) == target)
        times: dict[str, list[float]] = {"plain": [], "ten": [], "mask": []}
        cpu: dict[str, list[float]] = {u: [] for u in times}
        sid = 500
        for run in range(args.runs):
            for user in times:
                sid += 1
                c0 = cpu_seconds(relay.pid)
                t = io_catch_up(work, sid, port, user, "pw", target)
                cpu[user].append(cpu_seconds(relay.pid) - c0)
                times[user].append(t)
                print(f"  run {run + 1}: {user:<5} {t:6.2f}s  relay CPU {cpu[user][-1]:.2f}s",
                      flush=True)
        best = {u: min(v) for u, v in times.items()}
        print(f"\nreplica IO catch-up through the relay (best of {args.runs}), and the relay's "
              "CPU while it ran (median):")
        for u, t in best.items():
            print(f"  {u:<6} {t:6.2f}s   {best['plain'] / t:4.2f}x pass-through   "
                  f"relay CPU {statistics.median(cpu[u]):.2f}s")
        rows, secs = mask_rate(os.path.join(work, "relay"))
        print(f"\nmask chain alone: {rows} rows of b.wide in {secs:.2f}s = "
              f"{rows / secs:,.0f} rows/s (one core, the whole log walked)")
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)
        primary.stop()
        shutil.rmtree(work, ignore_errors=True)  # (the primary's and the relay's logs)


if __name__ == "__main__":
    main()
