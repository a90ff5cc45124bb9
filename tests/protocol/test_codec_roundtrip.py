"""Round trips: encode then decode gives the packet back, and decode then encode gives the bytes
back, for every packet type at both protocol levels. A table of hand-picked packets first, then
hypothesis over everything protocol_strategies can generate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_helpers import HOT, split
from protocol_strategies import any_packet, hot_packet
from support.codec import decode_hot, decode_packet, encode_hot, encode_packet

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5
from mqttbroker.protocol.properties import PropertyId as P

V4, V5 = MQTT_3_1_1, MQTT_5
SR = pk.SubscriptionRequest

CASES: list[tuple[pk.Packet, int]] = [
    (pk.Connect(), V5),
    (pk.Connect(protocol_level=4), V4),
    (pk.Connect(protocol_level=3, protocol_name="MQIsdp", client_id="a" * 23), V4),
    (
        pk.Connect(
            "ç",
            username="",
            password=b"",
            will=pk.Will("", b"", 0, False, {P.USER_PROPERTY: [("", "")]}),
            properties={P.AUTHENTICATION_METHOD: "m", P.AUTHENTICATION_DATA: b"\x00"},
        ),
        V5,
    ),
    (
        pk.Connect("x", protocol_level=4, username="u", will=pk.Will("t", b"\x00" * 300, 2, True)),
        V4,
    ),
    (pk.Connack(True, 0, {P.USER_PROPERTY: [("a", "1"), ("a", "1")]}), V5),
    (pk.Connack(False, 0x9F), V5),
    (pk.Connack(False, 3), V4),
    (pk.Publish("", b""), V5),
    (pk.Publish("a" * 65535, b"p"), V5),
    (pk.Publish("t", b"\x00" * 70000, 1, packet_id=65535), V4),
    (pk.Publish("t", b"", 2, True, True, 1, {P.SUBSCRIPTION_IDENTIFIER: [268_435_455]}), V5),
    (pk.Puback(0), V5),
    (pk.Pubrec(65535, 0x99), V5),
    (pk.Pubrel(1, 0, {P.REASON_STRING: "r" * 1000}), V5),
    (pk.Pubcomp(1), V4),
    (pk.Subscribe(1, [SR("#", 2, True, True, 2)] * 3), V5),
    (pk.Subscribe(65535, [SR("$SYS/#", 1)]), V4),
    (pk.Suback(1, [0x00] * 200), V5),
    (pk.Suback(1, [0x80]), V4),
    (pk.Unsubscribe(1, ["a", "b", "c"]), V5),
    (pk.Unsubscribe(1, [""]), V4),
    (pk.Unsuback(2, [0x8F], {P.USER_PROPERTY: [("k", "v")]}), V5),
    (pk.Unsuback(2), V4),
    (pk.Pingreq(), V4),
    (pk.Pingresp(), V5),
    (pk.Disconnect(0x98, {P.SERVER_REFERENCE: "other"}), V5),
    (pk.Disconnect(), V4),
    (pk.Auth(0x19, {P.REASON_STRING: "again"}), V5),
]


def round_trip(packet: pk.Packet, version: int) -> None:
    data = grammar.encode(packet, version)
    ptype, flags, body = split(data)
    assert ptype == packet.packet_type
    decoded = grammar.decode(ptype, flags, body, version)
    assert decoded == packet
    assert grammar.encode(decoded, version) == data
    assert encode_packet(packet, version) == data
    assert decode_packet(data[0], body, version) == packet
    if ptype in HOT:
        assert encode_hot(packet, version) == data
        start = len(data) - len(body)
        assert decode_hot(ptype, flags, data, start, len(data), version) == packet


@pytest.mark.parametrize(
    ("packet", "version"),
    CASES,
    ids=[f"{type(p).__name__}-v{v}-{i}" for i, (p, v) in enumerate(CASES)],
)
def test_round_trip_cases(packet: pk.Packet, version: int) -> None:
    round_trip(packet, version)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_round_trip_any_packet_v5(data: st.DataObject) -> None:
    """Every MQTT 5 packet type, with any properties the spec allows in it."""
    round_trip(data.draw(any_packet(V5)), V5)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_round_trip_any_packet_v311(data: st.DataObject) -> None:
    """Every MQTT 3.1.1 packet type (and 3.1 CONNECT)."""
    round_trip(data.draw(any_packet(V4)), V4)


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([V4, V5]))
def test_several_packets_in_one_buffer(data: st.DataObject, version: int) -> None:
    """Packets back to back in one buffer split on their Remaining Lengths and decode in order;
    the fast path decodes the hot ones in place."""
    packets = data.draw(st.lists(any_packet(version), min_size=1, max_size=5))
    buffer = b"".join(grammar.encode(p, version) for p in packets)
    pos = 0
    for packet in packets:
        header = fastpath.read_fixed_header(buffer, pos, len(buffer))
        assert header is not None
        length, start = header
        end = start + length
        ptype, flags = buffer[pos] >> 4, buffer[pos] & 15
        assert grammar.decode(ptype, flags, buffer[start:end], version) == packet
        if ptype in HOT:
            assert decode_hot(ptype, flags, buffer, start, end, version) == packet
        pos = end
    assert pos == len(buffer)
    # A cut anywhere inside the first fixed header asks for more bytes.
    assert fastpath.read_fixed_header(buffer, 0, 1) is None


@settings(max_examples=80, deadline=None)
@given(st.data(), st.sampled_from([V4, V5]))
def test_hot_packet_round_trip_through_fast_path_only(data: st.DataObject, version: int) -> None:
    packet = data.draw(hot_packet(version))
    encoded = encode_hot(packet, version)
    header = fastpath.read_fixed_header(encoded, 0, len(encoded))
    assert header is not None
    length, start = header
    assert start + length == len(encoded)
    decoded = decode_hot(encoded[0] >> 4, encoded[0] & 15, encoded, start, len(encoded), version)
    assert decoded == packet
