"""PUBLISH end to end through publish, router and deliver: the QoS 0/1/2 exchanges on both sides,
QoS downgrade, ordering, one copy per subscriber at the highest QoS of its overlapping
subscriptions, properties forwarded unchanged."""

from __future__ import annotations

import pytest
from support.harness import MQTT_3_1_1, Harness, Prop, pair, pk, split_raw


def test_qos0_is_delivered_without_id_and_never_acknowledged(h: Harness) -> None:
    """[MQTT-4.3.1-1] [MQTT-3.3.1-2] [MQTT-2.2.1-2] [MQTT-3.3.4-1] QoS 0: delivered at QoS 0
    with DUP 0 and no packet id; the publisher gets no acknowledgement."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"hello", 0)
    assert publisher.receive() == []
    (message,) = subscriber.publishes()
    assert (message.topic, message.payload, message.qos, message.dup) == ("t", b"hello", 0, False)
    assert message.packet_id is None
    assert message.retain is False


def test_qos1_is_acknowledged_and_stays_in_flight_until_its_puback(h: Harness) -> None:
    """[MQTT-4.3.2-1] [MQTT-4.3.2-2] [MQTT-4.3.2-3] [MQTT-4.3.2-4] [MQTT-2.2.1-5] QoS 1 on both
    sides: PUBACK with the publisher's id; the subscriber gets QoS 1, DUP 0, a non-zero id, and
    the message stays in flight until its PUBACK."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"m", 1, packet_id=42)
    ack = publisher.one(pk.Puback)
    assert (ack.packet_id, ack.reason_code) == (42, 0)
    (message,) = subscriber.publishes()
    assert (message.qos, message.dup, message.payload) == (1, False, b"m")
    assert message.packet_id
    assert list(subscriber.session.inflight) == [message.packet_id]
    subscriber.puback(message.packet_id)
    assert subscriber.receive() == []
    assert subscriber.session.inflight == {}


def test_qos1_without_subscribers_is_acknowledged_0x10(h: Harness) -> None:
    """[MQTT-3.4.2-1] PUBACK 0x10 (No matching subscribers) when nobody subscribed; a 3.1.1
    client gets the plain 2-byte PUBACK."""
    publisher = h.connect("pub")
    publisher.publish("nobody", b"m", 1, packet_id=5)
    ack = publisher.one(pk.Puback)
    assert (ack.packet_id, ack.reason_code) == (5, 0x10)
    old = h.connect("old", version=MQTT_3_1_1)
    old.publish("nobody", b"m", 1, packet_id=6)
    old.receive()
    assert old.link.writes[-1] == b"\x40\x02\x00\x06"


