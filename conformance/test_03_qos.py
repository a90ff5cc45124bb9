"""The QoS 1 and QoS 2 flows (sections 3.4 to 3.7 and 4.3), with the broker as receiver (from a
publisher) and as sender (to a subscriber)."""

from __future__ import annotations

import time

import pytest

from .mqtt import (
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    P,
    ack,
)

# -- the broker as receiver --------------------------------------------------------------------


def test_qos1_puback(clients, topic):
    """A QoS 1 PUBLISH is answered by PUBACK with the same Packet Identifier and a defined
    reason code (0x00, or 0x10 when nobody subscribes).
    [MQTT-4.3.2-4] [MQTT-2.2.1-5] [MQTT-3.3.4-1] [MQTT-3.4.2-1]"""
    c = clients.connected()
    for pid in (1, 0x0102, 0xFFFF):
        c.publish(topic, b"x", qos=1, packet_id=pid)
        pkt = c.expect(PUBACK)
        assert pkt.packet_id == pid and pkt.reason_code in (0x00, 0x10), pkt
    c.subscribe(topic)
    c.publish(topic, b"x", qos=1, packet_id=5)
    pkt = c.expect(PUBACK, stash_publish=True)
    assert pkt.packet_id == 5 and pkt.reason_code == 0x00, pkt


def test_qos2_pubrec_pubcomp(clients, topic):
    """A QoS 2 PUBLISH is answered by PUBREC with its Packet Identifier; the PUBREL by PUBCOMP
    with the same identifier; the message is delivered once.
    [MQTT-4.3.3-8] [MQTT-4.3.3-11] [MQTT-2.2.1-5] [MQTT-3.3.4-1] [MQTT-3.5.2-1] [MQTT-3.7.2-1]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    c = clients.connected()
    c.publish(topic, b"exactly-once", qos=2, packet_id=0x4242)
    rec = c.expect(PUBREC)
    assert rec.packet_id == 0x4242 and rec.reason_code in (0x00, 0x10), rec
    c.send(ack(PUBREL, 0x4242))
    comp = c.expect(PUBCOMP)
    assert comp.packet_id == 0x4242 and comp.reason_code == 0x00, comp
    pkt = sub.expect_publish(topic, b"exactly-once")
    sub.acknowledge(pkt)
    assert sub.drain() == []


def test_qos1_packet_id_reuse_is_new_message(clients, topic):
    """After its PUBACK, a PUBLISH reusing the Packet Identifier is a new message, whatever its
    DUP flag. [MQTT-4.3.2-5]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    c = clients.connected()
    c.publish_acked(topic, b"first", qos=1, packet_id=7)
    c.publish_acked(topic, b"second", qos=1, packet_id=7, dup=True)
    for payload in (b"first", b"second"):
        sub.acknowledge(sub.expect_publish(topic, payload))


def test_qos2_duplicate_before_pubrel_not_delivered_twice(clients, topic):
    """Until the PUBREL, a PUBLISH with the same Packet Identifier is acknowledged again with
    PUBREC but not delivered onward again. [MQTT-4.3.3-10] [MQTT-2.2.1-5]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    c = clients.connected()
    c.publish(topic, b"once", qos=2, packet_id=9)
    assert c.expect(PUBREC).packet_id == 9
    c.publish(topic, b"once", qos=2, packet_id=9, dup=True)
    assert c.expect(PUBREC).packet_id == 9
    c.send(ack(PUBREL, 9))
    assert c.expect(PUBCOMP).packet_id == 9
    c.publish_acked(topic, b"sentinel", qos=2)
    first = sub.expect_publish(topic)
    sub.acknowledge(first)
    second = sub.expect_publish(topic)
    sub.acknowledge(second)
    assert [first.payload, second.payload] == [b"once", b"sentinel"]


def test_qos2_packet_id_reuse_after_pubcomp(clients, topic):
    """After PUBCOMP, a PUBLISH with the same Packet Identifier is a new message.
    [MQTT-4.3.3-12]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    c = clients.connected()
    c.publish_acked(topic, b"one", qos=2, packet_id=11)
    c.publish_acked(topic, b"two", qos=2, packet_id=11)
    for payload in (b"one", b"two"):
        sub.acknowledge(sub.expect_publish(topic, payload))


