"""DumpStream: one client's binlog stream, read from the relay log through its own cursor.

Starts as a real MariaDB primary does (artificial ROTATE, FORMAT_DESCRIPTION, header
events, artificial GTID_LIST after a skip), then sends events as stored, a batch per
write, with an artificial ROTATE before each next segment's header and heartbeats when
idle. Back-pressure is the client's own: `drain()` under `write_timeout`; a stuck client
costs only its own cursor. Reads (`pread`s of the segment, its header) run in the relay
log's reader threads, never on the event loop. With send rules each chunk goes through
the chain in a worker thread, the next chunk's while this one is framed and written (so
hooks may see a chunk that a failed write never sends).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.binlog import build, walk
from relay.binlog.constants import CRC_LEN, FL_STANDALONE, HEADER_LEN, EventType
from relay.binlog.group import GROUP_START, GroupTracker, commit_time_us, txn_of
from relay.binlog.gtid import Gtid, GtidSet, GtidState
from relay.binlog.position import Position
from relay.config import RulePoint
from relay.downstream.listing import transaction_start
from relay.downstream.semisync import ReplicaAcks
from relay.downstream.until import FLAG_UNTIL_REACHED, UntilGtid
from relay.errors import CorruptLog, HookError, MalformedEvent, RelayError
from relay.relaylog.cursor import Chunk, Cursor
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import GtidSetStart, GtidStart, SegmentHeader, segment_header
from relay.rules.runtime import ChainHandle, Rules
from relay.wire.dumpstream import ACK_REQUESTED, frame_eof, frame_event, frame_stored

if TYPE_CHECKING:
    from relay.rules.engine import RuleStream

log = logging.getLogger("relay.downstream")

_MYSQL_GROUP_START = frozenset(map(int, GROUP_START - {EventType.GTID}))
DUMP_CHUNK = 256 << 10  # bytes per wake-up; 1 MiB measured no faster and is less fair


@dataclass
class DumpRequest:
    client: str
    server_id: int
    checksum_aware: bool         # the client set @master_binlog_checksum (to anything)
    rotate_crc: bool             # ... to CRC32: the first artificial ROTATE carries a CRC
    heartbeat: float | None      # seconds; None: no heartbeats
    write_timeout: float
    non_blocking: bool = False   # BINLOG_DUMP_NON_BLOCK: EOF at the end instead of waiting
    user: str = ""               # the login name, for rules that name their clients
    rules: Rules | None = None   # the relay's rules; None or no send rule: pass-through
    executor: Executor | None = None  # where rule chains run, off the event loop
    heartbeat_v2: bool = False   # a MySQL dump's USE_HEARTBEAT_EVENT_V2: type-41 heartbeats
    # No transaction committed after this (microseconds since the epoch) is sent: the dump
    # holds before the first one, as at the log's end (point-in-time recovery).
    until_time_us: int | None = None
    # ANNOTATE_ROWS go out: the client asked for them (BINLOG_SEND_ANNOTATE_ROWS_EVENT) or
    # cannot take a hole in the stream. A MariaDB primary leaves them out otherwise: a
    # replica without log_slave_updates does not ask (one event in five of a one-row
    # transaction, each a write and a parse on the replica).
    annotate: bool = True


@dataclass
class _Ruled:
    """A chunk through the send chain: what goes out, whether the chunk ended inside a
    transaction, and the error of a rule that stopped the stream in it (`produced` is
    then what the rules let out before it). An int among the pieces is where transactions
    a MySQL replica holds were skipped to: a heartbeat there."""

    chunk: Chunk
    produced: Sequence[bytes | int]
    in_transaction: bool
    stopped: HookError | None = None


def _dropped(work: asyncio.Future[_Ruled]) -> None:
    """(A job whose chunk will not be sent: its outcome is dropped, its error too.)"""
    if not work.cancelled():
        work.exception()


class RulesTimeout(RelayError):
    """A chunk of events did not come back from the rules in time (a hook stuck in code
    the watchdog cannot interrupt)."""

    code = "rules_timeout"


class DumpStream:
    def __init__(self, relay_log: RelayLog, writer: asyncio.StreamWriter,
                 request: DumpRequest) -> None:
        self.log = relay_log
        self.writer = writer
        self.req = request
        self.seq = 1
        self.segment = ""
        self.position = 0       # end offset of the last event sent in `segment`
        self.bytes_sent = 0
        self.last_ts = 0        # header timestamp of the last event sent
        self._server_id = 0
        self._log_crc = True
        self._skip: dict[int, int] = {}
        self._strip = False
        self._omit = -1 if request.annotate else EventType.ANNOTATE_ROWS  # (-1: none)
        self._tracker = GroupTracker()
        self._skipping = False
        self._binlog_state = GtidState()  # while skipping: the state as groups pass
        self._list_due = False
        # A MySQL replica's GTID set (COM_BINLOG_DUMP_GTID): its transactions are skipped
        # wherever they are; checked until `_exclude_until` (segment number, offset).
        self._exclude: GtidSet | None = None
        self._exclude_until: tuple[int, int] | None = None
        self._skipped_to = 0   # the end of skipped transactions not yet told (heartbeat)
        self._acks: ReplicaAcks | None = None
        self._ack_tracker: GroupTracker | None = None
        self._rules: ChainHandle | None = None
        self._engine: RuleStream | None = None
        self._partial: Sequence[bytes | int] = []   # what the rules let out before they stopped
        self._inline = False   # the send chain runs on the loop (see _start_rules)
        # A dump with rules asked for a file/position inside a transaction: the engine
        # starts at the transaction's first event, and what comes out of it at or before
        # this offset of that segment the client already has; None once past it.
        self._seen: tuple[str, int] | None = None
        self.computed = 0       # the client's own idea of its position (rules may grow events)
        # Where the dump holds (the first transaction past `until_time_us`), in `segment`
        self.held_at: int | None = None
        # A MariaDB replica's START SLAVE UNTIL master_gtid_pos (relay/downstream/until.py)
        self._until: UntilGtid | None = None
        self._until_skipping = False
        self.until_done = False    # reached: the flagged GTID_LIST went out, EOF follows
        rules = request.rules
        if rules is not None and rules.has(RulePoint.SEND):
            handle = rules.chain(RulePoint.SEND, request.user, request.server_id)
            if handle.chain:
                # imported here: a relay without send rules never loads the rule engine
                from relay.rules.engine import RuleStream

                self._rules = handle
                self._engine = RuleStream(handle.chain)
            else:
                rules.release(handle.chain)

    def use_semi_sync(self, acks: ReplicaAcks | None) -> None:
        """The client set @rpl_semi_sync_slave: every event gets the 0xEF header (before
        the stream starts)."""
        self._acks = acks
        # Where transactions end, to ask a semi-sync replica for an acknowledgement there.
        self._ack_tracker = GroupTracker() if acks is not None and acks.ask else None

    @property
    def acks(self) -> ReplicaAcks | None:
        """The semi-sync side of this dump (None: the client did not negotiate it)."""
        return self._acks

    @property
    def chain(self) -> ChainHandle | None:
        return self._rules

    def close(self) -> None:
        if self._rules is not None and self.req.rules is not None:
            self.req.rules.release(self._rules.chain)
            self._rules = None

    # --- framing ---------------------------------------------------------------------------

    def _event(self, out: bytearray, data: bytes | memoryview, *, sent: bool = False,
               made: bool = False) -> None:
        """Frame one event; `sent`: one of the stream's own (a semi-sync replica is asked
        to acknowledge the one that ends a transaction); `made`: built here, already with
        the client's checksum (only stored events have a CRC to strip)."""
        if self._strip and not made and data[4] != EventType.FORMAT_DESCRIPTION:
            data = build.reframe(data, True, strip_crc=True)
        acks = self._acks
        if acks is None:
            self.seq = frame_event(out, data, self.seq)
            return
        flag = 0
        tracker = self._ack_tracker
        if sent and tracker is not None and tracker.feed(data, self._log_crc and not self._strip):
            flag = ACK_REQUESTED
            acks.request(self.segment, int.from_bytes(data[13:17], "little"))
        self.seq = frame_event(out, data, self.seq, flag)

    def _fde(self, fde: bytes, *, created_zero: bool, log_pos_zero: bool) -> bytes:
        if created_zero or log_pos_zero:
            log_pos = 0 if log_pos_zero else struct.unpack_from("<I", fde, 13)[0]
            fde = build.copy_fde(fde, log_pos=log_pos, created=0 if created_zero else None)
        if self._strip:
            fde = build.fde_without_checksum(fde)
        return fde

    async def _write(self, out: bytearray | bytes, *, then_wait: bool = False) -> None:
        """Send `out`; past the write timeout while the client does not read, fail.
        `then_wait`: the dump waits for the log next (it yields there)."""
        writer = self.writer
        if writer.is_closing():  # reset by the peer while the chunk was read: uvloop
            raise ConnectionResetError("the client closed the connection")  # raises on write
        writer.write(out)
        self.bytes_sent += len(out)
        if writer.transport.get_write_buffer_size():
            # (what went out at once needs no timer: a follower writes once a transaction)
            await self._drain()
        if not then_wait:
            # drain() does not suspend below the high-water mark: yield once per chunk so
            # a fast client cannot starve the others, the upstream or new connections.
            await asyncio.sleep(0)

    async def _drain(self) -> None:
        """Wait until the socket takes what is buffered; past the write timeout, fail."""
        async with asyncio.timeout(self.req.write_timeout):
            await self.writer.drain()

    # --- start -------------------------------------------------------------------------------

    async def _header(self, segment: str) -> SegmentHeader:
        return await self.log.read(lambda: segment_header(self.log, segment))

    def _preamble(self, header: SegmentHeader, segment: str, position: int) -> bytearray:
        self._server_id = struct.unpack_from("<I", header.fde, 5)[0]
        self._log_crc = header.fde[-CRC_LEN - 1] == 1
        if self._engine is not None:
            self._engine.decoder.format_description(header.fde)
        out = bytearray()
        # A checksum-aware client gets events as stored; only this first artificial ROTATE
        # follows the algorithm it named (as a primary does). Others get CRCs stripped.
        self._strip = self._log_crc and not self.req.checksum_aware
        self._event(out, build.rotate(segment, position=position, server_id=self._server_id,
                                      log_pos=0, artificial=True,
                                      checksum=self.req.rotate_crc and not self._strip),
                    made=True)
        self.segment = segment
        return out

    async def from_file(self, segment: str, position: int, *,
                        exclude: GtidSet | None = None,
                        exclude_until: tuple[int, int] | None = None) -> None:
        """From a file and position; `exclude`: a MySQL client's GTID set, whose
        transactions are skipped up to `exclude_until` (None: all along), for
        COM_BINLOG_DUMP_GTID naming a file."""
        self._exclude = exclude
        self._exclude_until = exclude_until
        header = await self._header(segment)
        out = self._preamble(header, segment, position)
        fde = self._fde(header.fde, created_zero=position > 4, log_pos_zero=position > 4)
        self._event(out, fde)
        start = position if position > 4 else 4 + len(header.fde)
        begin = start
        if self._engine is not None and position > 4:
            # Inside a transaction (a replica reconnecting mid-transaction, mysqlbinlog
            # --start-position): the rules need its table maps, so the engine starts at
            # its first event, and the client gets what a dump from there would send
            # from `start` on.
            begin = await self.log.read(lambda: transaction_start(self.log, segment, start))
            if begin < start:
                self._seen = (segment, start)
        self.position = self.computed = start
        await self._write(out)
        await self._stream(Cursor(self.log, segment, begin, reader=self.req.client))

    async def from_gtid(self, start: GtidStart, until: GtidState | None = None) -> None:
        """From a MariaDB GTID position; `until`: the replica's @slave_until_gtid."""
        header = await self._header(start.segment)
        out = self._preamble(header, start.segment, 4)
        self._event(out, self._fde(header.fde, created_zero=not start.at_segment_start,
                                   log_pos_zero=False))
        for ev in header.header_events:
            self._event(out, ev)
        for state, end in start.reached:
            self._event(out, self._gtid_list(state, end), made=True)
        self._skip = dict(start.skip)
        self._binlog_state = start.state.copy()
        self.position = self.computed = start.resume_offset
        if until is not None:
            self._until = UntilGtid(until, start.passed)
            if self._until.reached:  # reached before the start: nothing to send
                self._until_reached(out, start.resume_offset)
                await self._write(out)
                await self._write(frame_eof(self.seq))
                return
        await self._write(out)
        await self._stream(Cursor(self.log, start.segment, start.resume_offset,
                                  reader=self.req.client))

    async def from_gtid_set(self, start: GtidSetStart) -> None:
        """A MySQL replica's auto-positioned dump: the segment from its start, header events
        as stored, then every transaction the replica lacks; a heartbeat tells it where
        the ones it holds ended (as a MySQL primary's dump thread does)."""
        header = await self._header(start.segment)
        out = self._preamble(header, start.segment, 4)
        # The segment's first transaction skipped: created and log_pos cleared, as MySQL
        # does (the replica's SQL thread must not take the FDE's end as its position).
        self._event(out, self._fde(header.fde, created_zero=start.skipped,
                                   log_pos_zero=start.skipped))
        for ev in header.header_events:
            self._event(out, ev)
        self._exclude = start.exclude
        self._exclude_until = start.exclude_until
        self.position = self.computed = start.resume_offset
        if start.skipped:
            self._skipped_to = start.resume_offset
            self._told_skipped(out)
        await self._write(out)
        await self._stream(Cursor(self.log, start.segment, start.resume_offset,
                                  reader=self.req.client))

    def _told_skipped(self, out: bytearray) -> None:
        """The heartbeat after skipped transactions: the replica's position moves past
        them (a MySQL replica counts positions, it does not jump to log_pos)."""
        if self._skipped_to:
            # Through rules the replica's count may be past the stored offset (events the
            # rules made larger): a heartbeat below its count is fatal to it (1623).
            self._event(out, self._heartbeat_event(max(self._skipped_to, self.computed)),
                        made=True)
            if self._acks is not None:  # (what it holds needs no acknowledgement)
                self._acks.holds(self.segment, self._skipped_to)
            self.computed = max(self.computed, self._skipped_to)
            self._skipped_to = 0

    def _heartbeat_event(self, log_pos: int) -> bytes:
        make = build.heartbeat_v2 if self.req.heartbeat_v2 else build.heartbeat
        return make(self.segment, server_id=self._server_id, log_pos=log_pos,
                    checksum=self._log_crc and not self._strip)

    def _excluded_past(self, segment: str, end: int) -> None:
        """Past the log's end when the dump began: no later transaction is in the
        replica's set, so the stream goes back to the fast path."""
        until = self._exclude_until
        if until is not None and (self.log.segments.number_of(segment), end) >= until \
                and not self._skipping:
            self._exclude = None

    # --- the stream ----------------------------------------------------------------------------

    def _gtid_list(self, state: GtidState, end: int, *, stored: bool = False,
                   count_flags: int = 0) -> bytes:
        """An artificial GTID_LIST; `stored`: in the log's own form (a CRC when the log
        has them), for the rules' output, whose framing strips CRCs as a client asks."""
        return build.gtid_list(list(state), server_id=self._server_id, log_pos=end,
                               artificial=True, count_flags=count_flags,
                               checksum=self._log_crc and (stored or not self._strip))

    def _keep(self, data: bytes) -> bool:
        """While some domain is still at or before the client's GTID, drop its groups; for
        a MySQL replica, drop every group whose GTID is in its set."""
        exclude = self._exclude
        if exclude is not None:
            if data[4] in _MYSQL_GROUP_START:
                txn = txn_of(data)
                self._skipping = txn is not None and exclude.contains(txn)
        elif data[4] == EventType.GTID:
            seq, domain = struct.unpack_from("<QI", data, HEADER_LEN)
            gtid = Gtid(domain, struct.unpack_from("<I", data, 5)[0], seq)
            self._binlog_state.update(gtid)
            last = self._skip.get(domain)
            self._skipping = last is not None and seq <= last
            if last is not None and seq >= last:
                del self._skip[domain]  # the client's GTID: later groups of it are new
                self._list_due = True
            if self._until is not None:
                standalone = bool(data[HEADER_LEN + 12] & FL_STANDALONE)
                self._until_skipping = not self._until.admits(gtid, standalone)
        keep = not (self._skipping or self._until_skipping)
        if self._tracker.feed(data, self._log_crc):
            self._skipping = self._until_skipping = False
            if self._until is not None and self._until.reached:
                self.until_done = True  # the group that reached it ends here
        return keep

    def _due_list(self, end: int, *, stored: bool = False) -> bytes | None:
        """After the group in which a domain reached the client's GTID: the artificial
        GTID_LIST a primary sends there (the binlog state; log_pos at the group's end)."""
        if not self._list_due or self._tracker.in_group:
            return None
        self._list_due = False
        return self._gtid_list(self._binlog_state, end, stored=stored)

    async def _stream(self, cursor: Cursor) -> None:
        ahead: asyncio.Future[_Ruled] | None = None  # the rules' work on the next chunk
        push = functools.partial(self._push, cursor)
        try:
            while True:
                if self.held_at is not None:
                    if self.req.non_blocking:  # (mysqlbinlog without --stop-never)
                        await self._write(frame_eof(self.seq))
                        return
                    await self._hold()
                    return
                slow = self._skip or self._skipping or self._strip or self._engine is not None \
                    or self._acks is not None or self._exclude is not None \
                    or self.req.until_time_us is not None or self._until is not None
                ruled = None
                if self._engine is not None:
                    if ahead is None:
                        chunk = await cursor.read_chunk_async(DUMP_CHUNK)
                        if chunk.data:
                            ahead = self._start_rules(chunk)
                    if ahead is not None:
                        ruled = await self._ruled(ahead)  # (a timeout leaves it in `ahead`)
                        ahead = None
                        chunk = ruled.chunk
                elif slow:
                    chunk = await cursor.read_chunk_async(DUMP_CHUNK)
                else:
                    chunk = await cursor.peek_chunk_async(DUMP_CHUNK)
                if not chunk.data:
                    if self.req.non_blocking:
                        await self._write(frame_eof(self.seq))
                        return
                    # (on the pass-through path, what comes while it waits is sent at
                    # once, from the move: _push)
                    if not await cursor.wait(self.req.heartbeat, None if slow else push):
                        await self._heartbeat()
                    elif self.writer.transport.get_write_buffer_size():
                        await self._drain()  # (what a push left in the socket's buffer)
                    continue
                out = bytearray()
                if chunk.segment != self.segment and chunk.offset == 4:
                    # A primary names each next file with an artificial ROTATE before the
                    # file's header, after the stored ROTATE that closed the last one.
                    self._event(out, build.rotate(
                        chunk.segment, position=4, server_id=self._server_id, log_pos=0,
                        artificial=True, checksum=self._log_crc and not self._strip),
                        made=True)
                self.segment = chunk.segment
                if ruled is not None:
                    if ruled.stopped is None and not (self._per_event or self._skipping):
                        # The next chunk goes through the rules while this one is framed
                        # and written (the worker owns the engine until it is done).
                        following = await cursor.read_chunk_async(DUMP_CHUNK)
                        if following.data:
                            ahead = self._start_rules(following)
                    if self._seen is not None and chunk.segment != self._seen[0]:
                        self._seen = None  # (a transaction ends in its segment)
                    self._frame_produced(out, ruled.produced)
                    if ruled.stopped is not None:
                        # A rule stopped the stream: the events before the one it stopped
                        # at go out first, so the client's position is right before it.
                        if out:
                            await self._write(out)
                        raise ruled.stopped
                    used = len(chunk.data)
                    if self._seen is not None and chunk.offset + used >= self._seen[1] \
                            and not ruled.in_transaction:
                        self._seen = None  # past the transaction it started in
                elif slow:
                    self._frame_slow(out, chunk.data, base=chunk.offset)
                    used = len(chunk.data)
                else:
                    used = self._frame_fast(out, chunk, cursor)
                    if used:
                        cursor.advance(used)
                    else:  # one event larger than the chunk: read (and consume) it whole
                        chunk = await cursor.read_chunk_async(DUMP_CHUNK)
                        self._frame_fast(out, chunk, cursor)
                        used = len(chunk.data)
                self.position = chunk.offset + used if self.held_at is None else self.held_at
                if self._exclude is not None:
                    self._told_skipped(out)  # (skipped to the end of this chunk)
                    self._excluded_past(chunk.segment, self.position)
                if out:
                    # (at the visible end the next ask answers "nothing new" and waits)
                    await self._write(out, then_wait=ruled is None and cursor.at_visible_end())
                else:  # a chunk of skipped groups: read from memory, it yields nowhere else
                    await asyncio.sleep(0)
                if self.until_done:  # START SLAVE UNTIL reached: the dump ends here
                    await self._write(frame_eof(self.seq))
                    return
        finally:
            cursor.close()
            if ahead is not None and not ahead.done():
                # A job still runs the chain (a hook may take long): it is released when
                # the job returns, not under it.
                ahead.add_done_callback(self._close_after)
            else:
                if ahead is not None:
                    _dropped(ahead)
                self.close()

    def _push(self, cursor: Cursor) -> bool:
        """The log's end moved while this pass-through dump waited there: send what came,
        read from the page cache, as the dump's loop would, from the move itself (no task
        to wake, no future, no coroutine: about half of what a follower cost a
        transaction). False leaves it to the loop: a socket that holds bytes back (the
        loop's write times out a client that stopped reading), a new segment, bytes not
        in the page cache, a corrupt event (the loop raises it)."""
        writer = self.writer
        if writer.is_closing() or writer.transport.get_write_buffer_size():
            return False
        chunk = cursor.peek_cached(DUMP_CHUNK)
        if chunk is None or chunk.segment != self.segment:
            return False
        out = bytearray()
        seq, last_ts = self.seq, self.last_ts
        try:
            used = self._frame_fast(out, chunk, cursor)
        except CorruptLog:
            return False
        if not used:  # (one event larger than the chunk)
            return False
        try:
            writer.write(out)
        except Exception:  # (the loop's own write meets it again and ends the dump)
            self.seq, self.last_ts = seq, last_ts
            raise
        cursor.advance(used)
        self.position = chunk.offset + used
        self.bytes_sent += len(out)
        # More than a chunk came, or the socket did not take it all: the loop goes on
        # (and drains under the write timeout)
        return cursor.at_visible_end() and not writer.transport.get_write_buffer_size()

    def _frame_fast(self, out: bytearray, chunk: Chunk, cursor: Cursor) -> int:
        """Whole events of the chunk, as stored, each behind its packet header; returns the
        bytes used (a partial event at the end is left for the next read)."""
        try:
            used, last = self._frame_stored(out, chunk.data)
        except MalformedEvent as exc:
            raise cursor.corrupt(chunk.offset + (exc.offset or 0), "impossible event size") \
                from None
        if last >= 0:
            self.last_ts = int.from_bytes(chunk.data[last : last + 4], "little") or self.last_ts
        return used

    def _frame_stored(self, out: bytearray, buf: bytes) -> tuple[int, int]:
        """Frame the whole events of `buf` as they are: (bytes used, start of the last event
        framed, -1 when none)."""
        self.seq, used, last = frame_stored(out, buf, self.seq, self._omit)
        return used, last

    def _frame_slow(self, out: bytearray, chunk: bytes, *, rules: bool = False,
                    base: int = 0) -> None:
        """Per event: GTID skipping, checksum stripping, FDE rewriting; with `rules`, the
        events the send chain produced (skipping done, positions counted). `base`: the
        chunk's offset in its segment."""
        # (looked up once a chunk: this loop runs per event for semi-sync replicas and
        # clients without checksums too, which have neither a time limit nor an UNTIL)
        limited = not rules and self.req.until_time_us is not None
        until = not rules and self._until is not None
        for pos, size in walk.spans(chunk):
            data = chunk[pos : pos + size] if pos or size != len(chunk) else chunk
            listed = None
            if limited and self._past_until(data):
                self.held_at = base + pos
                return
            if not rules and (self._skip or self._skipping or self._exclude is not None
                              or until):
                keep = self._keep(data)
                listed = self._due_list(base + pos + size)
                if not keep:
                    if listed is not None:
                        self._event(out, listed, made=True)
                    if self._exclude is not None:  # (a MariaDB replica takes no heartbeat
                        self._skipped_to = base + pos + size  # mid-stream: its GTID_LIST)
                    if self.until_done:
                        self._until_reached(out, base + pos + size)
                        return
                    continue
                if self._skipped_to:
                    self._told_skipped(out)
            if data[4] == self._omit:  # (a hole the client takes, as its primary leaves)
                if listed is not None:
                    self._event(out, listed, made=True)
                continue
            if data[4] == EventType.FORMAT_DESCRIPTION:
                data = self._fde(data, created_zero=False, log_pos_zero=False)
            self._event(out, data, sent=True)
            if listed is not None:
                self._event(out, listed, made=True)
            if rules:
                log_pos = int.from_bytes(data[13:17], "little")
                self.computed = max(self.computed + len(data), log_pos)
            self.last_ts = int.from_bytes(data[0:4], "little") or self.last_ts
            if until and self.until_done:
                self._until_reached(out, base + pos + size)
                return

    # --- rules --------------------------------------------------------------------------------

    def _close_after(self, work: asyncio.Future[_Ruled]) -> None:
        _dropped(work)
        self.close()

    def _start_rules(self, chunk: Chunk) -> asyncio.Future[_Ruled]:
        """The chunk through the send chain: in a worker thread when a rule reads rows
        (masks and hooks cost CPU; a hook must not hold up the loop), on the loop when none
        does (filters, renames, drops: a kernel's walk and the table maps, bounded by the
        chunk; a thread's hop and hand-back cost more than that work)."""
        loop = asyncio.get_running_loop()
        if self._engine is not None and not self._engine.chain.reads_rows \
                and not self._reload_due():
            # (a reload due between transactions could bring a mask or a hook: a thread's)
            done: asyncio.Future[_Ruled] = loop.create_future()
            self._inline = True
            try:
                done.set_result(self._apply_job(chunk))
            except Exception as exc:  # raised where the thread's would be: on the await,
                done.set_exception(exc)  # after the chunk before it went out
            finally:
                self._inline = False
            return done
        return loop.run_in_executor(self.req.executor, self._apply_job, chunk)

    async def _ruled(self, work: asyncio.Future[_Ruled]) -> _Ruled:
        budget = 10.0 + sum(r.spec.hook_timeout for r in self._engine.chain.rules) \
            if self._engine is not None else 10.0
        try:
            async with asyncio.timeout(budget):
                return await asyncio.shield(work)
        except TimeoutError:
            raise RulesTimeout(f"rules gave no answer for {budget:g}s after "
                               f"{self.segment} {self.position}; a hook is stuck") from None

    def _apply_job(self, chunk: Chunk) -> _Ruled:
        """What the rules let out of the chunk (see _start_rules: in a worker thread, or on
        the loop)."""
        engine = self._engine
        assert engine is not None
        try:
            produced = self._apply_rules(chunk)
        except HookError as exc:
            return _Ruled(chunk, self._partial, engine.in_transaction, exc)
        return _Ruled(chunk, produced, engine.in_transaction)

    def _unseen(self, produced: Sequence[bytes | int]) -> Sequence[bytes | int]:
        """What the rules let out that the client does not have yet: the events whose
        stored end lies past the offset it asked for (each keeps its stored event's
        log_pos; one the rules made, that of the event it stands for)."""
        assert self._seen is not None
        until = self._seen[1]
        out: list[bytes | int] = []
        for piece in produced:
            if isinstance(piece, int):
                out.append(piece)
                continue
            for pos, size in walk.spans(piece):
                if int.from_bytes(piece[pos + 13 : pos + 17], "little") > until:
                    out.append(piece[pos : pos + size])
        return out

    def _frame_produced(self, out: bytearray, produced: Sequence[bytes | int]) -> None:
        if self._seen is not None:
            produced = self._unseen(produced)
        for piece in produced:  # one or more whole events each, or where skips ended
            if isinstance(piece, int):
                self._skipped_to = piece
                self._told_skipped(out)
                continue
            if not piece:
                continue
            if self._strip or self._acks is not None \
                    or piece[4] == EventType.FORMAT_DESCRIPTION:
                self._frame_slow(out, piece, rules=True)
                continue
            _, last = self._frame_stored(out, piece)  # a kept transaction, as stored
            if last < 0:  # (only events the client does not take)
                continue
            log_pos = int.from_bytes(piece[last + 13 : last + 17], "little")
            self.computed = max(self.computed + len(piece), log_pos)
            self.last_ts = int.from_bytes(piece[last : last + 4], "little") or self.last_ts

    def _apply_rules(self, chunk: Chunk) -> Sequence[bytes | int]:
        engine = self._engine
        assert engine is not None
        self._partial = []
        if not (self._per_event or self._skipping):
            try:
                return engine.feed_chunk(chunk.data, chunk.segment, chunk.offset,
                                         self._maybe_reload)
            except HookError:
                self._partial = engine.partial
                raise
        out: list[bytes | int] = []
        data = chunk.data
        skipped_to = 0  # a MySQL replica's transactions skipped up to here, not yet told
        for pos, size in walk.spans(data):
            ev = data[pos : pos + size]
            if self._past_until(ev):
                self.held_at = chunk.offset + pos
                break
            if self._keep(ev):
                if skipped_to:
                    out.append(skipped_to)
                    skipped_to = 0
                if not engine.in_transaction:
                    self._maybe_reload()
                try:
                    out += engine.feed(ev, Position(chunk.segment, chunk.offset + pos))
                except HookError:
                    self._partial = out
                    raise
            elif self._exclude is not None:  # (a MariaDB replica gets its GTID_LIST)
                skipped_to = chunk.offset + pos + size
            if (listed := self._due_list(chunk.offset + pos + size, stored=True)) is not None:
                out.append(listed)
            if self.until_done:
                out.append(self._until_list(chunk.offset + pos + size, stored=True))
                skipped_to = 0
                break
        if skipped_to:
            out.append(skipped_to)
        return out

    def _reload_due(self) -> bool:
        """The relay's rules were reloaded since this dump took its chain."""
        rules = self.req.rules
        return rules is not None and self._rules is not None and \
            rules.version != self._rules.version

    def _maybe_reload(self) -> None:
        """Between transactions: after a rules reload, the new chain from here on (not
        inside a chunk run on the loop: a reload made meanwhile, by the metrics server's
        thread, is the next chunk's, run in a thread)."""
        rules = self.req.rules
        engine = self._engine
        if self._inline or engine is None or not self._reload_due():
            return
        assert rules is not None and self._rules is not None  # (_reload_due says so)
        rules.release(self._rules.chain)
        self._rules = rules.chain(RulePoint.SEND, self.req.user, self.req.server_id)
        engine.set_chain(self._rules.chain)

    @property
    def _per_event(self) -> bool:
        """Whether each event is looked at: skipping at the start, a MySQL replica's set,
        a time limit or an UNTIL position."""
        return bool(self._skip) or self._exclude is not None \
            or self.req.until_time_us is not None or self._until is not None

    def _until_list(self, end: int, *, stored: bool = False) -> bytes:
        """The GTID_LIST that tells a replica its UNTIL position is reached: the binlog
        state as the groups passed, flagged in its count."""
        return self._gtid_list(self._binlog_state, end, stored=stored,
                               count_flags=FLAG_UNTIL_REACHED)

    def _until_reached(self, out: bytearray, end: int) -> None:
        self.until_done = True
        self._event(out, self._until_list(end), made=True)
        log.info("%s: UNTIL master_gtid_pos reached at %s:%d (%s)", self.req.client,
                 self.segment, end, self._binlog_state)

    def _past_until(self, data: bytes) -> bool:
        """Whether `data` opens a transaction committed after the dump's time limit."""
        limit = self.req.until_time_us
        return limit is not None and data[4] in GROUP_START \
            and commit_time_us(data, self._log_crc, original=True) > limit

    async def _hold(self) -> None:
        """At the time limit: nothing more is sent; the client is kept, with heartbeats,
        as at the log's end (a replica stays connected at its last transaction)."""
        log.info("%s: holding at %s:%d, before the first transaction past the time limit",
                 self.req.client, self.segment, self.held_at)
        while True:
            await asyncio.sleep(self.req.heartbeat or 30.0)
            if self.req.heartbeat is not None:
                await self._heartbeat()

    async def _heartbeat(self) -> None:
        out = bytearray()
        # Rules may have made the events the client got larger than they are stored: a
        # heartbeat must never carry a position below the client's own count (fatal 1623).
        self._event(out, self._heartbeat_event(max(self.position, self.computed)), made=True)
        await self._write(out)
