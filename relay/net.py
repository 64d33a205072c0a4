"""The listening socket of each of the relay's servers (replicas, the tap, metrics): one
way to bind it, accept connections as plain sockets (a TLS handshake, in-band or from the
first byte, is then the server's own, with a context read per connection and failures it
can name), learn the bound port (a configured port of 0 takes any free one) and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

STREAM_LIMIT = 1 << 20  # a client's line or frame may be this long before the reader pauses
# Connections the kernel queues before the loop accepts them (asyncio's default is 100): a
# burst of reconnecting replicas, or a flood, is queued and answered (served or turned
# away over max_clients) instead of waiting out SYN retransmissions for seconds.
BACKLOG = 1024
log = logging.getLogger("relay.net")


async def open_streams(sock: socket.socket, tls: ssl.SSLContext | None = None,
                       handshake_timeout: float | None = None
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket, after a server-side TLS handshake when `tls` is
    given (its failure raises here, where the caller can name the client)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol, sock, ssl=tls,
        ssl_handshake_timeout=handshake_timeout if tls is not None else None)
    transport.set_write_buffer_limits(high=1 << 20)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def peer_of(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


class SocketListener:
    """Accepts connections as plain sockets, each handed to `accept` in a task this listener
    owns: for a protocol whose server speaks first and may switch to TLS in-band (MySQL),
    where nothing may read ahead of the handshake."""

    def __init__(self, accept: Callable[[socket.socket], Coroutine[Any, Any, None]]) -> None:
        self._accept = accept
        self._sock: socket.socket | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def open(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self._loop_task = asyncio.create_task(self._accepting(sock), name="accept")

    @property
    def port(self) -> int:
        assert self._sock is not None
        return int(self._sock.getsockname()[1])

    async def _accepting(self, sock: socket.socket) -> None:
        try:
            await self._accept_loop(sock)
        finally:
            sock.close()  # here, after the loop stopped watching its descriptor

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and the like: the next accept may work
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._serve(conn)
            # Then whatever else the kernel queued, without a loop round trip each (a burst
            # of reconnecting replicas, or a flood, must not overflow the backlog).
            for _ in range(BACKLOG):
                try:
                    conn, _ = sock.accept()
                except OSError:   # BlockingIOError: the queue is empty
                    break
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # reset before it was set up: nothing to serve
            conn.close()
            return
        # `accept` owns the socket from here (its transport closes it).
        task = asyncio.create_task(self._accept(conn))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def stop(self) -> None:
        """Stop accepting (connections already made go on)."""
        if self._loop_task is not None:
            self._loop_task.cancel()  # its end closes the listening socket

    async def closed(self) -> None:
        """Wait until the accept loop and the connections' tasks are done."""
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
