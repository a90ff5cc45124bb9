"""SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PUBLISH forwarding and PINGREQ (sections 3.3, 3.8 to
3.12), with the subscription options No Local and Retain As Published."""

from __future__ import annotations

from .mqtt import (
    MQTT_311,
    PINGRESP_BYTES,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    ack,
    packet,
    string,
    sub_options,
    subscribe,
    u16,
    unsubscribe,
)

# -- exact bytes -------------------------------------------------------------------------------


def test_qos0_publish_exact_bytes(clients, topic):
    """A QoS 0 message is forwarded as exactly 30 <len> <topic> 00 <payload>: DUP 0, no Packet
    Identifier, a Property Length of 0 when there are no properties.
    [MQTT-2.2.1-2] [MQTT-2.2.2-1] [MQTT-3.3.1-2] [MQTT-4.3.1-1] [MQTT-3.3.2-1]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    pub = clients.connected()
    pub.publish(topic, b"hello")
    assert sub.read_raw() == packet(0x30, string(topic) + b"\x00" + b"hello")


def test_suback_exact_bytes(clients, topic):
    """SUBACK echoes the SUBSCRIBE's Packet Identifier and carries one reason code:
    90 04 12 34 00 01 for a QoS 1 subscription (property length 0).
    [MQTT-3.8.4-1] [MQTT-3.8.4-2] [MQTT-2.2.1-6] [MQTT-2.2.2-1]"""
    c = clients.connected()
    c.send(subscribe(0x1234, [(topic, 1)]))
    raw = c.read_raw()
    assert raw[0] == 0x90 and raw[2:4] == b"\x12\x34", raw.hex(" ")
    if raw[4] == 0:  # no properties: the whole packet is fixed
        assert raw == b"\x90\x04\x12\x34\x00\x01", raw.hex(" ")
    c.send(subscribe(0xFFFF, [(topic + "/2", 2)]))
    raw = c.read_raw()
    assert raw[2:4] == b"\xff\xff" and raw[-1] == 2, raw.hex(" ")


def test_unsuback_exact_bytes(clients, topic):
    """UNSUBACK echoes the UNSUBSCRIBE's Packet Identifier: b0 04 43 21 00 00 after removing an
    existing subscription. [MQTT-3.10.4-4] [MQTT-3.10.4-5] [MQTT-2.2.1-6] [MQTT-3.11.3-2]"""
    c = clients.connected()
    c.subscribe(topic)
    c.send(unsubscribe(0x4321, [topic]))
    raw = c.read_raw()
    assert raw[0] == 0xB0 and raw[2:4] == b"\x43\x21", raw.hex(" ")
    if raw[4] == 0:
        assert raw == b"\xb0\x04\x43\x21\x00\x00", raw.hex(" ")


def test_pingresp(clients):
    """Every PINGREQ is answered with a PINGRESP, exactly d0 00. [MQTT-3.12.4-1]"""
    c = clients.connected()
    c.send(b"\xc0\x00" * 3)
    for _ in range(3):
        assert c.read_raw() == PINGRESP_BYTES


def test_v311_subscriber_exact_bytes(clients, topic):
    """MQTT 3.1.1: SUBACK 90 03 <id> <qos>, PUBLISH without a Property Length, UNSUBACK b0 02 <id>."""
    c = clients.connected(version=MQTT_311)
    c.send(subscribe(7, [(topic, 1)], version=MQTT_311))
    assert c.read_raw() == b"\x90\x03\x00\x07\x01"
    pub = clients.connected()
    pub.publish_acked(topic, b"abc", qos=1)
    pkt = c.expect_publish(topic, b"abc")
    assert pkt.raw == packet(0x32, string(topic) + u16(pkt.packet_id) + b"abc")
    c.send(ack(PUBACK, pkt.packet_id, version=MQTT_311))
    c.send(unsubscribe(8, [topic], version=MQTT_311))
    assert c.read_raw() == b"\xb0\x02\x00\x08"


# -- SUBACK contents ---------------------------------------------------------------------------


def test_suback_one_code_per_filter_in_order(clients, topic):
    """A SUBSCRIBE with several filters is answered by one SUBACK with one reason code per
    filter, in order, each the QoS granted; each subscription then works as if made alone.
    [MQTT-3.8.4-5] [MQTT-3.8.4-6] [MQTT-3.8.4-7] [MQTT-3.9.3-1] [MQTT-3.9.3-2]"""
    c = clients.connected()
    filters = [(f"{topic}/q2", 2), (f"{topic}/q0", 0), (f"{topic}/q1", 1), (f"{topic}/+", 0)]
    suback = c.subscribe(*filters)
    assert suback.reason_codes == [2, 0, 1, 0], suback
    pub = clients.connected()
    for name in ("q2", "q0", "q1"):
        pub.publish_acked(f"{topic}/{name}", name.encode(), qos=2)
    seen = {}
    for pkt in c.drain():
        seen.setdefault(pkt.topic, []).append(pkt.qos)
        c.acknowledge(pkt)
    # Each topic also matches "+" (QoS 0): one copy at the higher QoS, or two copies.
    assert max(seen[f"{topic}/q2"]) == 2 and max(seen[f"{topic}/q1"]) == 1, seen
    assert seen[f"{topic}/q0"] and max(seen[f"{topic}/q0"]) == 0, seen


def test_delivered_qos_is_minimum_of_published_and_granted(clients, topic):
    """A message is delivered at the lower of its published QoS and the subscription's granted
    QoS, and each receiver acknowledges according to that QoS.
    [MQTT-3.8.4-8] [MQTT-3.3.4-1] [MQTT-4.3.1-1]"""
    subs = {}
    for granted in (0, 1, 2):
        s = clients.connected()
        assert s.subscribe(topic, qos=granted).reason_codes == [granted]
        subs[granted] = s
    pub = clients.connected()
    for qos in (0, 1, 2):
        ack_pkt = pub.publish_acked(topic, f"q{qos}".encode(), qos=qos)
        if qos:
            assert ack_pkt is not None and ack_pkt.reason_code == 0, ack_pkt
        for granted, s in subs.items():
            pkt = s.expect_publish(topic, f"q{qos}".encode())
            assert pkt.qos == min(qos, granted), f"granted {granted}, published {qos}: {pkt!r}"
            s.acknowledge(pkt)
    for s in subs.values():
        assert s.drain() == []


def test_overlapping_subscriptions_get_highest_qos(clients, topic):
    """A message matching several subscriptions of one client is delivered respecting the
    highest QoS among them (extra copies are allowed). [MQTT-3.3.4-2]"""
    c = clients.connected()
    c.subscribe((f"{topic}/+", 0), (f"{topic}/#", 2), (f"{topic}/x", 1))
    clients.connected().publish_acked(f"{topic}/x", b"m", qos=2)
    copies = c.drain()
    assert copies, "message not delivered"
    assert max(p.qos for p in copies) == 2, copies
    for p in copies:
        assert p.topic == f"{topic}/x" and p.payload == b"m"
        c.acknowledge(p)


def test_topic_name_sent_matches_filter(clients, topic):
    """The Topic Name of a forwarded PUBLISH is the published one, which matches the filter.
    [MQTT-3.3.2-3]"""
    c = clients.connected()
    c.subscribe(f"{topic}/+/c/#")
    clients.connected().publish_acked(f"{topic}/b/c/d/e", b"x", qos=1)
    pkt = c.expect_publish(f"{topic}/b/c/d/e", b"x")
    assert pkt.topic.startswith(topic + "/")


# -- subscription replacement ------------------------------------------------------------------


def test_subscribe_again_replaces_subscription(clients, topic):
    """Subscribing again to the same filter replaces the subscription: its new QoS applies and
    the client gets one copy, not two. [MQTT-3.8.4-3]"""
    c = clients.connected()
    assert c.subscribe(topic, qos=0).reason_codes == [0]
    assert c.subscribe(topic, qos=2).reason_codes == [2]
    pub = clients.connected()
    pub.publish_acked(topic, b"m", qos=2)
    pub.publish_acked(topic, b"sentinel", qos=0)
    got = [c.expect_publish(topic), c.expect_publish(topic)]
    assert [p.payload for p in got] == [b"m", b"sentinel"], got
    assert got[0].qos == 2, got
    c.acknowledge(got[0])


def test_replacing_subscription_resends_retained(clients, topic, retained):
    """Replacing a subscription with Retain Handling 0 sends the matching retained messages
    again. [MQTT-3.8.4-4] [MQTT-3.3.1-9]"""
    retained(topic)
    clients.connected().publish_acked(topic, b"kept", qos=1, retain=True)
    c = clients.connected()
    for _ in range(2):
        c.subscribe((topic, sub_options(qos=1, rh=0)))
        pkt = c.expect_publish(topic, b"kept")
        assert pkt.retain
        c.acknowledge(pkt)


# -- UNSUBSCRIBE -------------------------------------------------------------------------------


def test_unsubscribe_nonexistent_still_answered(clients, topic):
    """An UNSUBSCRIBE that removes nothing is still answered by an UNSUBACK with its Packet
    Identifier, reason code 0x11 (No subscription existed). [MQTT-3.10.4-5] [MQTT-3.11.3-2]"""
    c = clients.connected()
    pkt = c.unsubscribe(topic, packet_id=99)
    assert pkt.packet_id == 99 and pkt.reason_codes == [0x11], pkt


def test_unsubscribe_stops_delivery(clients, topic):
    """After UNSUBSCRIBE no new matching messages are sent. [MQTT-3.10.4-2]"""
    c = clients.connected()
    c.subscribe(f"{topic}/a", f"{topic}/b", qos=1)
    assert c.unsubscribe(f"{topic}/a").reason_codes == [0x00]
    pub = clients.connected()
    pub.publish_acked(f"{topic}/a", b"gone", qos=1)
    pub.publish_acked(f"{topic}/b", b"sentinel", qos=1)
    pkt = c.expect_publish()
    assert (pkt.topic, pkt.payload) == (f"{topic}/b", b"sentinel"), pkt
    c.acknowledge(pkt)


def test_unsubscribe_compares_filters_literally(clients, topic):
    """UNSUBSCRIBE removes only a subscription whose filter is character-for-character the
    same, wildcards included. [MQTT-3.10.4-1]"""
    c = clients.connected()
    c.subscribe(f"{topic}/+", qos=1)
    assert c.unsubscribe(f"{topic}/x").reason_codes == [0x11]
    assert c.unsubscribe(f"{topic}/#").reason_codes == [0x11]
    pub = clients.connected()
    pub.publish_acked(f"{topic}/x", b"still", qos=1)
    c.acknowledge(c.expect_publish(f"{topic}/x", b"still"))
    assert c.unsubscribe(f"{topic}/+").reason_codes == [0x00]
    assert c.unsubscribe(f"{topic}/+").reason_codes == [0x11]


def test_unsubscribe_several_filters(clients, topic):
    """An UNSUBSCRIBE with several filters is handled like successive ones and answered by one
    UNSUBACK with a reason code per filter, in order.
    [MQTT-3.10.4-6] [MQTT-3.11.3-1] [MQTT-3.11.3-2]"""
    c = clients.connected()
    c.subscribe(f"{topic}/a", f"{topic}/c")
    pkt = c.unsubscribe(f"{topic}/a", f"{topic}/b", f"{topic}/c", f"{topic}/a")
    assert pkt.reason_codes == [0x00, 0x11, 0x00, 0x11], pkt


def test_unsubscribe_completes_deliveries_in_flight(clients, topic):
    """QoS 1 and QoS 2 deliveries begun before an UNSUBSCRIBE are completed after it.
    [MQTT-3.10.4-3]"""
    c = clients.connected()
    c.subscribe(topic, qos=2)
    pub = clients.connected()
    pub.publish_acked(topic, b"q1", qos=1)
    pub.publish_acked(topic, b"q2", qos=2)
    p1 = c.expect_publish(topic, b"q1")
    p2 = c.expect_publish(topic, b"q2")
    assert c.unsubscribe(topic).reason_codes == [0x00]
    c.send(ack(PUBACK, p1.packet_id))
    c.send(ack(PUBREC, p2.packet_id))
    rel = c.expect(PUBREL)
    assert rel.packet_id == p2.packet_id and rel.reason_code == 0, rel
    c.send(ack(PUBCOMP, p2.packet_id))
    pub.publish_acked(topic, b"after", qos=1)
    assert c.drain() == []


# -- No Local, Retain As Published -------------------------------------------------------------


def test_no_local(clients, topic):
    """No Local 1: the broker does not send a client's own messages back to it, but forwards
    other clients' messages. [MQTT-3.8.3-3]"""
    c = clients.connected()
    c.subscribe((topic, sub_options(qos=1, nl=True)))
    c.publish_acked(topic, b"own", qos=1)
    clients.connected().publish_acked(topic, b"other", qos=1)
    pkt = c.expect_publish(topic)
    assert pkt.payload == b"other", f"own message came back: {pkt!r}"
    c.acknowledge(pkt)
    assert c.drain() == []


