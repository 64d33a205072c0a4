#!/usr/bin/env python3
"""The ingest's steady state alone, at several git revisions: a primary's binlog replayed
as the dump packets it sends, in reads of --read bytes, through each revision's dump
reader and ingest into a relay log (on uvloop, under the sync policy --sync): the best
process CPU time (the log's worker thread included) of --repeat.

`ingest_revisions.py` times the whole process (start-up, the network, the primary);
this isolates the per-event and per-read work of the hot path, with no noise from
them, so a difference of a few percent shows.

    python bench/ingest_replay.py --rev 5b46194 --rev WORKTREE [--binlog FILE] [--size 230]

Without --binlog it builds one of --size MB on a sandbox primary (relay_throughput.py's
workload). Each revision runs in its own interpreter with PYTHONPATH at its tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.ingest_revisions import checkout, tree_env

# Runs inside each revision's interpreter: only the APIs each revision has.
_CHILD = r"""
import asyncio, os, sys, time, tempfile, shutil
stream_path, reads, repeat, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(stream_path, "rb") as f:
    stream = f.read()
chunks = [stream[i:i + reads] for i in range(0, len(stream), reads)]
import uvloop
from relay.relaylog.log import RelayLog
from relay.config import SyncPolicy
from relay.upstream.ingest import Ingest
try:
    from relay.wire.dumpstream import DumpReader
    from relay.upstream.protocol import StreamStart
    from relay.upstream.ingest import PLAIN
    modern = True
except ImportError:
    from relay.upstream.protocol import UpstreamProtocol
    modern = False
try:  # the process's malloc tuning, where the revision's app does it
    from relay.app import keep_freed_memory
    keep_freed_memory()
except ImportError:
    pass

class NoLink:
    def pause(self): pass
    def resume(self): pass
    def fail(self, exc): raise exc
    def reply(self, payload): pass

async def once():
    d = tempfile.mkdtemp(prefix="relay-replay-")
    log = RelayLog(d, sync=SyncPolicy.parse(sync), segment_size=1 << 31)
    log.open()
    log.start()
    ingest = Ingest(log)
    t0, c0 = time.perf_counter(), time.process_time()
    if modern:
        ingest.on_stream(StreamStart(True, NoLink()))
        reader = DumpReader(plain=PLAIN, tally=ingest.stats)
        for c in chunks:
            batch = reader.feed(c)
            if batch.data:
                ingest.on_events(batch)
            await asyncio.sleep(0)  # the loop's turn: the log worker's callbacks
    else:
        ingest.session_checksum = True
        proto = UpstreamProtocol()
        proto.start_dump(ingest)
        for c in chunks:
            proto._dump_data(c)
            await asyncio.sleep(0)
    log.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = os.path.getsize(os.path.join(d, "relay-bin.000001"))
    shutil.rmtree(d)
    return wall, cpu, size

results = [uvloop.run(once()) for _ in range(repeat)]
wall = min(r[0] for r in results)
cpu = min(r[1] for r in results)
print(f"{cpu:.4f} {results[0][2]} {wall:.4f}")
"""


def dump_stream(binlog: str) -> bytes:
    """The packets a MariaDB primary sends for a dump of `binlog` from its start: an
    artificial ROTATE, then each event of the file behind an OK byte, in sequence."""
    from relay.binlog import build, walk

    with open(binlog, "rb") as f:
        data = f.read()
    out = bytearray()
    seq = 1

    def packet(payload: bytes | memoryview) -> None:
        nonlocal seq
        body = b"\x00" + bytes(payload)
        out.extend(len(body).to_bytes(3, "little") + bytes((seq,)) + body)
        seq = (seq + 1) & 0xFF

    rotate = build.rotate(os.path.basename(binlog), server_id=1, timestamp=0, log_pos=0,
                          checksum=True, position=4, artificial=True)
    packet(rotate)
    view = memoryview(data)
    for start, size in walk.spans(data, 4):
        packet(view[start : start + size])
    return bytes(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", action="append", default=[],
                    help="a git revision, WORKTREE, or PURE (the work tree on the "
                    "pure-Python kernels) (repeatable)")
    ap.add_argument("--binlog", default="", help="a MariaDB binlog file to replay")
    ap.add_argument("--keep", default="", metavar="FILE",
                    help="keep the built binlog here (a later run takes it with --binlog)")
    ap.add_argument("--size", type=int, default=230, help="binlog size to build, MB")
    ap.add_argument("--read", type=int, default=256 << 10, help="bytes per read")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sync", default="off", help="the log's sync policy (off: CPU only)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate the revisions this many times")
    args = ap.parse_args()
    revs = args.rev or ["HEAD", "WORKTREE"]
    with tempfile.TemporaryDirectory(prefix="relay-bench-replay-") as work:
        binlog = args.binlog
        if not binlog:
            from bench.relay_throughput import build_binlog
            from relay.testing.mariadb import MariaDB

            server = MariaDB(base_dir=os.path.join(work, "primary"),
                             options={"max_binlog_size": "1G", "binlog_checksum": "CRC32"})
            server.start()
            try:
                build_binlog(server, args.size)
                binlog = server.binlog_path(server.binlog_files()[-1])
                stream = dump_stream(binlog)
                if args.keep:
                    shutil.copyfile(binlog, args.keep)
            finally:
                server.stop()
        else:
            stream = dump_stream(binlog)
        stream_path = os.path.join(work, "stream")
        with open(stream_path, "wb") as f:
            f.write(stream)
        print(f"stream: {len(stream) / 1e6:.1f} MB in reads of {args.read} bytes", flush=True)
        trees = {rev: checkout(rev, work) for rev in revs}
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", "relay"], cwd=tree,
                           check=True)
        results: dict[str, list[float]] = {rev: [] for rev in revs}
        for i in range(args.rounds):
            for rev in revs:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, stream_path, str(args.read),
                     str(args.repeat), args.sync],
                    cwd=trees[rev], env=tree_env(rev, trees[rev]),
                    check=False, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{rev}: {out.stderr}")
                fields = out.stdout.split()
                results[rev].append(float(fields[0]))
                print(f"  round {i + 1}: {rev:12s} {float(fields[0]):.3f} s CPU, "
                      f"{float(fields[2]):.3f} s wall ({int(fields[1]) / 1e6:.1f} MB written)",
                      flush=True)
        print(f"\n{'':12s} {'best CPU':>9s} {'MB/s':>7s}")
        for rev in revs:
            best = min(results[rev])
            print(f"{rev:12s} {best:8.3f}s {len(stream) / best / 1e6:7.1f}")


if __name__ == "__main__":
    main()
