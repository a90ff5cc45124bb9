"""Malformed packets and Protocol Errors (sections 1.5, 2.1.3, 2.2, 4.13): each is answered by
closing the connection, with a DISCONNECT carrying the right reason code if one is sent."""

from __future__ import annotations

import pytest

from .mqtt import (
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    P,
    ack,
    packet,
    properties,
    publish,
    string,
    sub_options,
    subscribe,
    u16,
    unsubscribe,
    vbi,
)

MALFORMED = {0x81}
MALFORMED_OR_PROTOCOL = {0x81, 0x82}

# -- Variable Byte Integers --------------------------------------------------------------------


def test_non_minimal_remaining_length(clients):
    """A Remaining Length not encoded in the fewest bytes (PINGREQ as c0 80 00) is malformed.
    [MQTT-1.5.5-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(b"\xc0\x80\x00")
    c.expect_disconnect(MALFORMED)


def test_non_minimal_property_length(clients, topic):
    """A Property Length not encoded in the fewest bytes is malformed. [MQTT-1.5.5-1]"""
    c = clients.connected()
    c.send(packet(0x30, string(topic) + b"\x80\x00" + b"payload"))
    c.expect_disconnect(MALFORMED)


def test_remaining_length_longer_than_four_bytes(clients):
    """A Variable Byte Integer has at most four bytes. [MQTT-1.5.5-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(b"\x30\xff\xff\xff\xff\x7f")
    c.expect_disconnect(MALFORMED)


def test_broker_encodes_lengths_minimally(clients, topic):
    """The broker's own Remaining Lengths are minimal: 1, 2 and 3 bytes around the 127 and
    16383 boundaries (the parser rejects any other encoding). [MQTT-1.5.5-1]"""
    sub = clients.connected()
    sub.subscribe(topic)
    pub = clients.connected()
    overhead = 2 + len(topic.encode()) + 1
    for body_length, width in ((127, 1), (128, 2), (16383, 2), (16384, 3), (70000, 3)):
        pub.publish(topic, b"x" * (body_length - overhead))
        raw = sub.read_raw()
        assert raw[1 : 1 + width] == vbi(body_length), (body_length, raw[:5].hex(" "))
        assert len(raw) == 1 + width + body_length


# -- UTF-8 string pairs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pair",
    [(b"k\xff", b"v"), (b"k", b"v\xed\xa0\x80"), (b"k\x00", b"v"), (b"k", b"\x00")],
    ids=["name-ff", "value-surrogate", "name-null", "value-null"],
)
def test_user_property_must_be_valid_utf8(clients, topic, pair):
    """Both strings of a UTF-8 String Pair follow the UTF-8 string rules; a User Property with
    ill-formed UTF-8 or U+0000 is malformed. [MQTT-1.5.7-1] [MQTT-1.5.4-1] [MQTT-1.5.4-2]"""
    c = clients.connected()
    name, value = pair
    prop = b"\x26" + string(name) + string(value)
    c.send(packet(0x30, string(topic) + vbi(len(prop)) + prop + b"x"))
    c.expect_disconnect(MALFORMED)


# -- reserved flags ----------------------------------------------------------------------------

RESERVED_FLAG_CASES = {
    "PUBACK-0x41": lambda: b"\x41\x02\x00\x01",
    "PUBREC-0x58": lambda: b"\x58\x02\x00\x01",
    "PUBCOMP-0x71": lambda: b"\x71\x02\x00\x01",
    "PINGREQ-0xC1": lambda: b"\xc1\x00",
    "PINGREQ-0xC8": lambda: b"\xc8\x00",
    "CONNECT-0x11": None,
}


