"""Query answers and start-position resolution, on a relay log built from synthesized
events (no server)."""

from __future__ import annotations

import pathlib

import pytest

from relay.binlog.gtid import Gtid, GtidState
from relay.config import SyncMode, SyncPolicy
from relay.downstream.answers import Answers, PrimarySnapshot
from relay.downstream.replies import Deferred, Err, Kill, Lookup, Ok, Process, Replica, Rows
from relay.downstream.sessionvars import SessionVars
from relay.downstream.statements import split_statements
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import (
    PositionError,
    binlog_gtid_pos,
    check_file_position,
    resolve_gtid,
    segment_header,
)
from tests.helpers import fde, transaction, write_transactions


@pytest.fixture
def log(tmp_path: pathlib.Path) -> RelayLog:
    """Two segments: 0-1-1..0-1-5 (with domain 1 interleaved), then 0-1-6..0-1-8."""
    rl = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    rl.open()
    w = rl.appender()
    w.new_segment(fde())
    for g in [Gtid(0, 1, 1), Gtid(0, 1, 2), Gtid(1, 2, 1), Gtid(0, 1, 3), Gtid(0, 1, 4),
              Gtid(1, 2, 2), Gtid(0, 1, 5)]:
        w.begin_group()
        for ev in transaction(g):
            w.append(ev, 0, len(ev))
        w.commit(g)
    w.seal()
    w.new_segment(fde())
    for seq in (6, 7, 8):
        g = Gtid(0, 1, seq)
        w.begin_group()
        for ev in transaction(g):
            w.append(ev, 0, len(ev))
        w.commit(g)
    w.finish()
    return rl


class Sessions:
    """The relay's connections, as a session registry would list them."""

    def __init__(self, processes: list[Process] | None = None) -> None:
        self._processes = processes or []

    def replicas(self) -> list[Replica]:
        return []

    def processes(self) -> list[Process]:
        return self._processes


def answers(rl: RelayLog) -> Answers:
    return Answers(rl, server_id=4242, sessions=Sessions())


def test_replica_setup_sequence(log: RelayLog) -> None:
    a, s = answers(log), SessionVars()
    assert isinstance(a.answer("SELECT UNIX_TIMESTAMP()", s), Rows)
    r = a.answer("SHOW VARIABLES LIKE 'SERVER_ID'", s)
    assert isinstance(r, Rows) and r.rows == [["server_id", "4242"]] and len(r.columns) == 2
    assert a.answer("SET @master_heartbeat_period= 30000001024", s) == Ok()
    assert s.heartbeat_ns == 30000001024
    assert a.answer("SET @master_binlog_checksum= @@global.binlog_checksum", s) == Ok()
    r = a.answer("SELECT @master_binlog_checksum", s)
    assert isinstance(r, Rows) and r.rows == [["CRC32"]]
    assert a.answer("SET @mariadb_slave_capability=4", s) == Ok() and s.capability == 4
    assert isinstance(a.answer("SELECT @@GLOBAL.gtid_domain_id", s), Rows)
    assert a.answer("SET @slave_connect_state='0-1-9'", s) == Ok()
    assert s.user_vars["slave_connect_state"] == "0-1-9"
    assert a.answer("SET @slave_gtid_strict_mode=1", s) == Ok()
    # unknown SETs are fine; an error there would stop the replica
    assert a.answer("SET @some_future_variable = 'x'", s) == Ok()
    # The relay's own semi-sync setting (off here: the replica stays asynchronous), never
    # the primary's: a replica told ON asks for 0xEF headers.
    r = a.answer("SHOW VARIABLES LIKE 'rpl_semi_sync_master_enabled'", s)
    assert isinstance(r, Rows) and r.rows == [["rpl_semi_sync_master_enabled", "OFF"]]
    assert not s.semi_sync_slave
    assert a.answer("SET @rpl_semi_sync_slave= 1", s) == Ok() and s.semi_sync_slave


def test_mysql_style_multi_assignment(log: RelayLog) -> None:
    a, s = answers(log), SessionVars()
    assert a.answer("SET @master_heartbeat_period = 15000000000, "
                    "@source_heartbeat_period = 15000000000", s) == Ok()
    assert a.answer("SET @master_binlog_checksum = @@global.binlog_checksum, "
                    "@source_binlog_checksum = @@global.binlog_checksum", s) == Ok()
    assert s.user_vars["source_binlog_checksum"] == "CRC32" and s.heartbeat_ns == 15 * 10**9
    r = a.answer("SELECT @@GLOBAL.SERVER_ID", s)
    assert isinstance(r, Rows) and r.rows == [["4242"]]


