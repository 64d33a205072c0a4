"""The listening socket of each of the relay's servers (replicas, the tap): one way to
bind it, to learn the bound port (a configured port of 0 takes any free one) and to stop
accepting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

Accept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
STREAM_LIMIT = 1 << 20  # a client's line or frame may be this long before the reader pauses
# Connections the kernel queues before the loop accepts them (asyncio's default is 100): a
# burst of reconnecting replicas, or a flood, is queued and answered (served or turned
# away over max_clients) instead of waiting out SYN retransmissions for seconds.
BACKLOG = 1024


class Listener:
    def __init__(self, accept: Accept) -> None:
        self._accept = accept
        self._server: asyncio.Server | None = None

    async def open(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port,
                                                  limit=STREAM_LIMIT, backlog=BACKLOG)

    @property
    def port(self) -> int:
        """The bound port (after `open`)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Stop accepting (connections already made go on)."""
        if self._server is not None:
            self._server.close()

    async def closed(self) -> None:
        """Wait until the connections the server made are gone."""
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
