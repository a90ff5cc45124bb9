"""The hand-written CONNECT, SUBSCRIBE and UNSUBSCRIBE decoders and CONNACK/SUBACK/UNSUBACK
encoders in fastpath.py (used when thousands of clients connect and subscribe at once) agree
with the construct grammar: same packets from the same bytes, same bytes from the same packets,
and on arbitrary or mutated bytes both decoders succeed alike or both raise an MQTTError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import connacks, connects, subacks, subscribes, unsubacks, unsubscribes
from support.codec import decode_packet, encode_packet

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5

versions = st.sampled_from([MQTT_3_1_1, MQTT_5])


def split(data: bytes) -> tuple[int, int]:
    header = fastpath.read_fixed_header(data, 0, len(data))
    assert header is not None
    length, start = header
    assert start + length == len(data)
    return data[0], start


@settings(max_examples=300, deadline=None)
@given(st.data(), versions)
def test_connect_decoders_agree(data: st.DataObject, version: int) -> None:
    packet = data.draw(connects(version))
    raw = grammar.encode(packet, version)
    first, start = split(raw)
    assert fastpath.decode_connect(first & 15, raw, start, len(raw)) == packet
    assert decode_packet(first, raw[start:], version) == packet


@settings(max_examples=300, deadline=None)
@given(st.data(), versions, st.sampled_from(["subscribe", "unsubscribe"]))
def test_subscribe_and_unsubscribe_decoders_agree(
    data: st.DataObject, version: int, kind: str
) -> None:
    strategy, decode = {
        "subscribe": (subscribes, fastpath.decode_subscribe),
        "unsubscribe": (unsubscribes, fastpath.decode_unsubscribe),
    }[kind]
    packet = data.draw(strategy(version))
    raw = grammar.encode(packet, version)
    first, start = split(raw)
    assert decode(first & 15, raw, start, len(raw), version) == packet
    assert decode_packet(first, raw[start:], version) == packet


@settings(max_examples=300, deadline=None)
@given(st.data(), versions, st.sampled_from(["connack", "suback", "unsuback"]))
def test_ack_encoders_agree(data: st.DataObject, version: int, kind: str) -> None:
    strategy = {"connack": connacks, "suback": subacks, "unsuback": unsubacks}[kind]
    packet = data.draw(strategy(version))
    expected = grammar.encode(packet, version)
    if isinstance(packet, pk.Connack):
        assert fastpath.encode_connack(packet, version) == expected
    else:
        assert fastpath.encode_suback(packet, version) == expected
    assert encode_packet(packet, version) == expected


def outcome(decode: object) -> object:
    try:
        return decode()  # type: ignore[operator]
    except MQTTError:
        return MQTTError


@settings(max_examples=400, deadline=None)
@given(st.data(), versions, st.sampled_from([1, 8, 10]))
def test_decoders_agree_on_damaged_bytes(data: st.DataObject, version: int, ptype: int) -> None:
    """Valid packets with bytes flipped, cut or appended, and plain random bodies."""
    if data.draw(st.booleans()):
        strategy = {1: connects, 8: subscribes, 10: unsubscribes}[ptype]
        packet = data.draw(strategy(version))
        raw = bytearray(grammar.encode(packet, version))
        _, start = split(bytes(raw))
        body = raw[start:]
        for _ in range(data.draw(st.integers(1, 3))):
            if body:
                body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            body = body[: data.draw(st.integers(0, len(body)))]
        body = bytes(body)
    else:
        body = data.draw(st.binary(max_size=48))
    flags = 0 if ptype == 1 else 2
    slow = outcome(lambda: grammar.decode(ptype, flags, body, version))
    if ptype == 1:
        fast = outcome(lambda: fastpath.decode_connect(flags, body, 0, len(body)))
    elif ptype == 8:
        fast = outcome(lambda: fastpath.decode_subscribe(flags, body, 0, len(body), version))
    else:
        fast = outcome(lambda: fastpath.decode_unsubscribe(flags, body, 0, len(body), version))
    assert fast == slow
