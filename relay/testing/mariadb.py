"""Start throwaway servers in temporary directories on free ports: this machine's
`mariadbd`, or MariaDB 11.8 / MySQL 9.7 from Debian roots run with chroot (builds.py).

Used by `relay run --sandbox`, `relay demo` and the test fixtures. Each server is small
(16 MB buffer pool), is stopped by its own PID, and never touches port 3306.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pymysql

from relay.errors import RelayError
from relay.testing.builds import ServerBuild, ServerFlavour, builds


class MariaDBNotInstalled(RelayError):
    """No mariadbd (or mysqld) on this machine; the message says how to install it."""

    code = "mariadb_not_installed"


def find_binary(*names: str) -> str:
    for name in names:
        for d in (None, "/usr/sbin", "/usr/bin", "/usr/local/bin"):
            path = shutil.which(name, path=d)
            if path:
                return path
    raise MariaDBNotInstalled(
        f"none of {', '.join(names)} found: install MariaDB server "
        "(Debian: apt-get install mariadb-server)")


# Test processes side by side (pytest-xdist sets these): each takes ports from its own
# share of 20000-31999, below the kernel's ephemeral range, in turn. A port the kernel
# picks (bind to 0) is free now, but another process may be handed the same one before
# its taker binds it; two workers starting servers all day meet that now and then.
# The worker goes through its share in turn from a random start.
_SHARED_RANGE = (20000, 32000)
_port_lock = threading.Lock()
_next_port = random.randrange(1 << 30)


def free_port() -> int:
    """A port nothing listens on, for a server about to start (never 3306)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    # Only in the worker itself (its conftest names its pid): a process it starts would
    # walk the same share and could take a port the worker picked and has not bound yet.
    mine = os.environ.get("RELAY_PORT_SHARE_PID") == str(os.getpid())
    if not worker.startswith("gw") or count < 1 or not mine:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    share = (_SHARED_RANGE[1] - _SHARED_RANGE[0]) // count
    first = _SHARED_RANGE[0] + int(worker[2:]) % count * share
    global _next_port
    with _port_lock:
        for _ in range(share):
            port = first + _next_port % share
            _next_port += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # in use, or in TIME_WAIT: the next one
                    continue
                return port
    raise RuntimeError(f"no free port in {first}-{first + share - 1}")


# The servers' redo log; the template is installed with it, so no first start resizes it.
REDO_LOG_SIZE = "48M"
_template_lock = threading.Lock()
_templates: dict[str, str] = {}


def _install(build: ServerBuild, datadir: str, tmpdir: str) -> None:
    """A fresh data directory for `build` (paths on this machine)."""
    data, tmp = build.server_path(datadir), build.server_path(tmpdir)
    if build.mysql:
        cmd = build.command(build.daemon, "--no-defaults", "--initialize-insecure",
                            f"--datadir={data}", f"--secure-file-priv={tmp}",
                            f"--tmpdir={tmp}", "--log-error-verbosity=1")
    else:
        cmd = build.command(build.tool("mariadb-install-db", "mysql_install_db"),
                            "--no-defaults", f"--datadir={data}",
                            "--auth-root-authentication-method=normal", "--skip-test-db",
                            "--skip-name-resolve",
                            f"--innodb-log-file-size={REDO_LOG_SIZE}", f"--tmpdir={tmp}")
    if os.geteuid() == 0:
        cmd.append("--user=root")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if res.returncode != 0:
        raise RuntimeError(f"installing {build.name}'s data directory failed: "
                           f"{(res.stderr or res.stdout)[-2000:]}")


def _scratch(build: ServerBuild, prefix: str) -> str:
    """A new temporary folder the server can reach: under its root for a rooted build."""
    if build.root is None:
        return tempfile.mkdtemp(prefix=prefix)
    parent = build.host_path("/srv/relay-tests")
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def _template(build: ServerBuild) -> str:
    """A data directory installed once per process and build, that each server's is
    copied from: installing bootstraps the system tables in 1 to 4 s, a copy takes 0.1 s.
    Removed when the process exits."""
    with _template_lock:
        if build.name not in _templates:
            base = _scratch(build, f"relay-{build.name}-template-")
            try:
                os.makedirs(os.path.join(base, "tmp"))
                _install(build, os.path.join(base, "data"), os.path.join(base, "tmp"))
            except BaseException:
                shutil.rmtree(base, ignore_errors=True)
                raise
            atexit.register(shutil.rmtree, base, ignore_errors=True)
            _templates[build.name] = os.path.join(base, "data")
        return _templates[build.name]


def machine_build() -> ServerBuild:
    """This machine's MariaDB (the default server of every fixture)."""
    found = next((b for b in builds().values() if b.root is None), None)
    if found is None:
        find_binary("mariadbd", "mysqld")  # raises MariaDBNotInstalled, saying how
        raise MariaDBNotInstalled("no MariaDB server found")
    return found


