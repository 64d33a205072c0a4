"""`relay run` with no upstream: a local MariaDB primary for the relay to mirror, kept in
<data_dir>/sandbox-primary so restarts of the relay resume against the same history. With no
[[downstream.users]] it adds one (password kept in <data_dir>/sandbox-password) and prints
the CHANGE MASTER TO and mariadb-binlog lines that work against the relay. It listens where
[downstream] listen says: loopback by default (127.0.0.1:3307), and it says where."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time

from msgspec.structs import replace

from relay.config import Config, DownstreamUser
from relay.testing.mariadb import MariaDB

log = logging.getLogger("relay.sandbox")


def start_sandbox(config: Config, *, workload: bool) -> tuple[MariaDB, Config]:
    base = os.path.join(os.path.abspath(config.relay.data_dir), "sandbox-primary")
    os.makedirs(base, exist_ok=True)
    server = MariaDB(server_id=1 if config.relay.server_id != 1 else 2, base_dir=base)
    server.start()
    # the relay's metadata look-ups (information_schema, SHOW CREATE TABLE) run as this
    # user: REFERENCES shows every table's definition and none of its rows
    server.execute_many(["SET SESSION sql_log_bin = 0",
                         f"GRANT REFERENCES ON *.* TO '{server.repl_user}'@'%'"])
    log.info("sandbox primary: MariaDB on 127.0.0.1:%d (datadir %s)", server.port,
             server.datadir)
    # from the sandbox's first binlog: a fresh replica (empty GTID position) can start
    upstream = replace(config.upstream, sources=[server.url], start="earliest")
    relay_dir = os.path.join(os.path.abspath(config.relay.data_dir), "relaylog")
    relay = replace(config.relay, data_dir=relay_dir)
    downstream = config.downstream
    if not downstream.users:
        user = DownstreamUser(name=SANDBOX_USER, password=_sandbox_password(config))
        downstream = replace(downstream, users=[user])
    if workload:
        threading.Thread(target=_workload, args=(server,), daemon=True).start()
    return server, replace(config, upstream=upstream, relay=relay, downstream=downstream)


SANDBOX_USER = "replica"


def _sandbox_password(config: Config) -> str:
    """A password made once per data_dir, so replicas keep working across restarts."""
    path = os.path.join(os.path.abspath(config.relay.data_dir), "sandbox-password")
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        return f.read().strip()
    password = secrets.token_urlsafe(12)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


def connection_lines(config: Config) -> str:
    """How to point a replica and mariadb-binlog at this relay, ready to paste (a password
    from the user's own config is not printed)."""
    listen = config.downstream.listen
    host, _, port = listen.rpartition(":")
    where = listen
    if host in ("", "0.0.0.0", "::", "[::]"):
        # every interface: that is what it says; the lines below connect through loopback
        where = f"{listen} (every interface)"
        host = "127.0.0.1"
    host = host.strip("[]")
    user = config.downstream.users[0]
    password = user.resolve_password() if user.name == SANDBOX_USER else "<password>"
    return "\n".join([
        f"relay serves replicas on {where} as user {user.name!r}. Point a MariaDB "
        "replica at it:",
        f"  CHANGE MASTER TO MASTER_HOST='{host}', MASTER_PORT={port}, "
        f"MASTER_USER='{user.name}', MASTER_PASSWORD='{password}', "
        "MASTER_USE_GTID=slave_pos; START SLAVE;",
        "or read the relay log as it grows:",
        f"  mariadb-binlog --read-from-remote-server --host={host} --port={port} "
        f"--user={user.name} --password='{password}' --stop-never relay-bin.000001",
    ])


def _workload(server: MariaDB) -> None:
    """One small transaction a second, so the relay has something to mirror."""
    with contextlib.suppress(Exception):
        server.execute_many([
            "CREATE DATABASE IF NOT EXISTS sandbox",
            "CREATE TABLE IF NOT EXISTS sandbox.ticks (id INT AUTO_INCREMENT PRIMARY KEY, "
            "at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6), note VARCHAR(64))"])
        n = 0
        while server.process is not None:
            n += 1
            server.execute_many([f"INSERT INTO sandbox.ticks (note) VALUES ('tick {n}')"])
            time.sleep(1.0)


__all__ = ["connection_lines", "start_sandbox"]
