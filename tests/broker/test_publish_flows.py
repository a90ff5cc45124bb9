"""PUBLISH from a publisher to subscribers: the QoS 0/1/2 exchanges on both sides, QoS
downgrade, packet identifiers, the client's Receive Maximum, ordering, resending with DUP after a
reconnect, overlapping subscriptions, the client's Maximum Packet Size and coalesced output."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.harness import Harness, Prop, pk, split_raw

from mqttbroker.broker.session import DROP_LOG_INTERVAL

MQTT_3_1_1 = 4


EXPIRY = {Prop.SESSION_EXPIRY_INTERVAL: 300}  # a session that outlives its connection


def pair(h: Harness, sub_qos: int = 2, topic_filter: str = "t", **connect: object):  # type: ignore[no-untyped-def]
    """A subscriber on ``topic_filter`` and a publisher."""
    subscriber = h.connect("sub", **connect)  # type: ignore[arg-type]
    assert subscriber.subscribe(topic_filter, sub_qos)[0].reason_codes == [sub_qos]
    publisher = h.connect("pub")
    return subscriber, publisher


def come_back(h: Harness, receive_maximum: int):  # type: ignore[no-untyped-def]
    """The subscriber of ``pair`` back on its session, with a new Receive Maximum."""
    properties = {**EXPIRY, Prop.RECEIVE_MAXIMUM: receive_maximum}
    return h.connect("sub", clean_start=False, properties=properties, expect_present=True)


def test_qos0_flow(h: Harness) -> None:
    """[MQTT-4.3.1-1] [MQTT-3.3.1-2] [MQTT-2.2.1-2] [MQTT-3.3.4-1] QoS 0: delivered at QoS 0
    with DUP 0 and no packet id; the publisher gets no acknowledgement."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"hello", 0)
    assert publisher.receive() == []
    (message,) = subscriber.publishes()
    assert (message.topic, message.payload, message.qos, message.dup) == ("t", b"hello", 0, False)
    assert message.packet_id is None
    assert message.retain is False


def test_qos1_flow(h: Harness) -> None:
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


def test_qos1_no_matching_subscribers(h: Harness) -> None:
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


