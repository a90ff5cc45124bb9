"""Behaviours a broader suite checks: broker-sent topic aliases after a reconnect, expiry of
messages held back by the client's Receive Maximum, the Server Keep Alive enforced, and a
session's expiry bracketed in time (the harness clock makes the brackets exact)."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk
from test_aliases_and_sharing import raw_publishes, resolve


def test_outbound_aliases_start_afresh_after_a_reconnect(h: Harness) -> None:
    """Topic aliases belong to a network connection (MQTT-3.3.2-7): after the client
    reconnects to its session, the first message on a topic carries the topic name again."""
    props = {Prop.TOPIC_ALIAS_MAXIMUM: 4, Prop.SESSION_EXPIRY_INTERVAL: 60}
    sub = h.connect("sub", properties=props)
    sub.subscribe("t/#", 1)
    pub = h.connect("pub")
    pub.publish("t/a", b"1", 1)
    pub.publish("t/a", b"2", 1)
    first = raw_publishes(sub)
    assert [p.topic for p in first] == ["t/a", ""]
    for p in first:
        sub.puback(p.packet_id)
    sub.lose()
    again = h.connect("sub", clean_start=False, properties=props, expect_present=True)
    pub.publish("t/a", b"3", 1)
    got = raw_publishes(again)
    assert [p.topic for p in got] == ["t/a"]  # not the alias alone: the client forgot it
    assert resolve(got, 4) == ["t/a"]


def test_message_held_back_by_receive_maximum_expires(h: Harness) -> None:
    """A message waiting for room in the client's Receive Maximum expires there: once room
    comes after its Message Expiry Interval, it is not sent (MQTT-3.3.2-5)."""
    sub = h.connect("sub", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", 1)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"short-lived", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("t", b"lasting", 1)
    (first,) = sub.publishes()
    assert first.payload == b"first"
    h.tick(6.0)
    sub.puback(first.packet_id)
    assert [p.payload for p in sub.publishes()] == [b"lasting"]


def test_message_held_back_sent_with_the_remaining_expiry(h: Harness) -> None:
    """Sent before it expires, it carries the time it has left (MQTT-3.3.2-6)."""
    sub = h.connect("sub", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", 1)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"x", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    (first,) = sub.publishes()
    h.tick(4.0)
    sub.puback(first.packet_id)
    (held,) = sub.publishes()
    assert held.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6


def test_server_keep_alive_enforced(make_harness: Any) -> None:
    """With max_keepalive 10 a client asking for 0 (or 60) is told Server Keep Alive 10 and is
    held to it (MQTT-3.1.2-22 at the server's value): still connected a little before 1.5 x 10
    s of silence, gone after."""
    h: Harness = make_harness(max_keepalive=10)
    for asked in (0, 60):
        c = h.connect(f"c{asked}", keep_alive=asked)
        assert c.connack is not None
        assert c.connack.properties[Prop.SERVER_KEEP_ALIVE] == 10
        start = h.clock.now
        h.tick(14.5)
        assert not c.link.closed
        h.tick(1.0)
        assert c.link.closed
        packets = c.receive()
        assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x8D
        h.clock.now = start


def test_session_expiry_bracketed(h: Harness) -> None:
    """Session Expiry Interval 30: the session is there just before 30 s, gone just after; a
    DISCONNECT raising it to 100 keeps it past 30 s (MQTT-3.1.2-23)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 30}
    h.connect("a", properties=props).lose()
    h.tick(29.9)
    h.connect("a", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(30.1)
    h.connect("a", clean_start=False, properties=props, expect_present=False).disconnect()
    b = h.connect("b", properties=props)
    b.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
    h.tick(99.0)
    h.connect("b", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(100.5)
    h.connect("b", clean_start=False, properties=props, expect_present=False)


def test_session_expiry_never(h: Harness) -> None:
    """0xFFFFFFFF: the session does not expire (a year later it is still there)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}
    h.connect("forever", properties=props).lose()
    h.tick(366 * 86400.0)
    h.connect("forever", clean_start=False, properties=props, expect_present=True)


def test_session_expiry_set_on_disconnect_after_0_is_a_protocol_error(h: Harness) -> None:
    """CONNECT with Session Expiry Interval 0 then DISCONNECT with a non-zero one: a Protocol
    Error (section 3.14.2.2.2): DISCONNECT 0x82, and the will is published as after any
    error."""
    watcher = h.connect("w")
    watcher.subscribe("will/#")
    c = h.connect("c", will=pk.Will("will/c", b"gone"))
    c.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 10})
    packets = c.receive()
    assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x82
    assert [p.topic for p in watcher.publishes()] == ["will/c"]
    h.connect("c", clean_start=False, expect_present=False)
