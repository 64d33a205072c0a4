"""ClientSession and DumpStream in one process: a relay log built from synthesized events,
a session context around it, and the relay's own replica client on the other end of a
socket pair. How each dump ends (KILL, a replacing dump, the replica vanishing, shutdown)
is counted and recorded once, with where the dump stood, and leaves no task behind."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from relay.binlog import walk
from relay.binlog.checksum import verify
from relay.binlog.constants import EventType
from relay.binlog.events import decode_fde
from relay.binlog.gtid import Gtid, GtidState
from relay.config import Source, SyncMode, SyncPolicy
from relay.downstream.accounts import Account
from relay.downstream.answers import Answers
from relay.downstream.auth import Authenticator
from relay.downstream.connection import PacketConnection
from relay.downstream.context import DownstreamSettings, SessionContext
from relay.downstream.dump import DumpRequest, DumpStream
from relay.downstream.registry import AckView, EndReason, SessionInfo, SessionRegistry
from relay.downstream.replies import Err, Replica, Rows
from relay.downstream.semisync import SemiSyncPrimary
from relay.downstream.session import ClientSession
from relay.errors import UpstreamError
from relay.logins import LoginGuard
from relay.relaylog.cursor import SegmentReader
from relay.relaylog.log import RelayLog
from relay.relaylog.retention import Retention, RetentionPolicy
from relay.rules.runtime import Rules
from relay.upstream.protocol import StreamStart, UpstreamProtocol
from relay.upstream.session import Session, SessionSettings
from relay.wire.dumpstream import DumpReader, EventBatch
from tests.helpers import fde, transaction


@dataclass
class Collect:
    """A replica's end of the dump: the events it got."""

    events: list[bytes] = field(default_factory=list)
    got: asyncio.Event = field(default_factory=asyncio.Event)

    def on_stream(self, start: StreamStart) -> None:
        pass

    def on_events(self, batch: EventBatch) -> None:
        self.events += [bytes(batch.data[p : p + n]) for p, n in walk.spans(batch.data)]
        self.got.set()

    async def on_end(self) -> None:
        pass

    def gtids(self) -> list[int]:
        return [int.from_bytes(e[19:27], "little") for e in self.events
                if e[4] == EventType.GTID]


async def _no_primary(sql: str, charset: str) -> Rows | Err:
    return Err(2013, "no primary here")


class Relay:
    """A relay log with 20 transactions and the context its sessions get."""

    def __init__(self, directory: str) -> None:
        self.log = RelayLog(directory, sync=SyncPolicy(SyncMode.OFF))
        self.log.open()
        self.log.start()
        w = self.log.appender()
        w.new_segment(fde())
        for seq in range(1, 21):
            w.begin_group()
            for ev in transaction(Gtid(0, 1, seq)):
                w.append(ev, 0, len(ev))
            w.commit(Gtid(0, 1, seq))
        w.finish()
        self.registry = SessionRegistry()
        settings = DownstreamSettings("127.0.0.1", 0,
                                      {"repl": Account.with_password("repl", "pw")}, 4242,
                                      write_timeout=5, handshake_timeout=5, catchup_wait=1)
        self.executor = ThreadPoolExecutor(1)
        self.ctx = SessionContext(
            self.log, settings,
            Authenticator(settings.accounts, tls=None, guard=LoginGuard(100, 60),
                          connections_of=self.registry.connections_of),
            Answers(self.log, server_id=4242, sessions=self.registry), self.registry,
            _no_primary, Rules(), self.executor, SemiSyncPrimary(),
            Retention(self.log, RetentionPolicy()))
        self.tasks: list[asyncio.Task[None]] = []
        self.ids = 0

    async def connect(self, server_id: int, sink: Collect) -> asyncio.Task[None]:
        """A session on one end of a socket pair, the replica client on the other."""
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        self.ids += 1
        session = ClientSession(self.ctx, PacketConnection(reader, writer), self.ids)
        task = asyncio.create_task(session.run())
        self.registry.add(session, task)
        task.add_done_callback(lambda _: self.registry.discard(session))
        self.tasks.append(task)
        client = _SocketSession(theirs, server_id, sink)
        return asyncio.create_task(client.run(GtidState()))

    async def close(self) -> None:
        await self.registry.close()
        self.log.close()
        self.executor.shutdown()


