"""Long fuzz runs of every surface that reads network bytes (tests/fuzz_targets.py), with
atheris (libFuzzer, coverage-guided): a million inputs per surface by default, started
from the surface's valid seeds. Per surface it prints the inputs run, the slowest input's
time, the peak RSS and whether anything other than a clean error (a RelayError) came out;
a crash leaves its input in the work directory and makes the exit status 1.

    python bench/fuzz.py                       # every surface, 1,000,000 inputs each
    python bench/fuzz.py --runs 200000 --surface tap --surface upstream

The suite runs the same targets under hypothesis (tests/unit/test_fuzz.py), briefly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SURFACES = ("handshake", "statements", "tap", "upstream", "binlog", "kernels", "text_rows",
            "change_lines", "row_values", "json_document")


def worker(surface: str, runs: int, report: str, corpus: str) -> None:
    """Run inside the fuzzing process: atheris calls `one` per input."""
    import atheris

    sys.path.insert(0, ROOT)
    with atheris.instrument_imports(include=["relay"]):
        from relay.errors import RelayError
        from tests.fuzz_targets import TARGETS
    target = TARGETS[surface]
    slowest = [0.0]

    def one(data: bytes) -> None:
        t0 = time.perf_counter()
        with contextlib.suppress(RelayError):
            target(data)
        took = time.perf_counter() - t0
        if took > slowest[0]:
            slowest[0] = took
            with open(report, "w") as f:
                json.dump({"slowest_s": took, "slowest_len": len(data)}, f)

    atheris.Setup([sys.argv[0], f"-runs={runs}", "-print_final_stats=1", "-timeout=10",
                   "-rss_limit_mb=2048", "-max_len=4096", corpus], one)
    atheris.Fuzz()


def run_surface(surface: str, runs: int, work: str) -> dict[str, object]:
    sys.path.insert(0, ROOT)
    from tests.fuzz_targets import seeds

    corpus = os.path.join(work, f"corpus-{surface}")
    os.makedirs(corpus, exist_ok=True)
    for i, seed in enumerate(seeds(surface)):
        with open(os.path.join(corpus, f"seed{i}"), "wb") as f:
            f.write(seed)
    report = os.path.join(work, f"report-{surface}.json")
    # The worker's temp files (a target's relay log) go under `work`: libFuzzer ends the
    # process with exit(), so the worker's own clean-up would never run.
    scratch = os.path.join(work, f"tmp-{surface}")
    os.makedirs(scratch, exist_ok=True)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", surface, "--runs", str(runs), "--report",
         report, "--corpus", corpus], cwd=work, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": ROOT, "TMPDIR": scratch})
    took = time.monotonic() - t0
    stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", proc.stderr))
    slow: dict[str, float] = {}
    if os.path.exists(report):
        with open(report) as f:
            slow = json.load(f)
    crashed = proc.returncode != 0
    if crashed:
        print(proc.stderr[-6000:], file=sys.stderr)
    return {"surface": surface, "runs": int(stats.get("number_of_executed_units", 0)),
            "seconds": took, "slowest_ms": 1000 * float(slow.get("slowest_s", 0.0)),
            "peak_rss_mb": int(stats.get("peak_rss_mb", 0)), "crashed": crashed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1_000_000)
    p.add_argument("--surface", action="append", choices=SURFACES)
    p.add_argument("--worker")
    p.add_argument("--report")
    p.add_argument("--corpus")
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.runs, args.report, args.corpus)
        return 0
    work = tempfile.mkdtemp(prefix="relay-fuzz-")
    print(f"{'surface':<12}{'inputs':>11}{'seconds':>9}{'slowest ms':>12}{'peak RSS MB':>13}"
          "  result")
    failed = False
    for surface in args.surface or SURFACES:
        r = run_surface(surface, args.runs, work)
        failed |= bool(r["crashed"])
        result = f"CRASH (input in {work})" if r["crashed"] else "clean"
        print(f"{surface:<12}{r['runs']:>11,}{r['seconds']:>9.0f}{r['slowest_ms']:>12.1f}"
              f"{r['peak_rss_mb']:>13}  {result}", flush=True)
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