def test_qos1_publisher_dup_not_forwarded(h: Harness) -> None:
    """[MQTT-3.3.1-3] [MQTT-4.3.2-5] DUP on the inbound PUBLISH does not carry over to the
    outbound one; a QoS 1 resend after PUBACK is a new message."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"m", 1, packet_id=3, dup=True)
    publisher.publish("t", b"m", 1, packet_id=3, dup=True)
    assert [type(p) for p in publisher.receive()] == [pk.Puback, pk.Puback]
    received = subscriber.publishes()
    assert [p.dup for p in received] == [False, False]


def test_qos2_flow_both_sides(h: Harness) -> None:
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
    h.broker.flush()
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


def test_qos2_duplicate_before_pubrel_not_delivered_twice(h: Harness) -> None:
    """[MQTT-4.3.3-10] [MQTT-4.3.3-12] A QoS 2 PUBLISH repeated before PUBREL is acknowledged
    again but not delivered again; after PUBCOMP the same id starts a new message."""
    subscriber, publisher = pair(h, sub_qos=0)
    publisher.publish("t", b"first", 2, packet_id=9)
    publisher.publish("t", b"first", 2, packet_id=9, dup=True)
    publisher.publish("t", b"first", 2, packet_id=9, dup=True)
    recs = publisher.receive()
    assert [(type(p), p.packet_id) for p in recs] == [(pk.Pubrec, 9)] * 3
    assert [p.payload for p in subscriber.publishes()] == [b"first"]
    publisher.pubrel(9)
    assert publisher.one(pk.Pubcomp).packet_id == 9
    publisher.publish("t", b"second", 2, packet_id=9)
    assert publisher.one(pk.Pubrec).packet_id == 9
    assert [p.payload for p in subscriber.publishes()] == [b"second"]


def test_pubrel_for_unknown_id(h: Harness) -> None:
    """[MQTT-4.3.3-11] [MQTT-3.7.2-1] A PUBREL for an id not awaiting release still gets PUBCOMP
    with that id (0x92 Packet Identifier not found)."""
    client = h.connect("c1")
    client.pubrel(77)
    comp = client.one(pk.Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (77, 0x92)
    assert not client.closed


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


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_qos_downgrade(h: Harness, sub_qos: int, pub_qos: int) -> None:
    """[MQTT-3.8.4-8] Delivered at the lower of the published QoS and the granted QoS."""
    subscriber, publisher = pair(h, sub_qos=sub_qos)
    publisher.publish("t", b"m", pub_qos)
    (message,) = subscriber.publishes()
    assert message.qos == min(sub_qos, pub_qos)


def test_packet_ids_nonzero_and_unique_in_flight(h: Harness) -> None:
    """[MQTT-2.2.1-4] [MQTT-4.3.2-1] [MQTT-4.3.3-1] Outgoing ids are non-zero and never reuse an
    id still in flight, also across the wrap from 65535 to 1."""
    subscriber, publisher = pair(h, sub_qos=1)
    for index in range(40):
        publisher.publish("t", str(index).encode(), 1 + index % 2)
    received = subscriber.publishes()
    ids = [p.packet_id for p in received]
    assert len(ids) == 40 and all(ids) and len(set(ids)) == 40
    for p in received[::2]:  # acknowledge half of them
        subscriber.puback(p.packet_id)
    subscriber.session.next_packet_id = 65534  # jump to the wrap (ids 2, 4, ... still in flight)
    for index in range(10):
        publisher.publish("t", b"w%d" % index, 1)
    later = [p.packet_id for p in subscriber.publishes()]
    in_flight = [p.packet_id for p in received[1::2]]
    assert later[:2] == [65534, 65535]
    assert all(later) and len(set(later)) == 10
    assert not set(later) & set(in_flight)
    assert set(subscriber.session.inflight) == set(in_flight) | set(later)


def test_receive_maximum_respected(h: Harness) -> None:
    """[MQTT-3.3.4-9] [MQTT-4.9.0-1] [MQTT-4.9.0-2] [MQTT-3.3.4-10] [MQTT-4.9.0-3] At most Receive
    Maximum unacknowledged QoS 1/2 PUBLISHes; the others wait and flow, in order, as PUBACKs
    come in; other packets are not held back meanwhile."""
    subscriber, publisher = pair(h, sub_qos=1, properties={Prop.RECEIVE_MAXIMUM: 2})
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    first = subscriber.publishes()
    assert [p.payload for p in first] == [b"0", b"1"]
    subscriber.pingreq()
    assert [type(p) for p in subscriber.receive()] == [pk.Pingresp]
    assert subscriber.subscribe("other", 1)[1:] == []
    subscriber.puback(first[0].packet_id)
    (third,) = subscriber.publishes()
    assert third.payload == b"2"
    subscriber.puback(first[1].packet_id)
    subscriber.puback(third.packet_id)
    rest = subscriber.publishes()
    assert [p.payload for p in rest] == [b"3", b"4"]
    subscriber.puback(rest[0].packet_id)
    assert [p.payload for p in subscriber.publishes()] == [b"5"]


def test_receive_maximum_qos2_slot_freed_by_pubcomp(h: Harness) -> None:
    """[MQTT-3.3.4-9] A QoS 2 message holds its slot until PUBCOMP, not PUBREC."""
    subscriber, publisher = pair(h, sub_qos=2, properties={Prop.RECEIVE_MAXIMUM: 1})
    publisher.publish("t", b"a", 2)
    publisher.publish("t", b"b", 2)
    (first,) = subscriber.publishes()
    subscriber.pubrec(first.packet_id)
    assert [type(p) for p in subscriber.receive()] == [pk.Pubrel]
    subscriber.pubcomp(first.packet_id)
    (second,) = subscriber.publishes()
    assert second.payload == b"b"


def test_qos0_not_held_by_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] Receive Maximum limits QoS 1/2 only: QoS 0 flows while the quota is used."""
    subscriber, publisher = pair(h, sub_qos=1, properties={Prop.RECEIVE_MAXIMUM: 1})
    publisher.publish("t", b"q1-a", 1)
    publisher.publish("t", b"q1-b", 1)
    publisher.publish("t", b"q0", 0)
    assert [p.payload for p in subscriber.publishes()] == [b"q1-a", b"q0"]