class _SocketSession(Session):
    """The relay's replica client, over an already connected socket."""

    def __init__(self, sock: socket.socket, server_id: int, sink: Collect) -> None:
        super().__init__(Source("127.0.0.1", 0, "repl", "pw"),
                         SessionSettings(server_id, 1.0, 5.0, 30.0), sink)
        self._sock = sock

    async def open_connection(self) -> tuple[asyncio.Transport, UpstreamProtocol]:
        transport, proto = await asyncio.get_running_loop().create_connection(
            UpstreamProtocol, sock=self._sock)
        return transport, proto


@pytest.fixture
async def relay(tmp_path: pathlib.Path) -> AsyncIterator[Relay]:
    r = Relay(str(tmp_path))
    yield r
    await r.close()


async def _dumping(relay: Relay, sink: Collect) -> None:
    async with asyncio.timeout(5):
        while len(sink.gtids()) < 20:
            sink.got.clear()
            await sink.got.wait()


async def _settled(relay: Relay, client: asyncio.Task[None]) -> None:
    client.cancel()
    with contextlib.suppress(BaseException):
        await client
    async with asyncio.timeout(5):
        await asyncio.wait(relay.tasks)


async def test_a_gtid_dump_serves_every_transaction(relay: Relay) -> None:
    sink = Collect()
    client = await relay.connect(31, sink)
    await _dumping(relay, sink)
    assert sink.gtids() == list(range(1, 21))
    info = relay.registry.snapshot()[0]
    assert info.replica is not None and info.replica.server_id == 31 and info.dump is not None
    assert relay.log.readers.floor() is not None  # its cursor is a registered reader
    await _settled(relay, client)


@pytest.mark.parametrize("how", ["kill", "replaced", "gone", "shutdown"])
async def test_each_way_a_dump_ends_is_recorded_once_and_no_task_is_left(
        relay: Relay, how: str) -> None:
    sink = Collect()
    client = await relay.connect(41, sink)
    await _dumping(relay, sink)
    before = len(asyncio.all_tasks())
    if how == "kill":
        assert relay.registry.kill(1, query_only=False, by="test") is not None
        expected = EndReason.KILLED
    elif how == "replaced":
        again = Collect()
        second = await relay.connect(41, again)
        await _dumping(relay, again)
        expected = EndReason.REPLACED
    elif how == "gone":
        client.cancel()  # the replica's end closes its socket
        expected = EndReason.CLIENT_GONE
    else:
        await relay.registry.close()
        expected = EndReason.SHUTDOWN
    async with asyncio.timeout(5):
        await asyncio.wait([relay.tasks[0]])
    assert relay.registry.ended[expected] == 1
    assert sum(relay.registry.ended.values()) == 1  # that one ending, nothing else
    # What /status lists: the replica's one ending, how, and where its dump stood (it had
    # sent the log's 20 transactions, from its first segment).
    ends = [e for e in relay.registry.recent_ended if e.server_id == 41]
    assert [(e.conn_id, e.reason) for e in ends] == [(1, expected)], ends
    assert ends[0].segment == relay.log.segments[0] and ends[0].bytes_sent > 0
    assert ends[0].position == relay.log.visible[1]
    if how == "replaced":
        # The older dump hears why, as from a primary: error 4052.
        async with asyncio.timeout(5):
            await asyncio.wait({client})
        error = client.exception()
        assert isinstance(error, UpstreamError) and error.server_error is not None
        assert error.server_error.errno == 4052
        await _settled(relay, second)
    await _settled(relay, client)
    # The session's own tasks (its dump and its watcher) went with it.
    assert len(asyncio.all_tasks()) <= before - 1
    assert not [t for t in asyncio.all_tasks() if "watcher" in t.get_name()
                or ": dump" in t.get_name()]
    assert relay.log.readers.snapshot() == []  # and its cursor with them


