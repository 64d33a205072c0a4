#!/usr/bin/env python3
"""The kernels' unit tests (tests/unit/test_kernels.py: the compiled twins against the
pure ones on well-formed, cut and mutated buffers, and the 16 MiB splits;
tests/unit/test_text_rows.py: the snapshot's text-result kernels) run once under
valgrind's memcheck, which reports every read or write outside a live allocation and
every use of uninitialised memory. Python's own allocator is switched off
(PYTHONMALLOC=malloc) so that each object is an allocation valgrind sees; the report
counts the errors whose stack passes through the compiled kernels; one of those, or a
failed test, makes the exit status 1. (The rest are CPython's and glibc's own: vectorised
string compares that read whole words past a string's end, which memcheck reports.)

    python bench/memcheck.py [--examples 200] [--test tests/unit/test_text_rows.py]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200,
                    help="hypothesis examples per property (the suite runs 400)")
    ap.add_argument("--test", action="append", default=[],
                    help="a test file (repeatable; default: both kernel test files)")
    args = ap.parse_args()
    tests = args.test or [os.path.join(ROOT, "tests", "unit", name)
                          for name in ("test_kernels.py", "test_text_rows.py")]
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="relay-memcheck-")
    log = os.path.join(work, "memcheck.log")
    env = {**os.environ, "PYTHONMALLOC": "malloc", "PYTHONPATH": ROOT,
           "RELAY_KERNEL_EXAMPLES": str(args.examples)}
    env.pop("RELAY_PURE_PYTHON", None)
    cmd = ["valgrind", "--tool=memcheck", "--error-exitcode=99", "--leak-check=no",
           "--track-origins=yes", f"--log-file={log}", sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "-p", "no:xdist", *tests]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    with open(log) as f:
        text = f.read()
    errors = re.findall(r"ERROR SUMMARY: (\d+) errors", text)
    blocks = text.split("\n==")
    in_kernels = sum(1 for b in blocks if "compiled.cpython" in b and ("Invalid" in b
                                                                       or "uninitialised" in b))
    lines = proc.stdout.strip().splitlines()
    print("\n".join(ln for ln in lines if ln.startswith(("FAILED", "ERROR", "E ")))
          or proc.stderr[-2000:])
    print(lines[-1] if lines else "")
    print(f"memcheck: {in_kernels} errors through the compiled kernels, "
          f"{errors[-1] if errors else '?'} in all")
    failed = proc.returncode not in (0, 99) or "failed" in (lines[-1] if lines else "failed")
    if in_kernels or failed:
        print(f"the log: {log}")
        return 1
    shutil.rmtree(work, ignore_errors=True)  # (the log is kept only when something failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