def test_qos2_packet_id_reuse_after_refused_pubrec(clients, topic):
    """After a PUBREC with a reason code of 0x80 or above, a PUBLISH with the same Packet
    Identifier is a new message. The refusal is provoked with a Payload Format Indicator of 1 on
    a payload that is not UTF-8 (a broker that checks answers 0x99). [MQTT-4.3.3-9]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    c = clients.connected()
    c.publish(topic, b"\xff\xfe", qos=2, packet_id=13, props=[(P.PAYLOAD_FORMAT_INDICATOR, 1)])
    rec = c.expect(PUBREC)
    if rec.reason_code < 0x80:
        c.send(ack(PUBREL, 13))
        c.expect(PUBCOMP)
        pytest.skip("the broker does not check Payload Format Indicator 1 payloads")
    c.publish(topic, b"valid", qos=2, packet_id=13)
    rec = c.expect(PUBREC)
    assert rec.packet_id == 13 and rec.reason_code < 0x80, rec
    c.send(ack(PUBREL, 13))
    assert c.expect(PUBCOMP).reason_code == 0
    pkt = sub.expect_publish(topic, b"valid")
    sub.acknowledge(pkt)


def test_qos2_flow_completes_after_message_expired(clients, topic):
    """A QoS 2 receiver completes PUBREC/PUBREL/PUBCOMP even when the message expired meanwhile:
    the PUBCOMP is 0x00, not 0x92. [MQTT-4.3.3-13]"""
    c = clients.connected()
    c.publish(topic, b"short-lived", qos=2, packet_id=21, props=[(P.MESSAGE_EXPIRY_INTERVAL, 1)])
    assert c.expect(PUBREC).packet_id == 21
    time.sleep(1.6)
    c.send(ack(PUBREL, 21))
    comp = c.expect(PUBCOMP)
    assert comp.packet_id == 21 and comp.reason_code == 0x00, comp


def test_pubrel_for_unknown_packet_id(clients):
    """A PUBREL is always answered by a PUBCOMP with its Packet Identifier; for an identifier the
    broker does not know, the reason code is 0x92 (Packet Identifier not found) or 0x00.
    [MQTT-4.3.3-11] [MQTT-3.7.2-1]"""
    c = clients.connected()
    c.send(ack(PUBREL, 0x3333))
    comp = c.expect(PUBCOMP)
    assert comp.packet_id == 0x3333 and comp.reason_code in (0x00, 0x92), comp


def test_pubrec_for_unknown_packet_id(clients):
    """A PUBREC the broker cannot match is not an error it disconnects for; if it answers, the
    PUBREL carries a defined PUBREL reason code. [MQTT-3.6.2-1]"""
    c = clients.connected()
    c.send(ack(PUBREC, 0x2222))
    for pkt in c.ping():
        assert pkt.type == PUBREL and pkt.packet_id == 0x2222, pkt
        assert pkt.reason_code in (0x00, 0x92)


def test_dup_not_propagated(clients, topic):
    """The DUP flag of a forwarded PUBLISH does not copy the incoming one: a first delivery
    has DUP 0 even if the publisher set DUP 1. [MQTT-3.3.1-3] [MQTT-4.3.2-2] [MQTT-4.3.3-2]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    c = clients.connected()
    c.publish_acked(topic, b"q1", qos=1, dup=True)
    c.publish_acked(topic, b"q2", qos=2, dup=True)
    for payload in (b"q1", b"q2"):
        pkt = sub.expect_publish(topic, payload)
        assert not pkt.dup, pkt
        sub.acknowledge(pkt)


# -- the broker as sender ----------------------------------------------------------------------


def test_outgoing_qos1_packet_ids(clients, topic):
    """QoS 1 messages to a subscriber go out with QoS 1, DUP 0 and non-zero Packet Identifiers
    that differ while unacknowledged. [MQTT-4.3.2-1] [MQTT-4.3.2-2] [MQTT-2.2.1-4]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    got = [sub.expect_publish(topic, b"%d" % i) for i in range(5)]
    ids = [p.packet_id for p in got]
    assert all(ids) and len(set(ids)) == 5, ids
    assert all(p.qos == 1 and not p.dup for p in got), got
    for p in got:
        sub.acknowledge(p)


def test_outgoing_qos2_flow(clients, topic):
    """QoS 2 to a subscriber: PUBLISH with QoS 2, DUP 0 and unused non-zero identifiers; on PUBREC
    the broker sends PUBREL (flags 0010) with the same identifier; PUBCOMP ends it.
    [MQTT-4.3.3-1] [MQTT-4.3.3-2] [MQTT-4.3.3-4] [MQTT-2.2.1-4] [MQTT-2.2.1-5] [MQTT-3.6.2-1]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=2)
    pub = clients.connected()
    for i in range(3):
        pub.publish_acked(topic, b"%d" % i, qos=2)
    got = [sub.expect_publish(topic, b"%d" % i) for i in range(3)]
    ids = [p.packet_id for p in got]
    assert all(ids) and len(set(ids)) == 3, ids
    assert all(p.qos == 2 and not p.dup for p in got), got
    for p in got:
        sub.send(ack(PUBREC, p.packet_id))
        rel = sub.expect(PUBREL)
        assert rel.raw[0] == 0x62, rel.raw.hex(" ")
        assert rel.packet_id == p.packet_id and rel.reason_code == 0x00, rel
        sub.send(ack(PUBCOMP, p.packet_id))
    assert sub.drain() == []


def test_no_retransmission_while_connected(clients, topic):
    """The broker does not resend an unacknowledged PUBLISH on the same connection (only when a
    session is resumed). [MQTT-4.4.0-1]"""
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    clients.connected().publish_acked(topic, b"once", qos=1)
    sub.expect_publish(topic, b"once")
    sub.expect_nothing(1.0)
