"""The tap's wire format, sans I/O: frames, positions, errors, the login proof.

A frame is a 4-byte big-endian length and a msgpack map (bin type for bytes). The server
speaks first with {"hello": "relay-tap", "v": 1, "nonce": bytes, "epoch": str}; the client
logs in with {"cmd": "login", "user": str, "proof": HMAC-SHA256(password, nonce)}; then
each request is a map with "cmd" and the server answers with one map, or, for fetch and
subscribe, with a run of frames that ends in {"k": "end", ...}. An error is
{"error": code, "message": text}; after one the connection stays usable unless the code is
"auth", "blocked" or "malformed" (a blocked address gets that error in place of the
greeting).

Positions are integers: segment number << 32 | byte offset in that segment (a binlog
offset fits 32 bits). They grow with the log, and the ones the tap hands out are
transaction boundaries.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from enum import Enum
from typing import Any

import msgpack

from relay.errors import RelayError

VERSION = 1
MAX_FRAME = 64 << 20
HEADER = 4


class TapForm(Enum):
    """How a range is sent: raw events (executors decode them) or decoded row messages."""

    RAW = "raw"
    ROWS = "rows"


class TapError(RelayError):
    """An error frame, raised on the client side; codes:

    auth            wrong user or password (the server closes the connection)
    blocked         the client's address is blocked after too many failed logins in a
                    row ([tap] max_connect_errors): refused before any password is
                    checked (the server closes the connection)
    malformed       a frame that is not msgpack, or too large (the server closes)
    unknown_command a "cmd" the server does not know
    bad_request     a missing or wrong argument
    not_in_log      a position that is no transaction boundary of this log, or one the
                    log no longer holds
    epoch           the log was rebuilt: positions of the old one mean nothing here
    rules           a tap rule stopped the stream (a failing hook)
    denied          a snapshot of a table the user's tap rules hide, or whose values
                    they change (masks, hooks): snapshots read the primary directly
    quota           the user keeps as many snapshots, bytes of plans, subscriber names
                    or subscribers with re-snapshot requests as it may ([tap]
                    max_snapshots_per_user, max_snapshot_bytes_per_user,
                    max_subscribers_per_user)
    internal        a fault of the server's; the request can be retried
    tls             the TLS handshake failed (client side: a wrong CA, a name mismatch)
    """

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[TapError], tuple[str, str]]:
        return TapError, (self.code, self.message)  # Spark ships errors between processes

    def frame(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}


def encode(obj: Any) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(HEADER, "big") + body


class FrameDecoder:
    """Bytes in, whole frames out. A frame over MAX_FRAME or bytes that are not msgpack
    raise TapError("malformed")."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER:
            size = int.from_bytes(buf[pos : pos + HEADER], "big")
            if size > self.max_frame:
                raise TapError("malformed", f"a frame of {size} bytes (the limit is "
                                            f"{self.max_frame})")
            if len(buf) - pos - HEADER < size:
                break
            out.append(decode_body(bytes(buf[pos + HEADER : pos + HEADER + size])))
            pos += HEADER + size
        del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


def decode_body(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as exc:  # TypeError: a map keyed by a list or a map
        raise TapError("malformed", f"not a msgpack frame: {exc}") from None


def position(segment: int, offset: int) -> int:
    return segment << 32 | offset


def split_position(pos: int) -> tuple[int, int]:
    return pos >> 32, pos & 0xFFFFFFFF


def position_text(pos: int) -> str:
    seg, off = split_position(pos)
    return f"{seg}:{off}"


def new_nonce() -> bytes:
    return os.urandom(20)


def proof(password: str, nonce: bytes) -> bytes:
    return hmac.new(password.encode("utf-8"), nonce, hashlib.sha256).digest()


def check_proof(password: str, nonce: bytes, given: Any) -> bool:
    return isinstance(given, bytes) and hmac.compare_digest(proof(password, nonce), given)
