"""A TCP proxy that injects link faults between the relay and a primary (or a replica and
the relay), for tests and soaks: reset every connection (RST, as a dropped NAT entry or a
restarted firewall does), cut the link once a number of bytes came from the server
(inside a transaction, say), stall (forward nothing in either direction while keeping the
connections open, as a partition or a frozen peer looks), or deliver what the server sends
one byte at a time. It runs its own event loop on a thread, so a test drives it from
plain code."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading

from relay.testing.mariadb import free_port


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.resets = 0
        self.cuts = 0
        self.connections = 0
        self._cut_after: int | None = None  # server -> client bytes, then a reset (once)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()  # set: forwarding; clear: stalled
        self._trickle = False
        self.trickled = 0  # bytes delivered one at a time
        self._tasks: set[asyncio.Task[None]] = set()  # one per proxied connection

    # --- control (from any thread) -------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def reset_all(self) -> None:
        """Abort every proxied connection with a TCP reset."""
        asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(10)

    def cut_after(self, nbytes: int) -> None:
        """Reset the connections once `nbytes` more came from the server."""
        self._loop.call_soon_threadsafe(setattr, self, "_cut_after", nbytes)

    def stall(self, stalled: bool) -> None:
        """Stop (True) or resume (False) forwarding bytes; connections stay open."""
        self._loop.call_soon_threadsafe(
            self._flowing.clear if stalled else self._flowing.set)

    def trickle(self, on: bool) -> None:
        """Deliver what the server sends one byte per write (True), as a congested or
        fragmenting link does, or whole again (False)."""
        self._loop.call_soon_threadsafe(setattr, self, "_trickle", on)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # --- the proxy -------------------------------------------------------------------------

    async def _start(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._proxy(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for w in (writer, up_writer):  # small writes go out as they are
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._writers |= {writer, up_writer}
        self.connections += 1
        await asyncio.gather(self._pipe(reader, up_writer),
                             self._pipe(up_reader, writer, from_server=True),
                             return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    from_server: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                if from_server and self._trickle:
                    for i in range(len(data)):
                        writer.write(data[i : i + 1])
                        await writer.drain()
                    self.trickled += len(data)
                else:
                    writer.write(data)
                    await writer.drain()
                if from_server and self._cut_after is not None:
                    self._cut_after -= len(data)
                    if self._cut_after <= 0:
                        self._cut_after = None
                        self.cuts += 1
                        await self._reset_all()
                        return
        finally:
            with contextlib.suppress(OSError):
                writer.write_eof()

    async def _reset_all(self) -> None:
        for w in list(self._writers):
            sock = w.get_extra_info("socket")
            if sock is not None:  # linger 0: close sends RST instead of FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))
            w.transport.abort()
        self._writers.clear()
        self.resets += 1

    async def _stop(self) -> None:
        self._flowing.set()
        await self._reset_all()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