def test_ordered_delivery(h: Harness) -> None:
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


def test_resend_with_dup_after_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1] [MQTT-4.6.0-1] [MQTT-3.1.2-23] Unacknowledged PUBLISHes are
    sent again with DUP 1, the same ids, in order, when the session is resumed; messages queued
    meanwhile follow with DUP 0."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=2, properties=expiry)
    publisher.publish("t", b"a", 1)
    publisher.publish("t", b"b", 2)
    first = subscriber.publishes()
    assert [(p.payload, p.dup) for p in first] == [(b"a", False), (b"b", False)]
    subscriber.lose()
    publisher.publish("t", b"c", 1)
    h.tick(10)
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    resent = again.publishes()
    assert [(p.payload, p.dup, p.packet_id, p.qos) for p in resent] == [
        (b"a", True, first[0].packet_id, 1),
        (b"b", True, first[1].packet_id, 2),
        (b"c", False, resent[2].packet_id, 1),
    ]
    assert resent[2].packet_id not in (first[0].packet_id, first[1].packet_id)


def test_pubrel_resent_not_publish_after_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-4.3.3-6] A QoS 2 message whose PUBREC arrived is continued with
    PUBREL after a reconnect; the PUBLISH is never sent again."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=2, properties=expiry)
    publisher.publish("t", b"x", 2)
    (message,) = subscriber.publishes()
    subscriber.pubrec(message.packet_id)
    assert [type(p) for p in subscriber.receive()] == [pk.Pubrel]
    subscriber.lose()
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    received = again.receive()
    assert [(type(p), p.packet_id) for p in received] == [(pk.Pubrel, message.packet_id)]
    again.pubcomp(message.packet_id)
    assert again.receive() == []
    assert again.session.inflight == {}


def test_no_resend_on_clean_start(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-3.1.2-4] Reconnecting with Clean Start 1 resends nothing."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    publisher.publish("t", b"a", 1)
    assert len(subscriber.publishes()) == 1
    subscriber.lose()
    again = h.connect("sub", clean_start=True, expect_present=False)
    assert again.receive() == []