async def test_a_refused_start_is_an_error_packet_not_a_crash(relay: Relay) -> None:
    sink = Collect()
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    session = ClientSession(relay.ctx, PacketConnection(reader, writer), 99)
    task = asyncio.create_task(session.run())
    client = _SocketSession(theirs, 51, sink)
    with pytest.raises(Exception, match="1236"):
        async with asyncio.timeout(5):
            await client.run(GtidState.parse("0-1-99"))  # the relay never had it
    await asyncio.wait([task], timeout=5)
    assert session.end_reason is EndReason.DUMP_REFUSED


async def _dump_bytes(relay: Relay, request: DumpRequest, *, until_heartbeats: int = 0,
                      begin: Callable[[DumpStream], Coroutine[Any, Any, None]] | None = None,
                      ) -> tuple[list[bytes], DumpReader]:
    """A DumpStream from the log's first segment (or as `begin` starts it) into a socket;
    what the client reads."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    reader, _ = await asyncio.open_connection(sock=theirs)
    stream = DumpStream(relay.log, writer, request)
    task = asyncio.create_task(stream.from_file(relay.log.segments[0], 4) if begin is None
                               else begin(stream))
    dump = DumpReader()
    events: list[bytes] = []
    try:
        async with asyncio.timeout(5):
            while not dump.ended:
                data = await reader.read(1 << 16)
                if not data:
                    break
                batch = dump.feed(data)
                events += [bytes(batch.data[p : p + n]) for p, n in walk.spans(batch.data)]
                if until_heartbeats and sum(e[4] == EventType.HEARTBEAT
                                            for e in events) >= until_heartbeats:
                    break
    finally:
        task.cancel()
        await asyncio.wait([task])
        writer.close()
    return events, dump


def _append_mapped(relay: Relay, seqs: range = range(21, 31)) -> None:
    """Transactions the rules can read (a TABLE_MAP of d.t before the rows): 0-1-21 to
    0-1-30 unless `seqs` says."""
    from relay.binlog import build

    table_map = build.build_event(EventType.TABLE_MAP, (18).to_bytes(6, "little")
                                  + b"\0\0\1d\0\1t\0\1\3\0\0", server_id=1, log_pos=0)
    w = relay.log.appender()
    for seq in seqs:
        w.begin_group()
        events = transaction(Gtid(0, 1, seq))
        for ev in [events[0], table_map, *events[1:]]:
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    w.finish()


def _request(**kw: object) -> DumpRequest:
    base: dict[str, object] = {"client": "test", "server_id": 0, "checksum_aware": True,
                               "rotate_crc": True, "heartbeat": None, "write_timeout": 5.0}
    base.update(kw)
    return DumpRequest(**base)  # type: ignore[arg-type]


async def test_a_non_blocking_dump_serves_the_log_and_ends_with_eof(relay: Relay) -> None:
    events, dump = await _dump_bytes(relay, _request(non_blocking=True))
    assert dump.ended
    assert events[0][4] == EventType.ROTATE and events[1][4] == EventType.FORMAT_DESCRIPTION
    with SegmentReader(relay.log, relay.log.segments[0], reader="test") as seg:
        stored = [d for _, d in seg.events()]
    assert events[2:] == stored[1:]  # the stored events, byte for byte, after the FDE
    assert all(verify(e) for e in events[2:])


async def test_a_client_without_checksums_gets_none(relay: Relay) -> None:
    events, _ = await _dump_bytes(relay, _request(non_blocking=True, checksum_aware=False,
                                                  rotate_crc=False))
    fdes = [e for e in events if e[4] == EventType.FORMAT_DESCRIPTION]
    assert fdes and all(decode_fde(f).checksum_alg == 0 for f in fdes)
    gtids = [e for e in events if e[4] == EventType.GTID]
    assert len(gtids) == 20 and all(len(e) == 19 + 19 and not verify(e) for e in gtids)
    assert all(int.from_bytes(e[9:13], "little") == len(e) for e in events)
    # The events the relay makes are built without a CRC, not cut short a second time:
    # the artificial ROTATE names the whole segment.
    rotate = next(e for e in events if e[4] == EventType.ROTATE)
    assert rotate[19 + 8 :] == relay.log.segments.names[0].encode()


async def test_an_idle_dump_sends_heartbeats_at_the_clients_period(relay: Relay) -> None:
    events, _ = await _dump_bytes(relay, _request(heartbeat=0.05), until_heartbeats=3)
    beats = [e for e in events if e[4] == EventType.HEARTBEAT]
    assert len(beats) >= 3 and events.index(beats[0]) > 20  # after what the log holds
    end = int.from_bytes(beats[-1][13:17], "little")
    assert end == relay.log.visible[1]  # at the end of what was sent


async def test_a_session_added_after_shutdown_began_ends_at_once(relay: Relay) -> None:
    # A connection accepted just before the listener stopped reaches the registry after
    # its close() started: it must not outlive the shutdown.
    await relay.registry.close()
    sink = Collect()
    client = await relay.connect(43, sink)
    async with asyncio.timeout(5):
        await asyncio.wait([relay.tasks[0]])
    assert relay.registry.ended[EndReason.SHUTDOWN] == 1
    assert sink.gtids() == []
    await _settled(relay, client)


async def test_the_next_segment_is_named_by_an_artificial_rotate(relay: Relay) -> None:
    # As a primary crosses into its next file: the stored ROTATE that closed the last
    # segment, then an artificial ROTATE (timestamp 0, log_pos 0) naming the next one,
    # then that segment's FORMAT_DESCRIPTION.
    sink = Collect()
    client = await relay.connect(44, sink)
    await _dumping(relay, sink)
    w = relay.log.appender()
    w.seal()
    w.new_segment(fde())
    w.begin_group()
    for ev in transaction(Gtid(0, 1, 21)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 21))
    w.finish()
    async with asyncio.timeout(5):
        while 21 not in sink.gtids():
            sink.got.clear()
            await sink.got.wait()
    second = relay.log.segments.names[1]
    types = [e[4] for e in sink.events]
    at = types.index(EventType.ROTATE, 1)  # the first is the preamble's artificial one
    stored, artificial, header = sink.events[at : at + 3]
    assert int.from_bytes(stored[17:19], "little") & 0x20 == 0  # stored: not artificial
    assert artificial[4] == EventType.ROTATE and second.encode() in artificial
    assert int.from_bytes(artificial[17:19], "little") & 0x20  # LOG_EVENT_ARTIFICIAL_F
    assert int.from_bytes(artificial[13:17], "little") == 0 and artificial[:4] == b"\0" * 4
    assert header[4] == EventType.FORMAT_DESCRIPTION
    await _settled(relay, client)


async def test_a_dump_with_a_time_limit_holds_there_and_a_non_blocking_one_ends(
        relay: Relay) -> None:
    # Every transaction of the log is later than the limit: nothing of them is sent.
    events, dump = await _dump_bytes(relay, _request(non_blocking=True, until_time_us=-1))
    assert dump.ended and not [e for e in events if e[4] == EventType.GTID]
    # A limit past them all: every one, then the EOF (mysqlbinlog without --stop-never).
    events, dump = await _dump_bytes(relay, _request(non_blocking=True,
                                                     until_time_us=1 << 62))
    assert dump.ended and len([e for e in events if e[4] == EventType.GTID]) == 20
    # A blocking dump holds at the limit and sends heartbeats there.
    events, _ = await _dump_bytes(relay, _request(heartbeat=0.05, until_time_us=-1),
                                  until_heartbeats=2)
    beats = [e for e in events if e[4] == EventType.HEARTBEAT]
    assert len(beats) >= 2 and not [e for e in events if e[4] == EventType.GTID]


@pytest.mark.parametrize("with_rules", [False, True], ids=["plain", "send-rules"])
@pytest.mark.parametrize("checksums", [True, False], ids=["crc", "no-crc"])
async def test_until_master_gtid_pos_ends_the_dump_after_its_gtid(
        relay: Relay, with_rules: bool, checksums: bool) -> None:
    from relay.binlog.events import Event, decode_gtid_list
    from relay.config import parse_config
    from relay.downstream.until import FLAG_UNTIL_REACHED
    from relay.relaylog.positions import resolve_gtid

    _append_mapped(relay)
    rules = Rules.from_entries(parse_config({"rules": [
        {"name": "d", "at": "send", "drop_events": ["annotate"]}]}).rules) \
        if with_rules else None
    start = resolve_gtid(relay.log, GtidState.parse("0-1-23"), relay.log.state.copy())
    request = _request(checksum_aware=checksums, rotate_crc=checksums, rules=rules,
                       executor=relay.executor)
    events, dump = await _dump_bytes(relay, request, begin=lambda stream: stream.from_gtid(
        start, GtidState.parse("0-1-26")))
    assert dump.ended  # EOF after the flagged GTID_LIST
    gtids = [int.from_bytes(e[19:27], "little") for e in events if e[4] == EventType.GTID]
    assert gtids == [24, 25, 26]
    last = events[-1]
    assert last[4] == EventType.GTID_LIST and len(last) == 19 + 4 + 16 + (4 if checksums else 0)
    assert int.from_bytes(last[19:23], "little") == 1 | FLAG_UNTIL_REACHED
    assert decode_gtid_list(Event(last, checksums)) == [Gtid(0, 1, 26)]
    assert all(int.from_bytes(e[9:13], "little") == len(e) for e in events)
    if checksums:
        assert all(verify(e) for e in events[1:])


class _CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts the jobs it is given."""

    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("masked", [False, True], ids=["filters", "mask"])
