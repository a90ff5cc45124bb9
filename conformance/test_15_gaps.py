"""What a broader suite tests beyond the numbered statements: CONNECT properties a client may not
send (each "a Protocol Error" in section 3.1.2.11), the will on a session take-over, and every
packet split byte by byte across TCP segments or many packets in one segment."""

from __future__ import annotations

import pytest

from .mqtt import (
    CONNACK,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    P,
    ack,
    connect,
    publish,
    subscribe,
    unsubscribe,
)

PROTOCOL_ERROR = {0x82, 0x81}


@pytest.mark.parametrize(
    "props",
    [
        [(P.RECEIVE_MAXIMUM, 0)],
        [(P.MAXIMUM_PACKET_SIZE, 0)],
        [(P.REQUEST_PROBLEM_INFORMATION, 2)],
        [(P.REQUEST_RESPONSE_INFORMATION, 2)],
        [(P.SESSION_EXPIRY_INTERVAL, 1), (P.SESSION_EXPIRY_INTERVAL, 2)],
        [(P.RECEIVE_MAXIMUM, 5), (P.RECEIVE_MAXIMUM, 5)],
        [(P.AUTHENTICATION_DATA, b"data")],
        [(P.TOPIC_ALIAS, 1)],  # not a CONNECT property
    ],
    ids=[
        "receive-maximum-0",
        "maximum-packet-size-0",
        "request-problem-information-2",
        "request-response-information-2",
        "session-expiry-twice",
        "receive-maximum-twice",
        "authentication-data-without-method",
        "topic-alias",
    ],
)
def test_connect_property_errors_refused(clients, props):
    """Each is a Protocol Error or a Malformed Packet: refused (CONNACK 0x81/0x82 if one is
    sent) and closed."""
    c = clients.new()
    c.send(connect(c.name, props=props))
    c.expect_refused(PROTOCOL_ERROR)


def test_will_payload_not_matching_its_format_refused(clients, topic):
    """A Will Message marked UTF-8 (Payload Format Indicator 1) that is not: CONNACK 0x99
    (Payload format invalid) if one is sent, then closed; the will is never published."""
    s = clients.connected()
    s.subscribe(topic)
    c = clients.new()
    c.send(
        connect(
            c.name,
            will_topic=topic,
            will_payload=b"\xff\xfe",
            will_props=[(P.PAYLOAD_FORMAT_INDICATOR, 1)],
        )
    )
    c.expect_refused({0x99, 0x81, 0x82})
    assert s.drain() == []


def test_will_published_on_session_take_over(clients, uid, topic):
    """A connection taken over by a new one with the same ClientID ends as if the network had
    failed: its will (Will Delay 0) is published."""
    s = clients.connected()
    s.subscribe(topic)
    old = clients.new()
    old.connect(uid + "-will", will_topic=topic, will_payload=b"taken over")
    new = clients.new()
    new.connect(uid + "-will")
    old.expect_disconnect({0x8E})
    s.expect_publish(topic, b"taken over")


def _all_packets(name, topic):
    return [
        connect(name),
        subscribe(1, [(topic, 2)]),
        publish(topic, b"q0"),
        publish(topic, b"q1", qos=1, packet_id=2),
        publish(topic, b"q2", qos=2, packet_id=3),
        ack(PUBREL, 3),
        unsubscribe(4, [topic]),
        b"\xc0\x00",
    ]


def _answers(c, topic):
    """What the broker answers to _all_packets, and the messages it sends back."""
    want = [CONNACK, SUBACK, PUBACK, PUBREC, PUBCOMP, UNSUBACK, PINGRESP]
    got = []
    payloads = []
    while len(got) < len(want):
        pkt = c.read()
        if pkt.type == PUBLISH:  # the subscription's own messages come back
            payloads.append(pkt.payload)
            if pkt.qos:
                c.send(ack(PUBACK if pkt.qos == 1 else PUBREC, pkt.packet_id))
        elif pkt.type == PUBREL:  # the broker releasing its QoS 2 message
            c.send(ack(PUBCOMP, pkt.packet_id))
        else:
            got.append(pkt.type)
    assert got == want, got
    return payloads


def test_every_packet_split_byte_by_byte(clients, topic):
    """CONNECT, SUBSCRIBE, PUBLISH at each QoS, PUBREL, UNSUBSCRIBE and PINGREQ, each byte in
    its own TCP segment: answered as if sent whole."""
    c = clients.new()
    data = b"".join(_all_packets(c.name, topic))
    for i in range(len(data)):
        c.send(data[i : i + 1])
    payloads = _answers(c, topic)
    assert sorted(payloads) == [b"q0", b"q1", b"q2"], payloads


def test_many_packets_in_one_segment(clients, topic):
    """The same packets, and 200 QoS 1 PUBLISHes, all in one segment."""
    c = clients.new()
    many = b"".join(publish(f"{topic}/x", b"%d" % i, qos=1, packet_id=100 + i) for i in range(200))
    c.send(b"".join(_all_packets(c.name, topic)) + many)
    payloads = _answers(c, topic)
    assert sorted(payloads) == [b"q0", b"q1", b"q2"], payloads
    ids = [c.expect(PUBACK).packet_id for _ in range(200)]
    assert ids == [100 + i for i in range(200)]
