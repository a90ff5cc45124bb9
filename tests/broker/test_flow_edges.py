"""Edges of the outbound QoS flows: the receive window refilled by every way a message leaves
it (PUBACK, PUBREC with an error, PUBCOMP, a message too large to send), with message expiry
counted at the moment it is sent; QoS 2 state kept for a persistent session; topic aliases and
the client's Maximum Packet Size."""

from __future__ import annotations

import pytest
from support.harness import Client, Harness, Prop, pk, split_packets


def window(h: Harness, client_id: str = "sub", **props: int) -> Client:
    """A subscriber to ``t`` at QoS 2 with a receive window of one message."""
    properties = {
        Prop.RECEIVE_MAXIMUM: 1,
        **{getattr(Prop, k.upper()): v for k, v in props.items()},
    }
    client = h.connect(client_id, properties=properties)
    client.subscribe("t", 2)
    return client


def raw_publishes(client: Client) -> list[pk.Publish]:
    """What the client was sent, decoded without the harness's no-alias check."""
    client.h.broker.flush()
    packets = split_packets(client.link.data[client._read :], client.version)
    client._read = len(client.link.data)
    return [p for p in packets if isinstance(p, pk.Publish)]


def test_message_held_back_keeps_its_expiry_running(h: Harness) -> None:
    """[MQTT-3.3.2-6] A message waiting behind the receive window (MQTT-3.3.4-9) is sent when a
    PUBACK makes room, with its Message Expiry Interval reduced by the time it waited; one
    whose interval ran out meanwhile is not sent at all."""
    sub = window(h)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"waits", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    pub.publish("t", b"expires", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    (first,) = sub.publishes()
    h.clock.advance(4)
    sub.puback(first.packet_id)
    (waited,) = sub.publishes()
    assert waited.payload == b"waits"
    assert waited.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6
    h.clock.advance(2)
    sub.puback(waited.packet_id)
    assert sub.receive() == []  # "expires" ran out while it waited
    assert not sub.session.queue and not sub.session.inflight


def test_refused_pubrec_frees_the_window(h: Harness) -> None:
    """[MQTT-4.3.3-4] A PUBREC with a reason code of 0x80 or more ends the QoS 2 exchange: no
    PUBREL, and the next message, with its expiry reduced, takes the free place."""
    sub = window(h)
    pub = h.connect("pub")
    pub.publish("t", b"refused", 2)
    pub.publish("t", b"next", 2, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    (refused,) = sub.publishes()
    h.clock.advance(3)
    sub.pubrec(refused.packet_id, 0x80)
    (nxt,) = sub.publishes()  # not a PUBREL
    assert (nxt.payload, nxt.properties[Prop.MESSAGE_EXPIRY_INTERVAL]) == (b"next", 7)
    assert list(sub.session.inflight) == [nxt.packet_id]


def test_pubcomp_frees_the_window_with_expiry_counted(h: Harness) -> None:
    sub = window(h)
    pub = h.connect("pub")
    pub.publish("t", b"one", 2)
    pub.publish("t", b"two", 2, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    (one,) = sub.publishes()
    sub.pubrec(one.packet_id)
    assert sub.one(pk.Pubrel).packet_id == one.packet_id
    h.clock.advance(1)
    sub.pubcomp(one.packet_id)
    (two,) = sub.publishes()
    assert (two.payload, two.properties[Prop.MESSAGE_EXPIRY_INTERVAL]) == (b"two", 9)


def test_qos2_released_state_survives_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] A persistent session that got the PUBREC of a QoS 2 message resends the
    PUBREL, not the PUBLISH, when the client comes back."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    sub = h.connect("sub", properties=props)
    sub.subscribe("t", 2)
    h.connect("pub").publish("t", b"m", 2)
    (message,) = sub.publishes()
    sub.pubrec(message.packet_id)
    assert sub.one(pk.Pubrel).packet_id == message.packet_id
    sub.lose()
    again = h.connect("sub", clean_start=False, properties=props, expect_present=True)
    assert again.one(pk.Pubrel).packet_id == message.packet_id
    again.pubcomp(message.packet_id)
    assert not again.session.inflight


def test_too_large_for_the_client_is_dropped_as_delivered(h: Harness) -> None:
    """[MQTT-3.1.2-25] A message above the client's Maximum Packet Size is not sent, and counts
    as delivered: it does not take the one place in the receive window."""
    sub = window(h, maximum_packet_size=200)
    pub = h.connect("pub")
    pub.publish("t", b"x" * 500, 1)
    pub.publish("t", b"fits", 1)
    assert [p.payload for p in sub.publishes()] == [b"fits"]


def test_aliased_topic_then_too_large_is_dropped_as_delivered(h: Harness) -> None:
    """The same with a topic alias in use: once the alias is set, a later message on the topic
    (sent without its name) that still exceeds the Maximum Packet Size is dropped, keeps no
    place in the window, and the alias stays valid for the next one."""
    sub = window(h, maximum_packet_size=200, topic_alias_maximum=1)
    pub = h.connect("pub")
    pub.publish("t", b"small", 1)
    (first,) = raw_publishes(sub)
    assert (first.topic, first.properties[Prop.TOPIC_ALIAS]) == ("t", 1)
    sub.puback(first.packet_id)
    pub.publish("t", b"x" * 500, 1)
    pub.publish("t", b"after", 1)
    (after,) = raw_publishes(sub)
    assert (after.topic, after.payload, after.properties[Prop.TOPIC_ALIAS]) == ("", b"after", 1)


def test_evicted_alias_kept_when_the_new_topic_does_not_fit(h: Harness) -> None:
    """A new topic that would take over the only alias but is too large to send leaves the
    client's alias map as it was (the old topic is still sent by alias alone), and, dropped as
    delivered, keeps no place in the receive window."""
    sub = window(h, maximum_packet_size=200, topic_alias_maximum=1)
    sub.subscribe("big/#", 1)
    pub = h.connect("pub")
    pub.publish("t", b"a", 1)
    (first,) = raw_publishes(sub)
    assert (first.topic, first.properties[Prop.TOPIC_ALIAS]) == ("t", 1)
    sub.puback(first.packet_id)
    pub.publish("big/" + "x" * 300, b"b", 1)
    pub.publish("t", b"c", 1)
    (again,) = raw_publishes(sub)
    assert (again.topic, again.payload, again.properties[Prop.TOPIC_ALIAS]) == ("", b"c", 1)


def test_new_topic_too_large_with_an_alias_free(h: Harness) -> None:
    """Aliases to spare, but the new topic's PUBLISH exceeds the Maximum Packet Size: dropped as
    delivered, no alias taken; the next topic gets the first alias."""
    sub = window(h, maximum_packet_size=200, topic_alias_maximum=2)
    sub.subscribe("big/#", 1)
    pub = h.connect("pub")
    pub.publish("big/" + "x" * 300, b"b", 1)
    pub.publish("t", b"c", 1)
    (sent,) = raw_publishes(sub)
    assert (sent.topic, sent.payload, sent.properties[Prop.TOPIC_ALIAS]) == ("t", b"c", 1)


@pytest.mark.parametrize("sub_qos", [0, 2])
def test_qos2_publish_forwarded_with_its_expiry(h: Harness, sub_qos: int) -> None:
    """[MQTT-3.3.2-6] A QoS 2 PUBLISH with a Message Expiry Interval reaches subscribers with
    the interval less the time it waited (none here; QoS 0 subscribers too)."""
    sub = h.connect("sub")
    sub.subscribe("t", sub_qos)
    pub = h.connect("pub")
    pub.publish("t", b"m", 2, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 30})
    assert pub.one(pk.Pubrec).reason_code == 0
    (message,) = sub.publishes()
    assert (message.qos, message.properties[Prop.MESSAGE_EXPIRY_INTERVAL]) == (sub_qos, 30)
