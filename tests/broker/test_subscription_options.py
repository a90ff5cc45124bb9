"""SUBSCRIBE / UNSUBSCRIBE and the subscription options: No Local, Retain As Published, Retain
Handling; retained messages through the broker; shared subscriptions."""

from __future__ import annotations

import pytest
from support.harness import Harness, Prop, pk

from mqttbroker.protocol import grammar

MQTT_3_1_1 = 4


def test_suback_codes_in_order(h: Harness) -> None:
    """[MQTT-3.8.4-1] [MQTT-3.8.4-2] [MQTT-3.8.4-5] [MQTT-3.8.4-6] [MQTT-3.8.4-7] [MQTT-3.9.3-1]
    One SUBACK with the SUBSCRIBE's id and one code per filter, in order: the granted QoS or
    0x8F for an invalid filter."""
    client = h.connect("c1")
    requests = [
        pk.SubscriptionRequest("a", 2),
        pk.SubscriptionRequest("a/#/b", 1),
        pk.SubscriptionRequest("b/+", 1),
        pk.SubscriptionRequest("$share//x", 1),
        pk.SubscriptionRequest("c", 0),
    ]
    client.send(pk.Subscribe(321, requests))
    suback = client.one(pk.Suback)
    assert suback.packet_id == 321
    assert suback.reason_codes == [2, 0x8F, 1, 0x8F, 0]
    assert sorted(client.session.subscriptions) == ["a", "b/+", "c"]


def test_suback_v311_failure_code(h: Harness) -> None:
    """A 3.1.1 client gets return code 0x80 for a filter that cannot be subscribed."""
    client = h.connect("c1", version=MQTT_3_1_1)
    assert client.subscribe("a+")[0].reason_codes == [0x80]


def test_subscribe_replaces_existing(h: Harness) -> None:
    """[MQTT-3.8.4-3] Subscribing to the same filter again replaces the subscription: one copy per
    message, with the new QoS."""
    client = h.connect("c1")
    client.subscribe("t", 0)
    client.subscribe("t", 2)
    publisher = h.connect("pub")
    publisher.publish("t", b"m", 2)
    (message,) = client.publishes()
    assert message.qos == 2
    assert len(client.session.subscriptions) == 1


def test_unsubscribe(h: Harness) -> None:
    """[MQTT-3.10.4-1] [MQTT-3.10.4-2] [MQTT-3.10.4-4] [MQTT-3.10.4-5] [MQTT-3.10.4-6]
    [MQTT-3.11.3-1] UNSUBACK with the same id and one code per filter: 0x00 removed, 0x11 none
    existed (filters compared literally); no more messages for the removed filter."""
    client = h.connect("c1")
    client.subscribe("a/+")
    client.subscribe("b")
    packet_id = client._next_id
    (unsuback,) = client.unsubscribe("a/b", "b", "a/+", "b")
    assert isinstance(unsuback, pk.Unsuback)
    assert unsuback.packet_id == packet_id
    assert unsuback.reason_codes == [0x11, 0x00, 0x00, 0x11]
    publisher = h.connect("pub")
    publisher.publish("a/b", b"m")
    publisher.publish("b", b"m")
    assert client.receive() == []


def test_unsubscribe_literal_compare_keeps_wildcard(h: Harness) -> None:
    """[MQTT-3.10.4-1] Unsubscribing 'a/b' does not remove 'a/+'."""
    client = h.connect("c1")
    client.subscribe("a/+")
    (unsuback,) = client.unsubscribe("a/b")
    assert unsuback.reason_codes == [0x11]
    h.connect("pub").publish("a/b", b"still")
    assert [p.payload for p in client.publishes()] == [b"still"]


def test_unsubscribe_v311(h: Harness) -> None:
    """[MQTT-3.10.4-4] A 3.1.1 client gets the 4-byte UNSUBACK."""
    client = h.connect("c1", version=MQTT_3_1_1)
    client.subscribe("a")
    client.unsubscribe("a")
    assert client.link.writes[-1] == b"\xb0\x02\x00\x02"


def test_unsubscribe_finishes_messages_in_flight(h: Harness) -> None:
    """[MQTT-3.10.4-3] A QoS 1 delivery started before UNSUBSCRIBE is still completed."""
    client = h.connect("c1")
    client.subscribe("t", 1)
    h.connect("pub").publish("t", b"m", 1)
    (message,) = client.publishes()
    client.unsubscribe("t")
    client.puback(message.packet_id)
    assert client.session.inflight == {}
    assert not client.closed


def test_no_local(h: Harness) -> None:
    """[MQTT-3.8.3-3] No Local: a client's own messages do not come back on that subscription;
    other subscribers still get them."""
    me = h.connect("me")
    me.subscribe("t", 1, no_local=True)
    other = h.connect("other")
    other.subscribe("t", 1)
    me.publish("t", b"mine", 1)
    assert [type(p) for p in me.receive()] == [pk.Puback]
    assert [p.payload for p in other.publishes()] == [b"mine"]
    other.publish("t", b"theirs", 0)
    assert [p.payload for p in me.publishes()] == [b"theirs"]


