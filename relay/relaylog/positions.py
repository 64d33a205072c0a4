"""Where a reader starts: segment header states, GTID -> (segment, offset) resolution as a
MariaDB primary does it (replication-protocol.md 10.2), and file/offset validation."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from relay.binlog import walk
from relay.binlog.constants import HEADER_LEN, EventType
from relay.binlog.events import Event, decode_fde, decode_gtid_list
from relay.binlog.flavour import header_position
from relay.binlog.gtid import Gtid, GtidPosition, GtidSet, GtidState, TxnId
from relay.errors import MalformedEvent, RelayError
from relay.relaylog import gtid_index
from relay.relaylog.log import RelayLog
from relay.relaylog.segfile import SUFFIX, open_segment


class PositionError(RelayError):
    """A start position the relay cannot serve; the text is what a primary would say.
    `behind` marks the cases that may resolve by waiting: the relay has no log yet, or
    the client asks for a GTID the relay has not received yet."""

    code = "position"

    def __init__(self, message: str, *, behind: bool = False) -> None:
        super().__init__(message)
        self.behind = behind


@dataclass(frozen=True)
class SegmentHeader:
    fde: bytes
    state: GtidPosition       # the GTID_LIST (PREVIOUS_GTIDS) at the segment's start
    header_end: int           # offset of the first event after FDE/GTID_LIST/CHECKPOINTs
    header_events: tuple[bytes, ...]  # GTID_LIST and BINLOG_CHECKPOINT events as stored
    # Every GTID a MariaDB GTID_LIST names: each server's last in each domain (`state`
    # keeps one a domain), what a primary checks an UNTIL position against.
    listed: tuple[Gtid, ...] = ()


@lru_cache(maxsize=256)
def _read_header(path: str, mtime_ns: int) -> SegmentHeader:
    del mtime_ns  # part of the cache key only
    segment = open_segment(path)
    try:
        data = segment.pread(64 << 10, 0)
    finally:
        segment.close()
    end = 4
    fde = b""
    state: GtidPosition = GtidState()
    events: list[bytes] = []
    listed: tuple[Gtid, ...] = ()
    checksum = False
    try:
        for pos, size in walk.spans(data, 4, where=path):
            ev = data[pos : pos + size]
            typ = ev[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                fde = ev
                checksum = decode_fde(ev).has_crc
            elif typ in (EventType.GTID_LIST, EventType.PREVIOUS_GTIDS):
                state = header_position(ev, checksum)
                if typ == EventType.GTID_LIST:
                    listed = tuple(decode_gtid_list(Event(ev, checksum)))
                events.append(ev)
            elif typ == EventType.BINLOG_CHECKPOINT:
                events.append(ev)
            else:
                break
            end = pos + size
    except MalformedEvent as exc:
        raise PositionError(f"segment {os.path.basename(path)}: {exc}") from None
    pos = end
    if not fde:
        raise PositionError(f"segment {os.path.basename(path)} has no FORMAT_DESCRIPTION")
    return SegmentHeader(fde, state, pos, tuple(events), listed)


def segment_header(log: RelayLog, name: str) -> SegmentHeader:
    path = log.path_of(name)
    # The header never changes once written; the key only guards against a re-created
    # file. Plain first, then compressed: compression removes the plain file only once
    # the compressed one is in place.
    for stored in (path, path + SUFFIX):
        try:
            return _read_header(path, os.stat(stored).st_ctime_ns)
        except FileNotFoundError:
            continue
    raise PositionError(f"binary log {name} was purged: Could not find GTID state "
                        "requested by slave in any binlog files. Probably the slave state "
                        "is too old and required binlog files have been purged.")


@dataclass
class GtidStart:
    segment: str
    resume_offset: int               # where the first group to send starts (or the end)
    skip: dict[int, int] = field(default_factory=dict)  # domain -> last seq the client has
    skipped: bool = False            # anything skipped: send an artificial GTID_LIST
    # The client has nothing past the segment's start in any domain: only then may the
    # FORMAT_DESCRIPTION keep `created` (which tells a replica that the primary restarted,
    # so it drops its temporary tables), as a primary decides it (is_pos_reached).
    at_segment_start: bool = True
    # The artificial GTID_LISTs a primary sends before the first group it sends: one as
    # each requested domain's GTID is passed, with the binlog state there and log_pos at
    # the end of that group.
    reached: tuple[tuple[GtidState, int], ...] = ()
    # What a MariaDB primary reads before the first group it sends, in order: the
    # segment's GTID_LIST (every server's last GTID) and the groups skipped. An UNTIL
    # position among them was reached before the start (relay/downstream/until.py).
    passed: tuple[Gtid, ...] = ()

    @property
    def state(self) -> GtidState:
        """The binlog state at resume: the last of each domain of what was passed."""
        return GtidState(self.passed)


def _mariadb(state: GtidPosition) -> GtidState:
    if not isinstance(state, GtidState):
        raise PositionError("this relay log holds MySQL transactions; a MariaDB GTID "
                            "position cannot start a dump in it")
    return state


def resolve_gtid(log: RelayLog, request: GtidState, known: GtidPosition) -> GtidStart:
    """Blocking (it reads the GTID index): callers on the event loop run it in a thread.
    `known` is a copy of the log's GTID state taken on the loop (the writer's state
    belongs to the loop; a thread must not read it)."""
    segments = log.segments.names  # one consistent copy
    if not segments:
        raise PositionError("the relay has no binlog yet", behind=True)
    known = _mariadb(known)
    for g in request:
        mine = known.get(g.domain)
        if mine is not None and g.seq > mine.seq:
            raise PositionError(
                f"Error: connecting slave requested to start from GTID {g}, which is not in "
                "the master's binlog", behind=True)
    chosen = None
    for name in reversed(segments):
        starts_at = _mariadb(segment_header(log, name).state)
        if all((r := request.get(h.domain)) is not None and r.seq >= h.seq for h in starts_at):
            chosen = name
            break
    if chosen is None:
        raise PositionError(
            "Could not find GTID state requested by slave in any binlog files. Probably the "
            "slave state is too old and required binlog files have been purged.")
    header = segment_header(log, chosen)
    starts_at = _mariadb(header.state)
    _check_held(log, request, known, chosen, starts_at)
    seen_domains = known.domains() | starts_at.domains()
    skip = {g.domain: g.seq for g in request if g.domain in seen_domains}
    at_start = all((h := starts_at.get(domain)) is not None and h.seq >= seq
                   for domain, seq in skip.items())
    # A domain whose requested GTID is the segment's start state was reached in an earlier
    # file: nothing to skip or announce for it here.
    skip = {d: seq for d, seq in skip.items()
            if (h := starts_at.get(d)) is None or h.seq < seq}
    limit = log.visible_size(chosen)
    resume = header.header_end  # past every skipped group; the ROTATE of a full one follows
    skipped = False
    state = starts_at.copy()
    reached: list[tuple[GtidState, int]] = []
    passed = list(header.listed)
    for entry in gtid_index.read_entries(log.path_of(chosen)):
        if entry.end > limit:
            break
        txn = entry.txn
        last = skip.get(txn.domain) if isinstance(txn, Gtid) else None
        if last is not None and isinstance(txn, Gtid) and txn.seq <= last:
            skipped = True
            resume = entry.end
            state.update(txn)
            passed.append(txn)
            if txn.seq == last:  # the client's own GTID in this domain: passed
                del skip[txn.domain]
                reached.append((state.copy(), entry.end))
            continue
        resume = entry.start
        break
    if resume == header.header_end:
        skipped = False
    return GtidStart(chosen, resume, skip, skipped, at_start, tuple(reached), tuple(passed))


@dataclass
class GtidSetStart:
    """Where a MySQL replica's auto-positioned dump (COM_BINLOG_DUMP_GTID) starts, as a
    MySQL primary picks it (find_first_log_not_in_gtid_set): the newest segment whose
    PREVIOUS_GTIDS the replica holds all of; from there, every transaction the replica
    holds is skipped."""

    segment: str
    resume_offset: int       # the first transaction the replica lacks (or the end)
    skipped: bool            # transactions of the segment were passed over
    exclude: GtidSet         # the replica's set: transactions in it are never sent
    # The stream may stop checking once past this (segment number, offset): every
    # transaction of the replica's set the relay has ends at or before it (where the last
    # one ends; for a replica whose set is a prefix of the log, where the skipping at the
    # start ends). None: check all along (the replica holds transactions of sources the
    # relay has not seen yet, which may come).
    exclude_until: tuple[int, int] | None


def _mysql(state: GtidPosition) -> GtidSet:
    if not isinstance(state, GtidSet):
        raise PositionError("this relay log holds MariaDB transactions; a MySQL GTID set "
                            "(COM_BINLOG_DUMP_GTID) cannot start a dump in it: point a "
                            "MariaDB replica at it, or the MySQL replica at a MySQL relay")
    return state


def resolve_gtid_set(log: RelayLog, request: GtidSet, known: GtidPosition,
                     visible: tuple[int, int]) -> GtidSetStart:
    """Blocking (it reads segment headers and the GTID index). `known` is the log's
    visible GTID state and `visible` (segment number, offset) where it holds, the two taken
    together on the event loop: what a client may already have is what the log shows, and
    no transaction past `visible` can be in `known`. The errors are a MySQL primary's: the
    replica lacks transactions the relay purged, or holds transactions of a source the
    relay has seen that the relay lacks (it may be behind its primary: waited for, as a
    MariaDB request is)."""
    segments = log.segments.names
    if not segments:
        raise PositionError("the relay has no binlog yet", behind=True)
    known_set = _mysql(known)
    ahead = known_set.first_missing(request)
    if ahead is not None:
        raise PositionError(
            "Slave has more GTIDs than the master has, using the master's SERVER_UUID. "
            f"This may indicate that the end of the binary log was truncated or that the "
            f"last binary log file was lost, e.g., after a power or disk failure when "
            f"sync_binlog != 1. The master may or may not have rolled back transactions "
            f"that were already replicated to the slave. Suggest to replicate any "
            f"transactions that master has rolled back from slave to master, and/or commit "
            f"empty transactions on master to account for transactions that have been "
            f"committed on master but are not included in GTID_EXECUTED. (the relay lacks "
            f"{ahead})", behind=True)
    chosen = None
    for name in reversed(segments):
        if request.covers(_mysql(segment_header(log, name).state)):
            chosen = name
            break
    if chosen is None:
        purged = _mysql(segment_header(log, segments[0]).state)
        raise PositionError(
            "Cannot replicate because the source purged required binary logs. Replicate "
            "the missing transactions from elsewhere, or provision a new replica from "
            "backup. Consider increasing the source's binary log expiration period. The "
            f"GTID set sent by the replica is '{request}'; the relay's oldest binary log "
            f"starts after '{purged}'.")
    header = segment_header(log, chosen)
    limit = log.visible_size(chosen)
    resume = header.header_end
    skipped = False
    for entry in gtid_index.read_entries(log.path_of(chosen)):
        if entry.end > limit or not request.contains(entry.txn):
            break
        resume = entry.end
        skipped = True
    until = _last_excluded(log, request, chosen, resume, visible) \
        if known_set.covers(request) else None
    return GtidSetStart(chosen, resume, skipped, request, until)


def _check_held(log: RelayLog, request: GtidState, known: GtidState, chosen: str,
                starts_at: GtidState) -> None:
    """A primary refuses a replica whose GTID of a domain it has is not in its binlog,
    though its binlog has that domain past the GTID's number: the replica has diverged
    (it executed transactions of its own, or followed another history). Checked here by
    finding each such GTID from the chosen segment on: it is its start state, or a
    transaction of the segments from there (the GTID index), or a later number of its
    server comes before any later one of another server in its domain. Blocking (it reads
    GTID indexes)."""
    pending = {g.domain: g for g in request
               if (mine := known.get(g.domain)) is not None and mine != g
               and starts_at.get(g.domain) != g}
    if not pending:
        return
    last: dict[int, Gtid] = {}  # the last visible transaction of each domain looked for
    for txn in _visible_transactions(log, chosen):
        if not isinstance(txn, Gtid) or (wanted := pending.get(txn.domain)) is None:
            continue
        last[txn.domain] = txn
        if txn == wanted or (txn.server_id == wanted.server_id and txn.seq > wanted.seq):
            # (MariaDB holds a GTID its server's later numbers pass, a hole in the numbers
            # included: its binlog state for that server is past it)
            del pending[wanted.domain]
            if not pending:
                return
        elif txn.seq > wanted.seq:
            break  # another server's passed it: the log does not have it
    else:
        wanted = next(iter(pending.values()))
        if last.get(wanted.domain) != known.get(wanted.domain):
            # What readers see ends before the writer's last transaction of the domain
            # (the state asked about runs ahead of the visible end): waited for.
            raise PositionError(f"Error: connecting slave requested to start from GTID "
                                f"{wanted}, which is not in the master's binlog", behind=True)
    raise PositionError(
        f"Error: connecting slave requested to start from GTID {wanted}, which is not in the "
        "master's binlog. Since the master's binlog contains GTIDs with higher sequence "
        "numbers, it probably means that the slave has diverged due to executing extra "
        "erroneous transactions")


def _visible_transactions(log: RelayLog, first: str) -> Iterator[TxnId]:
    """The transactions of the log from segment `first` on, to what readers may see."""
    segments = log.segments.names
    if first not in segments:  # purged meanwhile: the caller's start is gone too
        return
    for name in segments[segments.index(first):]:
        limit = log.visible_size(name)
        for entry in gtid_index.read_entries(log.path_of(name)):
            if entry.end > limit:
                return
            yield entry.txn


def exclusion_end(log: RelayLog, request: GtidSet, segment: str, offset: int,
                  known: GtidPosition, visible: tuple[int, int]) -> tuple[int, int] | None:
    """For a dump of a MySQL client's set from `segment` at `offset` (a file named in
    COM_BINLOG_DUMP_GTID): where skipping may stop, as resolve_gtid_set's `until`.
    Blocking; `known` and `visible` taken together on the loop."""
    if not _mysql(known).covers(request):
        return None
    return _last_excluded(log, request, segment, offset, visible)


def _last_excluded(log: RelayLog, request: GtidSet, chosen: str, resume: int,
                   visible: tuple[int, int]) -> tuple[int, int]:
    """Where the last transaction of `request` in the log ends (from `chosen` on; at
    least `resume`): past it the dump needs no skipping. Only the segments before the
    first whose PREVIOUS_GTIDS holds all of `request` are read (their GTID index only):
    a replica whose set is a prefix of the log's costs one segment's index."""
    names = log.segments.names
    last = (log.segments.number_of(chosen), resume)
    for name in names[names.index(chosen):]:
        if name != chosen and _mysql(segment_header(log, name).state).covers(request):
            break   # every transaction of the request lies before this segment
        number = log.segments.number_of(name)
        if (number, 0) > visible:
            break
        limit = visible[1] if number == visible[0] else log.visible_size(name)
        for entry in gtid_index.read_entries(log.path_of(name)):
            if entry.end > limit:
                break
            if request.contains(entry.txn):
                last = max(last, (number, entry.end))
    return last


def check_file_position(log: RelayLog, name: str, pos: int) -> tuple[str, int]:
    """Validate a file/offset start; an empty name means the first segment."""
    segments = log.segments.names
    if not name:
        if not segments:
            raise PositionError("the relay has no binlog yet", behind=True)
        name = segments[0]
    if name not in segments:
        raise PositionError("Could not find first log file name in binary log index file")
    size = log.visible_size(name)
    if pos < 4 or pos > size:
        raise PositionError(
            f"Client requested master to start replication from impossible position; the "
            f"first event '{name}' at {pos}, the last event read from '{name}' at 4, the "
            f"last byte read from '{name}' at 4.")
    if 4 < pos < size:
        segment = open_segment(log.path_of(name))
        try:
            head = segment.pread(HEADER_LEN, pos)
        finally:
            segment.close()
        ev_size, log_pos = struct.unpack_from("<II", head, 9) if len(head) == HEADER_LEN else (0, 0)
        if log_pos != pos + ev_size:  # every relay event ends at its own log_pos
            raise PositionError(
                f"Client requested master to start replication from position {pos} of "
                f"'{name}', which is not at an event boundary")
    return name, pos


def binlog_gtid_pos(log: RelayLog, name: str, pos: int) -> GtidPosition | None:
    """The GTID state at (name, pos), as BINLOG_GTID_POS() answers; None if unknown.
    Blocking: it reads the GTID index."""
    if name not in log.segments:
        return None
    state = segment_header(log, name).state.copy()
    for entry in gtid_index.read_entries(log.path_of(name)):
        if entry.end > pos:
            break
        state.update(entry.txn)
    return state
