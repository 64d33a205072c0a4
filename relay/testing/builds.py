"""The server builds the tests can start: this machine's `mariadbd`, and servers in Debian
roots (scripts/build-roots: MySQL 9.7 from Debian's unstable suite, MariaDB 11.8 from
Debian 13) started with chroot. A user's own server can be named instead, per build:
`RELAY_MYSQL_ROOT` / `RELAY_MARIADB_11_ROOT` (a root folder holding the server), or
`RELAY_ROOTS` (where scripts/build-roots put them). A build is data (flavour, version,
where it runs); a test says which builds it runs against.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from enum import Enum

from relay.errors import RelayError

DEFAULT_ROOTS = "/var/cache/relay-roots"


class ServerFlavour(Enum):
    MARIADB = "mariadb"
    MYSQL = "mysql"


class BuildMissing(RelayError):
    """A server build a test asked for is not on this machine; the message says how to
    get it."""

    code = "build_missing"


@dataclass(frozen=True)
class ServerBuild:
    """One server program: its flavour and version, and where it runs."""

    name: str                  # "mariadb-10.11", "mariadb-11.8", "mysql-9.7"
    flavour: ServerFlavour
    version: str               # as the server prints it: "11.8.9", "9.7.4"
    daemon: str                # the server's path (inside `root` when there is one)
    root: str | None = None    # a Debian root it runs in with chroot; None: this machine

    @property
    def mysql(self) -> bool:
        return self.flavour is ServerFlavour.MYSQL

    def tool(self, *names: str) -> str:
        """A client program of this build (mysqlbinlog, mariadb-binlog, ...), as a path
        inside its root."""
        for name in names:
            for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
                if os.access(self.host_path(f"{d}/{name}"), os.X_OK):
                    return f"{d}/{name}"
        raise BuildMissing(f"{self.name} has none of {', '.join(names)}")

    def host_path(self, path: str) -> str:
        """Where a path of the server's file system is on this machine."""
        return path if self.root is None else os.path.join(self.root, path.lstrip("/"))

    def server_path(self, path: str) -> str:
        """How the server names a path of this machine (which must be inside its root)."""
        if self.root is None:
            return path
        root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            raise ValueError(f"{path} is outside {self.name}'s root {self.root}")
        return "/" + os.path.relpath(real, root)

    def command(self, program: str, *args: str) -> list[str]:
        """The argv that runs `program` (a path inside the root) with `args`."""
        return ([program] if self.root is None else ["chroot", self.root, program]) + \
            list(args)

    def __str__(self) -> str:
        where = f" (root {self.root})" if self.root else ""
        return f"{self.flavour.value} {self.version}{where}"


_VERSION = re.compile(r"Ver\s+(\d+\.\d+\.\d+)")


def _version(build_argv: list[str]) -> str:
    out = subprocess.run(build_argv, capture_output=True, text=True, timeout=60)
    m = _VERSION.search(out.stdout + out.stderr)
    if out.returncode != 0 or m is None:
        raise BuildMissing(f"{' '.join(build_argv)} does not run: "
                           f"{(out.stderr or out.stdout).strip()[-300:]}")
    return m.group(1)


def _machine_mariadb() -> ServerBuild | None:
    for name in ("mariadbd", "mysqld"):
        for d in (None, "/usr/sbin", "/usr/bin", "/usr/local/bin"):
            path = shutil.which(name, path=d)
            if path is None:
                continue
            version = _version([path, "--version"])
            major_minor = ".".join(version.split(".")[:2])
            return ServerBuild(f"mariadb-{major_minor}", ServerFlavour.MARIADB, version, path)
    return None


def _rooted(name: str, flavour: ServerFlavour, daemon: str, env: str) -> ServerBuild | None:
    root = os.environ.get(env) or os.path.join(
        os.environ.get("RELAY_ROOTS", DEFAULT_ROOTS), name)
    if not os.access(os.path.join(root, daemon.lstrip("/")), os.X_OK):
        return None
    version = _version(["chroot", root, daemon, "--version"])
    return ServerBuild(name, flavour, version, daemon, root)


@functools.cache
def builds() -> dict[str, ServerBuild]:
    """Every build found on this machine, by name."""
    found = [_machine_mariadb(),
             _rooted("mariadb-11.8", ServerFlavour.MARIADB, "/usr/sbin/mariadbd",
                     "RELAY_MARIADB_11_ROOT"),
             _rooted("mysql-9.7", ServerFlavour.MYSQL, "/usr/sbin/mysqld", "RELAY_MYSQL_ROOT")]
    return {b.name: b for b in found if b is not None}


def build(name: str) -> ServerBuild:
    """The build called `name`, or BuildMissing saying how to get it."""
    found = builds().get(name)
    if found is not None:
        return found
    if name.startswith("mariadb-10"):
        how = "install MariaDB server (Debian: apt-get install mariadb-server)"
    else:
        how = (f"build its root with scripts/build-roots {name} (as root), or name one with "
               f"{'RELAY_MYSQL_ROOT' if name.startswith('mysql') else 'RELAY_MARIADB_11_ROOT'}")
    raise BuildMissing(f"no {name} server here: {how}")
