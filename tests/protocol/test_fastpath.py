"""protocol/fastpath.py, the hand-written codec of the packets a busy broker handles most.

The hand-written fast path (fastpath.py) agrees with the construct grammar (grammar.py) on the
hot packets, in both directions:

* for valid PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP, DISCONNECT and AUTH at both levels, the two
  encoders give the same bytes (DISCONNECT and AUTH have one encoder, the grammar's), and each
  decoder reads the other's bytes back to the same packet;
* for arbitrary and mutated bytes, the two decoders either both succeed with equal packets or both
  raise an MQTTError. Where they raise different error classes (e.g. MalformedPacket from one,
  ProtocolError from the other, because they check rules in a different order) the test still
  passes, but records a hypothesis event "error class differs: ..." (see
  ``pytest --hypothesis-show-statistics``) so that the disagreement is visible, not hidden.

The hand-written CONNECT, SUBSCRIBE and UNSUBSCRIBE decoders and CONNACK/SUBACK/UNSUBACK
encoders in fastpath.py (used when thousands of clients connect and subscribe at once) agree
with the construct grammar: same packets from the same bytes, same bytes from the same packets,
and on arbitrary or mutated bytes both decoders succeed alike or both raise an MQTTError.

The reason each Malformed Packet is refused with, as the fast path gives it (the client reads
it in the DISCONNECT's Reason String, the operator in the log): one case per check.

SUBSCRIBE and UNSUBSCRIBE with more topic filters than the broker allows per packet are
refused whole (0x97) from a walk over the filters' lengths, before decoding them; exactly the
limit passes. Filters of 256 bytes and more check that the walk reads both length bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st
from support.codec import decode_hot, decode_packet, encode_hot, encode_packet
from support.strategies import (
    ACK_CLASSES,
    acks,
    auths,
    connacks,
    connects,
    disconnects,
    hot_packet,
    publishes,
    subacks,
    subscribes,
    unsubacks,
    unsubscribes,
)

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import LimitExceeded, MalformedPacket, MQTTError, ProtocolError
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5, PacketType
from mqttbroker.protocol.reasons import ReasonCode

V4, V5 = MQTT_3_1_1, MQTT_5
versions = st.sampled_from([V4, V5])
HOT_TYPES = [3, 4, 5, 6, 7, 12, 13, 14, 15]


def body_of(data: bytes) -> tuple[int, int, int]:
    """(packet type, flags, body start) of one whole packet."""
    header = fastpath.read_fixed_header(data, 0, len(data))
    assert header is not None
    length, start = header
    assert start + length == len(data)
    return data[0] >> 4, data[0] & 15, start


def as_311(packet: pk.Packet) -> pk.Packet:
    """What a packet becomes through MQTT 3.1.1, which has no properties or ack reason codes."""
    if isinstance(packet, pk.Publish):
        return dataclasses.replace(packet, properties={})
    if isinstance(packet, pk.Ack):
        return type(packet)(packet.packet_id)
    return packet


def check_agree(packet: pk.Packet, version: int) -> None:
    fast = encode_hot(packet, version)
    slow = grammar.encode(packet, version)
    assert fast == slow
    ptype, flags, start = body_of(slow)
    expected = packet if version == V5 else as_311(packet)
    # fast path reads grammar's bytes, grammar reads the fast path's bytes
    assert decode_hot(ptype, flags, slow, start, len(slow), version) == expected
    assert grammar.decode(ptype, flags, fast[start:], version) == expected
    # and the body inside a larger buffer
    padded = b"\x01\x02" + fast + b"\xff\xff"
    assert decode_hot(ptype, flags, padded, start + 2, len(fast) + 2, version) == expected


@settings(max_examples=200, deadline=None)
@given(st.data(), versions)
def test_publish_agrees(data: st.DataObject, version: int) -> None:
    """Valid PUBLISH, QoS 0-2, unicode topics, any payload, any PUBLISH properties (several
    Subscription Identifiers and User Properties included)."""
    check_agree(data.draw(publishes(version)), version)


@settings(max_examples=150, deadline=None)
@given(st.data(), versions, st.sampled_from(ACK_CLASSES))
def test_acks_agree(data: st.DataObject, version: int, cls: type[pk.Ack]) -> None:
    """PUBACK/PUBREC (PUBACK_CODES), PUBREL/PUBCOMP (PUBREL_CODES), with or without a reason
    string and user properties."""
    check_agree(data.draw(acks(version, cls)), version)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_v5_packets_encoded_for_311_agree(data: st.DataObject) -> None:
    """MQTT 5 content encoded at 3.1.1: both encoders drop properties and reason codes alike."""
    check_agree(data.draw(st.one_of(publishes(V5), acks(V5))), V4)


def test_pings_agree() -> None:
    for version in (V4, V5):
        for packet in (pk.Pingreq(), pk.Pingresp()):
            check_agree(packet, version)


@settings(max_examples=100, deadline=None)
@given(st.data(), versions)
def test_disconnect_and_auth_agree(data: st.DataObject, version: int) -> None:
    """DISCONNECT (empty in 3.1.1; in MQTT 5 any reason code, with or without properties) and
    AUTH (MQTT 5 only)."""
    options = [disconnects(version)] + ([auths()] if version == V5 else [])
    check_agree(data.draw(st.one_of(options)), version)


# ---------------------------------------------------------------------------------------------
# Arbitrary bytes: both decoders accept with equal results, or both reject


def run(decode: Any) -> tuple[str, Any]:
    try:
        return "ok", decode()
    except MQTTError as exc:
        return "error", exc


def compare_decoders(ptype: int, flags: int, body: bytes, version: int) -> None:
    note(f"type={ptype} flags={flags:04b} version={version} body={body!r}")
    padded = b"\x00\x80" + body + b"\xff\x7f"
    slow = run(lambda: grammar.decode(ptype, flags, body, version))
    fast = run(lambda: decode_hot(ptype, flags, padded, 2, 2 + len(body), version))
    if slow[0] == "ok" or fast[0] == "ok":
        assert slow == fast, f"grammar {slow!r} vs fastpath {fast!r}"
        event(f"both decode {PacketType(ptype).name}")
        return
    slow_cls, fast_cls = type(slow[1]).__name__, type(fast[1]).__name__
    if slow_cls != fast_cls:
        event(f"error class differs: grammar {slow_cls}, fastpath {fast_cls}")
    else:
        event(f"both raise {slow_cls}")


@st.composite
def random_bodies(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """A hot packet type, usually with flags it may carry, and any bytes as its body."""
    ptype = draw(st.sampled_from(HOT_TYPES))
    if ptype == PacketType.PUBLISH:
        flags = draw(st.integers(0, 15))
    elif draw(st.integers(0, 9)):
        flags = 2 if ptype == PacketType.PUBREL else 0
    else:
        flags = draw(st.integers(0, 15))
    return ptype, flags, draw(st.binary(max_size=40)), draw(versions)


@settings(max_examples=400, deadline=None)
@given(random_bodies())
def test_random_bodies(case: tuple[int, int, bytes, int]) -> None:
    compare_decoders(*case)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """A valid hot packet's body with a few random edits (and sometimes other flags)."""
    version = draw(versions)
    packet = draw(hot_packet(version))
    data = grammar.encode(packet, version)
    ptype, flags, start = body_of(data)
    body = bytearray(data[start:])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "truncate", "append", "flags"]))
        if kind == "flags":
            flags = draw(st.integers(0, 15))
        elif kind == "append":
            body += draw(st.binary(min_size=1, max_size=4))
        elif kind == "insert":
            body.insert(draw(st.integers(0, len(body))), draw(st.integers(0, 255)))
        elif body and kind == "set":
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        elif body and kind == "delete":
            del body[draw(st.integers(0, len(body) - 1))]
        elif body:
            del body[draw(st.integers(0, len(body) - 1)) :]
    return ptype, flags, bytes(body), version