def test_checksum_never_null(log: RelayLog) -> None:
    r = answers(log).answer("SELECT @master_binlog_checksum", SessionVars())
    assert isinstance(r, Rows) and r.rows == [["NONE"]]


def test_admin_queries(log: RelayLog) -> None:
    a, s = answers(log), SessionVars()
    r = a.answer("select @@gtid_binlog_pos, @@version", s)
    assert isinstance(r, Rows) and r.rows == [["0-1-8,1-2-2", "10.11.19-MariaDB-log"]]
    r = a.answer("SHOW BINARY LOGS", s)
    assert isinstance(r, Rows) and [row[0] for row in r.rows] == list(log.segments)
    deferred = a.answer(f"SELECT BINLOG_GTID_POS('{log.segments[1]}', 4)", s)
    assert isinstance(deferred, Deferred)  # it reads the GTID index: off the event loop
    r = deferred.run()
    assert isinstance(r, Rows) and r.rows == [["0-1-5,1-2-2"]]
    err = a.answer("DROP TABLE x", s)
    assert isinstance(err, Err) and err.code == 1235 and "SHOW MASTER STATUS" in err.message
    assert isinstance(a.answer("SELECT @@no_such_thing", s), Err)


def test_statements_split_as_written() -> None:
    assert split_statements("SELECT 1; SELECT 'a;b' /* ; */; ") == ["SELECT 1", " SELECT 'a;b' /* ; */"]
    assert split_statements("SELECT 1") == ["SELECT 1"]


def test_column_names_aliases_and_forms(log: RelayLog) -> None:
    a, s = answers(log), SessionVars(connection_id=7)
    r = a.answer("SELECT VERSION() AS version", s)
    assert isinstance(r, Rows) and r.columns == ["version"] and r.rows == [["10.11.19-MariaDB-log"]]
    r = a.answer("/* hello */ select @@GLOBAL.gtid_current_pos gtidPos, @@Server_Id, "
                 "connection_id(), 1, 'x' AS `y z`", s)
    assert isinstance(r, Rows)
    assert r.columns == ["gtidPos", "@@Server_Id", "connection_id()", "1", "y z"]
    assert r.rows == [["0-1-8,1-2-2", "4242", "7", "1", "x"]]
    r = a.answer("SELECT @@version_comment LIMIT 1", s)
    assert isinstance(r, Rows) and len(r.rows) == 1


def test_variables_come_from_the_primary_with_the_relays_own(log: RelayLog) -> None:
    up = PrimarySnapshot({"server_id": "1", "binlog_row_metadata": "FULL", "port": "3306",
                   "version": "10.11.19-MariaDB-log", "innodb_buffer_pool_size": "16777216"},
                  {"server_id": "INT UNSIGNED"}, {"Uptime": "999", "Threads_running": "2"})
    a = Answers(log, server_id=4242, sessions=Sessions(), primary=lambda: up, port=3307)
    s = SessionVars()
    r = a.answer("SHOW VARIABLES LIKE 'BINLOG_ROW_METADATA'", s)
    assert isinstance(r, Rows) and r.rows == [["binlog_row_metadata", "FULL"]]
    r = a.answer("show global variables where Variable_name IN ('server_id', 'port') "
                 "or Value = '16777216'", s)
    assert isinstance(r, Rows)
    assert r.rows == [["innodb_buffer_pool_size", "16777216"], ["port", "3307"],
                      ["server_id", "4242"]]
    r = a.answer("SELECT @@server_id", s)
    assert isinstance(r, Rows) and r.defs is not None and r.defs[0].type_code == 8
    # A variable the primary does not have is unknown here too.
    err = a.answer("SELECT @@gtid_mode", s)
    assert isinstance(err, Err) and err.code == 1193
    r = a.answer("SHOW STATUS LIKE 'Thread%'", s)
    assert isinstance(r, Rows) and r.rows == [["Threads_running", "2"]]
    r = a.answer("SHOW GLOBAL STATUS WHERE Variable_name = 'uptime'", s)
    assert isinstance(r, Rows) and r.rows[0][0] == "Uptime" and r.rows[0][1] != "999"


