"""broker/deliver.py: PUBLISH to the client (topic aliases the broker sets, the client's Maximum
Packet Size, message expiry counted when sent, Subscription Identifiers) and the client's
PUBACK/PUBREC/PUBCOMP freeing the receive window."""

from __future__ import annotations

import pytest
from support.harness import Client, Harness, Prop, pair, pk, split_packets, window


def raw_publishes(client: Client) -> list[pk.Publish]:
    """What the client was sent, decoded without the harness's no-alias check."""
    client.h.broker.scheduler.flush()
    packets = split_packets(client.link.data[client._read :], client.version)
    client._read = len(client.link.data)
    return [p for p in packets if isinstance(p, pk.Publish)]


def resolve(publishes: list[pk.Publish], maximum: int) -> list[str]:
    """Play the client's side of the alias map: the topic each PUBLISH stands for."""
    table: dict[int, str] = {}
    topics = []
    for p in publishes:
        alias = p.properties.get(Prop.TOPIC_ALIAS)
        if alias is None:
            topics.append(p.topic)
            continue
        assert 0 < alias <= maximum  # [MQTT-3.1.2-26] [MQTT-3.3.2-8]
        if p.topic:
            table[alias] = p.topic
        topics.append(table[alias])  # KeyError: an alias used before it was set
    return topics


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


def test_qos2_pubrec_error_ends_exchange(h: Harness) -> None:
    """[MQTT-4.4.0-2] A PUBREC with a reason code >= 0x80 acknowledges the message: no PUBREL,
    no resend, and the in-flight slot is free."""
    subscriber, publisher = pair(h, properties={Prop.RECEIVE_MAXIMUM: 1})
    publisher.publish("t", b"1", 2)
    publisher.publish("t", b"2", 2)
    (first,) = subscriber.publishes()
    subscriber.pubrec(first.packet_id, 0x80)
    (second,) = subscriber.publishes()
    assert second.payload == b"2"