# Found with a long run (30,000 examples) of the strategy above: a v5 ack whose property block
# holds a property not allowed in it, followed by stray bytes. grammar reports MalformedPacket
# (the trailing bytes, seen while parsing); fastpath reports ProtocolError (decode_ack runs the
# property checks of collect() before its trailing-bytes check). Both are MQTTErrors, so this
# test passes on them; kept as explicit examples so the case is always exercised.
@example((7, 0, b"\x00\x01\x00\x03\x21\x00\x01" + b"\xff", 5))
@example((4, 0, b"\x00\x01\x00\x03\x23\x00\x05" + b"\xff", 5))
@settings(max_examples=300, deadline=None)
@given(mutated())
def test_mutated_bodies(case: tuple[int, int, bytes, int]) -> None:
    compare_decoders(*case)


# ---------------------------------------------------------------------------------------------
# scan_publish: the connection's PUBLISH slicer, against the full decoder


def check_scan(first: int, data: bytes, body: int, stop: int, version: int) -> None:
    """scan_publish slices what decode_publish decodes, or defers to it (properties), or
    raises where it raises; it leaves only the topic's UTF-8 check to the router."""
    note(f"first=0x{first:02X} version={version} body={data[body:stop]!r}")
    full = run(lambda: fastpath.decode_publish(first & 15, data, body, stop, version))
    scan = run(lambda: fastpath.scan_publish(first, data, body, stop, version))
    if scan[0] == "error":
        assert full[0] == "error", f"scan raised {scan[1]!r}, decode gave {full[1]!r}"
        return
    topic_end, start, packet_id = scan[1]
    if full[0] == "error":
        if start == -1:  # deferred to the full decoder (it has properties), which refuses it
            assert version == V5, full
            return
        # else only a topic that is not well-formed gets past the scan
        assert "string" in full[1].message, full
        topic = data[body + 2 : topic_end]
        assert b"\x00" in topic or topic != topic.decode("utf-8", "ignore").encode(), full
        return
    packet = full[1]
    if start == -1:
        assert version == V5 and packet.properties
        return
    assert not packet.properties
    assert data[body + 2 : topic_end].decode() == packet.topic
    assert data[start:stop] == packet.payload
    assert packet_id == (packet.packet_id or 0)