def test_inbound_qos2_state_survives_reconnect(h: Harness) -> None:
    """[MQTT-4.3.3-10] [MQTT-3.1.2-23] A publisher's QoS 2 id awaiting PUBREL is remembered across
    a reconnect: the resent PUBLISH is not delivered again, and PUBREL gets PUBCOMP 0x00."""
    subscriber = h.connect("sub")
    subscriber.subscribe("t", 0)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    publisher = h.connect("pub", properties=expiry)
    publisher.publish("t", b"once", 2, packet_id=11)
    publisher.receive()
    publisher.lose()
    publisher = h.connect("pub", clean_start=False, properties=expiry, expect_present=True)
    publisher.publish("t", b"once", 2, packet_id=11, dup=True)
    assert publisher.one(pk.Pubrec).packet_id == 11
    publisher.pubrel(11)
    comp = publisher.one(pk.Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (11, 0)
    assert [p.payload for p in subscriber.publishes()] == [b"once"]


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


def test_deliveries_coalesced_into_one_write(h: Harness) -> None:
    """Several deliveries before flush() reach the link in a single write call."""
    subscriber, publisher = pair(h, sub_qos=1)
    other = h.connect("pub2")
    writes_before = len(subscriber.link.writes)
    publisher.send(
        *(pk.Publish("t", b"%d" % i, i % 2, packet_id=i + 1 if i % 2 else None) for i in range(5))
    )
    other.publish("t", b"other", 0)
    assert len(subscriber.link.writes) == writes_before  # nothing written before the flush
    h.broker.flush()
    assert len(subscriber.link.writes) == writes_before + 1
    assert len(split_raw(subscriber.link.writes[-1])) == 6
    assert [p.payload for p in subscriber.publishes()] == [b"0", b"1", b"2", b"3", b"4", b"other"]


def test_acks_coalesced_into_one_write(h: Harness) -> None:
    """All the PUBACKs for one chunk of PUBLISHes go out in one write."""
    publisher = h.connect("pub")
    before = len(publisher.link.writes)
    publisher.send(*(pk.Publish("t", b"m", 1, packet_id=i) for i in range(1, 8)))
    h.broker.flush()
    assert len(publisher.link.writes) == before + 1
    assert [p.packet_id for p in publisher.receive()] == list(range(1, 8))


def test_partial_packets_across_reads(h: Harness) -> None:
    """Packets split anywhere across data_received calls are reassembled."""
    subscriber, publisher = pair(h, sub_qos=1)
    from mqttbroker.protocol import grammar

    stream = b"".join(
        grammar.encode(pk.Publish("t", b"p%d" % i * 20, 1, packet_id=i + 1), 5) for i in range(5)
    )
    for start in range(0, len(stream), 7):
        publisher.send_raw(stream[start : start + 7])
    assert [p.packet_id for p in publisher.receive()] == [1, 2, 3, 4, 5]
    assert [p.payload for p in subscriber.publishes()] == [b"p%d" % i * 20 for i in range(5)]


def test_resend_after_reconnect_respects_new_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] [MQTT-4.4.0-1] [MQTT-4.9.0-2] Receive Maximum is set afresh by each CONNECT
    (section 4.9): resuming a session with more unacknowledged messages than the new Receive
    Maximum resends only that many; the others follow, with DUP 1 and their original ids, as
    PUBACKs free the window."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    for index in range(5):
        publisher.publish("t", b"%d" % index, 1)
    first = subscriber.publishes()
    ids = [p.packet_id for p in first]
    assert len(ids) == 5
    subscriber.lose()
    again = come_back(h, receive_maximum=2)
    resent = again.publishes()
    assert [(p.packet_id, p.dup) for p in resent] == [(ids[0], True), (ids[1], True)]
    seen = [p.payload for p in resent]
    for _ in range(10):
        if not resent:
            break
        again.puback(resent[0].packet_id)
        more = again.publishes()
        assert len(more) <= 1
        if more:
            assert more[0].dup is True
            assert more[0].packet_id == ids[len(seen)]
        seen += [p.payload for p in more]
        resent = resent[1:] + more
    assert seen == [b"0", b"1", b"2", b"3", b"4"]


def test_queue_sent_on_resume_respects_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] Messages queued while the client was away, for a session that had nothing
    in flight, go out on its return at most Receive Maximum at a time, then one per PUBACK."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    subscriber.send(pk.Disconnect())
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    back = come_back(h, receive_maximum=2)
    first = back.publishes()
    assert [p.payload for p in first] == [b"0", b"1"]
    assert len(back.session.inflight) == 2
    back.puback(first[0].packet_id)
    assert [p.payload for p in back.publishes()] == [b"2"]


