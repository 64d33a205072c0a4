"""A tailing cursor follows live ingest from a real primary, waking as the log grows."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
from collections.abc import Callable

import pytest

from relay.app import App
from relay.binlog.constants import EventType
from relay.config import parse_config
from relay.relaylog.cursor import Cursor
from relay.testing.mariadb import MariaDB
from tests.conftest import gtids_in, primary_binlogs
from tests.integration import workload

pytestmark = pytest.mark.integration


async def test_cursor_sees_every_transaction_as_it_commits(mariadb_factory: Callable[..., MariaDB],
                                                           tmp_path: pathlib.Path) -> None:
    primary = mariadb_factory()
    config = parse_config({
        "relay": {"data_dir": os.path.join(str(tmp_path), "data")},
        "upstream": {"sources": [primary.url], "start": "earliest", "heartbeat_period": "1s",
                     "read_timeout": "5s"},
        "relaylog": {"segment_size": "64KiB", "sync": "transaction"},
    })
    app = App(config)
    task = asyncio.create_task(app.run())
    try:
        for _ in range(100):
            if app.relay_log.segments:
                break
            await asyncio.sleep(0.05)
        cursor = Cursor(app.relay_log, app.relay_log.segments[0])
        work = asyncio.create_task(asyncio.to_thread(workload.mixed, primary, rounds=2))
        seen = []
        wakeups = 0
        while True:
            batch = await cursor.read(timeout=10)
            assert batch, "cursor timed out while the primary was writing"
            wakeups += 1
            seen += [ev for ev in batch if ev.data[4] == EventType.GTID]
            if work.done() and len(seen) == len(gtids_in(primary_binlogs(primary))):
                break
        await work
        assert wakeups > 3  # it read in several rounds, woken as the log grew
        assert len({ev.segment for ev in seen}) > 1  # and followed rotations
        expected = gtids_in(primary_binlogs(primary))
        got = [(int.from_bytes(ev.data[27:31], "little"), int.from_bytes(ev.data[19:27], "little"))
               for ev in seen]
        assert got == [(g.domain, g.seq) for g in expected]
        cursor.close()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
