"""Packet framing: 3-byte length + sequence id, with 16 MiB splitting both ways."""

from __future__ import annotations

from relay.errors import RemoteProtocolError
from relay.wire.codec import MAX_PACKET


def frame(payload: bytes | memoryview, seq: int) -> tuple[bytes, int]:
    """Frame one logical payload into physical packets; return (bytes, next_seq)."""
    n = len(payload)
    if n < MAX_PACKET:
        return n.to_bytes(3, "little") + bytes((seq & 0xFF,)) + bytes(payload), (seq + 1) & 0xFF
    out = bytearray()
    pos = 0
    while True:
        chunk = payload[pos : pos + MAX_PACKET]
        out += len(chunk).to_bytes(3, "little") + bytes((seq & 0xFF,))
        out += chunk
        seq = (seq + 1) & 0xFF
        pos += len(chunk)
        if len(chunk) < MAX_PACKET:
            return bytes(out), seq


class PacketReader:
    """Accumulates bytes and yields whole logical payloads (split packets joined).

    Used for the handshake and command phases, where speed does not matter; the
    binlog stream has its own batch parser in relay.upstream.
    """

    def __init__(self, max_payload: int = 1 << 30) -> None:
        self._buf = bytearray()
        self._partial = bytearray()
        self._max = max_payload
        self.next_seq = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_payload(self) -> bytes | None:
        """Return the next complete logical payload, or None if more bytes are needed."""
        while True:
            if len(self._buf) < 4:
                return None
            length = int.from_bytes(self._buf[0:3], "little")
            if len(self._buf) < 4 + length:
                return None
            seq = self._buf[3]
            if seq != self.next_seq:
                raise RemoteProtocolError(f"packets out of order: got seq {seq}, "
                                          f"expected {self.next_seq}")
            self.next_seq = (seq + 1) & 0xFF
            self._partial += self._buf[4 : 4 + length]
            del self._buf[: 4 + length]
            if len(self._partial) > self._max:
                raise RemoteProtocolError("packet larger than the allowed maximum")
            if length < MAX_PACKET:
                payload = bytes(self._partial)
                self._partial.clear()
                return payload
