"""Message ids across nodes (mqttbroker/cluster/sequence.py), sans I/O: a copy of a message
routed already is known by its id, and a session arriving from another node is routed what
this node routed meanwhile and the other had not."""

from __future__ import annotations

from mqttbroker.cluster.sequence import (
    Recent,
    Routed,
    covered,
    new_origin,
    newest,
    parse_id,
    sent_to,
)


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


def test_a_session_arriving_gets_what_it_missed_oldest_first() -> None:
    recent = Recent(seconds=10.0)
    for counter in range(1, 6):
        recent.add(float(counter), "a.1", counter, f"a{counter}")
    recent.add(5.5, "b.1", 1, "b1")
    # The node it comes from had routed a's messages up to 3, none of b's.
    assert [m for _, _, m in recent.missed("dev", {"n": {"a.1": 3}}, 6.0)] == ["a4", "a5", "b1"]


def test_a_session_arriving_gets_what_the_nodes_it_was_at_were_never_sent() -> None:
    """The session was at n1, then n2. a's origin sent a2 to n1 and here (n1 had routed a's
    messages up to 1 when the session left it), a3 to n2 and here, a4 here alone; n2 had
    routed a's up to 3. Only a3 reached the session where it was: n2's counter covers a2,
    but a2 was never sent to n2 (its forward from n1, on its way, is not routed here: this
    node had a2 itself)."""
    recent = Recent(seconds=10.0)
    recent.add(1.0, "a.1", 2, "a2", sent_to(b"n1,here"))
    recent.add(2.0, "a.1", 3, "a3", sent_to(b"n2,here"))
    recent.add(3.0, "a.1", 4, "a4", sent_to(b"here"))
    came = {"n1": {"a.1": 1}, "n2": {"a.1": 3}}
    assert [m for _, _, m in recent.missed("dev", came, 4.0)] == ["a2", "a4"]


def test_a_nodes_counters_cover_what_was_sent_there_and_its_own() -> None:
    came = {"n1": {"a.1": 5, "n1.x": 7}}
    assert covered(came, "a.1", 5, sent_to(b"n1,n2")) and covered(came, "a.1", 4, None)
    assert not covered(came, "a.1", 5, sent_to(b"n2")) and not covered(came, "a.1", 6, None)
    assert not covered(came, "a.1", 3, sent_to(b""))  # (sent to nobody's plain subscriptions)
    assert covered(came, "n1.x", 7, sent_to(b"n2"))  # (n1's own: routed there)
    assert sent_to(b"*") is None and sent_to(b"n1,n2") == {"n1", "n2"}


def test_what_was_routed_while_the_session_was_here_is_not_routed_again() -> None:
    recent = Recent(seconds=10.0)
    recent.add(1.0, "a.1", 1, "a1")  # routed here to the session itself
    recent.left("dev", 2.0)  # handed over to another node
    recent.add(3.0, "a.1", 2, "a2")
    assert [m for _, _, m in recent.missed("dev", {}, 4.0)] == ["a2"]


def test_what_was_forwarded_to_the_session_where_it_was_is_not_routed_again() -> None:
    recent = Recent(seconds=10.0)
    recent.left("dev", 1.0)
    for counter in (1, 2, 3):
        recent.add(1.0 + counter, "a.1", counter, f"a{counter}")
    # The node it comes from routed none of a's messages itself, but got a2 forwarded from here.
    assert [m for _, _, m in recent.missed("dev", {}, 5.0, {("a.1", 2), ("b.1", 2)})] == [
        "a1",
        "a3",
    ]


def test_what_was_not_sent_on_after_all_is_not_routed_to_a_session_arriving() -> None:
    recent = Recent(seconds=10.0)
    for counter in (1, 2, 3):
        recent.add(float(counter), "a.1", counter, f"a{counter}")
    assert recent.has("a.1", 2, 4.0)  # (indexed from now on)
    recent.drop({("a.1", 2), ("b.1", 1)})
    assert not recent.has("a.1", 2, 4.0) and recent.has("a.1", 3, 4.0)
    assert [m for _, _, m in recent.missed("dev", {}, 5.0)] == ["a1", "a3"]


def test_only_the_last_seconds_are_kept() -> None:
    recent = Recent(seconds=10.0, limit=3)
    recent.add(0.0, "a.1", 1, "a1")
    recent.add(11.0, "a.1", 2, "a2")
    assert [m for _, _, m in recent.missed("dev", {}, 11.0)] == ["a2"]
    for counter in range(3, 7):
        recent.add(12.0, "a.1", counter, f"a{counter}")
    assert [m for _, _, m in recent.missed("dev", {}, 12.0)] == ["a4", "a5", "a6"]


def test_a_message_is_found_by_its_id_whether_or_not_it_was_looked_for_before() -> None:
    recent = Recent(seconds=10.0)
    recent.add(1.0, "a.1", 1, "a1")  # (no index kept yet)
    assert recent.has("a.1", 1, 2.0) and recent.when("a.1", 1, 2.0) == 1.0
    recent.add(3.0, "a.1", 2, "a2")  # (kept in the index now)
    assert recent.has("a.1", 2, 4.0) and not recent.has("a.1", 3, 4.0)
    recent.add(20.0, "a.1", 3, "a3")  # (the first two are too old; the index was let go)
    assert recent.has("a.1", 3, 30.0) and not recent.has("a.1", 1, 30.0)


def test_a_message_let_go_of_is_one_the_node_may_have_routed_whatever_the_delay() -> None:
    recent = Recent(seconds=10.0)
    recent.add(0.0, "a.1", 1, "a1")
    recent.add(1.0, "b.1", 7, "b7")
    recent.add(2.0, "a.1", 3, "a3")  # (a's 2 never came here: it went to another node only)
    assert recent.may_have("a.1", 1, 3.0) and not recent.may_have("a.1", 2, 3.0)
    recent.add(10.5, "a.1", 4, "a4")  # a1 let go: 15 s later, a forward of it is not new
    for late in (15.0, 1000.0):
        assert recent.may_have("a.1", 1, late)
        assert not recent.may_have("a.1", 2, late)  # above what was let go: never had it
        assert recent.may_have("a.1", 3, late) and recent.may_have("b.1", 7, late)
        assert not recent.may_have("a.1", 5, late) and not recent.may_have("c.1", 1, late)
    recent.add(20.0, "a.1", 5, "a5")  # (b7 and a3 let go now)
    assert recent.may_have("a.1", 2, 20.0) and recent.may_have("b.1", 6, 20.0)
    assert not recent.may_have("b.1", 8, 20.0)


def test_the_forwards_a_session_takes_along_are_bounded_newest_kept() -> None:
    ids = {f"a.1\x1d{n}" for n in range(1, 13)} | {"b.1\x1d30"}
    assert newest(ids, 20) is ids
    assert newest(ids, 3) == {"a.1\x1d11", "a.1\x1d12", "b.1\x1d30"}
