"""The operations HTTP endpoint: /metrics, /status, /healthz, /readyz and /-/reload, with
their credentials and TLS. What each path answers comes from an OpsView (relay/ops/service.py);
this module owns only the HTTP: a request line and headers, one answer, then close.

Hand-written: it is five fixed paths on the relay's own event loop (no framework's
routing, middleware or threads to carry), and prometheus_client's own server runs in a
thread without TLS choices of ours or a reload path."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from relay.config import is_loopback
from relay.errors import RelayError
from relay.net import SocketListener, open_streams
from relay.ops.status import Readiness
from relay.tls import ServerTls

log = logging.getLogger("relay.ops")
OPEN_PATHS = ("/healthz", "/readyz")   # probes: no credentials needed


class OpsView(Protocol):
    """What the endpoint serves."""

    def exposition(self) -> bytes: ...

    def status(self) -> dict[str, Any]: ...

    def readiness(self) -> Readiness: ...


class AdminServer:
    """The HTTP endpoint of [metrics] listen."""

    def __init__(self, view: OpsView, *, credentials: tuple[str, str] | None = None,
                 tls: ServerTls | None = None) -> None:
        """`credentials`: ("Bearer", token) or ("Basic", base64): what /metrics, /status and
        /-/reload require in an Authorization header. `tls`: HTTPS."""
        self.view = view
        self._authorization = (f"{credentials[0]} {credentials[1]}".encode()
                               if credentials is not None else None)
        self.tls = tls
        self._listener = SocketListener(self._accept)
        self.on_reload: Callable[[], str] | None = None

    async def serve(self, host: str, port: int) -> None:
        await self._listener.open(host, port)
        scheme = "https" if self.tls is not None else "http"
        log.info("metrics and health on %s://%s:%d/metrics, /healthz, /readyz%s", scheme, host,
                 self.port, " (/metrics and /status need credentials)"
                 if self._authorization is not None else "")

    @property
    def port(self) -> int:
        return self._listener.port

    async def close(self) -> None:
        self._listener.stop()
        await self._listener.closed()

    async def _accept(self, sock: socket.socket) -> None:
        try:
            reader, writer = await open_streams(
                sock, self.tls.context if self.tls is not None else None, 5.0)
        except (ssl.SSLError, OSError, TimeoutError):
            sock.close()  # a scraper that cannot do TLS; Prometheus reports it as down
            return
        await self._handle(reader, writer)

    def reload_credentials(self, credentials: tuple[str, str] | None) -> None:
        """Put new credentials in force (a rotated token_file or token_env, read again on
        SIGHUP): the next request is checked against them."""
        self._authorization = (f"{credentials[0]} {credentials[1]}".encode()
                               if credentials is not None else None)

    def _reload_refusal(self, method: bytes, peer: Any, request: bytes
                        ) -> tuple[bytes, str, str] | None:
        """Why /-/reload is refused (body, status, extra headers), or None. It re-reads the
        config and re-executes hook files: POST only (a browser's GET, a link or an
        <img> cannot trigger it), never from a web page (a browser names the page's origin
        in every cross-site POST, even a form's; the relay serves no page of its own, so a
        request that names any origin is a page's), and beyond loopback only with
        credentials."""
        if method != b"POST":
            return (b"/-/reload takes POST (curl -X POST ..., or relay rules reload)\n",
                    "405 Method Not Allowed", "Allow: POST\r\n")
        if {b"origin", b"sec-fetch-site"} & _header_names(request):
            return (b"/-/reload is not taken from a web page (the request names an origin); "
                    b"use relay rules reload, curl -X POST or SIGHUP\n", "403 Forbidden", "")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        if self._authorization is None and not is_loopback(str(host)):
            return (b"/-/reload from beyond loopback needs credentials: set [metrics] "
                    b"token_file, token_env or basic_user (and [metrics.tls]), or reload "
                    b"from the relay's host (relay rules reload, or SIGHUP)\n",
                    "403 Forbidden", "")
        return None

    def _authorized(self, request: bytes) -> bool:
        if self._authorization is None:
            return True
        for line in request.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                return hmac.compare_digest(value.strip(), self._authorization)
        return False

    def _reload(self) -> tuple[bytes, str]:
        if self.on_reload is None:
            return b"nothing to reload\n", "404 Not Found"
        try:
            return (self.on_reload() + "\n").encode(), "200 OK"
        except RelayError as exc:
            return (f"not reloaded, the old rules stay in force: {exc}\n").encode(), \
                "400 Bad Request"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readuntil(b"\r\n\r\n")
            method, target = request.split(b" ", 2)[:2]
            path = target.split(b"?", 1)[0].decode("ascii", "replace")
            headers = ""
            if path not in OPEN_PATHS and not self._authorized(request):
                body, status, ctype = b"unauthorized\n", "401 Unauthorized", "text/plain"
                kind = self._authorization.split(b" ", 1)[0].decode() \
                    if self._authorization else "Bearer"
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                             f"WWW-Authenticate: {kind} realm=\"relay\"\r\nContent-Length: "
                             f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                await writer.drain()
                return
            if path == "/metrics":
                body, status, ctype = (self.view.exposition(), "200 OK",
                                       "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                body = json.dumps(self.view.status(), indent=2).encode() + b"\n"
                status, ctype = "200 OK", "application/json"
            elif path == "/healthz":
                body, status, ctype = b"ok\n", "200 OK", "text/plain"
            elif path == "/-/reload":
                ctype = "text/plain"
                refusal = self._reload_refusal(method, writer.get_extra_info("peername"),
                                               request)
                if refusal is not None:
                    body, status, headers = refusal
                else:
                    await _drain_body(reader, request)
                    body, status = self._reload()
            elif path == "/readyz":
                r = self.view.readiness()
                body = ("ready\n" if r.ready else "not ready: " + "; ".join(r.reasons) + "\n"
                        ).encode()
                status = "200 OK" if r.ready else "503 Service Unavailable"
                ctype = "text/plain"
            else:
                body, status, ctype = b"not found: try /metrics, /status, /healthz, /readyz\n", \
                    "404 Not Found", "text/plain"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{headers}"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError, IndexError, ValueError):
            pass
        finally:
            writer.close()


def _header_names(request: bytes) -> set[bytes]:
    return {line.partition(b":")[0].strip().lower() for line in request.split(b"\r\n")[1:]}


async def _drain_body(reader: asyncio.StreamReader, request: bytes) -> None:
    """Read a request's body (Content-Length, up to 64 KiB; /-/reload ignores it), so that
    closing the connection does not reset it under the answer."""
    for line in request.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
            if length > 1 << 16:
                raise ValueError("request body too long")
            async with asyncio.timeout(5):
                await reader.readexactly(length)
            return
