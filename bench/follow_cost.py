"""What a replica at the end of the log costs the relay per transaction: the wake-up, the
read and the send of each transaction the ingest publishes, with no server and no
replica to share the machine with (bench/soak.py measures the same cost beside five real
replicas and a primary, and moves by several points from run to run).

    PYTHONPATH=. python bench/follow_cost.py [--followers 5] [--transactions 20000] [--runs 3]

A relay log in a temp dir (sync off) and --followers dumps at its end, each into a socket
that a `cat` process drains. Transactions (GTID, rows, XID: 120 bytes) are published one
at a time, paced (--pace microseconds apart, as a primary's commits at a steady rate),
so that every follower is woken once a transaction, as at 1,000 transactions/s; each
follower waits with a heartbeat period (--heartbeat, 30 s as a MariaDB replica asks by
default). It prints
the relay process's CPU per transaction with the followers and with none (the pacing and
the appends alone), and the difference per follower: the best of --runs each.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import tempfile
import time

import uvloop

from relay.config import SyncMode, SyncPolicy
from relay.downstream.dump import DumpRequest, DumpStream
from relay.relaylog.log import RelayLog
from tests.helpers import write_transactions


async def cpu_per_transaction(followers: int, transactions: int, pace: float,
                              heartbeat: float | None) -> float:
    """Process CPU seconds per published transaction, `followers` dumps following."""
    with tempfile.TemporaryDirectory(prefix="relay-bench-follow-") as work:
        log = RelayLog(work, sync=SyncPolicy(SyncMode.OFF))
        log.open()
        log.start()
        appender = log.appender()
        write_transactions(appender, range(1, 2))
        drains: list[subprocess.Popen[bytes]] = []
        streams: list[DumpStream] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            for i in range(followers):
                ours, theirs = socket.socketpair()
                drains.append(subprocess.Popen(["cat"], stdin=theirs.fileno(),
                                               stdout=subprocess.DEVNULL))
                theirs.close()
                _, writer = await asyncio.open_connection(sock=ours)
                stream = DumpStream(log, writer, DumpRequest(
                    f"bench{i}", 100 + i, checksum_aware=True, rotate_crc=True,
                    heartbeat=heartbeat, write_timeout=30.0))
                streams.append(stream)
                tasks.append(asyncio.create_task(stream.from_file(log.segments[0], 4)))

            async def caught_up() -> None:
                while any(s.position != log.visible[1] for s in streams):
                    await asyncio.sleep(0.001)

            await caught_up()
            t0 = time.process_time()
            for seq in range(2, transactions + 2):
                write_transactions(appender, range(seq, seq + 1))
                await asyncio.sleep(pace)
            await caught_up()
            return (time.process_time() - t0) / transactions
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                s.writer.close()
            for d in drains:
                d.terminate()
                d.wait(10)
            log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--followers", type=int, default=5)
    ap.add_argument("--transactions", type=int, default=20_000)
    ap.add_argument("--pace", type=float, default=500.0, help="microseconds between commits")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heartbeat", type=float, default=30.0,
                    help="the followers' heartbeat period, seconds (a MariaDB replica's "
                         "default: half of slave_net_timeout); 0: none")
    args = ap.parse_args()
    best: dict[int, float] = {}
    for _ in range(args.runs):
        for k in (0, args.followers):
            cost = uvloop.run(cpu_per_transaction(k, args.transactions, args.pace / 1e6,
                                                  args.heartbeat or None))
            best[k] = min(best.get(k, cost), cost)
    base, loaded = best[0], best[args.followers]
    per = (loaded - base) / args.followers if args.followers else 0.0
    print(f"relay CPU per transaction (best of {args.runs}): {base * 1e6:.1f} us with no "
          f"follower, {loaded * 1e6:.1f} us with {args.followers}; "
          f"{per * 1e6:.1f} us per follower per transaction")


if __name__ == "__main__":
    main()
