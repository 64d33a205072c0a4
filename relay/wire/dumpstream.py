"""The binlog dump stream as a primary sends it, read sans I/O: the one place its packets
are framed.

After COM_BINLOG_DUMP the primary sends one packet per event: length and sequence id,
an OK byte (0x00), then the event; with semi-sync (`@rpl_semi_sync_slave = 1` on a primary
that has it on) two more bytes before the event: 0xEF and a flag whose bit 0 asks for an
acknowledgement. An event of 16 MiB or more spans several packets; an ERR packet ends the
stream with the primary's error, an EOF packet ends a non-blocking dump. A semi-sync
primary restarts its numbering after reading each acknowledgement, so then the sequence
ids are taken as they come.

`DumpReader.feed(bytes)` returns what the bytes complete as one `EventBatch`: whole events
back to back with every packet header and semi-sync header stripped (and the offsets of
the events the primary wants acknowledged). Copying each event once into the batch costs
no more than the per-event slicing sinks would do anyway, and lets them walk plain event
bytes and copy aligned runs whole.

The reader reads every event header anyway, so it also does the per-event bookkeeping
a sink would otherwise repeat in a second pass: it tallies events and bytes by type, and
marks the events a sink must look at (`EventBatch.marks`): those of a type the sink did
not call plain, and those whose log_pos does not follow the previous event's. Between two
marks lie only plain events, each placed right after the one before it in the primary's
file, so a sink can take such a run whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from relay.errors import RemoteProtocolError
from relay.kernels import frame_stored as frame_stored  # the dump's pass-through framer
from relay.kernels import read_dump
from relay.kernels.pure import EVENT, frame_large
from relay.wire.codec import MAX_PACKET
from relay.wire.replies import build_eof, parse_err

SEMI_SYNC_MAGIC = 0xEF
ACK_REQUESTED = 0x01
# Of the event inside a packet the stream needs only its header's length, its size field
# (offset 9) and the heartbeat's type code (the wire layer sits below the binlog codec).
HEADER_LEN = 19
HEARTBEAT = 27
_LENSEQ = struct.Struct("<I")
_SIZE = struct.Struct("<I")
ALL_TYPES = frozenset(range(256))


_BYTES = EVENT - 1


@dataclass(slots=True)
class EventTally:
    """Events and bytes received, by type code (cumulative over connections). Each entry
    packs both, the events above bit 64 and the bytes below it, so counting an event is
    one addition in the reader's loop (`packed[type] += size + EVENT`), not two."""

    packed: list[int] = field(default_factory=lambda: [0] * 256)

    def add(self, typ: int, size: int) -> None:
        self.packed[typ] += size + EVENT

    @property
    def events_by_type(self) -> list[int]:
        return [v >> 64 for v in self.packed]

    @property
    def bytes_by_type(self) -> list[int]:
        return [v & _BYTES for v in self.packed]

    @property
    def events(self) -> int:
        return sum(self.packed) >> 64

    @property
    def bytes(self) -> int:
        return sum(v & _BYTES for v in self.packed)


@dataclass(slots=True)
class EventBatch:
    """Whole events back to back, as the primary sent them (no packet framing)."""

    data: bytearray = field(default_factory=bytearray)
    acks: list[int] = field(default_factory=list)  # offsets of events to acknowledge
    # Offsets of the events a sink must look at, ascending; the events between two marks
    # are plain and follow each other in the primary's file. None: look at every event.
    marks: list[int] | None = None

    @classmethod
    def of(cls, events: list[bytes] | list[bytes | memoryview]) -> EventBatch:
        """A batch of whole events (tests, tools, and sinks that made new events)."""
        data = bytearray()
        for ev in events:
            data += ev
        return cls(data)


