"""Column masks: NULL, a constant, or a keyed hash, applied to decoded values.

The keyed hash is HMAC-SHA256 of the value's bytes under a key taken from the
environment, so equal values hash equal (joins and GROUP BY still work) and nobody
without the key can reverse or recompute them. Its form follows the column: hex digits
(cut to the column's length) for strings, the digest's bytes (cut to length) for binary
columns, and an integer in range for integer columns.
"""

from __future__ import annotations

import binascii
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from relay.binlog import charsets
from relay.binlog.coltypes import ColumnType, string_real_type
from relay.config import MaskKind
from relay.errors import RelayError

if TYPE_CHECKING:
    from relay.binlog.tablemap import Column

T = ColumnType
_INT_BYTES = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}
_STRINGS = {T.VARCHAR, T.VAR_STRING, T.STRING, T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB,
            T.LONG_BLOB}
_NULL = object()
# Stored with a length prefix and read back as they are (no padding or trimming): a
# hash of their stored bytes is a hash of the value (ColumnMask.hash_stored).
_PREFIXED_STRINGS = {T.VARCHAR, T.VAR_STRING, T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB,
                     T.LONG_BLOB}
_HEX = "0123456789abcdef"
_ASCII = bytes(range(128))
_BLOCK = 64  # SHA-256's block: HMAC's key pads are this long


class _Hash(Protocol):
    def copy(self) -> _Hash: ...
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


def _hmac_pads(key: bytes) -> tuple[_Hash, _Hash]:
    """HMAC-SHA256's inner and outer hashes with the key's pads already taken (RFC 2104):
    a digest then costs two copies, not the key's setup each time (hmac.digest does)."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in key)),
            hashlib.sha256(bytes(b ^ 0x5C for b in key)))


def _ascii_is_ascii(codec: tuple[str, str]) -> bool:
    """Whether the character set decodes each ASCII byte to that character (so ASCII bytes
    are their own UTF-8)."""
    try:
        return _ASCII.decode(*codec) == _ASCII.decode("ascii")
    except UnicodeError:
        return False


class MaskError(RelayError):
    """A mask cannot apply to a column (NULL into NOT NULL, a hash of a date ...) or its
    hash key is missing."""

    code = "rules"


@dataclass(frozen=True)
class Mask:
    column: str              # schema.table.column (wildcards as in table rules)
    kind: MaskKind
    value: Any = None        # the constant
    key_env: str = ""        # the hash key's environment variable

    def __post_init__(self) -> None:
        if not isinstance(self.kind, MaskKind):
            raise TypeError(f"mask of {self.column}: kind is a MaskKind (got {self.kind!r})")

    def key(self) -> bytes:
        key = os.environ.get(self.key_env, "")
        if not key:
            raise MaskError(f"mask of {self.column}: environment variable {self.key_env} "
                            "(the hash key) is not set")
        return key.encode()


def max_length(col: Column) -> int:
    """How many characters (text) or bytes (binary) the column holds."""
    if col.type == T.STRING:
        size = string_real_type(col.meta)[1]
    elif col.type in (T.VARCHAR, T.VAR_STRING):
        size = col.meta
    else:
        size = (1 << (8 * min(col.meta, 4))) - 1  # blobs: the length prefix's limit
    if col.collation is not None and col.collation != charsets.BINARY:
        size //= charsets.mbmaxlen(col.collation)
    return size


class ColumnMask:
    """A mask bound to one column of one table map: `apply(value)` gives the new value."""

    def __init__(self, mask: Mask, col: Column, key: bytes) -> None:
        self.mask = mask
        self.col = col
        if mask.kind is MaskKind.NULL and not col.nullable:
            raise MaskError(f"mask of {mask.column}: column {col.name} is NOT NULL; mask it "
                            "with a constant or a hash instead")
        if mask.kind is MaskKind.HASH and col.type not in _STRINGS and col.type not in _INT_BYTES:
            raise MaskError(f"mask of {mask.column}: a hash needs a string, binary or "
                            f"integer column; {col.name} is {col.type_name}")
        self._text = col.collation is not None and col.collation != charsets.BINARY
        self._limit = max_length(col) if col.type in _STRINGS else 0
        # hash_stored: a hash of a prefixed string column whose stored bytes decode (text
        # in a character set that writes hex digits as ASCII) or are the value (binary)
        self._codec = charsets.codec_of(col.collation) if self._text and \
            col.collation is not None else None
        self._inner, self._outer = _hmac_pads(key)
        # hash_stored's shortcuts past decoding a value to str and encoding it to UTF-8:
        # UTF-8 stored is only checked; ASCII in a set that keeps ASCII is taken as it is.
        self._utf8 = self._codec == ("utf-8", "strict")
        self._ascii_kept = self._codec is not None and _ascii_is_ascii(self._codec)
        self.hashes_stored = mask.kind is MaskKind.HASH and col.type in _PREFIXED_STRINGS \
            and not col.hint and (col.collation == charsets.BINARY or (
                self._codec is not None and _HEX.encode(*self._codec) == _HEX.encode()))
        if mask.kind is MaskKind.CONSTANT and isinstance(mask.value, str | bytes) and \
                col.type in _STRINGS and len(mask.value) > self._limit:
            raise MaskError(f"mask of {mask.column}: the constant is longer than column "
                            f"{col.name} holds ({self._limit})")

    def apply(self, value: Any) -> Any:
        if value is None:
            return None  # NULL stays NULL: no value to hide
        kind = self.mask.kind
        if kind is MaskKind.NULL:
            return None
        if kind is MaskKind.CONSTANT:
            return self.mask.value
        raw = value.encode("utf-8") if isinstance(value, str) else (
            str(value).encode() if not isinstance(value, bytes | bytearray) else bytes(value))
        digest = self._digest(raw)
        col = self.col
        if col.type in _INT_BYTES:
            n = _INT_BYTES[T(col.type)]
            v = int.from_bytes(digest[:n], "little")
            return v if col.unsigned else v - (1 << (8 * n - 1))
        if self._text or isinstance(value, str):
            return digest.hex()[: self._limit]
        return digest[: self._limit]

    def hash_stored(self, stored: bytes) -> bytes:
        """When `hashes_stored`: the stored bytes (no length prefix) of what `apply` gives
        for the value `stored` holds, without decoding the row or encoding it again (the
        masks on stored bytes of relay/rules/engine.py). Text that does not decode raises
        UnicodeDecodeError, as decoding the value would."""
        codec = self._codec
        if codec is None:
            return self._digest(stored)[: self._limit]
        if self._utf8:
            stored.decode("utf-8")  # (checked only: the bytes are their UTF-8)
        elif not (self._ascii_kept and stored.isascii()):
            stored = stored.decode(*codec).encode("utf-8")
        return binascii.hexlify(self._digest(stored))[: self._limit]

    def _digest(self, raw: bytes) -> bytes:
        """HMAC-SHA256 of `raw` under the mask's key (what hmac.digest gives)."""
        inner = self._inner.copy()
        inner.update(raw)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()