@settings(max_examples=200, deadline=None)
@given(st.data(), versions)
def test_scan_publish_agrees_on_valid_packets(data: st.DataObject, version: int) -> None:
    raw = grammar.encode(data.draw(publishes(version)), version)
    _, _, start = body_of(raw)
    padded = b"\x01" + raw + b"\xff"
    check_scan(raw[0], padded, start + 1, len(raw) + 1, version)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 15), st.binary(max_size=40), versions)
@example(0x30, b"\x00\x01a\x00", V5)
@example(0x32, b"\x00\x01a\x00\x00\x00", V5)
@example(0x3E, b"\x00\x01a\x00\x01", V4)
@example(0x30, b"\x00\x02\xff\xfe", V4)
@example(0x30, b"\x00\x01\x00", V4)
@example(0x30, b"\x00\x00\x01", V5)  # properties that run past the end: deferred, refused
def test_scan_publish_agrees_on_any_bytes(flags: int, body: bytes, version: int) -> None:
    padded = b"\x00" + body + b"\x00"
    check_scan(0x30 | flags, padded, 1, 1 + len(body), version)


def test_connect_version_is_read_from_the_protocol_level() -> None:
    connect = grammar.encode(pk.Connect(client_id="v", protocol_level=V4), V4)
    _, _, start = body_of(connect)
    assert fastpath.connect_version(connect[start:]) == V4
    assert fastpath.connect_version(b"\x00\x04MQTT\x09rest") == V5
    assert fastpath.connect_version(b"\x00\x06MQIsdp\x03") == pk.MQTT_3_1
    assert fastpath.connect_version(b"\x00\x04MQTT\x00") == 0
    assert fastpath.connect_version(b"\x00\x04MQTT") == -1
    assert fastpath.connect_version(b"GET / HTTP/1.1") == -1


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