async def test_a_send_chain_that_reads_no_rows_runs_on_the_loop(
        relay: Relay, masked: bool) -> None:
    """Filters, renames and drops cost a kernel's walk and the table maps: the dump runs
    them on the loop (no thread's hop a chunk); a chain with a mask or a hook reads rows
    and runs in a worker thread. The client gets the same events either way."""
    from relay.config import parse_config
    from relay.relaylog.positions import resolve_gtid

    _append_mapped(relay)
    entries: list[dict[str, object]] = [
        {"name": "d", "at": "send", "drop_events": ["annotate"]}]
    if masked:
        entries.append({"name": "m", "at": "send", "mask": [{"column": "d.t.c",
                                                             "with": "null"}]})
    rules = Rules.from_entries(parse_config({"rules": entries}).rules)
    executor = _CountingExecutor()

    def from_20(stream: DumpStream) -> Coroutine[Any, Any, None]:
        return stream.from_gtid(resolve_gtid(relay.log, GtidState.parse("0-1-20"),
                                             relay.log.state.copy()))
    try:
        events, dump = await _dump_bytes(relay, _request(non_blocking=True, rules=rules,
                                                         executor=executor), begin=from_20)
    finally:
        executor.shutdown()
    assert dump.ended
    plain, _ = await _dump_bytes(relay, _request(non_blocking=True), begin=from_20)
    assert events == plain  # (the mask's column is not in d.t: it changes nothing)
    assert [int.from_bytes(e[19:27], "little") for e in events
            if e[4] == EventType.GTID] == list(range(21, 31))
    assert (executor.jobs > 0) == masked