@dataclass
class MariaDB:
    """One test server: this machine's `mariadbd` unless `build` names another (MariaDB
    11.8 or MySQL 9.7 in a Debian root: relay/testing/builds.py). `options` are extra
    `--name=value` server options; `files` are options naming files of this machine
    (certificates, keys), given to the server as copies it can read (in its root)."""

    server_id: int = 1
    options: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    port: int = 0
    repl_user: str = "repl"
    repl_password: str = "replpass"
    process: subprocess.Popen[bytes] | None = None
    build: ServerBuild | None = None
    _own_dir: bool = False

    def __post_init__(self) -> None:
        if self.build is None:
            self.build = machine_build()
        if self.build.root is not None:
            # A rooted server reaches only its root: its folder is made there, and a folder
            # the caller named points at it (a link), for the test's own records.
            given = self.base_dir
            self.base_dir = _scratch(self.build, "relay-server-")
            self._own_dir = True
            if given is not None:
                os.makedirs(given, exist_ok=True)
                with contextlib.suppress(OSError):
                    os.symlink(self.base_dir, os.path.join(given, "server"))
        elif self.base_dir is None:
            self.base_dir = tempfile.mkdtemp(prefix="relay-mariadb-")
            self._own_dir = True
        if not self.port:
            self.port = free_port()

    @property
    def flavour(self) -> ServerFlavour:
        assert self.build is not None
        return self.build.flavour

    @property
    def mysql(self) -> bool:
        return self.flavour is ServerFlavour.MYSQL

    @property
    def datadir(self) -> str:
        assert self.base_dir is not None
        return os.path.join(self.base_dir, "data")

    @property
    def socket_path(self) -> str:
        assert self.base_dir is not None
        return os.path.join(self.base_dir, "mysqld.sock")

    @property
    def url(self) -> str:
        return f"mysql://{self.repl_user}:{self.repl_password}@127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        assert self.base_dir is not None and self.build is not None
        b = self.build
        base = b.server_path(self.base_dir)
        tmp = b.server_path(self._tmpdir())
        args = [
            "--no-defaults", f"--datadir={base}/data", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--socket={base}/mysqld.sock",
            f"--pid-file={base}/mysqld.pid", f"--log-error={base}/error.log",
            f"--server-id={self.server_id}", "--binlog-format=ROW",
            "--binlog-row-metadata=FULL", "--innodb-buffer-pool-size=16M",
            "--max-connections=100", "--skip-name-resolve", "--performance-schema=OFF",
            "--max-allowed-packet=1G", "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0", f"--tmpdir={tmp}",
        ]
        if b.mysql:
            args += ["--log-bin=binlog", "--gtid-mode=ON", "--enforce-gtid-consistency=ON",
                     "--mysqlx=OFF", f"--secure-file-priv={tmp}",
                     "--innodb-redo-log-capacity=16M"]
        else:
            args += ["--log-bin=mariadb-bin", f"--innodb-log-file-size={REDO_LOG_SIZE}"]
        if os.geteuid() == 0:
            args.append("--user=root")
        args += [f"--{k.replace('_', '-')}={v}" for k, v in self.options.items()]
        args += [f"--{k.replace('_', '-')}={self.readable(v)}" for k, v in self.files.items()]
        return b.command(b.daemon, *args)

    def _tmpdir(self) -> str:
        """A private temporary directory: two servers bootstrapping at once must not meet
        in a shared /tmp."""
        assert self.base_dir is not None
        path = os.path.join(self.base_dir, "tmp")
        os.makedirs(path, exist_ok=True)
        return path

    def install(self) -> None:
        if os.path.isdir(os.path.join(self.datadir, "mysql")):
            return
        assert self.build is not None
        shutil.copytree(_template(self.build), self.datadir, dirs_exist_ok=True)
        # MySQL keeps its server_uuid in auto.cnf: each server makes its own at start (two
        # with one UUID would take each other's transactions as their own).
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.datadir, "auto.cnf"))

    def start(self, timeout: float = 60.0) -> MariaDB:
        self.install()
        self.process = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.build} exited ({self.process.returncode}): "
                                   f"{self.error_log()[-2000:]}")
            try:
                self.root().close()
                break
            except pymysql.err.OperationalError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"{self.build} did not start in {timeout}s: "
                               f"{self.error_log()[-2000:]}")
        self._ensure_repl_user()
        return self

    def error_log(self) -> str:
        try:
            with open(os.path.join(self.base_dir or "", "error.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _ensure_repl_user(self) -> None:
        user = f"'{self.repl_user}'@'%'"
        if self.mysql:
            statements = [f"CREATE USER IF NOT EXISTS {user} IDENTIFIED WITH "
                          f"caching_sha2_password BY '{self.repl_password}'",
                          f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}"]
        else:
            statements = [f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY "
                          f"'{self.repl_password}'",
                          "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SLAVE MONITOR ON *.* "
                          f"TO {user}"]
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute("SET sql_log_bin=0")
            for sql in statements:
                cur.execute(sql)

    def root(self, database: str | None = None) -> pymysql.Connection:
        return pymysql.connect(unix_socket=self.socket_path, user="root", password="",
                               database=database, autocommit=True, connect_timeout=5)

    def query(self, sql: str, args: Sequence[object] | None = None) -> list[tuple[object, ...]]:
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def execute_many(self, statements: Sequence[str]) -> None:
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)

    def replicate_from(self, host: str, port: int, *, user: str, password: str,
                       gtid: bool = True, heartbeat: float = 1.0,
                       ssl_ca: str | None = None) -> None:
        """CHANGE MASTER TO (MySQL: CHANGE REPLICATION SOURCE TO) host:port (a primary or
        a relay), then START SLAVE (START REPLICA). `ssl_ca` (a file on this machine,
        copied where the server reads it): TLS with the source's certificate verified."""
        if self.mysql:
            mode = ("SOURCE_AUTO_POSITION=1" if gtid
                    else "SOURCE_AUTO_POSITION=0, SOURCE_LOG_FILE='', SOURCE_LOG_POS=4")
            if ssl_ca is not None:
                mode += (f", SOURCE_SSL=1, SOURCE_SSL_CA='{self.readable(ssl_ca)}', "
                         "SOURCE_SSL_VERIFY_SERVER_CERT=1")
            self.execute_many([
                "STOP REPLICA",
                f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='{host}', SOURCE_PORT={port}, "
                f"SOURCE_USER='{user}', SOURCE_PASSWORD='{password}', "
                f"SOURCE_CONNECT_RETRY=1, SOURCE_HEARTBEAT_PERIOD={heartbeat}, "
                f"GET_SOURCE_PUBLIC_KEY=1, {mode}",
                "START REPLICA",
            ])
            return
        mode = ("MASTER_USE_GTID=slave_pos" if gtid
                else "MASTER_USE_GTID=no, MASTER_LOG_FILE='', MASTER_LOG_POS=4")
        if ssl_ca is not None:
            mode += (f", MASTER_SSL=1, MASTER_SSL_CA='{self.readable(ssl_ca)}', "
                     "MASTER_SSL_VERIFY_SERVER_CERT=1")
        self.execute_many([
            "STOP SLAVE",
            f"CHANGE MASTER TO MASTER_HOST='{host}', MASTER_PORT={port}, "
            f"MASTER_USER='{user}', MASTER_PASSWORD='{password}', MASTER_CONNECT_RETRY=1, "
            f"MASTER_HEARTBEAT_PERIOD={heartbeat}, {mode}",
            "START SLAVE",
        ])

    def readable(self, path: str) -> str:
        """`path` as the server names a copy of it it can read (inside its root)."""
        assert self.base_dir is not None and self.build is not None
        copy = os.path.join(self.base_dir, os.path.basename(path))
        if os.path.abspath(copy) != os.path.abspath(path):
            shutil.copy(path, copy)
        return self.build.server_path(copy)

    def slave_status(self) -> dict[str, object]:
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute("SHOW REPLICA STATUS" if self.mysql else "SHOW SLAVE STATUS")
            row = cur.fetchone()
            if row is None:
                return {}
            return {d[0]: v for d, v in zip(cur.description, row, strict=True)}

    def gtid_binlog_pos(self) -> str:
        """The transactions in the server's binlog: @@gtid_binlog_pos (MariaDB) or
        @@gtid_executed (MySQL, whose binlog holds what it executed)."""
        name = "@@GLOBAL.gtid_executed" if self.mysql else "@@gtid_binlog_pos"
        return str(self.query(f"SELECT {name}")[0][0]).replace("\n", "")

    def binlog_files(self) -> list[str]:
        return [str(r[0]) for r in self.query("SHOW BINARY LOGS")]

    def binlog_path(self, name: str) -> str:
        return os.path.join(self.datadir, name)

    def stop(self, timeout: float = 30.0) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def drop_storage(self) -> None:
        """After stop: remove InnoDB's redo log and system tablespaces (about 60 MB a
        server, nothing a post-mortem reads); the binlogs and the error log stay. A rooted
        server's whole folder goes (it lives in the root, not in the test's temp dir)."""
        assert self.process is None, "stop the server first"
        if self.build is not None and self.build.root is not None and self.base_dir:
            shutil.rmtree(self.datadir, ignore_errors=True)
            return
        for name in ("ib_logfile0", "ibdata1", "ibtmp1", "ib_buffer_pool", "undo_001",
                     "undo_002", "mysql.ibd"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.datadir, name))

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir and self.base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


@contextlib.contextmanager
def running(**kwargs: object) -> Iterator[MariaDB]:
    server = MariaDB(**kwargs)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.cleanup()
