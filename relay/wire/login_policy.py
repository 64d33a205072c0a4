"""What the relay refuses while it logs in to a primary: one policy for its three client
connections.

The relay talks to primaries through three transports: its own handshake for the binlog
stream (relay/upstream/session.py with relay/wire/auth.py: no library streams binlogs),
aiomysql for queries inside the relay process (relay/mysql/client.py), and PyMySQL in the
Spark executors that read a snapshot (relay/tap/snapshot.py: no event loop there). Each
asks this policy at the same three moments, so a password goes nowhere one of them would
not send it:

- the greeting: with TLS required, a server that does not offer it is refused (a library
  would go on in plain text); a library answers the greeting's method at once, so what
  an auth switch may not ask for, the greeting may not either (aiomysql sends the
  password in clear to a greeting that names mysql_clear_password);
- an auth switch: a clear-text method (mysql_clear_password, dialog) only over TLS, and
  sha256_password without TLS only with get-server-public-key;
- caching_sha2_password's full authentication without TLS fetches the server's RSA key,
  which a man in the middle would answer: only with get-server-public-key, as
  libmysqlclient's --get-server-public-key.

Sans-I/O: the transports say what happened; a refusal is a `LoginRefused` with the client
error number a MySQL client gives, which each transport raises in its library's form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from relay.config import Source
from relay.errors import AuthError

CLEAR_TEXT_METHODS = frozenset({"mysql_clear_password", "dialog"})
SHA256_PASSWORD = "sha256_password"
CR_SSL_CONNECTION_ERROR = 2026
CR_AUTH_PLUGIN_CANNOT_LOAD = 2059
CR_AUTH_PLUGIN_ERR = 2061

NO_TLS_OFFERED = "the server does not offer TLS; not connecting in plain text"
CLEAR_TEXT_REFUSED = ("the server asks for the password in clear text ({method}) on a plain "
                      "connection: refused; use TLS (ssl-mode=REQUIRED or stronger) "
                      "against a server that offers it")
KEY_REQUEST_REFUSED = (
    "the server asks for the password in full without TLS: the relay would have to trust "
    "the RSA key the server sends, which a man in the middle could answer. Use TLS "
    "(ssl-mode=REQUIRED or stronger), or allow it with get-server-public-key=true in the "
    "source URL (as the mysql client's --get-server-public-key)")


@contextmanager
def raised_as(error: Callable[[int, str], Exception]) -> Iterator[None]:
    """The policy's refusals inside the block as a client library's error (`error(errno,
    message)`: PyMySQL's OperationalError for aiomysql and PyMySQL), what its callers
    already catch."""
    try:
        yield
    except LoginRefused as exc:
        raise error(exc.errno, str(exc)) from None


class LoginRefused(AuthError):
    """The policy refused a step of the login; `errno` is the MySQL client's number."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno


@dataclass(frozen=True)
class LoginPolicy:
    tls_required: bool = False       # ssl-mode REQUIRED or stronger
    allow_key_request: bool = False  # get-server-public-key=true
    # Added to refusals: where the user sets what the message names (a Spark option, ...)
    hint: str = ""

    @classmethod
    def of_source(cls, source: Source) -> LoginPolicy:
        """The policy of an upstream source URL (its ssl-mode, get-server-public-key)."""
        return cls(source.tls.mode.required, source.get_server_public_key)

    def _refuse(self, errno: int, message: str) -> LoginRefused:
        return LoginRefused(errno, f"{message}{self.hint}")

    def greeted(self, *, offers_tls: bool, secure: bool, method: str,
                has_password: bool) -> None:
        """The server's greeting, before the client answers it."""
        if self.tls_required and not offers_tls:
            raise self._refuse(CR_SSL_CONNECTION_ERROR, NO_TLS_OFFERED)
        # A library answers the greeting in its method: clear text or a key it sends.
        self.switched(method, secure=secure, has_password=has_password)

    def switched(self, method: str, *, secure: bool, has_password: bool) -> None:
        """The server asks for `method` (an auth switch, or its greeting's first)."""
        if secure:
            return
        if method in CLEAR_TEXT_METHODS:
            raise self._refuse(CR_AUTH_PLUGIN_CANNOT_LOAD,
                               CLEAR_TEXT_REFUSED.format(method=method))
        if method == SHA256_PASSWORD and has_password and not self.allow_key_request:
            raise self._refuse(CR_AUTH_PLUGIN_ERR, KEY_REQUEST_REFUSED)

    def full_authentication(self, *, secure: bool) -> None:
        """caching_sha2_password's full authentication: without TLS the client would ask
        for the server's RSA key."""
        if not secure and not self.allow_key_request:
            raise self._refuse(CR_AUTH_PLUGIN_ERR, KEY_REQUEST_REFUSED)