def s(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "big") + raw


MQTT = s(b"MQTT")
CASES = [
    (0x30, s(b"t") + b"\x80", "truncated Variable Byte Integer"),
    (0x30, s(b"t") + b"\x80\x00", "Variable Byte Integer is not minimally encoded"),
    (0x30, s(b"t") + b"\xff\xff\xff\xff\x01", "Variable Byte Integer is longer than 4 bytes"),
    (0x82, b"\x00\x01\x00\x00", "truncated string length"),
    (0x82, b"\x00\x01\x00\x00\x05ab", "string runs past the end of the packet"),
    (0x82, b"\x00\x01\x00" + s(b"a\x00") + b"\x00", "string contains U+0000"),
    (0x82, b"\x00", "truncated packet identifier"),
    (0x82, b"\x00\x01\x00" + s(b"a"), "topic filter without subscription options"),
    (
        0x80,
        b"\x00\x01\x00" + s(b"a") + b"\x00",
        "reserved fixed-header flags of packet type 8 are wrong",
    ),
    (0x82, b"\x00\x01\x05\x0b", "properties run past the end of the packet"),
    (0x36, s(b"t") + b"\x00\x01\x00", "PUBLISH with QoS 3"),
    (0x38, s(b"t") + b"\x00", "QoS 0 PUBLISH with DUP set"),
    (0x32, s(b"t") + b"\x00", "truncated packet identifier"),
    (0x30, s(b"t"), "missing property length"),
    (0x40, b"\x00", "acknowledgement shorter than 2 bytes"),
    (0x40, b"\x00\x01\x00\x05", "property length does not match the packet's length"),
    (0xC0, b"\x00", "PINGREQ/PINGRESP with flags or a body"),
    (0x00, b"", "reserved packet type 0"),
    (0x11, b"", "reserved fixed-header flags of packet type 1 are wrong"),
    (0x10, MQTT, "truncated CONNECT variable header"),
    (0x10, MQTT + b"\x05\x03\x00\x3c\x00" + s(b"c"), "CONNECT reserved flag is not 0"),
    (0x10, MQTT + b"\x05\x08\x00\x3c\x00" + s(b"c"), "Will QoS/Retain set without the Will Flag"),
    (0x10, MQTT + b"\x05\x1c\x00\x3c\x00" + s(b"c") + b"\x00" + s(b"w") + s(b"x"), "Will QoS 3"),
    (
        0x10,
        MQTT + b"\x05\x00\x00\x3c\x00" + s(b"c") + b"x",
        "bytes after the end of the CONNECT payload",
    ),
]


@pytest.mark.parametrize(("first", "body", "reason"), CASES, ids=[c[2] for c in CASES])
def test_malformed_reason(first: int, body: bytes, reason: str) -> None:
    with pytest.raises(MalformedPacket) as error:
        fastpath.decode_packet(first, body, 0, len(body), 5)
    assert error.value.message == reason
    assert error.value.reason_code == 0x81


def test_password_without_user_name_in_311() -> None:
    body = MQTT + b"\x04\x40\x00\x3c" + s(b"c") + s(b"p")
    with pytest.raises(MalformedPacket, match=r"^password without user name \(MQTT 3.1.1\)$"):
        fastpath.decode_packet(0x10, body, 0, len(body), 4)


@pytest.mark.parametrize(
    ("first", "body", "reason"),
    [
        (0x30, b"\x00", "truncated PUBLISH"),
        (0x30, b"\x00\x05ab", "topic runs past the end of the PUBLISH"),
        (0x30, s(b"t"), "PUBLISH without a property length"),
        (0x38, s(b"t") + b"\x00", "QoS 0 PUBLISH with DUP set"),
    ],
)
def test_scan_publish_reason(first: int, body: bytes, reason: str) -> None:
    with pytest.raises(MalformedPacket) as error:
        fastpath.scan_publish(first, body, 0, len(body), 5)
    assert error.value.message == reason


