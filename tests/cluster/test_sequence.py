"""Message ids across nodes (mqttbroker/cluster/sequence.py), sans I/O: a copy of a message
routed already is known by its id."""

from __future__ import annotations

from mqttbroker.cluster.sequence import Routed, new_origin, parse_id


def test_an_id_is_read_back_and_a_frame_without_one_is_not() -> None:
    origin = new_origin("n1")
    assert origin.startswith("n1.") and origin != new_origin("n1")
    assert parse_id(f"{origin}\x1d42".encode()) == (origin, 42)
    assert parse_id(b"share-a\x1fshare-b") is None
    assert parse_id(b"n1.x\x1dnot-a-number") is None


def test_a_copy_of_a_message_routed_already_is_not_new() -> None:
    routed = Routed()
    assert routed.first("a.1", 1) and routed.first("a.1", 2)
    assert routed.first("b.1", 1)
    assert not routed.first("a.1", 2)  # the batch sent again
    assert not routed.first("a.1", 1)
    assert routed.first("a.1", 3)
    assert routed.changed
    assert Routed.from_redis({b"a.1": b"3", b"b.1": b"1"}).highest == {"a.1": 3, "b.1": 1}
