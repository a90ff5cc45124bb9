"""protocol/packets.py: the packet classes, and the exact bytes each packet is on the wire.

The packet classes write their ``__init__`` out (so that, compiled, it runs as C): each must
take every field by name, store it, and give each packet a properties dict of its own.

Golden bytes for every MQTT 3.1.1 control packet (and the 3.1 "MQIsdp" CONNECT), written by
hand from the 3.1.1 spec: no properties, no reason codes outside CONNACK/SUBACK, 2-byte acks.

Golden bytes for every MQTT 5.0 control packet (section 3), written by hand from the spec.

Each case states a packet and the exact bytes the spec prescribes for it; the bytes were counted
by hand, never produced by our encoder. ``check_golden`` asserts that grammar (and, for the hot
packets, the fast path) encodes the packet to those bytes and decodes them back to the packet.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from support.codec import check_golden, decode_hot, encode_hot, split

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5
from mqttbroker.protocol.properties import PropertyId as P

CLASSES = [
    pk.Will,
    pk.Connect,
    pk.Connack,
    pk.Publish,
    pk.Puback,
    pk.Pubrec,
    pk.Pubrel,
    pk.Pubcomp,
    pk.SubscriptionRequest,
    pk.Subscribe,
    pk.Suback,
    pk.Unsubscribe,
    pk.Unsuback,
    pk.Pingreq,
    pk.Pingresp,
    pk.Disconnect,
    pk.Auth,
]

REQUIRED: dict[type, dict[str, Any]] = {
    pk.Will: {"topic": "t"},
    pk.Puback: {"packet_id": 1},
    pk.Pubrec: {"packet_id": 1},
    pk.Pubrel: {"packet_id": 1},
    pk.Pubcomp: {"packet_id": 1},
    pk.SubscriptionRequest: {"topic_filter": "t"},
    pk.Subscribe: {"packet_id": 1, "subscriptions": []},
    pk.Suback: {"packet_id": 1, "reason_codes": []},
    pk.Unsubscribe: {"packet_id": 1, "topic_filters": []},
    pk.Unsuback: {"packet_id": 1},
}


# The classes with fields (PINGREQ and PINGRESP have none), and of those the ones with a
# container among their defaults: what the two tests below can say something about.
WITH_FIELDS = [cls for cls in CLASSES if dataclasses.fields(cls)]
WITH_CONTAINERS = [
    cls
    for cls in WITH_FIELDS
    if any(
        isinstance(getattr(cls(**REQUIRED.get(cls, {})), f.name), (dict, list))
        and f.name not in REQUIRED.get(cls, {})
        for f in dataclasses.fields(cls)
    )
]

# Fields whose default is None: a value of the type they hold otherwise.
WHEN_NOT_NONE: dict[str, Any] = {
    "username": "user",
    "password": b"secret",
    "will": pk.Will("will"),
    "packet_id": 7,
}


def _other_value(name: str, default: Any, index: int) -> Any:
    """A value of the field's type that differs from its default and from the other fields'."""
    if default is None:
        return WHEN_NOT_NONE[name]
    if isinstance(default, bool):
        return not default
    made: dict[type, Any] = {
        str: f"value-{index}",
        int: 1000 + index,
        bytes: b"value-%d" % index,
        dict: {index: "value"},
        list: [index],
    }
    return made[type(default)]


@pytest.mark.parametrize("cls", WITH_FIELDS, ids=lambda c: c.__name__)
def test_every_field_is_taken_by_name_and_kept(cls: type) -> None:
    defaults = cls(**REQUIRED.get(cls, {}))
    fields = dataclasses.fields(cls)
    values = {
        f.name: _other_value(f.name, getattr(defaults, f.name), i) for i, f in enumerate(fields)
    }
    packet = cls(**values)
    for name, value in values.items():
        assert getattr(packet, name) == value, name
        if isinstance(value, (dict, list)):
            assert getattr(packet, name) is value, name


@pytest.mark.parametrize("cls", WITH_CONTAINERS, ids=lambda c: c.__name__)
def test_defaults_give_each_packet_its_own_containers(cls: type) -> None:
    one, two = cls(**REQUIRED.get(cls, {})), cls(**REQUIRED.get(cls, {}))
    assert one == two
    for f in dataclasses.fields(cls):
        value = getattr(one, f.name)
        if isinstance(value, (dict, list)) and f.name not in REQUIRED.get(cls, {}):
            assert value == type(value)()
            assert value is not getattr(two, f.name), f.name


def test_each_packet_class_has_its_packet_type() -> None:
    expected = {
        pk.Connect: pk.CONNECT,
        pk.Connack: pk.CONNACK,
        pk.Publish: pk.PUBLISH,
        pk.Puback: pk.PUBACK,
        pk.Pubrec: pk.PUBREC,
        pk.Pubrel: pk.PUBREL,
        pk.Pubcomp: pk.PUBCOMP,
        pk.Subscribe: pk.SUBSCRIBE,
        pk.Suback: pk.SUBACK,
        pk.Unsubscribe: pk.UNSUBSCRIBE,
        pk.Unsuback: pk.UNSUBACK,
        pk.Pingreq: pk.PINGREQ,
        pk.Pingresp: pk.PINGRESP,
        pk.Disconnect: pk.DISCONNECT,
        pk.Auth: pk.AUTH,
    }
    for cls, ptype in expected.items():
        assert cls(**REQUIRED.get(cls, {})).packet_type == ptype, cls.__name__


# ---------------------------------------------------------------------------------------------
# MQTT 3.1.1 (and the 3.1 "MQIsdp" CONNECT): no properties, no reason codes outside
# CONNACK/SUBACK, 2-byte acks.

V4 = MQTT_3_1_1
V5 = MQTT_5
SR = pk.SubscriptionRequest

GOLDEN_V311: list[tuple[str, pk.Packet, bytes]] = [
    # CONNECT with will (QoS 2), user name and password; no property fields.
    (
        "connect-will-user-password",
        pk.Connect(
            client_id="c1",
            protocol_level=4,
            clean_start=True,
            keep_alive=10,
            username="u",
            password=b"p",
            will=pk.Will("t", b"m", qos=2, retain=False),
        ),
        b"\x10\x1a"
        b"\x00\x04MQTT"
        b"\x04"  # protocol level 4
        b"\xd6"  # user name, password, will QoS 10, will flag, clean session
        b"\x00\x0a"
        b"\x00\x02c1"
        b"\x00\x01t"
        b"\x00\x01m"
        b"\x00\x01u"
        b"\x00\x01p",
    ),
    (
        "connect-will-retain-qos1",
        pk.Connect(
            client_id="",
            protocol_level=4,
            clean_start=True,
            keep_alive=0,
            will=pk.Will("a", b"", qos=1, retain=True),
        ),
        b"\x10\x11\x00\x04MQTT\x04\x2e\x00\x00\x00\x00\x00\x01a\x00\x00",
    ),
    # MQTT 3.1: protocol name "MQIsdp", level 3.
    (
        "connect-mqisdp-level-3",
        pk.Connect(
            client_id="old",
            protocol_level=3,
            protocol_name="MQIsdp",
            clean_start=True,
            keep_alive=30,
        ),
        b"\x10\x11\x00\x06MQIsdp\x03\x02\x00\x1e\x00\x03old",
    ),
    # CONNACK: acknowledge flags and return code, nothing else.
    ("connack-accepted", pk.Connack(False, 0), b"\x20\x02\x00\x00"),
    ("connack-session-present", pk.Connack(True, 0), b"\x20\x02\x01\x00"),
    ("connack-refused-1", pk.Connack(False, 1), b"\x20\x02\x00\x01"),
    ("connack-refused-5", pk.Connack(False, 5), b"\x20\x02\x00\x05"),
    ("publish-qos0", pk.Publish("a/b", b"hi"), b"\x30\x07\x00\x03a/bhi"),
    (
        "publish-qos1",
        pk.Publish("a/b", b"hi", qos=1, packet_id=10),
        b"\x32\x09\x00\x03a/b\x00\x0ahi",
    ),
    (
        "publish-qos2-dup-retain",
        pk.Publish("x", b"", qos=2, retain=True, dup=True, packet_id=0xABCD),
        b"\x3d\x05\x00\x01x\xab\xcd",
    ),
    # Acks are always the packet identifier alone; PUBREL carries flags 0010.
    ("puback", pk.Puback(1), b"\x40\x02\x00\x01"),
    ("pubrec", pk.Pubrec(0x0102), b"\x50\x02\x01\x02"),
    ("pubrel", pk.Pubrel(3), b"\x62\x02\x00\x03"),
    ("pubcomp", pk.Pubcomp(0xFFFF), b"\x70\x02\xff\xff"),
    # SUBSCRIBE: requested QoS byte per filter, flags 0010.
    (
        "subscribe",
        pk.Subscribe(1, [SR("a/b", qos=1), SR("c", qos=2), SR("#", qos=0)]),
        b"\x82\x10\x00\x01\x00\x03a/b\x01\x00\x01c\x02\x00\x01#\x00",
    ),
    ("suback", pk.Suback(1, [1, 0x80, 0, 2]), b"\x90\x06\x00\x01\x01\x80\x00\x02"),
    (
        "unsubscribe",
        pk.Unsubscribe(11, ["a/b", "c"]),
        b"\xa2\x0a\x00\x0b\x00\x03a/b\x00\x01c",
    ),
    # UNSUBACK is the packet identifier alone (no reason codes).
    ("unsuback", pk.Unsuback(11), b"\xb0\x02\x00\x0b"),
    ("pingreq", pk.Pingreq(), b"\xc0\x00"),
    ("pingresp", pk.Pingresp(), b"\xd0\x00"),
    ("disconnect", pk.Disconnect(), b"\xe0\x00"),
]


@pytest.mark.parametrize(
    ("packet", "expected"), [c[1:] for c in GOLDEN_V311], ids=[c[0] for c in GOLDEN_V311]
)
def test_v311_packet_has_the_spec_bytes(packet: pk.Packet, expected: bytes) -> None:
    check_golden(packet, V4, expected)


def test_v311_connect_level_decides_the_layout() -> None:
    """CONNECT carries its own level: a 3.1.1 CONNECT decodes as 3.1.1 whatever the caller's
    version, and a level-5 one with properties."""
    body = b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"
    expected = pk.Connect(client_id="a", protocol_level=4)
    assert grammar.decode(1, 0, body, 5) == expected
    assert grammar.decode(1, 0, body, 4) == expected


def test_v311_publish_leaves_properties_out() -> None:
    """A 3.1.1 PUBLISH has no property length, so properties of the object are left out."""
    packet = pk.Publish("t", b"p", properties={P.CONTENT_TYPE: "c"})
    expected = b"\x30\x04\x00\x01tp"
    assert grammar.encode(packet, V4) == expected
    assert encode_hot(packet, V4) == expected


def test_v311_ack_drops_reason_code_and_properties() -> None:
    """3.1.1 cannot express an ack reason code or properties; the encoders send 2 bytes."""
    packet = pk.Puback(5, 0x80, {P.REASON_STRING: "no"})
    assert grammar.encode(packet, V4) == b"\x40\x02\x00\x05"
    assert encode_hot(packet, V4) == b"\x40\x02\x00\x05"


# ---------------------------------------------------------------------------------------------
# MQTT 5.0 (section 3)

GOLDEN_V5: list[tuple[str, pk.Packet, bytes]] = [
    # [MQTT-3.1.3-1] CONNECT with properties, a will with will properties, user name and
    # password: payload order client id, will properties, will topic, will payload, user,
    # password.
    (
        "connect-full",
        pk.Connect(
            client_id="cid",
            protocol_level=5,
            clean_start=True,
            keep_alive=60,
            username="user",
            password=b"pw",
            will=pk.Will(
                topic="w/t",
                payload=b"bye",
                qos=1,
                retain=True,
                properties={P.WILL_DELAY_INTERVAL: 5, P.USER_PROPERTY: [("a", "b")]},
            ),
            properties={
                P.SESSION_EXPIRY_INTERVAL: 120,
                P.RECEIVE_MAXIMUM: 20,
                P.USER_PROPERTY: [("k", "v")],
            },
        ),
        b"\x10\x40"  # CONNECT, remaining length 64
        b"\x00\x04MQTT"  # protocol name
        b"\x05"  # protocol level 5
        b"\xee"  # user name, password, will retain, will QoS 01, will flag, clean start, 0
        b"\x00\x3c"  # keep alive 60
        b"\x0f"  # property length 15
        b"\x11\x00\x00\x00\x78"  # session expiry interval 120
        b"\x21\x00\x14"  # receive maximum 20
        b"\x26\x00\x01k\x00\x01v"  # user property k=v
        b"\x00\x03cid"  # client identifier
        b"\x0c"  # will property length 12
        b"\x18\x00\x00\x00\x05"  # will delay interval 5
        b"\x26\x00\x01a\x00\x01b"  # user property a=b
        b"\x00\x03w/t"  # will topic
        b"\x00\x03bye"  # will payload
        b"\x00\x04user"  # user name
        b"\x00\x02pw",
    ),
    # [MQTT-2.2.2-1] [MQTT-3.1.3-3] No flags, empty client id, property length still present.
    (
        "connect-minimal",
        pk.Connect(client_id="", clean_start=False, keep_alive=0),
        b"\x10\x0d\x00\x04MQTT\x05\x00\x00\x00\x00\x00\x00",
    ),
    # MQTT 5 allows a Password without a User Name (3.1.2.9).
    (
        "connect-password-without-username",
        pk.Connect(client_id="c", keep_alive=5, password=b"\x00\xff"),
        b"\x10\x12\x00\x04MQTT\x05"
        b"\x42"  # password flag, clean start
        b"\x00\x05\x00"
        b"\x00\x01c"
        b"\x00\x02\x00\xff",
    ),
    # [MQTT-3.1.2-9] Will flag 1: will properties, topic and payload are present.
    (
        "connect-will-qos2-all-will-properties",
        pk.Connect(
            client_id="x",
            clean_start=False,
            keep_alive=0,
            will=pk.Will(
                topic="t",
                payload=b"",
                qos=2,
                retain=False,
                properties={
                    P.PAYLOAD_FORMAT_INDICATOR: 1,
                    P.MESSAGE_EXPIRY_INTERVAL: 10,
                    P.CONTENT_TYPE: "c",
                    P.RESPONSE_TOPIC: "r",
                    P.CORRELATION_DATA: b"\x01",
                },
            ),
        ),
        b"\x10\x27\x00\x04MQTT\x05"
        b"\x14"  # will QoS 10, will flag
        b"\x00\x00\x00"
        b"\x00\x01x"
        b"\x13"  # will property length 19
        b"\x01\x01"
        b"\x02\x00\x00\x00\x0a"
        b"\x03\x00\x01c"
        b"\x08\x00\x01r"
        b"\x09\x00\x01\x01"
        b"\x00\x01t"
        b"\x00\x00",
    ),
    (
        "connack-with-properties",
        pk.Connack(
            session_present=True,
            reason_code=0,
            properties={
                P.RECEIVE_MAXIMUM: 100,
                P.MAXIMUM_QOS: 1,
                P.ASSIGNED_CLIENT_IDENTIFIER: "auto-1",
                P.SERVER_KEEP_ALIVE: 30,
                P.REASON_STRING: "ok",
            },
        ),
        b"\x20\x19"
        b"\x01"  # session present
        b"\x00"  # success
        b"\x16"  # property length 22
        b"\x21\x00\x64"
        b"\x24\x01"
        b"\x12\x00\x06auto-1"
        b"\x13\x00\x1e"
        b"\x1f\x00\x02ok",
    ),
    # [MQTT-2.2.2-1] Property length 0 is still sent.
    (
        "connack-refused-no-properties",
        pk.Connack(False, 0x87),
        b"\x20\x03\x00\x87\x00",
    ),
    (
        "connack-four-byte-and-availability-properties",
        pk.Connack(
            properties={
                P.MAXIMUM_PACKET_SIZE: 0x10000,
                P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF,
                P.RETAIN_AVAILABLE: 0,
                P.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
                P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 0,
                P.SHARED_SUBSCRIPTION_AVAILABLE: 1,
                P.TOPIC_ALIAS_MAXIMUM: 0x0102,
                P.RESPONSE_INFORMATION: "ri",
                P.SERVER_REFERENCE: "s",
                P.AUTHENTICATION_METHOD: "m",
                P.AUTHENTICATION_DATA: b"d",
            }
        ),
        b"\x20\x29\x00\x00"
        b"\x26"  # property length 38
        b"\x27\x00\x01\x00\x00"
        b"\x11\xff\xff\xff\xff"
        b"\x25\x00"
        b"\x28\x01"
        b"\x29\x00"
        b"\x2a\x01"
        b"\x22\x01\x02"
        b"\x1a\x00\x02ri"
        b"\x1c\x00\x01s"
        b"\x15\x00\x01m"
        b"\x16\x00\x01d",
    ),
    # [MQTT-2.2.1-2] QoS 0: no packet identifier; [MQTT-2.2.2-1] property length 0.
    (
        "publish-qos0",
        pk.Publish("a/b", b"hi"),
        b"\x30\x08\x00\x03a/b\x00hi",
    ),
    (
        "publish-qos1-retain",
        pk.Publish("a/b", b"hi", qos=1, retain=True, packet_id=10),
        b"\x33\x0a\x00\x03a/b\x00\x0a\x00hi",
    ),
    # [MQTT-3.3.2-18] User properties keep their order (including a repeated name); a PUBLISH to
    # a subscriber may carry several Subscription Identifiers [MQTT-3.3.4-4].
    (
        "publish-qos2-dup-all-properties",
        pk.Publish(
            topic="t",
            payload=b"",
            qos=2,
            dup=True,
            packet_id=0x1234,
            properties={
                P.PAYLOAD_FORMAT_INDICATOR: 1,
                P.MESSAGE_EXPIRY_INTERVAL: 3600,
                P.CONTENT_TYPE: "text/plain",
                P.RESPONSE_TOPIC: "r",
                P.CORRELATION_DATA: b"\x01\x02",
                P.TOPIC_ALIAS: 5,
                P.USER_PROPERTY: [("z", "1"), ("a", "2"), ("z", "3")],
                P.SUBSCRIPTION_IDENTIFIER: [1, 300],
            },
        ),
        b"\x3c\x40"  # PUBLISH, DUP, QoS 2; remaining length 64
        b"\x00\x01t"
        b"\x12\x34"  # packet identifier
        b"\x3a"  # property length 58
        b"\x01\x01"
        b"\x02\x00\x00\x0e\x10"
        b"\x03\x00\x0atext/plain"
        b"\x08\x00\x01r"
        b"\x09\x00\x02\x01\x02"
        b"\x23\x00\x05"
        b"\x26\x00\x01z\x00\x011"
        b"\x26\x00\x01a\x00\x012"
        b"\x26\x00\x01z\x00\x013"
        b"\x0b\x01"  # subscription identifier 1
        b"\x0b\xac\x02",
    ),
    # [MQTT-3.8.1-1] flags 0010; subscription options bits: QoS (0-1), No Local (2), Retain As
    # Published (3), Retain Handling (4-5).
    (
        "subscribe-options",
        pk.Subscribe(
            10,
            [
                SR("a/+", qos=1, no_local=True),
                SR("b/#", qos=2, retain_as_published=True, retain_handling=2),
                SR("c", qos=0, retain_handling=1),
            ],
            {P.SUBSCRIPTION_IDENTIFIER: 42, P.USER_PROPERTY: [("k", "v")]},
        ),
        b"\x82\x1c"
        b"\x00\x0a"  # packet identifier
        b"\x09"  # property length
        b"\x0b\x2a"  # subscription identifier 42
        b"\x26\x00\x01k\x00\x01v"
        b"\x00\x03a/+\x05"  # QoS 1 + No Local
        b"\x00\x03b/#\x2a"  # QoS 2 + Retain As Published + Retain Handling 2
        b"\x00\x01c\x10",
    ),
    # The largest Subscription Identifier, 268,435,455, is the VBI FF FF FF 7F.
    (
        "subscribe-large-subscription-identifier",
        pk.Subscribe(1, [SR("t")], {P.SUBSCRIPTION_IDENTIFIER: 268_435_455}),
        b"\x82\x0c\x00\x01\x05\x0b\xff\xff\xff\x7f\x00\x01t\x00",
    ),
    (
        "suback",
        pk.Suback(10, [1, 2, 0x80], {P.REASON_STRING: "r"}),
        b"\x90\x0a\x00\x0a\x04\x1f\x00\x01r\x01\x02\x80",
    ),
    (
        "suback-no-properties",
        pk.Suback(10, [0, 0xA2]),
        b"\x90\x05\x00\x0a\x00\x00\xa2",
    ),
    # [MQTT-3.10.1-1] flags 0010.
    (
        "unsubscribe",
        pk.Unsubscribe(11, ["a/b", "c"], {P.USER_PROPERTY: [("k", "v")]}),
        b"\xa2\x12\x00\x0b\x07\x26\x00\x01k\x00\x01v\x00\x03a/b\x00\x01c",
    ),
    (
        "unsuback",
        pk.Unsuback(11, [0x00, 0x11]),
        b"\xb0\x05\x00\x0b\x00\x00\x11",
    ),
    (
        "unsuback-with-properties",
        pk.Unsuback(11, [0x87], {P.REASON_STRING: "no"}),
        b"\xb0\x09\x00\x0b\x05\x1f\x00\x02no\x87",
    ),
    (
        "pingreq",
        pk.Pingreq(),
        b"\xc0\x00",
    ),
    (
        "pingresp",
        pk.Pingresp(),
        b"\xd0\x00",
    ),
    # Reason 0x00 without properties: remaining length 0 (3.14.2.1).
    (
        "disconnect-empty",
        pk.Disconnect(),
        b"\xe0\x00",
    ),
    # [MQTT-3.14.2-1] Remaining length 1: the reason code alone.
    (
        "disconnect-reason-only",
        pk.Disconnect(0x04),
        b"\xe0\x01\x04",
    ),
    (
        "disconnect-with-properties",
        pk.Disconnect(0x8E, {P.SESSION_EXPIRY_INTERVAL: 0, P.REASON_STRING: "bye"}),
        b"\xe0\x0d\x8e\x0b\x11\x00\x00\x00\x00\x1f\x00\x03bye",
    ),
    (
        "disconnect-success-with-properties",
        pk.Disconnect(0, {P.SERVER_REFERENCE: "s"}),
        b"\xe0\x06\x00\x04\x1c\x00\x01s",
    ),
    # Reason 0x00 without properties: remaining length 0 (3.15.2.1).
    (
        "auth-empty",
        pk.Auth(),
        b"\xf0\x00",
    ),
    (
        "auth-reason-only",
        pk.Auth(0x19),
        b"\xf0\x01\x19",
    ),
    # [MQTT-3.15.1-1] flags 0000; [MQTT-3.15.2-1] reason 0x18.
    (
        "auth-with-properties",
        pk.Auth(0x18, {P.AUTHENTICATION_METHOD: "SCRAM", P.AUTHENTICATION_DATA: b"\x00\x01"}),
        b"\xf0\x0f\x18\x0d\x15\x00\x05SCRAM\x16\x00\x02\x00\x01",
    ),
]


@pytest.mark.parametrize(
    ("packet", "expected"), [c[1:] for c in GOLDEN_V5], ids=[c[0] for c in GOLDEN_V5]
)
def test_v5_packet_has_the_spec_bytes(packet: pk.Packet, expected: bytes) -> None:
    """Each case is a packet and the exact bytes the spec prescribes for it, counted by hand."""
    check_golden(packet, V5, expected)


# ---------------------------------------------------------------------------------------------
# PUBLISH (3.3)


def test_publish_two_byte_remaining_length() -> None:
    """[MQTT-1.5.5-1] Remaining length 204 is the VBI CC 01."""
    payload = b"x" * 200
    check_golden(pk.Publish("t", payload), V5, b"\x30\xcc\x01\x00\x01t\x00" + payload)


def test_publish_three_byte_remaining_length() -> None:
    """[MQTT-1.5.5-1] Remaining length 16384 is the VBI 80 80 01."""
    payload = bytes(range(256)) * 63 + b"\x00" * 252  # 16380 bytes
    packet = pk.Publish("t", payload)
    check_golden(packet, V5, b"\x30\x80\x80\x01\x00\x01t\x00" + payload)


def test_publish_unicode_topic() -> None:
    """[MQTT-1.5.4-1] A topic with 2-, 3- and 4-byte UTF-8 sequences."""
    topic = "é/€/𝄞"
    raw = topic.encode()
    assert raw == b"\xc3\xa9/\xe2\x82\xac/\xf0\x9d\x84\x9e"
    check_golden(
        pk.Publish(topic, b"p", qos=1, packet_id=1),
        V5,
        b"\x32\x11\x00\x0b" + raw + b"\x00\x01\x00p",
    )


def test_publish_user_property_order_interleaved() -> None:
    """[MQTT-3.3.2-18] User properties interleaved with other properties keep their order."""
    body = b"\x00\x01t\x12\x26\x00\x01z\x00\x01a\x03\x00\x01c\x26\x00\x01b\x00\x01bpay"
    expected = pk.Publish(
        "t", b"pay", properties={P.USER_PROPERTY: [("z", "a"), ("b", "b")], P.CONTENT_TYPE: "c"}
    )
    data = bytes([0x30, len(body)]) + body
    assert grammar.decode(3, 0, body, V5) == expected
    assert decode_hot(3, 0, data, 2, len(data), V5) == expected
    got = grammar.decode(3, 0, body, V5)
    assert isinstance(got, pk.Publish)
    assert got.properties[P.USER_PROPERTY] == [("z", "a"), ("b", "b")]


# ---------------------------------------------------------------------------------------------
# PUBACK, PUBREC, PUBREL, PUBCOMP (3.4 to 3.7)

ACK_CASES = [
    # (packet, expected bytes, description)
    (pk.Puback(1), b"\x40\x02\x00\x01", "PUBACK success, 2-byte form"),
    (pk.Puback(0x0102, 0x10), b"\x40\x03\x01\x02\x10", "PUBACK reason code only"),
    (
        pk.Puback(7, 0x87, {P.REASON_STRING: "no", P.USER_PROPERTY: [("k", "v")]}),
        b"\x40\x10\x00\x07\x87\x0c\x1f\x00\x02no\x26\x00\x01k\x00\x01v",
        "PUBACK with properties",
    ),
    (
        pk.Puback(7, 0, {P.REASON_STRING: "x"}),
        b"\x40\x08\x00\x07\x00\x04\x1f\x00\x01x",
        "PUBACK success with properties",
    ),
    (pk.Pubrec(2), b"\x50\x02\x00\x02", "PUBREC success, 2-byte form"),
    (pk.Pubrec(2, 0x80), b"\x50\x03\x00\x02\x80", "PUBREC reason code only"),
    (
        pk.Pubrec(0xFFFF, 0x97, {P.USER_PROPERTY: [("a", ""), ("a", "")]}),
        b"\x50\x10\xff\xff\x97\x0c\x26\x00\x01a\x00\x00\x26\x00\x01a\x00\x00",
        "PUBREC with repeated identical user properties",
    ),
    (pk.Pubrel(3), b"\x62\x02\x00\x03", "PUBREL success, 2-byte form"),
    (pk.Pubrel(3, 0x92), b"\x62\x03\x00\x03\x92", "PUBREL reason code only"),
    (
        pk.Pubrel(3, 0x92, {P.REASON_STRING: "gone"}),
        b"\x62\x0b\x00\x03\x92\x07\x1f\x00\x04gone",
        "PUBREL with properties",
    ),
    (pk.Pubcomp(4), b"\x70\x02\x00\x04", "PUBCOMP success, 2-byte form"),
    (pk.Pubcomp(4, 0x92), b"\x70\x03\x00\x04\x92", "PUBCOMP reason code only"),
    (
        pk.Pubcomp(4, 0, {P.USER_PROPERTY: [("n", "v")]}),
        b"\x70\x0b\x00\x04\x00\x07\x26\x00\x01n\x00\x01v",
        "PUBCOMP with properties",
    ),
]


@pytest.mark.parametrize(
    ("packet", "expected"), [c[:2] for c in ACK_CASES], ids=[c[2] for c in ACK_CASES]
)
def test_acks_are_2_bytes_on_success_3_with_a_reason(packet: pk.Ack, expected: bytes) -> None:
    """[MQTT-3.4.2-1] [MQTT-3.5.2-1] [MQTT-3.6.2-1] [MQTT-3.7.2-1] Ack forms of section 3.4.2:
    2 bytes for success without properties, 3 with a reason code and no properties."""
    check_golden(packet, V5, expected)


@pytest.mark.parametrize(
    ("first", "cls"),
    [(0x40, pk.Puback), (0x50, pk.Pubrec), (0x62, pk.Pubrel), (0x70, pk.Pubcomp)],
)
def test_acks_long_forms_of_success_decode(first: int, cls: type[pk.Ack]) -> None:
    """A sender may include the reason code 0x00 and a zero property length (3.4.2.1)."""
    for body in (b"\x00\x09\x00", b"\x00\x09\x00\x00"):
        data = bytes([first, len(body)]) + body
        assert grammar.decode(first >> 4, first & 15, body, V5) == cls(9)
        assert decode_hot(first >> 4, first & 15, data, 2, len(data), V5) == cls(9)


# ---------------------------------------------------------------------------------------------
# PINGREQ, PINGRESP, DISCONNECT, AUTH (3.12 to 3.15)


def test_disconnect_reason_and_zero_property_length_decodes() -> None:
    """A sender may include a zero property length; it decodes as no properties."""
    assert grammar.decode(14, 0, b"\x00\x00", V5) == pk.Disconnect()
    assert grammar.decode(14, 0, b"\x81\x00", V5) == pk.Disconnect(0x81)


def test_split_helper_rejects_wrong_remaining_length() -> None:
    """The helper used by every golden test really checks the hand-counted remaining length."""
    with pytest.raises(AssertionError):
        split(b"\x30\x09\x00\x03a/b\x00hi")