async def test_a_send_chains_error_in_the_next_chunk_comes_after_the_chunk_before_it(
        relay: Relay) -> None:
    """The chain runs a chunk ahead of what is sent: when it fails on the next chunk (a
    rows event without its table map), the chunk before still goes out first, whether
    the chain ran on the loop or in a thread."""
    from relay.binlog import build
    from relay.config import parse_config
    from relay.errors import RelayError
    from relay.relaylog.positions import resolve_gtid
    from tests.helpers import gtid_event, xid_event

    _append_mapped(relay, range(21, 2021))  # more than a dump's chunk (256 KiB)
    w = relay.log.appender()  # then rows of a table id no TABLE_MAP gave
    w.begin_group()
    for ev in (gtid_event(Gtid(0, 1, 2021)), build.build_event(
            EventType.WRITE_ROWS_V1, b"\x13\0\0\0\0\0\1\0" + b"x" * 40, server_id=1,
            log_pos=0), xid_event(2021)):
        w.append(ev, 0, len(ev))
    w.commit(Gtid(0, 1, 2021))
    w.finish()
    rules = Rules.from_entries(parse_config({"rules": [
        {"name": "d", "at": "send", "drop_events": ["annotate"]}]}).rules)
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    reader, _ = await asyncio.open_connection(sock=theirs)
    stream = DumpStream(relay.log, writer, _request(rules=rules, executor=relay.executor))
    received = bytearray()

    async def read_all() -> None:
        while data := await reader.read(1 << 16):
            received.extend(data)
    reading = asyncio.create_task(read_all())
    with pytest.raises(RelayError, match="TABLE_MAP"):
        await asyncio.wait_for(stream.from_gtid(resolve_gtid(
            relay.log, GtidState.parse("0-1-20"), relay.log.state.copy())), 10)
    writer.close()
    await asyncio.wait_for(reading, 5)
    batch = DumpReader().feed(bytes(received))
    gtids = [int.from_bytes(batch.data[p + 19 : p + 27], "little")
             for p, n in walk.spans(batch.data) if batch.data[p + 4] == EventType.GTID]
    assert len(gtids) > 1000 and gtids == list(range(21, 21 + len(gtids)))