def test_no_local_with_overlapping_subscription(h: Harness) -> None:
    """[MQTT-3.8.3-3] [MQTT-3.3.4-3] With an overlapping subscription without No Local the
    client gets its message once, with only that subscription's identifier."""
    me = h.connect("me")
    me.subscribe("t", 1, no_local=True, sub_id=1)
    me.subscribe("#", 0, sub_id=2)
    me.publish("t", b"mine", 1)
    received = me.receive()
    publishes = [p for p in received if isinstance(p, pk.Publish)]
    assert len(publishes) == 1
    assert publishes[0].qos == 0
    assert publishes[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [2]


def test_no_local_on_shared_subscription_is_protocol_error(h: Harness) -> None:
    """[MQTT-3.8.3-4] No Local on a shared subscription: DISCONNECT 0x82."""
    client = h.connect("c1")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest("$share/g/t", 1, no_local=True)]))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x82)]
    assert client.closed


def test_subscription_options_reserved_bits_malformed(h: Harness) -> None:
    """[MQTT-3.8.3-5] Non-zero reserved bits in Subscription Options: Malformed Packet."""
    client = h.connect("c1")
    data = bytearray(grammar.encode(pk.Subscribe(1, [pk.SubscriptionRequest("t", 1)]), 5))
    data[-1] |= 0x40
    client.send_raw(bytes(data))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x81)]
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_retain_as_published(h: Harness) -> None:
    """[MQTT-3.3.1-12] [MQTT-3.3.1-13] Live messages: RETAIN is kept with Retain As Published,
    cleared without it."""
    keep = h.connect("keep")
    keep.subscribe("t", 1, retain_as_published=True)
    clear = h.connect("clear")
    clear.subscribe("t", 1)
    publisher = h.connect("pub")
    publisher.publish("t", b"r", 1, retain=True)
    publisher.publish("t", b"n", 1, retain=False)
    assert [(p.payload, p.retain) for p in keep.publishes()] == [(b"r", True), (b"n", False)]
    assert [(p.payload, p.retain) for p in clear.publishes()] == [(b"r", False), (b"n", False)]


def test_retained_sent_on_subscribe_with_retain_flag(h: Harness) -> None:
    """[MQTT-3.3.1-5] [MQTT-3.3.1-9] A new subscription gets the matching retained messages after
    the SUBACK, with RETAIN 1 whatever Retain As Published says, at most at the granted QoS."""
    publisher = h.connect("pub")
    publisher.publish("r/a", b"1", 2, retain=True)
    publisher.publish("r/b", b"2", 0, retain=True)
    publisher.publish("r/a", b"3", 1, retain=True)  # replaces "1"
    publisher.publish("other", b"x", 1, retain=True)
    client = h.connect("c1")
    received = client.subscribe("r/+", 1)
    assert isinstance(received[0], pk.Suback)
    got = sorted((p.topic, p.payload, p.retain, p.qos) for p in received[1:])
    assert got == [("r/a", b"3", True, 1), ("r/b", b"2", True, 0)]


def test_retained_not_sent_to_wildcard_for_dollar_topics(h: Harness) -> None:
    """[MQTT-4.7.2-1] '#' does not bring retained '$' topics; '$SYS/#' does."""
    publisher = h.connect("pub")
    publisher.publish("$SYS/x", b"sys", 0, retain=True)
    publisher.publish("plain", b"p", 0, retain=True)
    client = h.connect("c1")
    assert [p.topic for p in client.subscribe("#")[1:]] == ["plain"]
    assert [p.topic for p in client.subscribe("+/x")[1:]] == []
    assert [p.topic for p in client.subscribe("$SYS/#")[1:]] == ["$SYS/x"]


@pytest.mark.parametrize(
    ("retain_handling", "on_new", "on_existing"),
    [(0, True, True), (1, True, False), (2, False, False)],
)
def test_retain_handling(h: Harness, retain_handling: int, on_new: bool, on_existing: bool) -> None:
    """[MQTT-3.3.1-9] [MQTT-3.3.1-10] [MQTT-3.3.1-11] [MQTT-3.8.4-4] Retain Handling 0 sends the
    retained messages at every SUBSCRIBE, 1 only when the subscription is new, 2 never."""
    h.connect("pub").publish("r", b"v", 0, retain=True)
    client = h.connect("c1")
    first = client.subscribe("r", 0, retain_handling=retain_handling)[1:]
    assert [p.payload for p in first] == ([b"v"] if on_new else [])
    second = client.subscribe("r", 0, retain_handling=retain_handling)[1:]
    assert [p.payload for p in second] == ([b"v"] if on_existing else [])


def test_retain_handling_1_new_after_unsubscribe(h: Harness) -> None:
    """[MQTT-3.3.1-10] After UNSUBSCRIBE the same filter is a new subscription again."""
    h.connect("pub").publish("r", b"v", 0, retain=True)
    client = h.connect("c1")
    assert len(client.subscribe("r", retain_handling=1)) == 2
    client.unsubscribe("r")
    assert len(client.subscribe("r", retain_handling=1)) == 2
