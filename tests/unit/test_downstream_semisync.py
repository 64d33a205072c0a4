"""The relay as a semi-sync primary: acknowledgement packets and the yes/no counts."""

from __future__ import annotations

import struct

import pytest

from relay.downstream.semisync import SemiSyncPrimary, parse_ack
from relay.errors import RemoteProtocolError
from relay.relaylog.replica_acks import ReplicaAckBoard


def ack(name: bytes, pos: int) -> bytes:
    return b"\xef" + struct.pack("<Q", pos) + name


def test_an_acknowledgement_names_file_and_position() -> None:
    assert parse_ack(ack(b"relay-bin.000002", 1234)) == ("relay-bin.000002", 1234)
    with pytest.raises(RemoteProtocolError):
        parse_ack(ack(b"not-a-segment", 1234))
    with pytest.raises(RemoteProtocolError):
        parse_ack(b"\x03SELECT 1")
    with pytest.raises(RemoteProtocolError):
        parse_ack(b"\xef\x01")


def test_each_transaction_counts_once_whichever_replica_acknowledges_it() -> None:
    primary = SemiSyncPrimary(enabled=True)
    a, b = primary.open(), primary.open()
    assert primary.clients == 2 and a.ask
    for replica in (a, b):
        for end in (100, 200, 300):
            replica.request("relay-bin.000001", end)
        replica.request("relay-bin.000002", 50)  # past the rotation: later, numerically
    a.acknowledged("relay-bin.000001", 200)      # covers 100 and 200
    assert primary.yes_tx == 2 and a.acks == 1 and a.last_ack == "relay-bin.000001:200"
    b.acknowledged("relay-bin.000001", 300)      # 100 and 200 were counted already
    assert primary.yes_tx == 3
    a.close()  # owed 300 (acknowledged by b) and 000002:50 (by no one)
    assert primary.no_tx == 1 and primary.clients == 1
    b.acknowledged("relay-bin.000002", 50)
    assert primary.yes_tx == 4
    b.close()
    b.close()  # once only
    assert primary.no_tx == 1 and primary.clients == 0
    assert primary.status()["Rpl_semi_sync_master_yes_tx"] == "4"


def test_the_board_gives_the_position_n_replicas_acknowledged() -> None:
    board = ReplicaAckBoard()
    moved: list[int] = []
    stop = board.add_listener(lambda: moved.append(1))
    assert board.watermark(1) == (0, 0)
    board.report(1, (1, 500))
    board.report(2, (1, 300))
    board.report(2, (1, 200))  # behind what it said: nothing moves
    assert board.watermark(1) == (1, 500) and board.watermark(2) == (1, 300)
    assert board.watermark(3) == (0, 0) and len(moved) == 2
    board.forget(1)
    assert board.watermark(1) == (1, 300) and board.replicas() == 1
    stop()
    board.report(2, (2, 4))
    assert len(moved) == 2
    with pytest.raises(ValueError):
        board.watermark(0)


def test_downstream_acknowledgements_reach_the_board() -> None:
    board = ReplicaAckBoard()
    primary = SemiSyncPrimary(enabled=True, board=board)
    replica = primary.open(7)
    replica.request("relay-bin.000003", 900)
    replica.acknowledged("relay-bin.000003", 900)
    assert board.watermark(1) == (3, 900)
    replica.close()
    assert board.watermark(1) == (0, 0)


def test_an_acknowledgement_beyond_what_was_sent_is_refused() -> None:
    """One forged acknowledgement must not satisfy semi_sync_wait_for_replicas."""
    board = ReplicaAckBoard()
    primary = SemiSyncPrimary(enabled=True, board=board)
    forger = primary.open(key=7)
    forger.request("relay-bin.000001", 100)
    forger.acknowledged("relay-bin.999999", 4294967295)
    forger.acknowledged("relay-bin.000001", 101)
    assert forger.refused == 2 and primary.refused_acks == 2
    assert forger.acks == 0 and primary.yes_tx == 0 and board.watermark(1) == (0, 0)
    forger.acknowledged("relay-bin.000001", 100)   # what it was sent: taken
    assert primary.yes_tx == 1 and board.watermark(1) == (1, 100)


def test_what_a_replica_already_holds_counts_for_the_relays_own_acknowledgement() -> None:
    # A MySQL replica reconnecting with a transaction whose acknowledgement was lost: the
    # relay skips it (it is in the replica's GTID set) and the board has it at once.
    primary = SemiSyncPrimary(enabled=True)
    primary.board = ReplicaAckBoard()
    replica = primary.open(key=7)
    replica.holds("relay-bin.000001", 400)
    assert primary.board.watermark(1) == (1, 400)
    assert primary.yes_tx == 0 and replica.acks == 0   # held, not acknowledged
    replica.request("relay-bin.000001", 500)
    replica.acknowledged("relay-bin.000001", 450)   # between: it was sent (skipped) there
    assert replica.refused == 0 and primary.board.watermark(1) == (1, 450)