def test_acknowledgement_longer_than_2_bytes_in_311() -> None:
    with pytest.raises(MalformedPacket) as error:
        fastpath.decode_packet(0x40, b"\x00\x01\x00", 0, 3, 4)
    assert error.value.message == "acknowledgement longer than 2 bytes"


@pytest.mark.parametrize(
    ("options", "version", "error", "reason"),
    [
        (0xC0, 5, MalformedPacket, "reserved subscription option bits are not 0"),
        (0x04, 4, MalformedPacket, "reserved subscription option bits are not 0"),
        (0x30, 5, ProtocolError, "Retain Handling 3"),
        (0x03, 5, ProtocolError, "subscription Maximum QoS 3"),
        (0x03, 4, MalformedPacket, "subscription QoS 3"),
    ],
)
def test_subscription_options_reason(
    options: int, version: int, error: type[Exception], reason: str
) -> None:
    body = b"\x00\x01" + (b"\x00" if version == 5 else b"") + s(b"a") + bytes([options])
    with pytest.raises(error) as raised:
        fastpath.decode_packet(0x82, body, 0, len(body), version)
    assert type(raised.value) is error and raised.value.message == reason  # type: ignore[attr-defined]


def test_encoders_refuse_what_no_packet_can_carry() -> None:
    """The encoders refuse what no packet can carry, saying what."""
    with pytest.raises(ValueError, match="^topic longer than 65535 bytes$"):
        fastpath.encode_publish(pk.Publish("t" * 65536, b""), 5)
    with pytest.raises(ValueError, match="^string longer than 65535 bytes$"):
        fastpath.encode_properties({0x1F: "x" * 65536})  # a Reason String
    with pytest.raises(
        ValueError, match="^a QoS 1 or 2 PUBLISH needs a non-zero packet identifier$"
    ):
        fastpath.encode_publish(pk.Publish("t", b"", 1), 5)


@pytest.mark.parametrize(
    ("packet_type", "flags", "body", "error", "reason"),
    [
        (
            1,
            0,
            MQTT + b"\x05\x01\x00\x3c\x00" + s(b"c"),
            MalformedPacket,
            "CONNECT reserved flag is not 0",
        ),
        (3, 2, s(b"t") + b"\x00\x00\x00", ProtocolError, "PUBLISH with packet identifier 0"),
        (
            8,
            2,
            b"\x00\x00\x00" + s(b"a") + b"\x00",
            ProtocolError,
            "SUBSCRIBE with packet identifier 0",
        ),
        (10, 2, b"\x00\x00\x00" + s(b"a"), ProtocolError, "UNSUBSCRIBE with packet identifier 0"),
        (0, 0, b"", MalformedPacket, "reserved packet type 0"),
    ],
)
def test_grammar_reason(
    packet_type: int, flags: int, body: bytes, error: type[Exception], reason: str
) -> None:
    """The grammar (the reference decoder, and the one for the packets the fast path leaves to
    it) gives the same reasons."""
    with pytest.raises(error) as raised:
        grammar.decode(packet_type, flags, body, 5)
    assert type(raised.value) is error and raised.value.message == reason  # type: ignore[attr-defined]


def test_fast_path_decodes_a_valid_connect() -> None:
    body = MQTT + b"\x05\x02\x00\x3c\x00" + s(b"c")
    packet = fastpath.decode_packet(0x10, body, 0, len(body), 5)
    assert isinstance(packet, pk.Connect) and packet.client_id == "c" and packet.clean_start


@pytest.mark.parametrize(
    ("first", "body", "error", "reason"),
    [
        (
            0x10,
            MQTT + b"\x05\x40\x00\x3c\x00" + s(b"c") + b"\x00\x09ab",
            MalformedPacket,
            "binary data runs past the end of the packet",
        ),
        (0x30, s(b"t") + b"\x02\x23\x00", MalformedPacket, "truncated property"),
        (0x30, s(b"t") + b"\x03\x02\x00\x00", MalformedPacket, "truncated property"),
        (
            0x30,
            s(b"t") + b"\x05\x11\x00\x00\x00\x01",
            ProtocolError,
            "property SESSION_EXPIRY_INTERVAL is not allowed in this packet",
        ),
    ],
    ids=["binary", "two-byte property", "four-byte property", "property not allowed"],
)
def test_more_reasons(first: int, body: bytes, error: type[Exception], reason: str) -> None:
    with pytest.raises(error) as raised:
        fastpath.decode_packet(first, body, 0, len(body), 5)
    assert type(raised.value) is error and raised.value.message == reason  # type: ignore[attr-defined]


