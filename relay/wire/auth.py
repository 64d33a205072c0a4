"""Password scrambles: mysql_native_password, both as client and as server."""

from __future__ import annotations

import hashlib
import hmac


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def native_scramble(password: bytes, salt: bytes) -> bytes:
    """Client side: SHA1(pw) XOR SHA1(salt || SHA1(SHA1(pw)))."""
    if not password:
        return b""
    stage1 = hashlib.sha1(password).digest()
    stage2 = hashlib.sha1(stage1).digest()
    return _xor(stage1, hashlib.sha1(salt[:20] + stage2).digest())


def native_password_hash(password: bytes) -> bytes:
    """What a server stores: SHA1(SHA1(password)); empty for an empty password."""
    if not password:
        return b""
    return hashlib.sha1(hashlib.sha1(password).digest()).digest()


def native_verify(stored_hash: bytes, salt: bytes, response: bytes) -> bool:
    """Server side check of a client's mysql_native_password response."""
    if not stored_hash:
        return response == b""
    if len(response) != 20:
        return False
    candidate = _xor(response, hashlib.sha1(salt[:20] + stored_hash).digest())
    return hmac.compare_digest(hashlib.sha1(candidate).digest(), stored_hash)
