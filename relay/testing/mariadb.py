"""Start throwaway `mariadbd` processes in temporary directories on free ports.

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
_template_dir: str | None = None


def _install(datadir: str, tmpdir: str) -> None:
    cmd = [find_binary("mariadb-install-db", "mysql_install_db"), "--no-defaults",
           f"--datadir={datadir}", "--auth-root-authentication-method=normal",
           "--skip-test-db", f"--innodb-log-file-size={REDO_LOG_SIZE}", f"--tmpdir={tmpdir}"]
    if os.geteuid() == 0:
        cmd.append("--user=root")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {res.stderr[-2000:]}")


def _template() -> str:
    """A data directory installed once per process, that each server's is copied from:
    `mariadb-install-db` bootstraps the system tables in 1 to 2 s, a copy takes 0.1 s.
    Removed when the process exits."""
    global _template_dir
    with _template_lock:
        if _template_dir is None:
            base = tempfile.mkdtemp(prefix="relay-mariadb-template-")
            try:
                os.makedirs(os.path.join(base, "tmp"))
                _install(os.path.join(base, "data"), os.path.join(base, "tmp"))
            except BaseException:
                shutil.rmtree(base, ignore_errors=True)
                raise
            atexit.register(shutil.rmtree, base, ignore_errors=True)
            _template_dir = os.path.join(base, "data")
        return _template_dir


@dataclass
class MariaDB:
    """One mariadbd. `options` are extra `--name=value` server options."""

    server_id: int = 1
    options: dict[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    port: int = 0
    repl_user: str = "repl"
    repl_password: str = "replpass"
    process: subprocess.Popen[bytes] | None = None
    _own_dir: bool = False

    def __post_init__(self) -> None:
        if self.base_dir is None:
            self.base_dir = tempfile.mkdtemp(prefix="relay-mariadb-")
            self._own_dir = True
        if not self.port:
            self.port = free_port()

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
        assert self.base_dir is not None
        args = [
            find_binary("mariadbd", "mysqld"), "--no-defaults",
            f"--datadir={self.datadir}", f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--socket={self.socket_path}", f"--pid-file={self.base_dir}/mysqld.pid",
            f"--log-error={self.base_dir}/error.log", f"--server-id={self.server_id}",
            "--log-bin=mariadb-bin", "--binlog-format=ROW", "--binlog-row-metadata=FULL",
            "--innodb-buffer-pool-size=16M", f"--innodb-log-file-size={REDO_LOG_SIZE}",
            "--max-connections=100", "--skip-name-resolve", "--performance-schema=OFF",
            "--max-allowed-packet=1G", "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
            f"--tmpdir={self._tmpdir()}",
        ]
        if os.geteuid() == 0:
            args.append("--user=root")
        args += [f"--{k.replace('_', '-')}={v}" for k, v in self.options.items()]
        return args

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
        shutil.copytree(_template(), self.datadir, dirs_exist_ok=True)

    def start(self, timeout: float = 60.0) -> MariaDB:
        self.install()
        self.process = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited ({self.process.returncode}): "
                                   f"{self.error_log()[-2000:]}")
            try:
                self.root().close()
                break
            except pymysql.err.OperationalError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"mariadbd did not start in {timeout}s: {self.error_log()[-2000:]}")
        self._ensure_repl_user()
        return self

    def error_log(self) -> str:
        try:
            with open(os.path.join(self.base_dir or "", "error.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _ensure_repl_user(self) -> None:
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute("SET sql_log_bin=0")
            cur.execute(f"CREATE USER IF NOT EXISTS '{self.repl_user}'@'%' "
                        f"IDENTIFIED BY '{self.repl_password}'")
            cur.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SLAVE MONITOR ON *.* "
                        f"TO '{self.repl_user}'@'%'")

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
                       gtid: bool = True, heartbeat: float = 1.0) -> None:
        """CHANGE MASTER TO host:port (a primary or a relay), then START SLAVE."""
        mode = ("MASTER_USE_GTID=slave_pos" if gtid
                else "MASTER_USE_GTID=no, MASTER_LOG_FILE='', MASTER_LOG_POS=4")
        self.execute_many([
            "STOP SLAVE",
            f"CHANGE MASTER TO MASTER_HOST='{host}', MASTER_PORT={port}, "
            f"MASTER_USER='{user}', MASTER_PASSWORD='{password}', MASTER_CONNECT_RETRY=1, "
            f"MASTER_HEARTBEAT_PERIOD={heartbeat}, {mode}",
            "START SLAVE",
        ])

    def slave_status(self) -> dict[str, object]:
        with contextlib.closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
            if row is None:
                return {}
            return {d[0]: v for d, v in zip(cur.description, row, strict=True)}

    def gtid_binlog_pos(self) -> str:
        return str(self.query("SELECT @@gtid_binlog_pos")[0][0])

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
        server, nothing a post-mortem reads); the binlogs and the error log stay."""
        assert self.process is None, "stop the server first"
        for name in ("ib_logfile0", "ibdata1", "ibtmp1", "ib_buffer_pool"):
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