@pytest.mark.parametrize("path", ["pass-through", "per event", "rules"])
async def test_a_client_that_did_not_ask_for_annotations_gets_none(relay: Relay,
                                                                   path: str) -> None:
    """ANNOTATE_ROWS left out, as a MariaDB primary leaves them out for a replica that did
    not ask: by the pass-through framer, the per-event path (a client without checksums)
    and after send rules; the other events as they are stored."""
    from relay.binlog import build
    from relay.config import parse_config
    from relay.relaylog.positions import resolve_gtid

    annotate = build.build_event(EventType.ANNOTATE_ROWS, b"INSERT INTO d.t VALUES (1)",
                                 server_id=1, log_pos=0)
    table_map = build.build_event(EventType.TABLE_MAP, (18).to_bytes(6, "little")
                                  + b"\0\0\1d\0\1t\0\1\3\0\0", server_id=1, log_pos=0)
    w = relay.log.appender()
    for seq in range(21, 26):
        w.begin_group()
        events = transaction(Gtid(0, 1, seq))
        for ev in [events[0], annotate, table_map, *events[1:]]:
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    w.finish()

    def from_20(stream: DumpStream) -> Coroutine[Any, Any, None]:
        return stream.from_gtid(resolve_gtid(relay.log, GtidState.parse("0-1-20"),
                                             relay.log.state.copy()))
    kw: dict[str, object] = {"non_blocking": True}
    if path == "per event":
        kw |= {"checksum_aware": False, "rotate_crc": False}
    if path == "rules":
        kw |= {"rules": Rules.from_entries(parse_config({"rules": [
            {"name": "r", "at": "send", "rename_schema": {"other": "elsewhere"}}]}).rules),
            "executor": relay.executor}
    asked, _ = await _dump_bytes(relay, _request(**kw), begin=from_20)
    events, _ = await _dump_bytes(relay, _request(annotate=False, **kw), begin=from_20)
    assert sum(e[4] == EventType.ANNOTATE_ROWS for e in asked) == 5
    assert events == [e for e in asked if e[4] != EventType.ANNOTATE_ROWS]
    assert [int.from_bytes(e[19:27], "little") for e in events
            if e[4] == EventType.GTID] == list(range(21, 26))