@pytest.mark.parametrize("case", [k for k, v in RESERVED_FLAG_CASES.items() if v])
def test_reserved_fixed_header_flags(clients, case):
    """Fixed-header flag bits marked Reserved must have their listed values; other values make
    the packet malformed. [MQTT-2.1.3-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(RESERVED_FLAG_CASES[case]())
    c.expect_disconnect(MALFORMED)


def test_connect_fixed_header_flags(clients):
    """A CONNECT whose fixed-header flags are not 0000 is malformed. [MQTT-2.1.3-1]"""
    from .mqtt import connect

    c = clients.new()
    raw = connect(c.name)
    c.send(bytes([0x11]) + raw[1:])
    c.expect_refused({0x81})


def test_pubrel_flags(clients, topic):
    """PUBREL's fixed-header flags are 0010; anything else is malformed and the connection is
    closed. [MQTT-3.6.1-1] [MQTT-2.1.3-1]"""
    c = clients.connected()
    c.publish(topic, b"x", qos=2, packet_id=5)
    c.expect(PUBREC)
    c.send(b"\x60\x02\x00\x05")
    c.expect_disconnect(MALFORMED)


def test_subscribe_flags(clients, topic):
    """SUBSCRIBE's fixed-header flags are 0010; anything else is malformed. [MQTT-3.8.1-1]
    [MQTT-2.1.3-1]"""
    c = clients.connected()
    raw = subscribe(1, [(topic, 0)])
    c.send(bytes([0x80]) + raw[1:])
    c.expect_disconnect(MALFORMED)


def test_unsubscribe_flags(clients, topic):
    """UNSUBSCRIBE's fixed-header flags are 0010; anything else is malformed. [MQTT-3.10.1-1]
    [MQTT-2.1.3-1]"""
    c = clients.connected()
    raw = unsubscribe(1, [topic])
    c.send(bytes([0xA3]) + raw[1:])
    c.expect_disconnect(MALFORMED)


def test_disconnect_flags(clients):
    """DISCONNECT's reserved flags must be 0; otherwise the receiver sends DISCONNECT 0x81
    (Malformed Packet) and closes. [MQTT-3.14.1-1]"""
    c = clients.connected()
    c.send(b"\xe2\x00")
    c.expect_disconnect(MALFORMED, required=True)


# -- packet identifiers ------------------------------------------------------------------------


@pytest.mark.parametrize("qos", [1, 2])
def test_publish_packet_id_zero(clients, topic, qos):
    """A QoS 1 or 2 PUBLISH needs a non-zero Packet Identifier. [MQTT-2.2.1-3]"""
    c = clients.connected()
    c.publish(topic, b"x", qos=qos, packet_id=0)
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_subscribe_packet_id_zero(clients, topic):
    """A SUBSCRIBE needs a non-zero Packet Identifier. [MQTT-2.2.1-3]"""
    c = clients.connected()
    c.send(subscribe(0, [(topic, 0)]))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_unsubscribe_packet_id_zero(clients, topic):
    """An UNSUBSCRIBE needs a non-zero Packet Identifier. [MQTT-2.2.1-3]"""
    c = clients.connected()
    c.send(unsubscribe(0, [topic]))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


# -- PUBLISH -----------------------------------------------------------------------------------


def test_publish_qos_3(clients, topic):
    """A PUBLISH with both QoS bits set is malformed. [MQTT-3.3.1-4] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(packet(0x36, string(topic) + u16(1) + b"\x00x"))
    c.expect_disconnect(MALFORMED)


def test_qos0_publish_with_dup(clients, topic):
    """DUP must be 0 on a QoS 0 PUBLISH; DUP 1 is malformed. [MQTT-3.3.1-2]"""
    c = clients.connected()
    c.send(packet(0x38, string(topic) + b"\x00x"))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_publish_with_subscription_identifier(clients, topic):
    """A PUBLISH from a client may not carry a Subscription Identifier: Protocol Error.
    [MQTT-3.3.4-6] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.SUBSCRIPTION_IDENTIFIER, 1)])
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_property_not_allowed_in_packet(clients, topic):
    """A property that does not belong in the packet (Session Expiry Interval in PUBLISH) is an
    error. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.SESSION_EXPIRY_INTERVAL, 10)])
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_property_repeated(clients, topic):
    """A property that may appear once, given twice, is an error. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.CONTENT_TYPE, "a"), (P.CONTENT_TYPE, "b")])
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_truncated_publish(clients, topic):
    """A PUBLISH whose topic length runs past the packet is malformed. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(packet(0x30, u16(200) + topic.encode()))
    c.expect_disconnect(MALFORMED)


# -- acknowledgement reason codes --------------------------------------------------------------


def _inflight(clients, topic, qos):
    sub = clients.connected()
    sub.subscribe(topic, qos=qos)
    clients.connected().publish_acked(topic, b"x", qos=qos)
    return sub, sub.expect_publish(topic)