class DumpReader:
    def __init__(self, *, semi_sync: bool = False, max_event: int = 1 << 30,
                 plain: frozenset[int] = ALL_TYPES, tally: EventTally | None = None) -> None:
        self.semi_sync = semi_sync
        self.max_event = max_event
        # Event types a sink need not look at one by one, as plain ints (a set of enum
        # members costs the hot loop a subclass comparison per lookup).
        self.plain = frozenset(map(int, plain))
        self._plain_table = bytes(t in self.plain for t in range(256))  # (the kernel's form)
        self.tally = tally if tally is not None else EventTally()
        self._last_pos = -1         # log_pos of the previous event (-1: mark the next)
        self.ended = False          # an EOF packet ended a non-blocking dump
        self._buf = bytearray()
        self._seq = 1               # the first packet of the dump reply
        self._big = bytearray()     # a payload of 16 MiB or more, joined from its packets
        self._big_active = False

    def feed(self, data: bytes) -> EventBatch:
        """The events `data` completes (an empty batch when none). Raises ServerError for
        the primary's ERR packet and RemoteProtocolError for bytes that break the
        protocol."""
        batch = EventBatch(marks=[])
        if self.ended:
            return batch
        buf: bytes | bytearray
        if self._buf:  # a packet was cut at the end of the last read: join it
            self._buf += data
            buf = self._buf
        else:  # the usual case: parse the read as it is (no copy)
            buf = data
        n = len(buf)
        pos = 0
        seq = self._seq
        out = batch.data
        marks = batch.marks
        assert marks is not None
        plain = self._plain_table
        tally = self.tally.packed
        last_pos = self._last_pos
        unpack = _LENSEQ.unpack_from
        strict = not self.semi_sync
        mv = memoryview(buf)
        done = False
        big = self._big_active
        try:
            while True:
                if strict and not big:
                    # The common case, compiled: whole one-event packets in sequence.
                    pos, seq, last_pos = read_dump(buf, pos, seq, last_pos, plain, tally,
                                                   out, marks)
                # Anything else, one packet at a time.
                if n - pos < 4:
                    break
                lenseq = unpack(buf, pos)[0]
                plen = lenseq & 0xFFFFFF
                end = pos + 4 + plen
                if end > n:
                    break
                got = lenseq >> 24
                if got != seq and strict:
                    raise RemoteProtocolError(f"packets out of order: got seq {got}, "
                                              f"expected {seq}")
                seq = (got + 1) & 0xFF
                if plen == MAX_PACKET or big:
                    self._join(mv[pos + 4 : end], plen, batch)
                    big = self._big_active
                else:
                    self._payload(mv[pos + 4 : end], batch)
                last_pos = -1  # mark the event after one taken this way
                pos = end
                if self.ended:
                    break
            self._seq = seq
            self._last_pos = last_pos
            done = True
        finally:
            mv.release()
            if not done:  # the connection ends with this error (a traceback may hold a view)
                self._buf = bytearray()
            elif buf is self._buf:
                del self._buf[:pos]
            elif pos < n:
                self._buf = bytearray(buf[pos:])  # the cut packet's start, for the next read
        return batch

    def _join(self, part: memoryview, plen: int, batch: EventBatch) -> None:
        big = self._big
        if len(big) + len(part) > self.max_event + 8:
            raise RemoteProtocolError(f"an event of over {self.max_event} bytes")
        big += part
        self._big_active = plen == MAX_PACKET
        if not self._big_active:
            payload = bytes(big)
            big.clear()
            self._payload(memoryview(payload), batch)

    def _payload(self, payload: memoryview, batch: EventBatch) -> None:
        """One logical payload the fast path did not take."""
        if not payload:
            raise RemoteProtocolError("empty packet in the dump stream")
        first = payload[0]
        if first == 0xFF:
            raise parse_err(bytes(payload))
        if first == 0xFE and len(payload) < 9:
            self.ended = True
            return
        if first != 0:
            raise RemoteProtocolError(f"unexpected packet 0x{first:02x} in the dump stream")
        event = payload[1:]
        if self.semi_sync:
            if len(event) >= 2 + HEADER_LEN and event[0] == SEMI_SYNC_MAGIC:
                if event[1] & ACK_REQUESTED:
                    batch.acks.append(len(batch.data))
                event = event[2:]
            elif not (len(event) >= HEADER_LEN and event[4] == HEARTBEAT):
                raise RemoteProtocolError("semi-sync: an event packet without the 0xEF "
                                          "header")
        if len(event) < HEADER_LEN:
            raise RemoteProtocolError(f"an event of {len(event)} bytes in the dump stream")
        size = _SIZE.unpack_from(event, 9)[0]
        if size != len(event):
            raise RemoteProtocolError(f"event_size {size} but the packet holds {len(event)} "
                                      "bytes")
        if batch.marks is not None:
            batch.marks.append(len(batch.data))
        self.tally.add(event[4], size)
        batch.data += event


def frame_eof(seq: int) -> bytes:
    """The EOF packet that ends a non-blocking dump (BINLOG_DUMP_NON_BLOCK) at the end of
    the log."""
    eof = build_eof()
    return len(eof).to_bytes(3, "little") + bytes((seq,)) + eof


def frame_event(out: bytearray, event: bytes | bytearray | memoryview, seq: int,
                semi_sync: int | None = None) -> int:
    """Append `event` as dump packets (OK byte, event; split at 16 MiB) to `out`; returns
    the next sequence id. The sending side of the same stream (the relay as a primary).
    With `semi_sync` (the flag byte: ACK_REQUESTED or 0) the event gets the semi-sync
    header a client that set @rpl_semi_sync_slave expects."""
    n = len(event) + (1 if semi_sync is None else 3)
    if n < MAX_PACKET:
        out += n.to_bytes(3, "little")
        out.append(seq)
        out.append(0)
        if semi_sync is not None:
            out.append(SEMI_SYNC_MAGIC)
            out.append(semi_sync)
        out += event
        return (seq + 1) & 0xFF
    head = b"\0" if semi_sync is None else bytes((0, SEMI_SYNC_MAGIC, semi_sync))
    return frame_large(out, head, event, seq)