def test_set_kill_metadata_and_listing(log: RelayLog) -> None:
    a, s = answers(log), SessionVars()
    assert a.answer("SET NAMES utf8mb4, @a = 'x', @@session.net_read_timeout = 3600, "
                    "autocommit = 1", s) == Ok()
    assert s.user_vars["a"] == "x" and s.system["net_read_timeout"] == "3600"
    r = a.answer("SELECT @@session.net_read_timeout, @a", s)
    assert isinstance(r, Rows) and r.rows == [["3600", "x"]]
    assert isinstance(a.answer("SET GLOBAL read_only = 0", s), Err)
    assert a.answer("KILL 12", s) == Kill(12, False)
    assert a.answer("KILL QUERY 12", s) == Kill(12, True)
    # metadata: look-ups the relay composes (test_lookups.py has their rules)
    composed = {
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'a'":
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'a' "
            "LIMIT 10001",
        "SHOW CREATE TABLE a.t": "SHOW CREATE TABLE `a`.`t`",
        "show databases": "SHOW DATABASES"}
    for q, sql in composed.items():
        r = a.answer(q, s)
        assert isinstance(r, Lookup) and r.sql == sql, (q, r)
    r = a.answer("SHOW FULL COLUMNS FROM t FROM a", s)
    assert isinstance(r, Lookup) and "information_schema.COLUMNS" in r.sql
    assert isinstance(a.answer("SELECT * FROM shop.orders", s), Err)
    no_fwd = Answers(log, server_id=1, forward_metadata=False)
    assert isinstance(no_fwd.answer("SHOW CREATE TABLE a.t", s), Err)
    listing = a.answer(f"SHOW BINLOG EVENTS IN '{log.segments[0]}' FROM 4 LIMIT 1, 3", s)
    assert isinstance(listing, Deferred)
    rows = listing.run()
    assert isinstance(rows, Rows) and len(rows.rows) == 3
    assert rows.columns == ["Log_name", "Pos", "Event_type", "Server_id", "End_log_pos",
                            "Info"]
    assert rows.rows[0][2] == "Gtid_list" and rows.rows[2][2] == "Gtid"
    assert str(rows.rows[2][5]).startswith(("BEGIN GTID 0-1-1", "GTID 0-1-1"))
    bad = a.answer("SHOW BINLOG EVENTS IN 'nope'", s)
    assert isinstance(bad, Err) and bad.code == 1220
    assert isinstance(a.answer("SELEC 1", s), Err)


def test_session_charset_user_and_processlist(log: RelayLog) -> None:
    a = Answers(log, server_id=4242, sessions=Sessions([
        Process(7, "cdc", "10.0.0.5:4000", None, "Binlog Dump", 12, "waiting"),
        Process(9, "cdc", "10.0.0.6:5000", "s", "Sleep", 3, None),
        Process(11, "admin", "10.0.0.7:6000", None, "Sleep", 1, None)]))
    s = SessionVars(connection_id=9, user="cdc", host="10.0.0.6")
    assert isinstance(a.answer("SET NAMES utf8mb4", s), Ok) and s.collation == 45
    assert s.charset == "utf8mb4"
    assert isinstance(a.answer("SET NAMES latin1 COLLATE latin1_bin", s), Ok)
    assert s.collation == 47
    assert isinstance(a.answer("SET CHARACTER SET utf8", s), Ok) and s.collation == 33
    bad = a.answer("SET NAMES klingon", s)
    assert isinstance(bad, Err) and bad.code == 1115 and s.collation == 33
    r = a.answer("SELECT USER(), CURRENT_USER() AS cu", s)
    assert isinstance(r, Rows) and r.rows == [["cdc@10.0.0.6", "cdc@%"]]
    listing = a.answer("SHOW PROCESSLIST", s)
    assert isinstance(listing, Rows) and listing.columns[:5] == [
        "Id", "User", "Host", "db", "Command"]
    assert [row[0] for row in listing.rows] == ["7", "9"]
    assert listing.rows[0][4] == "Binlog Dump" and listing.rows[1][4] == "Query"
    assert listing.rows[1][7] == "SHOW PROCESSLIST"
    # others' connections are for admins only (a server's PROCESS privilege)
    everyone = a.answer("SHOW FULL PROCESSLIST", SessionVars(connection_id=11, user="admin",
                                                             admin=True))
    assert isinstance(everyone, Rows) and [row[0] for row in everyone.rows] == ["7", "9", "11"]