def test_remaining_length_not_minimal() -> None:
    with pytest.raises(MalformedPacket, match="^Remaining Length is not minimally encoded$"):
        fastpath.read_fixed_header(b"\x30\x80\x00", 0, 3)


def test_grammar_publish_qos3_and_encoder_refusals() -> None:
    with pytest.raises(MalformedPacket, match="^PUBLISH with QoS 3$"):
        grammar.decode(3, 6, s(b"t") + b"\x00\x01\x00", 5)
    with pytest.raises(
        ValueError, match="^a QoS 1 or 2 PUBLISH needs a non-zero packet identifier$"
    ):
        grammar.encode(pk.Publish("t", b"", 1), 5)
    with pytest.raises(ValueError, match="^AUTH does not exist before MQTT 5$"):
        grammar.encode(pk.Auth(0), 4)


def test_protocol_errors_of_the_fast_path() -> None:
    with pytest.raises(ProtocolError, match="^PUBLISH with packet identifier 0$"):
        fastpath.scan_publish(0x32, s(b"t") + b"\x00\x00", 0, 5, 5)
    with pytest.raises(ProtocolError, match="^SUBSCRIBE with no topic filter$"):
        fastpath.decode_packet(0x82, b"\x00\x01\x00", 0, 3, 5)


MQTT_3_1_1 = 4
UNSUBSCRIBE = (PacketType.UNSUBSCRIBE << 4) | 2


def field(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def unsubscribe_body(filters: list[str], version: int) -> bytes:
    return b"\x00\x07" + (b"\x00" if version == MQTT_5 else b"") + b"".join(map(field, filters))


def decode(filters: list[str], version: int, limit: int) -> pk.Packet:
    body = b"\xff" + unsubscribe_body(filters, version) + b"\x00"
    return fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, version, limit)


LONG = "long/" + "x" * 295  # 300 bytes: 0x012C


@pytest.mark.parametrize("version", [MQTT_5, MQTT_3_1_1])
@pytest.mark.parametrize(
    "filters",
    [["a", "b", "c"], [LONG, "b", "c"], ["a", LONG, "c"], [LONG, LONG, LONG]],
    ids=["short", "long-first", "long-middle", "all-long"],
)
def test_unsubscribe_filter_limit(version: int, filters: list[str]) -> None:
    packet = decode(filters, version, 3)
    assert isinstance(packet, pk.Unsubscribe) and packet.topic_filters == filters
    with pytest.raises(LimitExceeded) as refused:
        decode(filters, version, 2)
    assert refused.value.reason_code == ReasonCode.QUOTA_EXCEEDED
    assert isinstance(decode(filters, version, 0), pk.Unsubscribe)  # 0: no limit


def test_unsubscribe_properties_are_skipped_before_counting() -> None:
    """MQTT 5: the property block (here a User Property) is not taken for filters."""
    props = b"\x26" + field("k") + field("v")
    body = b"\xff\x00\x07" + bytes([len(props)]) + props + field("a") + b"\x00"
    packet = fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, MQTT_5, 1)
    assert isinstance(packet, pk.Unsubscribe) and packet.topic_filters == ["a"]


def test_unsubscribe_properties_skipped_then_filters_counted() -> None:
    """Past the property block, every filter counts: three with a limit of two is refused."""
    props = b"\x26" + field("k") + field("v")
    body = b"\xff\x00\x07" + bytes([len(props)]) + props
    body += field("a") + field("b") + field("c") + b"\x00"
    with pytest.raises(LimitExceeded):
        fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, MQTT_5, 2)
