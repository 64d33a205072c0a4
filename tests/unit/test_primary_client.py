"""PrimaryConnection keeps a cancellation: on Python 3.11 aiomysql's connect (under
asyncio.wait_for) returns the attempt's result when the cancel lands as the attempt ends,
and a relay told to stop while its primary refused connections retried for ever."""

from __future__ import annotations

import asyncio
import contextlib
import random

from relay.config import Source
from relay.errors import ServerError
from relay.mysql.client import PrimaryConnection
from relay.testing.mariadb import free_port


async def _retry(source: Source, give_up: asyncio.Event) -> None:
    """What a reconnecting loop does: connect, and on a refusal try again at once."""
    while not give_up.is_set():
        with contextlib.suppress(ServerError):
            async with await PrimaryConnection.open(source, timeout=5):
                pass
        await asyncio.sleep(0)


async def test_a_cancel_during_connect_attempts_is_never_lost() -> None:
    source = Source.parse(f"mysql://repl:pw@127.0.0.1:{free_port()}")  # nothing listens
    lost = 0
    for _ in range(100):
        give_up = asyncio.Event()
        task = asyncio.create_task(_retry(source, give_up))
        await asyncio.sleep(random.uniform(0.0005, 0.005))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done:  # the cancel was swallowed: the loop went on
            lost += 1
            give_up.set()
            await task
        else:
            assert task.cancelled()
    assert lost == 0
