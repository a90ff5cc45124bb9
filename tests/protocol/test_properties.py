"""protocol/properties.py: the properties of MQTT 5 packets and their limits.

Properties (section 2.2.2): which packet may carry which property, repetition, unknown
identifiers, value rules and order. Bodies are built by hand around a property block; the table
of allowed properties is the spec's (support.strategies.ALLOWED), not the codec's.

The User Property limit (max_user_properties, 64 by default): more in one packet is refused
(LimitExceeded: 0x83 Implementation specific error), by every decoder, with a message naming the
limit; a repeated property that may not repeat is a Protocol Error however many there are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.clients import vbi
from support.codec import assert_rejects, decode_all, props, s
from support.strategies import (
    ALLOWED,
    BINARY_PROPS,
    BYTE_PROPS,
    FOUR_BYTE_PROPS,
    TWO_BYTE_PROPS,
    UTF8_PROPS,
)

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import LimitExceeded, MalformedPacket, ProtocolError
from mqttbroker.protocol.packets import MQTT_5, PacketType
from mqttbroker.protocol.properties import SPEC, WILL, PropertyId, limit_user_properties

T = PacketType
P = PropertyId
V5 = MQTT_5

# Packet (or WILL) -> (packet type, flags, body builder around a Property Length + properties).
TEMPLATES: dict[int, tuple[int, int, Any]] = {
    T.CONNECT: (1, 0, lambda p: b"\x00\x04MQTT\x05\x02\x00\x00" + p + s("")),
    WILL: (1, 0, lambda p: b"\x00\x04MQTT\x05\x06\x00\x00\x00" + s("") + p + s("t") + s(b"")),
    T.CONNACK: (2, 0, lambda p: b"\x00\x00" + p),
    T.PUBLISH: (3, 0, lambda p: s("t") + p + b"payload"),
    T.PUBACK: (4, 0, lambda p: b"\x00\x01\x00" + p),
    T.PUBREC: (5, 0, lambda p: b"\x00\x01\x00" + p),
    T.PUBREL: (6, 2, lambda p: b"\x00\x01\x00" + p),
    T.PUBCOMP: (7, 0, lambda p: b"\x00\x01\x00" + p),
    T.SUBSCRIBE: (8, 2, lambda p: b"\x00\x01" + p + s("t") + b"\x00"),
    T.SUBACK: (9, 0, lambda p: b"\x00\x01" + p + b"\x00"),
    T.UNSUBSCRIBE: (10, 2, lambda p: b"\x00\x01" + p + s("t")),
    T.UNSUBACK: (11, 0, lambda p: b"\x00\x01" + p + b"\x00"),
    T.DISCONNECT: (14, 0, lambda p: b"\x00" + p),
    T.AUTH: (15, 0, lambda p: b"\x00" + p),
}
NAMES = {WILL: "WILL", **{t: T(t).name for t in TEMPLATES if t != WILL}}


def sample(pid: int) -> tuple[bytes, Any]:
    """Wire bytes of a valid value of property ``pid`` (identifier excluded), and that value."""
    if pid in BYTE_PROPS:
        return b"\x01", 1
    if pid in TWO_BYTE_PROPS:
        return b"\x01\x02", 0x0102
    if pid in FOUR_BYTE_PROPS:
        return b"\x01\x02\x03\x04", 0x01020304
    if pid == P.SUBSCRIPTION_IDENTIFIER:
        return b"\x81\x01", 129
    if pid in UTF8_PROPS:
        return s("vé"), "vé"
    if pid in BINARY_PROPS:
        return s(b"\x00\xff"), b"\x00\xff"
    assert pid == P.USER_PROPERTY
    return s("k") + s("v"), ("k", "v")


def body_with(container: int, raw_props: bytes) -> tuple[int, int, bytes]:
    ptype, flags, build = TEMPLATES[container]
    return ptype, flags, build(props(raw_props))


def properties_of(packet: pk.Packet, container: int) -> dict[int, Any]:
    if container == WILL:
        assert isinstance(packet, pk.Connect) and packet.will is not None
        return packet.will.properties
    return packet.properties  # type: ignore[union-attr, no-any-return]


def repeats(pid: int, container: int) -> bool:
    """User Property may repeat anywhere; Subscription Identifier only in PUBLISH (3.3.2.3.8)."""
    return pid == P.USER_PROPERTY or (pid == P.SUBSCRIPTION_IDENTIFIER and container == T.PUBLISH)


ALLOWED_CASES = [(c, int(pid)) for c in TEMPLATES for pid in sorted(ALLOWED[c])]
FORBIDDEN_CASES = [(c, int(pid)) for c in TEMPLATES for pid in P if pid not in ALLOWED[c]]


def _ids(cases: list[tuple[int, int]]) -> list[str]:
    return [f"{NAMES[c]}-{P(pid).name}" for c, pid in cases]


@pytest.mark.parametrize(("container", "pid"), ALLOWED_CASES, ids=_ids(ALLOWED_CASES))
def test_allowed_property_decodes(container: int, pid: int) -> None:
    """Every property the spec allows in a packet decodes there, with its value."""
    raw, value = sample(pid)
    packet = decode_all(*body_with(container, vbi(pid) + raw), V5)
    expected = [value] if repeats(pid, container) else value
    assert properties_of(packet, container) == {pid: expected}


@pytest.mark.parametrize(("container", "pid"), FORBIDDEN_CASES, ids=_ids(FORBIDDEN_CASES))
def test_property_not_allowed_in_packet(container: int, pid: int) -> None:
    """A property the spec does not list for a packet is a Protocol Error (2.2.2.2)."""
    raw, _ = sample(pid)
    assert_rejects(ProtocolError, 0x82, *body_with(container, vbi(pid) + raw), V5)


@pytest.mark.parametrize(("container", "pid"), ALLOWED_CASES, ids=_ids(ALLOWED_CASES))
def test_a_property_twice_is_a_protocol_error_unless_repeatable(container: int, pid: int) -> None:
    """Including a property more than once is a Protocol Error, except User Property (anywhere)
    and Subscription Identifier (in PUBLISH), whose occurrences are all kept in order."""
    raw, value = sample(pid)
    value2: Any
    if pid == P.USER_PROPERTY:
        raw2, value2 = s("k") + s("w"), ("k", "w")
    elif pid == P.SUBSCRIPTION_IDENTIFIER:
        raw2, value2 = b"\x05", 5
    else:
        raw2, value2 = raw, value
    block = vbi(pid) + raw + vbi(pid) + raw2
    if repeats(pid, container):
        packet = decode_all(*body_with(container, block), V5)
        assert properties_of(packet, container) == {pid: [value, value2]}
    else:
        assert_rejects(ProtocolError, 0x82, *body_with(container, block), V5)


def test_subscription_identifier_twice_in_subscribe() -> None:
    """3.8.2.1.2: more than one Subscription Identifier in SUBSCRIBE is a Protocol Error."""
    block = b"\x0b\x01\x0b\x02"
    assert_rejects(ProtocolError, 0x82, *body_with(T.SUBSCRIBE, block), V5)


def test_user_property_order_kept() -> None:
    """[MQTT-3.3.2-17] [MQTT-3.3.2-18] User Properties keep their order, duplicates included,
    even when other properties come between them."""
    block = b"".join(
        [
            b"\x26" + s("b") + s("1"),
            b"\x03" + s("ct"),
            b"\x26" + s("a") + s("2"),
            b"\x26" + s("b") + s("1"),
            b"\x26" + s("") + s(""),
        ]
    )
    packet = decode_all(*body_with(T.PUBLISH, block), V5)
    assert properties_of(packet, T.PUBLISH) == {
        P.USER_PROPERTY: [("b", "1"), ("a", "2"), ("b", "1"), ("", "")],
        P.CONTENT_TYPE: "ct",
    }


def test_will_user_property_order_kept() -> None:
    """[MQTT-3.1.3-10] Will User Properties keep their order."""
    block = b"\x26" + s("z") + s("1") + b"\x26" + s("a") + s("2")
    packet = decode_all(*body_with(WILL, block), V5)
    assert properties_of(packet, WILL) == {P.USER_PROPERTY: [("z", "1"), ("a", "2")]}


def test_several_subscription_identifiers_in_publish_keep_order() -> None:
    """[MQTT-3.3.4-4] A PUBLISH may carry several Subscription Identifiers."""
    block = b"\x0b\x7f\x0b\x01\x0b\xff\xff\xff\x7f"
    packet = decode_all(*body_with(T.PUBLISH, block), V5)
    assert properties_of(packet, T.PUBLISH) == {P.SUBSCRIPTION_IDENTIFIER: [127, 1, 268_435_455]}


KNOWN = {int(p) for p in P}
UNKNOWN_IDS = [i for i in range(0x80) if i not in KNOWN]


@pytest.mark.parametrize("pid", UNKNOWN_IDS, ids=[f"0x{i:02X}" for i in UNKNOWN_IDS])
def test_unknown_property_identifier(pid: int) -> None:
    """An identifier not in table 2.2.2.2 cannot be parsed: Malformed Packet (0x81)."""
    block = bytes([pid]) + b"\x00\x00\x00\x00"
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBLISH, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBACK, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.CONNECT, block), V5)


def test_unknown_two_byte_property_identifier() -> None:
    """Identifiers are Variable Byte Integers: 0x80 0x01 is identifier 128, unknown."""
    block = b"\x80\x01\x00"
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBLISH, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.DISCONNECT, block), V5)


def test_non_minimal_property_identifier() -> None:
    """[MQTT-1.5.5-1] The identifier 0x01 written as 0x81 0x00 is not the shortest VBI."""
    block = b"\x81\x00\x01"
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBLISH, block), V5)


def test_non_minimal_subscription_identifier_value() -> None:
    """[MQTT-1.5.5-1] A Subscription Identifier of 1 written as 0x81 0x00."""
    block = b"\x0b\x81\x00"
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBLISH, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.SUBSCRIBE, block), V5)


VALUE_RULES = [
    # (container, property bytes, spec section stating the Protocol Error)
    (T.PUBLISH, b"\x01\x02", "3.3.2.3.2 Payload Format Indicator 2"),
    (WILL, b"\x01\xff", "3.1.3.2.3 Will Payload Format Indicator 255"),
    (T.PUBLISH, b"\x0b\x00", "3.3.2.3.8 Subscription Identifier 0"),
    (T.SUBSCRIBE, b"\x0b\x00", "3.8.2.1.2 Subscription Identifier 0"),
    (T.CONNECT, b"\x21\x00\x00", "3.1.2.11.3 Receive Maximum 0"),
    (T.CONNACK, b"\x21\x00\x00", "3.2.2.3.3 Receive Maximum 0"),
    (T.CONNECT, b"\x27\x00\x00\x00\x00", "3.1.2.11.4 Maximum Packet Size 0"),
    (T.CONNACK, b"\x27\x00\x00\x00\x00", "3.2.2.3.6 Maximum Packet Size 0"),
    (T.CONNECT, b"\x17\x02", "3.1.2.11.7 Request Problem Information 2"),
    (T.CONNECT, b"\x19\x02", "3.1.2.11.6 Request Response Information 2"),
    (T.CONNACK, b"\x24\x02", "3.2.2.3.4 Maximum QoS 2"),
    (T.CONNACK, b"\x25\x02", "3.2.2.3.5 Retain Available 2"),
    (T.CONNACK, b"\x28\x02", "3.2.2.3.11 Wildcard Subscription Available 2"),
    (T.CONNACK, b"\x29\x02", "3.2.2.3.12 Subscription Identifiers Available 2"),
    (T.CONNACK, b"\x2a\x02", "3.2.2.3.13 Shared Subscription Available 2"),
]


@pytest.mark.parametrize(
    ("container", "block"), [c[:2] for c in VALUE_RULES], ids=[c[2] for c in VALUE_RULES]
)
def test_property_value_rules(container: int, block: bytes) -> None:
    """Values the spec calls a Protocol Error (0x82)."""
    assert_rejects(ProtocolError, 0x82, *body_with(container, block), V5)


@pytest.mark.parametrize(
    "block",
    [
        b"\x26" + s(b"\xff") + s("v"),
        b"\x26" + s("k") + s(b"\xed\xa0\x80"),
        b"\x26" + s("k\x00") + s("v"),
        b"\x26" + s("k") + s("\x00"),
    ],
    ids=["name-invalid", "value-surrogate", "name-nul", "value-nul"],
)
def test_user_property_pair_strings(block: bytes) -> None:
    """[MQTT-1.5.7-1] Both strings of a UTF-8 String Pair obey the UTF-8 string rules."""
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBLISH, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.PUBACK, block), V5)
    assert_rejects(MalformedPacket, 0x81, *body_with(T.CONNECT, block), V5)


def test_empty_property_block_is_no_properties() -> None:
    """[MQTT-2.2.2-1] Property Length 0 means no properties."""
    for container in TEMPLATES:
        packet = decode_all(*body_with(container, b""), V5)
        assert properties_of(packet, container) == {}


PUBLISH_QOS1 = (PacketType.PUBLISH << 4) | 2


@pytest.fixture(autouse=True)
def limit() -> Iterator[None]:
    limit_user_properties(4)
    yield
    limit_user_properties(64)


def field(text: str) -> bytes:
    return len(text).to_bytes(2, "big") + text.encode()


def publish_body(props: bytes) -> bytes:
    return field("t") + b"\x00\x01" + vbi(len(props)) + props + b"payload"


def users(count: int) -> bytes:
    return b"".join(b"\x26" + field("k") + field("v") for _ in range(count))


def decoders(body: bytes) -> list[object]:
    """Decode ``body`` (a QoS 1 PUBLISH) with the fast path and with the grammar."""
    results: list[object] = []
    for decode in (
        lambda: fastpath.decode_packet(PUBLISH_QOS1, body, 0, len(body), MQTT_5),
        lambda: grammar.decode(PacketType.PUBLISH, 2, body, MQTT_5),
    ):
        try:
            results.append(decode())
        except (LimitExceeded, ProtocolError) as exc:
            results.append(exc)
    return results


def test_at_the_limit_decodes() -> None:
    for result in decoders(publish_body(users(4))):
        assert not isinstance(result, Exception), result


@pytest.mark.parametrize("count", [5, 4 + len(SPEC) + 1])  # past the limit; past the cap too
def test_past_the_limit_is_refused(count: int) -> None:
    for result in decoders(publish_body(users(count))):
        assert isinstance(result, LimitExceeded), result
        assert result.message == "more than 4 User Properties"


def test_repeated_property_past_the_cap_is_a_protocol_error() -> None:
    props = b"\x01\x00" * (4 + len(SPEC) + 1)  # Payload Format Indicator, over and over
    for result in decoders(publish_body(props)):
        assert isinstance(result, ProtocolError), result


def test_exactly_the_cap_decodes() -> None:
    """The cap counts every property: as many as it allows (the User Properties of the limit and
    the rest repeated Subscription Identifiers, which may repeat in a PUBLISH) still decode."""
    from mqttbroker.protocol.properties import properties_cap

    props = users(4) + b"\x0b\x01" * (properties_cap() - 4)
    for result in decoders(publish_body(props)):
        assert not isinstance(result, Exception), result


def test_reading_stops_past_the_cap() -> None:
    """Past the cap the decoders stop reading (a flood of properties costs nothing more): what
    follows, here a repeated Payload Format Indicator, is not looked at."""
    from mqttbroker.protocol.properties import properties_cap

    props = users(4) + b"\x0b\x01" * (properties_cap() - 3) + b"\x01\x00\x01\x00"
    for result in decoders(publish_body(props)):
        assert isinstance(result, LimitExceeded), result
        assert result.message == "more than 4 User Properties"


def test_max_user_properties_0_sets_no_limit() -> None:
    """max_user_properties 0: no limit, and no cap on reading."""
    limit_user_properties(0)
    for result in decoders(publish_body(users(200))):
        assert not isinstance(result, Exception), result
