"""Golden bytes for every MQTT 3.1.1 control packet (and the 3.1 "MQIsdp" CONNECT), written by
hand from the 3.1.1 spec: no properties, no reason codes outside CONNACK/SUBACK, 2-byte acks."""

from __future__ import annotations

import pytest
from protocol_helpers import check_golden
from support.codec import encode_hot

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_3_1_1
from mqttbroker.protocol.properties import PropertyId as P

V4 = MQTT_3_1_1
SR = pk.SubscriptionRequest


def test_connect_full() -> None:
    """3.1.1 CONNECT with will (QoS 2), user name and password; no property fields."""
    packet = pk.Connect(
        client_id="c1",
        protocol_level=4,
        clean_start=True,
        keep_alive=10,
        username="u",
        password=b"p",
        will=pk.Will("t", b"m", qos=2, retain=False),
    )
    expected = (
        b"\x10\x1a"
        b"\x00\x04MQTT"
        b"\x04"  # protocol level 4
        b"\xd6"  # user name, password, will QoS 10, will flag, clean session
        b"\x00\x0a"
        b"\x00\x02c1"
        b"\x00\x01t"
        b"\x00\x01m"
        b"\x00\x01u"
        b"\x00\x01p"
    )
    check_golden(packet, V4, expected)


def test_connect_will_retain_qos1() -> None:
    packet = pk.Connect(
        client_id="",
        protocol_level=4,
        clean_start=True,
        keep_alive=0,
        will=pk.Will("a", b"", qos=1, retain=True),
    )
    expected = b"\x10\x11\x00\x04MQTT\x04\x2e\x00\x00\x00\x00\x00\x01a\x00\x00"
    check_golden(packet, V4, expected)


def test_connect_mqisdp_level_3() -> None:
    """MQTT 3.1: protocol name "MQIsdp", level 3."""
    packet = pk.Connect(
        client_id="old", protocol_level=3, protocol_name="MQIsdp", clean_start=True, keep_alive=30
    )
    expected = b"\x10\x11\x00\x06MQIsdp\x03\x02\x00\x1e\x00\x03old"
    check_golden(packet, V4, expected)


def test_connect_level_decides_the_layout() -> None:
    """CONNECT carries its own level: a 3.1.1 CONNECT decodes as 3.1.1 whatever the caller's
    version, and a level-5 one with properties."""
    body = b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"
    expected = pk.Connect(client_id="a", protocol_level=4)
    assert grammar.decode(1, 0, body, 5) == expected
    assert grammar.decode(1, 0, body, 4) == expected


@pytest.mark.parametrize(
    ("packet", "expected"),
    [
        (pk.Connack(False, 0), b"\x20\x02\x00\x00"),
        (pk.Connack(True, 0), b"\x20\x02\x01\x00"),
        (pk.Connack(False, 1), b"\x20\x02\x00\x01"),
        (pk.Connack(False, 5), b"\x20\x02\x00\x05"),
    ],
)
def test_connack(packet: pk.Connack, expected: bytes) -> None:
    """3.1.1 CONNACK: acknowledge flags and return code, nothing else."""
    check_golden(packet, V4, expected)


def test_publish_qos0() -> None:
    check_golden(pk.Publish("a/b", b"hi"), V4, b"\x30\x07\x00\x03a/bhi")


def test_publish_qos1() -> None:
    check_golden(
        pk.Publish("a/b", b"hi", qos=1, packet_id=10), V4, b"\x32\x09\x00\x03a/b\x00\x0ahi"
    )


def test_publish_qos2_dup_retain() -> None:
    packet = pk.Publish("x", b"", qos=2, retain=True, dup=True, packet_id=0xABCD)
    check_golden(packet, V4, b"\x3d\x05\x00\x01x\xab\xcd")


def test_publish_properties_are_not_encoded_in_311() -> None:
    """A 3.1.1 PUBLISH has no property length, so properties of the object are left out."""
    packet = pk.Publish("t", b"p", properties={P.CONTENT_TYPE: "c"})
    expected = b"\x30\x04\x00\x01tp"
    assert grammar.encode(packet, V4) == expected
    assert encode_hot(packet, V4) == expected


@pytest.mark.parametrize(
    ("packet", "expected"),
    [
        (pk.Puback(1), b"\x40\x02\x00\x01"),
        (pk.Pubrec(0x0102), b"\x50\x02\x01\x02"),
        (pk.Pubrel(3), b"\x62\x02\x00\x03"),
        (pk.Pubcomp(0xFFFF), b"\x70\x02\xff\xff"),
    ],
)
def test_acks(packet: pk.Ack, expected: bytes) -> None:
    """3.1.1 acks are always the packet identifier alone; PUBREL carries flags 0010."""
    check_golden(packet, V4, expected)


def test_ack_reason_code_is_dropped_in_311() -> None:
    """3.1.1 cannot express an ack reason code or properties; the encoders send 2 bytes."""
    packet = pk.Puback(5, 0x80, {P.REASON_STRING: "no"})
    assert grammar.encode(packet, V4) == b"\x40\x02\x00\x05"
    assert encode_hot(packet, V4) == b"\x40\x02\x00\x05"


def test_subscribe() -> None:
    """3.1.1 SUBSCRIBE: requested QoS byte per filter, flags 0010."""
    packet = pk.Subscribe(1, [SR("a/b", qos=1), SR("c", qos=2), SR("#", qos=0)])
    expected = b"\x82\x10\x00\x01\x00\x03a/b\x01\x00\x01c\x02\x00\x01#\x00"
    check_golden(packet, V4, expected)


def test_suback() -> None:
    check_golden(pk.Suback(1, [1, 0x80, 0, 2]), V4, b"\x90\x06\x00\x01\x01\x80\x00\x02")


def test_unsubscribe() -> None:
    check_golden(pk.Unsubscribe(11, ["a/b", "c"]), V4, b"\xa2\x0a\x00\x0b\x00\x03a/b\x00\x01c")


def test_unsuback() -> None:
    """3.1.1 UNSUBACK is the packet identifier alone (no reason codes)."""
    check_golden(pk.Unsuback(11), V4, b"\xb0\x02\x00\x0b")


def test_pingreq() -> None:
    check_golden(pk.Pingreq(), V4, b"\xc0\x00")


def test_pingresp() -> None:
    check_golden(pk.Pingresp(), V4, b"\xd0\x00")


def test_disconnect() -> None:
    check_golden(pk.Disconnect(), V4, b"\xe0\x00")
