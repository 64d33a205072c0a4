"""Ed25519 as MariaDB's `ed25519` authentication plugin uses it: the secret scalar is
SHA-512 of the *password* (any length), where standard Ed25519 hashes a 32-byte seed.

Hand-written because no library takes that derivation: `cryptography` (OpenSSL) and
libsodium derive the scalar from a 32-byte seed only. Verifying a signature is standard and
goes to `cryptography`; this module computes a password's public key (what the server
stores, as `SHOW CREATE USER` prints it in base64) and signs a server's nonce as
MariaDB's `client_ed25519` does (plugin/auth_ed25519/ref10/sign.c). Arithmetic on Python
integers in extended coordinates (RFC 8032, section 5.1): a login, not a hot path. Not
constant-time: signing takes time that depends on the secret; acceptable for a login
(which a careful setup runs over TLS), not for a signing service.
"""

from __future__ import annotations

import base64
import hashlib

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
_Point = tuple[int, int, int, int]   # extended coordinates (X, Y, Z, T)


def _add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % P
    b = (p[1] + p[0]) * (q[1] + q[0]) % P
    c = 2 * p[3] * q[3] * D % P
    d = 2 * p[2] * q[2] % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _multiply(scalar: int, point: _Point) -> _Point:
    result: _Point = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _encode(point: _Point) -> bytes:
    zinv = pow(point[2], P - 2, P)
    x, y = point[0] * zinv % P, point[1] * zinv % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _base() -> _Point:
    y = 4 * pow(5, P - 2, P) % P
    xx = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    x = pow(xx, (P + 3) // 8, P)
    if (x * x - xx) % P:
        x = x * pow(2, (P - 1) // 4, P) % P
    if x & 1:
        x = P - x
    return (x, y, 1, x * y % P)


B = _base()


def _secret(password: bytes) -> tuple[int, bytes]:
    digest = hashlib.sha512(password).digest()
    scalar = int.from_bytes(digest[:32], "little")
    scalar &= (1 << 254) - 8
    scalar |= 1 << 254
    return scalar, digest[32:]


def public_key(password: bytes) -> bytes:
    """The 32-byte public key of `password`."""
    return _encode(_multiply(_secret(password)[0], B))


def public_key_text(password: bytes) -> str:
    """As the server stores and prints it: base64 without padding (43 characters)."""
    return base64.b64encode(public_key(password)).decode().rstrip("=")


def sign(password: bytes, message: bytes) -> bytes:
    """The 64-byte signature of `message` (the server's nonce) by `password`."""
    scalar, prefix = _secret(password)
    a = _encode(_multiply(scalar, B))
    r = int.from_bytes(hashlib.sha512(prefix + message).digest(), "little") % L
    big_r = _encode(_multiply(r, B))
    k = int.from_bytes(hashlib.sha512(big_r + a + message).digest(), "little") % L
    return big_r + ((r + k * scalar) % L).to_bytes(32, "little")


def parse_public_key(text: str) -> bytes:
    """A stored key (base64, padded or not) as 32 bytes; ValueError if it is none."""
    raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    if len(raw) != 32:
        raise ValueError(f"an ed25519 key is 32 bytes, not {len(raw)}")
    return raw