def test_no_local_0_sends_own_messages(clients, topic):
    """Without No Local a client receives its own messages (the contrast to the test above)."""
    c = clients.connected()
    c.subscribe(topic, qos=1)
    c.publish_acked(topic, b"own", qos=1)
    c.acknowledge(c.expect_publish(topic, b"own"))


def test_retain_as_published(clients, topic, retained):
    """Retain As Published 0 clears RETAIN on forwarded messages; 1 keeps the RETAIN flag the
    message was published with. [MQTT-3.3.1-12] [MQTT-3.3.1-13]"""
    retained(topic)
    rap0 = clients.connected()
    rap0.subscribe((topic, sub_options(qos=1, rap=False)))
    rap1 = clients.connected()
    rap1.subscribe((topic, sub_options(qos=1, rap=True)))
    pub = clients.connected()
    pub.publish_acked(topic, b"retained", qos=1, retain=True)
    pub.publish_acked(topic, b"plain", qos=1, retain=False)
    a = [rap0.expect_publish(topic, b"retained"), rap0.expect_publish(topic, b"plain")]
    b = [rap1.expect_publish(topic, b"retained"), rap1.expect_publish(topic, b"plain")]
    assert [p.retain for p in a] == [False, False], a
    assert [p.retain for p in b] == [True, False], b
