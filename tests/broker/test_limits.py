"""Configurable limits: each one answered with the right reason code, harming nobody else."""

from __future__ import annotations

from typing import Any

from support.harness import FakeLink, Harness, Prop, pk

from mqttbroker.broker.policy import ListenerPolicy


def _connect_as(h: Harness, client_id: str, user: str | None, expiry: int, clean: bool) -> Any:
    """CONNECT as ``user``; the CONNACK."""
    client = h.client(peer=f"peer-{client_id}")
    client.send(
        pk.Connect(
            client_id=client_id,
            clean_start=clean,
            username=user,
            properties={Prop.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {},
        )
    )
    (connack,) = client.receive(limit=1)
    assert isinstance(connack, pk.Connack)
    return client, connack


def test_max_connections_closes_the_extra_connection(make_harness: Any) -> None:
    h = make_harness(max_connections=2)
    first = h.connect("a")
    h.connect("b")
    extra = h.client()
    assert extra.closed  # closed on accept, before any byte
    assert h.broker.refused == 1
    first.subscribe("t")  # the others are unharmed


def test_max_connections_per_address(make_harness: Any) -> None:
    h: Harness = make_harness(max_connections_per_address=1)
    one = h.client(peer="10.0.0.1:1000")
    two = h.client(peer="10.0.0.1:1001")
    other = h.client(peer="10.0.0.2:1000")
    assert not one.closed and two.closed and not other.closed
    one.lose()  # the slot is given back
    again = h.client(peer="10.0.0.1:1002")
    assert not again.closed


def test_subscriptions_per_client(make_harness: Any) -> None:
    h = make_harness(max_subscriptions_per_client=2)
    client = h.connect("c")
    assert client.subscribe("a")[0].reason_codes == [0]
    assert client.subscribe("b")[0].reason_codes == [0]
    assert client.subscribe("c")[0].reason_codes == [0x97]
    assert client.subscribe("a", 1)[0].reason_codes == [1]  # replacing one is no new one
    client.unsubscribe("b")
    assert client.subscribe("c")[0].reason_codes == [0]


def test_persistent_session_count_follows_every_way_a_session_ends(make_harness: Any) -> None:
    """The counts behind max_sessions / max_sessions_per_user: a session of non-zero expiry
    counts once (resumed or taken over), and stops counting when it ends: DISCONNECT with
    expiry 0, Clean Start with expiry 0, expiry running out."""
    h = make_harness(max_sessions=3, max_sessions_per_user=2)
    broker = h.broker

    def counts() -> tuple[int, dict[str, int]]:
        return broker.persistent_sessions, dict(broker._user_sessions)

    a1, ack = _connect_as(h, "a1", "alice", 60, False)
    assert ack.reason_code == 0 and counts() == (1, {"alice": 1})
    a1b, ack = _connect_as(h, "a1", "alice", 60, False)  # takes over its own session
    assert (ack.reason_code, ack.session_present) == (0, True) and counts() == (1, {"alice": 1})
    a2, _ = _connect_as(h, "a2", "alice", 60, False)
    _, ack = _connect_as(h, "a3", "alice", 60, False)
    assert ack.reason_code == 0x97 and counts() == (2, {"alice": 2})
    _, ack = _connect_as(h, "n1", None, 60, False)  # anonymous: counted in all only
    assert ack.reason_code == 0 and counts() == (3, {"alice": 2})
    _, ack = _connect_as(h, "b1", "bob", 60, False)
    assert ack.reason_code == 0x97  # max_sessions
    a2.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 0})  # ends with the connection
    assert counts() == (2, {"alice": 1})
    _connect_as(h, "a1", "alice", 0, True)  # Clean Start, expiry 0: a1 is over
    assert counts() == (1, {})
    _, ack = _connect_as(h, "b1", "bob", 5, False)
    assert ack.reason_code == 0 and counts() == (2, {"bob": 1})
    h.tick(10)  # the connection stays: its session does not expire
    assert counts() == (2, {"bob": 1})
    h.clients[-1].lose()
    h.tick(6)  # bob's session expired
    assert counts() == (1, {})
    assert a1b.closed  # taken over by the Clean Start above


def test_output_past_max_output_buffer_closes_with_0x97(make_harness: Any, caplog: Any) -> None:
    """A client whose unread output passes max_output_buffer is told 0x97 and dropped, logged
    once; before that, while the transport is over its high-water mark, it is not read."""
    h: Harness = make_harness(max_output_buffer=1000)
    client = h.connect("slow")
    client.conn.pause_writing()  # the transport is over its high-water mark
    assert client.link.reading_paused
    client.link.unread = 999
    client.pingreq()
    assert not client.closed and client.receive() == [pk.Pingresp()]
    client.link.unread = 1001
    client.pingreq()
    received = client.receive()
    assert received[-1] == pk.Disconnect(0x97, received[-1].properties)
    assert client.link.aborted  # what it did not take is dropped
    assert caplog.text.count("max_output_buffer") == 1
    h.connect("other").subscribe("t")  # nobody else harmed


def test_reading_resumes_when_the_output_drains(make_harness: Any) -> None:
    h: Harness = make_harness()
    client = h.connect("c")
    client.conn.pause_writing()
    assert client.link.reading_paused
    client.conn.resume_writing()
    assert not client.link.reading_paused
    client.pingreq()
    assert client.receive() == [pk.Pingresp()]
    # Also with part of a packet waiting for the rest.
    client.send_raw(b"\x30\x05\x00\x01")  # a QoS 0 PUBLISH to "t", cut short
    client.conn.pause_writing()
    client.conn.resume_writing()
    assert not client.link.reading_paused
    client.send_raw(b"t\x00x\xc0\x00")  # its rest, then a PINGREQ
    assert client.receive() == [pk.Pingresp()]


def test_retained_messages_go_out_a_share_per_pass(make_harness: Any) -> None:
    """More retained messages than one pass sends: the rest follows in later passes, and the
    client's later input waits for them (its PINGRESP comes after the last one)."""
    h: Harness = make_harness()
    publisher = h.connect("pub")
    for index in range(5):
        publisher.publish(f"r/{index}", bytes([index]) * 400_000, retain=True)
    client = h.connect("c")
    client.send(
        pk.Subscribe(1, [pk.SubscriptionRequest("r/#", 0)]),
        pk.Pingreq(),
    )
    got = client.receive()
    assert 1 < len(got) < 6  # SUBACK and a share, not the whole retained set at once
    for _ in range(10):
        got += client.receive()
    assert isinstance(got[0], pk.Suback)
    assert sorted(p.payload for p in got[1:6]) == [bytes([i]) * 400_000 for i in range(5)]
    assert got[6:] == [pk.Pingresp()]


def test_a_subscribe_past_the_subscription_limit_is_refused_whole(make_harness: Any) -> None:
    h: Harness = make_harness(max_subscriptions_per_client=3)
    client = h.connect("c")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest(f"t/{i}") for i in range(4)]))
    assert client.one(pk.Disconnect).reason_code == 0x97
    assert client.closed


def test_connections_per_address_by_default(make_harness: Any) -> None:
    """Unless configured: 64 per address on listeners other machines reach, no limit on
    local-only ones."""
    h: Harness = make_harness()
    links = [FakeLink() for _ in range(65)]
    for link in links:
        h.broker.connect(link, "10.0.0.1:1")
    assert [link.closed for link in links] == [False] * 64 + [True]
    local = [FakeLink() for _ in range(65)]
    for link in local:
        h.broker.connect(link, "127.0.0.1:1", policy=ListenerPolicy(local=True))
    assert not any(link.closed for link in local)
