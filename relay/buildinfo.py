"""What this relay is: its version, the commit it was built from, the server flavours it
follows and serves, and which kernels run (`relay --version`, /status, relay_build_info).

The commit: git's HEAD when relay runs from a checkout (an editable install, whose tree
moves with each commit); else what the build recorded (setup.py writes relay/_commit.txt
into the built package, from git or from $RELAY_COMMIT, which the Dockerfile passes as a
build argument); else "unknown"."""

from __future__ import annotations

import os
import subprocess
from functools import cache

from relay import __version__, kernels
from relay.binlog.flavour import Flavour

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
FLAVOURS = tuple(f.value for f in Flavour)


@cache
def commit() -> str:
    checkout = os.path.dirname(_PACKAGE)
    if os.path.exists(os.path.join(checkout, ".git")):
        try:
            done = subprocess.run(["git", "-C", checkout, "rev-parse", "--short=12", "HEAD"],
                                  capture_output=True, text=True, timeout=5)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass   # no git on this machine: what the build recorded, if anything
    try:
        with open(os.path.join(_PACKAGE, "_commit.txt")) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def version_line() -> str:
    return (f"relay {__version__} (commit {commit()}; flavours {', '.join(FLAVOURS)}; "
            f"kernels: {kernels.IMPLEMENTATION.value}, {kernels.REASON})")