def test_puback_undefined_reason_code(clients, topic):
    """PUBACK carries one of the PUBACK reason codes; 0x05 is not one. [MQTT-3.4.2-1]"""
    sub, pkt = _inflight(clients, topic, 1)
    sub.send(ack(PUBACK, pkt.packet_id, 0x05))
    sub.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_pubrec_undefined_reason_code(clients, topic):
    """PUBREC carries one of the PUBREC reason codes; 0x05 is not one. [MQTT-3.5.2-1]"""
    sub, pkt = _inflight(clients, topic, 2)
    sub.send(ack(PUBREC, pkt.packet_id, 0x05))
    sub.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_pubrel_undefined_reason_code(clients, topic):
    """PUBREL carries one of the PUBREL reason codes (0x00, 0x92); 0x10 is not one.
    [MQTT-3.6.2-1]"""
    c = clients.connected()
    c.publish(topic, b"x", qos=2, packet_id=3)
    c.expect(PUBREC)
    c.send(ack(PUBREL, 3, 0x10))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_pubcomp_undefined_reason_code(clients, topic):
    """PUBCOMP carries one of the PUBCOMP reason codes (0x00, 0x92); 0x10 is not one.
    [MQTT-3.7.2-1]"""
    sub, pkt = _inflight(clients, topic, 2)
    sub.send(ack(PUBREC, pkt.packet_id))
    sub.expect(PUBREL)
    sub.send(ack(PUBCOMP, pkt.packet_id, 0x10))
    sub.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_disconnect_undefined_reason_code(clients):
    """DISCONNECT carries one of the Disconnect reason codes; 0x05 makes it malformed.
    [MQTT-3.14.2-1]"""
    c = clients.connected()
    c.send(b"\xe0\x01\x05")
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


# -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------------


def test_subscribe_without_filters(clients):
    """A SUBSCRIBE without any Topic Filter is a Protocol Error. [MQTT-3.8.3-2]"""
    c = clients.connected()
    c.send(packet(0x82, u16(1) + properties(None)))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_subscribe_filter_ill_formed_utf8(clients, topic):
    """SUBSCRIBE Topic Filters are UTF-8 Encoded Strings; ill-formed UTF-8 is malformed.
    [MQTT-3.8.3-1] [MQTT-1.5.4-1]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic.encode() + b"/\xff", 0)]))
    c.expect_disconnect(MALFORMED)


@pytest.mark.parametrize("options", [0x40, 0x80, 0xC1])
def test_subscribe_reserved_option_bits(clients, topic, options):
    """Non-zero reserved bits in the Subscription Options make the SUBSCRIBE malformed.
    [MQTT-3.8.3-5] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic, options)]))
    c.expect_disconnect(MALFORMED)


def test_subscribe_qos_3(clients, topic):
    """Maximum QoS 3 in the Subscription Options is an error. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic, 3)]))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_subscribe_retain_handling_3(clients, topic):
    """Retain Handling 3 is a Protocol Error. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic, sub_options(rh=3))]))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_unsubscribe_without_filters(clients):
    """An UNSUBSCRIBE without any Topic Filter is a Protocol Error. [MQTT-3.10.3-2]"""
    c = clients.connected()
    c.send(packet(0xA2, u16(1) + properties(None)))
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_unsubscribe_filter_ill_formed_utf8(clients, topic):
    """UNSUBSCRIBE Topic Filters are UTF-8 Encoded Strings; ill-formed UTF-8 is malformed.
    [MQTT-3.10.3-1] [MQTT-1.5.4-1]"""
    c = clients.connected()
    c.send(unsubscribe(1, [topic.encode() + b"/\xc3"]))
    c.expect_disconnect(MALFORMED)


# -- packets only a server sends ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\x20\x03\x00\x00\x00",
        b"\x90\x04\x00\x01\x00\x00",
        b"\xb0\x04\x00\x01\x00\x00",
        b"\xd0\x00",
        b"\x00\x00",
    ],
    ids=["CONNACK", "SUBACK", "UNSUBACK", "PINGRESP", "type-0"],
)
def test_server_only_packet_from_client(clients, raw):
    """A client sending a packet type only a server sends (or reserved type 0) is closed.
    [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(raw)
    c.expect_disconnect(MALFORMED_OR_PROTOCOL)


def test_malformed_publish_does_not_reach_subscribers(clients, topic):
    """Nothing of a malformed packet is acted on: a PUBLISH with QoS 3 is not delivered.
    [MQTT-4.13.1-1]"""
    sub = clients.connected()
    sub.subscribe(topic)
    c = clients.connected()
    c.send(packet(0x36, string(topic) + u16(1) + b"\x00bad"))
    c.expect_disconnect(MALFORMED)
    clients.connected().send(publish(topic, b"sentinel"))
    assert sub.expect_publish(topic).payload == b"sentinel"
