"""`relay run` with no upstream: a local MariaDB primary for the relay to mirror, kept in
<data_dir>/sandbox-primary so restarts of the relay resume against the same history."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from relay.config import Config
from relay.testing.mariadb import MariaDB

log = logging.getLogger("relay.sandbox")


def start_sandbox(config: Config, *, workload: bool) -> tuple[MariaDB, Config]:
    base = os.path.join(os.path.abspath(config.relay.data_dir), "sandbox-primary")
    os.makedirs(base, exist_ok=True)
    server = MariaDB(server_id=1 if config.relay.server_id != 1 else 2, base_dir=base)
    server.start()
    log.info("sandbox primary: MariaDB on 127.0.0.1:%d (datadir %s)", server.port,
             server.datadir)
    upstream = config.upstream.model_copy(update={"sources": [server.url]})
    relay_dir = os.path.join(os.path.abspath(config.relay.data_dir), "relaylog")
    relay = config.relay.model_copy(update={"data_dir": relay_dir})
    if workload:
        threading.Thread(target=_workload, args=(server,), daemon=True).start()
    return server, config.model_copy(update={"upstream": upstream, "relay": relay})


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


__all__ = ["start_sandbox"]