def test_column_flags_follow_the_server(log: RelayLog) -> None:
    a = answers(log)
    s = SessionVars()
    r = a.answer("SELECT VERSION() AS v, @x, UNIX_TIMESTAMP(), 1", s)
    assert isinstance(r, Rows) and r.defs is not None
    version, user_var, ts, one = r.defs
    assert version.flags & 0x01 and version.type_code == 0xFD
    assert user_var.type_code == 0xFB  # user variables are LONGBLOB strings
    assert ts.charset == 63 and ts.flags & 0x80 and not ts.flags & 0x01
    assert one.flags == 0x81
    listing = a.answer("SHOW VARIABLES LIKE 'server_id'", s)
    assert isinstance(listing, Rows) and listing.defs is not None
    assert all(d.flags == 0x1001 for d in listing.defs)


def test_resolve_gtid_picks_segment_and_skips(log: RelayLog) -> None:
    start = resolve_gtid(log, GtidState.parse("0-1-3,1-2-1"), log.state.copy())
    assert start.segment == log.segments[0] and start.skipped
    header = segment_header(log, log.segments[0])
    assert start.resume_offset > header.header_end
    # exactly the second segment's start state: no skipping there
    start = resolve_gtid(log, GtidState.parse("0-1-5,1-2-2"), log.state.copy())
    assert start.segment == log.segments[1] and not start.skipped
    start = resolve_gtid(log, GtidState.parse("0-1-7,1-2-2"), log.state.copy())
    assert start.segment == log.segments[1] and start.skipped
    # a fresh replica (empty state) starts at the first segment
    start = resolve_gtid(log, GtidState(), log.state.copy())
    assert start.segment == log.segments[0] and not start.skipped


def test_only_a_start_at_the_segment_start_keeps_created(log: RelayLog) -> None:
    # created set tells a replica that the primary restarted (it drops its temporary
    # tables): only a client with nothing past the segment's start may see it.
    assert resolve_gtid(log, GtidState(), log.state.copy()).at_segment_start
    assert resolve_gtid(log, GtidState.parse("0-1-5,1-2-2"), log.state.copy()).at_segment_start
    # Naming only domain 1: the segment's first transaction (domain 0) is not skipped, yet
    # the client holds 1-2-1, which lies inside the segment.
    start = resolve_gtid(log, GtidState.parse("1-2-1"), log.state.copy())
    assert start.segment == log.segments[0] and not start.skipped
    assert not start.at_segment_start
    assert not resolve_gtid(log, GtidState.parse("0-1-7,1-2-2"),
                            log.state.copy()).at_segment_start


def test_an_artificial_gtid_list_as_each_requested_domain_is_passed(log: RelayLog) -> None:
    # Segment 0: 0-1-1, 0-1-2, 1-2-1, 0-1-3, 0-1-4, 1-2-2, 0-1-5. A primary sends one
    # artificial GTID_LIST after the group holding each requested GTID: the binlog state
    # there, log_pos at the group's end.
    start = resolve_gtid(log, GtidState.parse("0-1-3,1-2-1"), log.state.copy())
    assert [str(state) for state, _ in start.reached] == ["0-1-2,1-2-1", "0-1-3,1-2-1"]
    assert start.reached[-1][1] == start.resume_offset and not start.skip
    # Domain 1 passed at the start, domain 0 (1-2-2 after 0-1-4) while streaming.
    start = resolve_gtid(log, GtidState.parse("0-1-1,1-2-2"), log.state.copy())
    assert [str(state) for state, _ in start.reached] == ["0-1-1"]
    assert start.skip == {1: 2} and str(start.state) == "0-1-1"
    # At a segment's exact start state: nothing to pass, nothing announced.
    start = resolve_gtid(log, GtidState.parse("0-1-5,1-2-2"), log.state.copy())
    assert start.reached == () and start.skip == {}


def test_what_a_gtid_start_passes_before_its_first_group(log: RelayLog) -> None:
    # Segment 0 (its GTID_LIST empty): the groups skipped, in order.
    start = resolve_gtid(log, GtidState.parse("0-1-3,1-2-1"), log.state.copy())
    assert [str(g) for g in start.passed] == ["0-1-1", "0-1-2", "1-2-1", "0-1-3"]
    # Segment 1: its GTID_LIST (every server's last GTID), then the groups skipped.
    start = resolve_gtid(log, GtidState.parse("0-1-7,1-2-2"), log.state.copy())
    header = segment_header(log, start.segment)
    assert start.passed[:len(header.listed)] == header.listed
    assert [str(g) for g in header.listed] == ["0-1-5", "1-2-2"]
    assert [str(g) for g in start.passed[len(header.listed):]] == ["0-1-6", "0-1-7"]