def test_inbound_receive_maximum_exceeded(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.3.4-7] More unacknowledged QoS 2 PUBLISHes from a client than the server's Receive
    Maximum: DISCONNECT 0x93."""
    h = make_harness(receive_maximum=2)
    publisher = h.connect("pub")
    assert publisher.connack.properties[Prop.RECEIVE_MAXIMUM] == 2  # type: ignore[union-attr]
    publisher.publish("t", b"1", 2)
    publisher.publish("t", b"2", 2)
    assert [type(p) for p in publisher.receive()] == [pk.Pubrec, pk.Pubrec]
    publisher.pubrel(1)  # frees one
    assert [type(p) for p in publisher.receive()] == [pk.Pubcomp]
    publisher.publish("t", b"3", 2)
    assert [type(p) for p in publisher.receive()] == [pk.Pubrec]
    publisher.publish("t", b"4", 2)
    received = publisher.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x93)]
    assert publisher.closed


def test_payload_format_invalid(h: Harness) -> None:
    """[MQTT-3.4.2-1] [MQTT-3.5.2-1] [MQTT-4.3.3-9] A payload that is not UTF-8 despite Payload
    Format Indicator 1 is refused with 0x99 (PUBACK or PUBREC) and not delivered; after a PUBREC
    >= 0x80 the same packet id starts a new message."""
    subscriber, publisher = pair(h)
    utf8 = {Prop.PAYLOAD_FORMAT_INDICATOR: 1}
    publisher.publish("t", b"\xff\xfe", 1, packet_id=4, properties=utf8)
    ack = publisher.one(pk.Puback)
    assert (ack.packet_id, ack.reason_code) == (4, 0x99)
    publisher.publish("t", b"\xff\xfe", 2, packet_id=5, properties=utf8)
    rec = publisher.one(pk.Pubrec)
    assert (rec.packet_id, rec.reason_code) == (5, 0x99)
    assert subscriber.receive() == []
    publisher.publish("t", "ok ✓".encode(), 2, packet_id=5, properties=utf8)
    rec = publisher.one(pk.Pubrec)
    assert (rec.packet_id, rec.reason_code) == (5, 0)
    assert [p.payload for p in subscriber.publishes()] == ["ok ✓".encode()]


def test_pubrec_for_unknown_id(h: Harness) -> None:
    """[MQTT-3.6.2-1] A PUBREC for an id with no QoS 2 message in flight: PUBREL 0x92."""
    client = h.connect("c1")
    client.pubrec(9)
    rel = client.one(pk.Pubrel)
    assert (rel.packet_id, rel.reason_code) == (9, 0x92)
    assert not client.closed


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


def test_offline_queue_bounded(make_harness: Callable[..., Harness]) -> None:
    """The offline queue holds at most max_queued_messages; later messages are dropped, the
    earliest are kept and delivered in order."""
    h = make_harness(max_queued_messages=3)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=1, properties=expiry)
    subscriber.lose()
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    assert [p.payload for p in again.publishes()] == [b"0", b"1", b"2"]
    assert again.session.dropped == 3


def test_paused_transport_queues_then_drains(h: Harness) -> None:
    """Backpressure: while the transport is paused QoS 1/2 messages wait in the queue (QoS 0 is
    dropped), and flow in order when it resumes."""
    subscriber, publisher = pair(h, sub_qos=1)
    subscriber.conn.pause_writing()
    publisher.publish("t", b"a", 1)
    publisher.publish("t", b"dropped", 0)
    publisher.publish("t", b"b", 1)
    assert subscriber.receive() == []
    subscriber.conn.resume_writing()
    assert [p.payload for p in subscriber.publishes()] == [b"a", b"b"]


def test_queue_drops_logged_per_session_rate_limited(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """A message dropped from a full offline queue: the publisher's PUBACK says success (the
    drop is the subscriber's queue policy), and the log names the session and the count: at
    the first drop, then at most once per interval, the end of a burst included."""
    h = make_harness(max_queued_messages=1)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=1, properties=expiry)
    subscriber.lose()
    caplog.set_level(logging.WARNING, logger="mqttbroker.session")

    def drop_lines() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        caplog.clear()
        return lines

    for index in range(4):
        publisher.publish("t", b"%d" % index, 1)
    assert [(a.packet_id, a.reason_code) for a in publisher.receive()] == [
        (i, 0) for i in range(1, 5)
    ]
    assert drop_lines() == ["session sub: 1 messages dropped (queue full); 1 dropped in all"]
    h.tick(1.0)
    assert drop_lines() == []  # within the interval: the line waits
    h.tick(DROP_LOG_INTERVAL)
    assert drop_lines() == ["session sub: 2 messages dropped (queue full); 3 dropped in all"]
    h.tick(DROP_LOG_INTERVAL)
    assert drop_lines() == []  # nothing new to report
    publisher.publish("t", b"later", 1)  # the interval is over: logged at once
    assert drop_lines() == ["session sub: 1 messages dropped (queue full); 4 dropped in all"]
    assert subscriber.session.dropped == 4


def test_v311_qos1_publish_with_empty_payload(h: Harness) -> None:
    """A 3.1.1 QoS 1 PUBLISH ends right after its packet identifier (no properties, no
    payload): accepted, acknowledged and delivered with its empty payload."""
    sub = h.connect("sub")
    sub.subscribe("t", 1)
    pub = h.connect("pub", version=MQTT_3_1_1)
    pub.send_raw(b"\x32\x05\x00\x01t\x00\x07")
    (puback,) = pub.receive()
    assert isinstance(puback, pk.Puback) and puback.packet_id == 7
    assert [p.payload for p in sub.publishes()] == [b""]