def test_qos2_exchanges_carry_the_right_ids_on_both_sides(h: Harness) -> None:
    """[MQTT-4.3.3-1] [MQTT-4.3.3-2] [MQTT-4.3.3-3] [MQTT-4.3.3-4] [MQTT-4.3.3-5] [MQTT-4.3.3-8]
    [MQTT-4.3.3-11] [MQTT-2.2.1-5] QoS 2: PUBREC/PUBREL/PUBCOMP with the right ids on both sides."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"m", 2, packet_id=7)
    rec = publisher.one(pk.Pubrec)
    assert (rec.packet_id, rec.reason_code) == (7, 0)
    (message,) = subscriber.publishes()
    assert (message.qos, message.dup) == (2, False)
    sub_id = message.packet_id
    assert sub_id
    # The subscriber side.
    subscriber.pubrec(sub_id)
    subscriber.receive(limit=0)
    h.broker.scheduler.flush()
    raw = split_raw(subscriber.link.data[subscriber._read :])
    assert raw == [bytes((0x62, 2, sub_id >> 8, sub_id & 0xFF))]  # PUBREL, flags 0010
    rel = subscriber.one(pk.Pubrel)
    assert rel.packet_id == sub_id
    assert sub_id in subscriber.session.inflight  # until PUBCOMP, MQTT-4.3.3-5
    subscriber.pubcomp(sub_id)
    assert subscriber.receive() == []
    assert subscriber.session.inflight == {}
    # The publisher side.
    publisher.pubrel(7)
    comp = publisher.one(pk.Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    assert subscriber.receive() == []


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_delivered_at_the_lower_of_published_and_granted_qos(
    h: Harness, sub_qos: int, pub_qos: int
) -> None:
    """[MQTT-3.8.4-8] Delivered at the lower of the published QoS and the granted QoS."""
    subscriber, publisher = pair(h, sub_qos=sub_qos)
    publisher.publish("t", b"m", pub_qos)
    (message,) = subscriber.publishes()
    assert message.qos == min(sub_qos, pub_qos)


def test_one_publishers_messages_arrive_in_order_per_qos(h: Harness) -> None:
    """[MQTT-4.6.0-5] [MQTT-4.6.0-6] Messages from one publisher on one topic arrive in the order
    they were published, per QoS, also when they had to wait for the window."""
    subscriber, publisher = pair(h, sub_qos=2, properties={Prop.RECEIVE_MAXIMUM: 3})
    sent = {0: [], 1: [], 2: []}  # type: dict[int, list[bytes]]
    for index in range(30):
        qos = index % 3
        payload = b"%d" % index
        sent[qos].append(payload)
        publisher.publish("t", payload, qos)
    got = {0: [], 1: [], 2: []}  # type: dict[int, list[bytes]]
    for _ in range(100):
        batch = subscriber.receive()
        if not batch:
            break
        for p in batch:
            if isinstance(p, pk.Publish):
                got[p.qos].append(p.payload)
                if p.qos == 1:
                    subscriber.puback(p.packet_id)
                elif p.qos == 2:
                    subscriber.pubrec(p.packet_id)
            elif isinstance(p, pk.Pubrel):
                subscriber.pubcomp(p.packet_id)
    assert got == sent


def test_overlapping_subscriptions_one_copy_highest_qos(h: Harness) -> None:
    """[MQTT-3.3.4-2] [MQTT-3.3.4-3] [MQTT-3.3.4-4] A message matching several subscriptions of
    one client is delivered once, at the highest granted QoS, with every Subscription Identifier."""
    subscriber = h.connect("sub")
    subscriber.subscribe("a/+", 0, sub_id=1)
    subscriber.subscribe("a/#", 1, sub_id=2)
    subscriber.subscribe("+/b", 0)  # no identifier
    subscriber.subscribe("#", 0, sub_id=3)
    publisher = h.connect("pub")
    publisher.publish("a/b", b"m", 2)
    (message,) = subscriber.publishes()
    assert message.qos == 1
    assert sorted(message.properties[Prop.SUBSCRIPTION_IDENTIFIER]) == [1, 2, 3]
    publisher.publish("a", b"m", 2)  # matches a/# and # only
    (message,) = subscriber.publishes()
    assert message.qos == 1
    assert sorted(message.properties[Prop.SUBSCRIPTION_IDENTIFIER]) == [2, 3]
    publisher.publish("x/b", b"m", 2)  # matches +/b (no id) and #
    (message,) = subscriber.publishes()
    assert message.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [3]


def test_each_subscriber_gets_one_copy(h: Harness) -> None:
    """[MQTT-4.5.0-1] Every matching session gets the message, exactly once."""
    subscribers = [h.connect(f"s{i}") for i in range(5)]
    for index, sub in enumerate(subscribers):
        sub.subscribe(["#", "t", "+", "t/#", "$share/g/t"][index], 1)
    publisher = h.connect("pub")
    publisher.publish("t", b"m", 1)
    assert [len(s.publishes()) for s in subscribers] == [1, 1, 1, 1, 1]


def test_properties_forwarded_unchanged(h: Harness) -> None:
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20] Payload Format Indicator, Response Topic, Correlation Data, Content Type and
    User Properties (in order) reach the subscriber unchanged."""
    subscriber, publisher = pair(h)
    props = {
        Prop.PAYLOAD_FORMAT_INDICATOR: 1,
        Prop.RESPONSE_TOPIC: "reply/here",
        Prop.CORRELATION_DATA: b"\x00\x01corr",
        Prop.CONTENT_TYPE: "text/plain",
        Prop.USER_PROPERTY: [("k", "1"), ("a", "2"), ("k", "0")],
    }
    publisher.publish("t", "héllo".encode(), 1, properties=props)
    (message,) = subscriber.publishes()
    for key, value in props.items():
        assert message.properties[key] == value


@pytest.mark.parametrize(
    ("ack", "answer"),
    [
        # [MQTT-3.6.2-1] a PUBREC for an id with no QoS 2 message in flight to the client
        pytest.param("pubrec", pk.Pubrel, id="pubrec"),
        # [MQTT-4.3.3-11] [MQTT-3.7.2-1] a PUBREL for an id not awaiting release
        pytest.param("pubrel", pk.Pubcomp, id="pubrel"),
    ],
)
def test_qos2_ack_for_an_unknown_id_is_answered_0x92(
    h: Harness, ack: str, answer: type[pk.Pubrel | pk.Pubcomp]
) -> None:
    """A QoS 2 ack for an id the broker has no exchange for still gets the next packet of the
    exchange with that id and 0x92 Packet Identifier not found; the connection stays open."""
    client = h.connect("c1")
    getattr(client, ack)(77)
    reply = client.one(answer)
    assert (reply.packet_id, reply.reason_code) == (77, 0x92)
    assert not client.closed