def test_resolve_gtid_errors(log: RelayLog) -> None:
    with pytest.raises(PositionError, match="not in the master's binlog") as ahead:
        resolve_gtid(log, GtidState.parse("0-1-99"), log.state.copy())
    assert ahead.value.behind  # (the relay may be behind its primary: waited for)


@pytest.mark.parametrize(("request_", "lacking"), [
    ("0-2-3", "0-2-3"), ("0-1-3,1-3-1", "1-3-1"), ("0-2-5,1-2-2", "0-2-5"),
    ("0-1-4,1-1-2", "1-1-2")])
def test_a_replica_whose_gtid_the_log_lacks_has_diverged(log: RelayLog, request_: str,
                                                        lacking: str) -> None:
    # As a MariaDB primary: a GTID of a domain the log has, numbered at or below the log's
    # last of that domain, that is not in the log (another server id: the replica executed
    # transactions of its own, or followed another history) is refused, not waited for.
    with pytest.raises(PositionError, match="diverged") as refused:
        resolve_gtid(log, GtidState.parse(request_), log.state.copy())
    assert not refused.value.behind
    assert f"from GTID {lacking}, which is not in the master's binlog" in str(refused.value)


def test_a_hole_in_a_servers_numbers_is_no_divergence(tmp_path: pathlib.Path) -> None:
    # 0-1-1, 0-1-2, 0-1-5 (a server that skipped numbers): a replica at 0-1-3 holds what
    # MariaDB's binlog state for server 1 is past, as a primary takes it.
    rl = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    rl.open()
    w = rl.appender()
    w.new_segment(fde())
    for seq in (1, 2, 5):
        w.begin_group()
        for ev in transaction(Gtid(0, 1, seq)):
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    w.finish()
    assert resolve_gtid(rl, GtidState.parse("0-1-3"), rl.state.copy()).segment
    with pytest.raises(PositionError, match="diverged"):  # another server's 3: diverged
        resolve_gtid(rl, GtidState.parse("0-2-3"), rl.state.copy())
    rl.close()


def test_a_replica_whose_gtids_are_in_the_log_or_in_no_domain_of_it_is_served(
        log: RelayLog) -> None:
    for held in ("0-1-3,1-2-1", "0-1-5,1-2-2", "0-1-1", "1-2-2", str(log.state),
                 "0-1-4,7-9-100"):  # (domain 7: the log has none of it)
        assert resolve_gtid(log, GtidState.parse(held), log.state.copy()).segment
    log.appender().rotate_if_full()


def test_file_positions(log: RelayLog) -> None:
    name = log.segments[1]
    assert check_file_position(log, "", 4) == (log.segments[0], 4)
    header = segment_header(log, name)
    assert check_file_position(log, name, header.header_end) == (name, header.header_end)
    with pytest.raises(PositionError, match="not at an event boundary"):
        check_file_position(log, name, header.header_end + 3)
    with pytest.raises(PositionError, match="impossible position"):
        check_file_position(log, name, 10**7)
    with pytest.raises(PositionError, match="Could not find first log file"):
        check_file_position(log, "nope.000009", 4)
    assert str(binlog_gtid_pos(log, name, log.visible[1])) == "0-1-8,1-2-2"


def test_a_gtid_written_but_not_yet_visible_is_waited_for_not_called_diverged(
        tmp_path: pathlib.Path) -> None:
    rl = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    rl.open()
    w = rl.appender()
    write_transactions(w, range(1, 4))  # visible
    for seq in (4, 5):  # written, not published yet
        w.begin_group()
        for ev in transaction(Gtid(0, 1, seq)):
            w.append(ev, 0, len(ev))
        w.commit(Gtid(0, 1, seq))
    assert str(rl.visible_state) == "0-1-3" and str(rl.state) == "0-1-5"
    with pytest.raises(PositionError) as waited:
        resolve_gtid(rl, GtidState.parse("0-1-4"), rl.state.copy())
    assert waited.value.behind and "diverged" not in str(waited.value)
    w.finish()  # now visible: served
    assert resolve_gtid(rl, GtidState.parse("0-1-4"), rl.state.copy()).skipped
    rl.close()