def test_annotations_go_out_as_a_mariadb_primary_sends_them() -> None:
    from relay.binlog.gtid import GtidSet
    from relay.downstream.session import DumpCommand, wants_annotations

    asked, not_asked = DumpCommand(0x02, 5, "", 4), DumpCommand(0x00, 5, "", 4)
    assert wants_annotations(asked, 4) and wants_annotations(asked, 0)
    assert not wants_annotations(not_asked, 4) and not wants_annotations(not_asked, 2)
    # A client that cannot take a hole gets them as they are (capability 1: it knows
    # the event; 0: a MySQL or old client, which a primary sends a dummy QUERY instead).
    assert wants_annotations(not_asked, 1) and wants_annotations(not_asked, 0)
    # COM_BINLOG_DUMP_GTID (MySQL): its 0x02 asks for type-41 heartbeats.
    assert wants_annotations(DumpCommand(0x00, 5, "", 4, GtidSet.parse("")), 4)


class _Follower:
    """A pass-through DumpStream from the log's first segment into a socket pair; the
    test reads the client's end without blocking (`take`)."""

    def __init__(self, relay: Relay, request: DumpRequest, sndbuf: int = 0) -> None:
        self.relay, self.request, self.sndbuf = relay, request, sndbuf
        self.ours, self.theirs = socket.socketpair()
        self.theirs.setblocking(False)
        self.dump = DumpReader()
        self.got: list[bytes] = []

    async def __aenter__(self) -> _Follower:
        if self.sndbuf:
            self.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        _, self.writer = await asyncio.open_connection(sock=self.ours)
        self.stream = DumpStream(self.relay.log, self.writer, self.request)
        self.task = asyncio.create_task(self.stream.from_file(self.relay.log.segments[0], 4))
        async with asyncio.timeout(5):
            while self.relay.log.visibility.waiting != 1 and not self.task.done():
                await asyncio.sleep(0.001)  # (until the dump sent the log and waits)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])
        self.writer.close()
        self.theirs.close()

    def take(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while data := self.theirs.recv(1 << 20):
                batch = self.dump.feed(data)
                self.got.extend(bytes(batch.data[p : p + n])
                                for p, n in walk.spans(batch.data))

    def of_type(self, event_type: int) -> list[bytes]:
        return [e for e in self.got if e[4] == event_type]

    def gtids(self) -> list[int]:
        return [int.from_bytes(e[19:27], "little") for e in self.of_type(EventType.GTID)]

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not done():
                await asyncio.sleep(0.001)
                self.take()


async def test_a_follower_at_the_end_is_sent_what_comes_from_the_move_itself(
        relay: Relay) -> None:
    """A pass-through dump waiting at the log's end gets each new transaction written to
    its socket by the publish that made it visible (no task switch a transaction), and
    goes on waiting; a client whose socket holds bytes back is left to the dump's loop
    (its write timeout), which sends the same bytes in the same order."""
    from tests.helpers import write_transactions

    async with _Follower(relay, _request(heartbeat=30.0), sndbuf=8 << 20) as f:
        f.take()  # (8 MiB of send buffer: a burst below goes whole)
        assert f.gtids() == list(range(1, 21))
        appender = relay.log.appender()
        for seq in range(21, 24):
            write_transactions(appender, range(seq, seq + 1))  # published (sync off) ...
            f.take()  # ... and on the client's socket before the dump's task could run
            assert f.gtids()[-1] == seq and relay.log.visibility.waiting == 1
        assert f.stream.position == relay.log.visible[1]
        # More than a chunk in one publish: the push sends a chunk, the loop the rest
        # (at once, not at the next publish or heartbeat).
        write_transactions(appender, range(24, 424), payload=b"z" * 1500, one_batch=True)
        await f.until(lambda: len(f.gtids()) >= 423)
        # A burst larger than the socket takes: once it holds bytes back the loop takes
        # over (and drains under the write timeout).
        f.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        write_transactions(appender, range(424, 2424), payload=b"y" * 2000)
        await f.until(lambda: len(f.gtids()) >= 2423)
        assert f.gtids() == list(range(1, 2424))
        assert all(verify(e) for e in f.got[2:])


async def test_a_client_that_stops_reading_times_out_after_a_push_left_bytes(
        relay: Relay) -> None:
    """What a push wrote but the socket did not take is drained under the write timeout:
    a client that stopped reading is dropped even when the log then stays idle."""
    from tests.helpers import write_transactions

    f = _Follower(relay, _request(heartbeat=None, write_timeout=0.3), sndbuf=4096)
    f.theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    async with f:  # (20 small transactions fit: it waits at the end)
        assert not f.task.done()
        # one publish, more than the socket and the transport's high-water mark (64 KiB)
        write_transactions(relay.log.appender(), range(21, 22), payload=b"w" * 100_000)
        async with asyncio.timeout(5):
            with pytest.raises(TimeoutError):
                await f.task


async def test_a_follower_fed_by_pushes_gets_heartbeats_only_when_the_log_is_idle(
        relay: Relay) -> None:
    """Each push starts the heartbeat period again, as a send does on a primary: while
    transactions come faster than the period, no heartbeat; once the log is idle, one
    a period, at the position of the last event sent."""
    from tests.helpers import write_transactions

    async with _Follower(relay, _request(heartbeat=0.3)) as f:
        appender = relay.log.appender()
        loop = asyncio.get_running_loop()
        start = loop.time()
        for seq in range(21, 41):  # one every 0.05 s for a second: well inside the period
            write_transactions(appender, range(seq, seq + 1))
            await asyncio.sleep(0.05)
            f.take()
        busy = loop.time() - start
        assert f.gtids()[-20:] == list(range(21, 41))
        assert f.of_type(EventType.HEARTBEAT) == [] and busy > 0.6  # (two periods passed)
        await f.until(lambda: bool(f.of_type(EventType.HEARTBEAT)))
        beat = f.of_type(EventType.HEARTBEAT)[0]
        assert int.from_bytes(beat[13:17], "little") == f.stream.position \
            == relay.log.visible[1]


@dataclass
class _AckingReplica:
    """A registry member: a semi-sync replica's session that sent `acks`."""

    conn_id: int
    acks: int
    end_reason: EndReason | None = None

    def info(self) -> SessionInfo:
        return SessionInfo(self.conn_id, "peer", "repl", None, Replica(7, "h", 1, "repl"),
                           None, 0.0, semi_sync=AckView(self.acks, self.acks, "b.000001:4"))

    def stopping(self, reason: EndReason, detail: str) -> None:
        self.end_reason = reason


async def test_a_replicas_acknowledgements_add_up_across_its_sessions() -> None:
    """The ended sessions' acknowledgements stay counted by server id (the metric is one
    counter per replica across its reconnects, never going down)."""
    registry = SessionRegistry()
    task = asyncio.create_task(asyncio.sleep(0))
    for conn_id, acks in ((1, 5), (2, 3)):
        member = _AckingReplica(conn_id, acks)
        registry.add(member, task)
        registry.discard(member)
    registry.discard(_AckingReplica(1, 100))   # (not a member any more: not counted)
    await task
    assert registry.ended_acks == {7: 8}