def test_single_subscription_identifier(h: Harness) -> None:
    """[MQTT-3.3.4-5] A subscription's identifier comes with each message it matches; none when
    it has none."""
    with_id = h.connect("with")
    with_id.subscribe("t", 1, sub_id=268_435_455)
    without = h.connect("without")
    without.subscribe("t", 1)
    publisher = h.connect("pub")
    publisher.publish("t", b"m", 1)
    assert with_id.publishes()[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [268_435_455]
    assert Prop.SUBSCRIPTION_IDENTIFIER not in without.publishes()[0].properties


def test_message_expiry_reduced_and_expired_dropped(h: Harness) -> None:
    """[MQTT-3.3.2-5] [MQTT-3.3.2-6] A queued message carries its Message Expiry Interval minus
    the time it waited; one that expired while queued is not delivered."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 1000}
    subscriber, publisher = pair(h, sub_qos=1, properties=expiry)
    subscriber.lose()
    publisher.publish("t", b"short", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    publisher.publish("t", b"long", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 60})
    h.tick(20)
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    (message,) = again.publishes()
    assert message.payload == b"long"
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 40


def test_outbound_message_larger_than_client_maximum_not_sent(h: Harness) -> None:
    """[MQTT-3.1.2-24] [MQTT-3.1.2-25] A PUBLISH larger than the client's Maximum Packet Size is
    not sent, and it is dropped as if delivered: it does not hold a Receive Maximum slot."""
    subscriber = h.connect(
        "sub", properties={Prop.MAXIMUM_PACKET_SIZE: 64, Prop.RECEIVE_MAXIMUM: 1}
    )
    subscriber.subscribe("t", 1)
    publisher = h.connect("pub")
    publisher.publish("t", b"x" * 100, 1)
    publisher.publish("t", b"y" * 100, 0)
    assert subscriber.receive() == []
    assert subscriber.session.inflight == {}
    publisher.publish("t", b"small", 1)
    (message,) = subscriber.publishes()
    assert message.payload == b"small"
    assert all(len(w) <= 64 for w in subscriber.link.writes)


def test_outbound_size_limit_counts_whole_packet(h: Harness) -> None:
    """[MQTT-3.1.2-24] The limit is on the whole packet: a payload that fits alone but not with
    the header, topic, id and properties is not sent."""
    subscriber = h.connect("sub", properties={Prop.MAXIMUM_PACKET_SIZE: 30})
    subscriber.subscribe("t", 1)
    publisher = h.connect("pub")
    # PUBLISH QoS 1 to a v5 client: 1 + 1 (length) + 3 (topic) + 2 (id) + 1 (properties) = 8
    publisher.publish("t", b"z" * 22, 1)  # 30 bytes: fits
    publisher.publish("t", b"z" * 23, 1)  # 31 bytes: does not
    received = subscriber.publishes()
    assert [len(p.payload) for p in received] == [22]


def test_duplicate_pubrec_gets_pubrel_again(h: Harness) -> None:
    """[MQTT-4.3.3-4] A PUBREC repeated (e.g. after a lost PUBREL) is answered with PUBREL again
    for the same id, and the PUBLISH is not sent again."""
    subscriber, publisher = pair(h, sub_qos=2)
    publisher.publish("t", b"m", 2)
    (message,) = subscriber.publishes()
    subscriber.pubrec(message.packet_id)
    subscriber.pubrec(message.packet_id)
    received = subscriber.receive()
    assert [(type(p), p.packet_id, p.reason_code) for p in received] == [
        (pk.Pubrel, message.packet_id, 0)
    ] * 2
    subscriber.pubcomp(message.packet_id)
    assert subscriber.receive() == []
    assert subscriber.session.inflight == {}


def test_outbound_aliases_are_set_then_reused(h: Harness) -> None:
    """The broker assigns aliases to a client that allows them; a repeated topic goes out with
    an empty topic name and its alias."""
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#")
    pub = h.connect("pub")
    for topic in ["t/a", "t/a", "t/b", "t/a", "t/b"]:
        pub.publish(topic, topic.encode())
    got = raw_publishes(sub)
    assert resolve(got, 2) == ["t/a", "t/a", "t/b", "t/a", "t/b"]
    assert [p.topic for p in got] == ["t/a", "", "t/b", "", ""]
    assert [p.payload for p in got] == [b"t/a", b"t/a", b"t/b", b"t/a", b"t/b"]


def test_least_recently_used_alias_is_reassigned(h: Harness) -> None:
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#", 1)
    pub = h.connect("pub")
    order = ["t/a", "t/b", "t/a", "t/c", "t/b", "t/a"]
    for topic in order:
        pub.publish(topic, b"x", 1)
    got = raw_publishes(sub)
    assert resolve(got, 2) == order
    assert all(p.properties[Prop.TOPIC_ALIAS] in (1, 2) for p in got)
    # t/c displaced t/b (least recently used), so t/b and then t/a came with their names again
    assert [bool(p.topic) for p in got] == [True, True, False, True, True, True]


def test_no_alias_without_a_topic_alias_maximum(h: Harness) -> None:
    """[MQTT-3.1.2-27] A client that announced no Topic Alias Maximum gets no aliases."""
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    for _ in range(3):
        pub.publish("t")
    got = raw_publishes(sub)
    assert len(got) == 3
    assert all(Prop.TOPIC_ALIAS not in p.properties and p.topic == "t" for p in got)


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


def test_pubrec_for_an_unknown_id(h: Harness) -> None:
    """A PUBREC with a success code for no QoS 2 message in flight gets PUBREL 0x92; one with
    an error code (0x80 included) is not answered."""
    client = h.connect("c")
    client.pubrec(77, 0x80)
    assert client.receive() == []
    client.pubrec(77, 0x00)
    pubrel = client.one(pk.Pubrel)
    assert (pubrel.packet_id, pubrel.reason_code) == (77, 0x92)
    assert not client.closed


def test_aliased_qos1_publish_keeps_its_fields(h: Harness) -> None:
    """A QoS 1 message sent with an alias in place of its topic still carries its QoS, packet
    identifier, subscription identifier and the message expiry it has left."""
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#", 1, sub_id=9)
    pub = h.connect("pub")
    expiry = {Prop.MESSAGE_EXPIRY_INTERVAL: 100}
    pub.publish("t/a", b"1", 1, properties=expiry)
    h.tick(10.0)
    pub.publish("t/a", b"2", 1, properties=expiry)
    got = raw_publishes(sub)
    assert resolve(got, 2) == ["t/a", "t/a"]
    second = got[1]
    assert second.topic == ""  # the alias alone
    assert second.qos == 1 and not second.dup and second.packet_id == got[0].packet_id + 1
    assert second.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [9]
    assert second.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 100
