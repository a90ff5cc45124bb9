"""protocol/grammar.py, the construct codec of every packet type, checked beside the fast path
wherever that handles the same packet.

Round trips: encode then decode gives the packet back, and decode then encode gives the bytes
back, for every packet type at both protocol levels. A table of hand-picked packets first, then
hypothesis over everything support.strategies can generate.

Variable Byte Integers (1.5.5) and the fixed header's Remaining Length (2.1.4), in both codecs:
fastpath.encode_vbi / decode_vbi / read_fixed_header and grammar.VBI.

Malformed and forbidden inputs, one codec rule at a time: each body is built by hand, and every
decoder of the packet type (grammar, plus the fast path for hot packets) must raise the spec's
error class with its reason code (MalformedPacket 0x81, ProtocolError 0x82,
UnsupportedProtocolVersion 0x84).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.clients import vbi
from support.codec import (
    HOT,
    assert_rejects,
    check_golden,
    decode_all,
    decode_hot,
    decode_packet,
    encode_hot,
    props,
    s,
    split,
)
from support.strategies import any_packet, hot_packet

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import (
    MalformedPacket,
    MQTTError,
    ProtocolError,
    UnsupportedProtocolVersion,
)
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5, PacketType
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
    """What the grammar encodes, every codec of the packet encodes alike and decodes back."""
    check_golden(packet, version, grammar.encode(packet, version))


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


# Table 1.5.5 of the spec: the boundaries of each encoded length.
VBI_TABLE = [
    (0, b"\x00"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"),
    (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f"),
    (321, b"\xc1\x02"),
]


@pytest.mark.parametrize(("value", "raw"), VBI_TABLE)
def test_vbi_table(value: int, raw: bytes) -> None:
    """[MQTT-1.5.5-1] The spec's table of Variable Byte Integer sizes, in both codecs."""
    assert fastpath.encode_vbi(value) == raw
    assert grammar.VBI.build(value) == raw
    assert fastpath.decode_vbi(raw, 0, len(raw)) == (value, len(raw))
    assert fastpath.decode_vbi(b"\xaa" + raw + b"\x80", 1, len(raw) + 1) == (value, len(raw) + 1)
    assert grammar.VBI.parse(raw) == value


@given(st.integers(0, 268_435_455))
def test_vbi_round_trip(value: int) -> None:
    """[MQTT-1.5.5-1] Both encoders give the same, shortest encoding (7 bits of the value a
    byte, the continuation bit on every byte but the last) and both decoders read it back."""
    raw = fastpath.encode_vbi(value)
    assert grammar.VBI.build(value) == raw
    assert len(raw) == max(1, -(-value.bit_length() // 7))
    assert [byte >> 7 for byte in raw] == [1] * (len(raw) - 1) + [0]
    assert fastpath.decode_vbi(raw, 0, len(raw)) == (value, len(raw))
    assert grammar.VBI.parse(raw) == value


@pytest.mark.parametrize("value", [-1, 268_435_456, 2**32])
def test_vbi_out_of_range_is_not_encoded(value: int) -> None:
    with pytest.raises(ValueError):
        fastpath.encode_vbi(value)
    with pytest.raises(ValueError):
        grammar.VBI.build(value)


NON_MINIMAL = [b"\x80\x00", b"\xff\x00", b"\x80\x80\x00", b"\x81\x80\x00", b"\x80\x80\x80\x00"]
TOO_LONG = [b"\x80\x80\x80\x80\x01", b"\xff\xff\xff\xff\x7f", b"\x80\x80\x80\x80\x00"]


@pytest.mark.parametrize("raw", NON_MINIMAL + TOO_LONG)
def test_vbi_malformed(raw: bytes) -> None:
    """[MQTT-1.5.5-1] A non-minimal encoding, or more than 4 bytes, is a Malformed Packet."""
    with pytest.raises(MalformedPacket) as info:
        fastpath.decode_vbi(raw, 0, len(raw))
    assert info.value.reason_code == 0x81
    with pytest.raises(MalformedPacket) as info:
        grammar.VBI.parse(raw)
    assert info.value.reason_code == 0x81


def test_vbi_truncated() -> None:
    for raw in (b"", b"\x80", b"\xff\xff\xff"):
        with pytest.raises(MalformedPacket):
            fastpath.decode_vbi(raw, 0, len(raw))
    # the bytes exist in the buffer but lie beyond ``end``
    with pytest.raises(MalformedPacket):
        fastpath.decode_vbi(b"\x80\x01", 0, 1)


# ---------------------------------------------------------------------------------------------
# read_fixed_header


@pytest.mark.parametrize(("value", "raw"), VBI_TABLE)
def test_read_fixed_header(value: int, raw: bytes) -> None:
    """Returns (remaining length, position of the body), ignoring what follows."""
    data = b"\x30" + raw
    assert fastpath.read_fixed_header(data, 0, len(data)) == (value, len(data))
    data = b"junk\x30" + raw + b"\x00body"
    assert fastpath.read_fixed_header(data, 4, len(data)) == (value, 5 + len(raw))


@pytest.mark.parametrize(
    "data",
    [b"\x30", b"\x30\x80", b"\x30\xff\xff", b"\x30\x80\x80\x80", b""],
    ids=["no-length", "1-of-2", "2-of-3", "3-of-4", "nothing"],
)
def test_read_fixed_header_incomplete(data: bytes) -> None:
    """None while the Remaining Length is incomplete: more bytes are needed."""
    assert fastpath.read_fixed_header(data, 0, len(data)) is None


def test_read_fixed_header_respects_end() -> None:
    """Bytes at or beyond ``end`` are not read yet."""
    data = b"\x30\x80\x01"
    assert fastpath.read_fixed_header(data, 0, 2) is None
    assert fastpath.read_fixed_header(data, 0, 3) == (128, 3)


@pytest.mark.parametrize("raw", NON_MINIMAL + TOO_LONG)
def test_read_fixed_header_malformed(raw: bytes) -> None:
    """[MQTT-1.5.5-1] Remaining Length not minimal or longer than 4 bytes: Malformed Packet."""
    data = b"\x30" + raw
    with pytest.raises(MalformedPacket) as info:
        fastpath.read_fixed_header(data, 0, len(data))
    assert info.value.reason_code == 0x81


def test_read_fixed_header_too_long_without_fifth_byte() -> None:
    """Four bytes all with the continuation bit are already known to be malformed."""
    data = b"\x30\x80\x80\x80\x80"
    with pytest.raises(MalformedPacket):
        fastpath.read_fixed_header(data, 0, len(data))


def test_grammar_remaining_length_of_encoded_packets() -> None:
    """The encoders write the Remaining Length as the shortest VBI of the body size."""
    from mqttbroker.protocol import packets as pk

    for size in (0, 1, 120, 121, 122, 16_379, 16_380, 16_381):
        packet = pk.Publish("t", b"\x00" * size)
        for data in (grammar.encode(packet, 5), encode_hot(packet, 5)):
            body_len = 3 + 1 + size
            assert data[1 : 1 + len(vbi(body_len))] == vbi(body_len)
            assert len(data) == 1 + len(vbi(body_len)) + body_len


T = PacketType
V4, V5 = MQTT_3_1_1, MQTT_5
VERSIONS = [V4, V5]

# ---------------------------------------------------------------------------------------------
# Valid MQTT 5 bodies of every packet type, used where a test changes one thing about them.

VALID_V5: dict[int, bytes] = {
    T.CONNECT: b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + s("c"),
    T.CONNACK: b"\x00\x00\x00",
    T.PUBLISH: s("t") + b"\x00p",
    T.PUBACK: b"\x00\x01",
    T.PUBREC: b"\x00\x01",
    T.PUBREL: b"\x00\x01",
    T.PUBCOMP: b"\x00\x01",
    T.SUBSCRIBE: b"\x00\x01\x00" + s("t") + b"\x01",
    T.SUBACK: b"\x00\x01\x00\x01",
    T.UNSUBSCRIBE: b"\x00\x01\x00" + s("t"),
    T.UNSUBACK: b"\x00\x01\x00\x00",
    T.PINGREQ: b"",
    T.PINGRESP: b"",
    T.DISCONNECT: b"",
    T.AUTH: b"",
}
# The fixed-header flags each packet type must carry (table 2.2, 2.1.3).
REQUIRED_FLAGS = {t: (2 if t in (T.PUBREL, T.SUBSCRIBE, T.UNSUBSCRIBE) else 0) for t in VALID_V5}

# ---------------------------------------------------------------------------------------------
# Fixed header flags (2.1.3)

WRONG_FLAGS = [
    (t, f) for t in VALID_V5 if t != T.PUBLISH for f in range(16) if f != REQUIRED_FLAGS[t]
]


def test_valid_bodies_decode() -> None:
    """The bodies the flag tests use are valid with the right flags (so a rejection is due to
    the flags alone)."""
    for ptype, body in VALID_V5.items():
        decode_all(ptype, REQUIRED_FLAGS[ptype], body, V5)


@pytest.mark.parametrize(
    ("ptype", "flags"), WRONG_FLAGS, ids=[f"{T(t).name}-{f:04b}" for t, f in WRONG_FLAGS]
)
def test_reserved_fixed_header_flags(ptype: int, flags: int) -> None:
    """[MQTT-2.1.3-1] [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1] [MQTT-3.14.1-1]
    [MQTT-3.15.1-1] Reserved flags other than the table's are a Malformed Packet."""
    assert_rejects(MalformedPacket, 0x81, ptype, flags, VALID_V5[ptype], V5)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("flags", [0b0110, 0b0111, 0b1110, 0b1111])
def test_publish_qos_3(flags: int, version: int) -> None:
    """[MQTT-3.3.1-4] A PUBLISH with both QoS bits set is a Malformed Packet."""
    body = s("t") + b"\x00\x01" + (b"\x00" if version == V5 else b"") + b"p"
    assert_rejects(MalformedPacket, 0x81, T.PUBLISH, flags, body, version)


def test_reserved_packet_type_0() -> None:
    """Packet type 0 is reserved (table 2.1): a Malformed Packet, from the dispatcher and from
    grammar.decode, whose docstring promises MalformedPacket/ProtocolError/... only."""
    with pytest.raises(MalformedPacket):
        decode_packet(0x00, b"", V5)
    with pytest.raises(MalformedPacket):
        grammar.decode(0, 0, b"", V5)


def test_auth_does_not_exist_in_311() -> None:
    """AUTH (type 15) is reserved in 3.1.1."""
    assert_rejects(MalformedPacket, 0x81, T.AUTH, 0, b"", V4)


# ---------------------------------------------------------------------------------------------
# CONNECT (3.1)


def connect_body(
    flags: int, level: int = 5, name: bytes = b"MQTT", tail: bytes | None = None
) -> bytes:
    head = s(name) + bytes([level, flags]) + b"\x00\x3c" + (b"\x00" if level == 5 else b"")
    if tail is None:
        tail = s("c")
        if flags & 0x04:
            tail += (b"\x00" if level == 5 else b"") + s("w") + s(b"m")
        if flags & 0x80:
            tail += s("u")
        if flags & 0x40:
            tail += s(b"p")
    return head + tail


@pytest.mark.parametrize("level", [4, 5])
def test_connect_bodies_are_valid(level: int) -> None:
    for flags in (0x02, 0x06, 0x0E, 0x16, 0x26, 0xC2, 0xEE):
        packet = grammar.decode(1, 0, connect_body(flags, level), level)
        assert isinstance(packet, pk.Connect)
        assert packet.protocol_level == level


@pytest.mark.parametrize("level", [4, 5])
def test_connect_reserved_flag(level: int) -> None:
    """[MQTT-3.1.2-3] The reserved Connect Flags bit must be 0."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x03, level), level)
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0xEF, level), level)


@pytest.mark.parametrize("level", [4, 5])
def test_connect_will_qos_3(level: int) -> None:
    """[MQTT-3.1.2-12] Will QoS 3 with the Will Flag set."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x1E, level), level)


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("flags", [0x0A, 0x12, 0x1A], ids=["qos1", "qos2", "qos3"])
def test_connect_will_qos_without_will_flag(flags: int, level: int) -> None:
    """[MQTT-3.1.2-11] Will Flag 0 requires Will QoS 0."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(flags, level), level)


@pytest.mark.parametrize("level", [4, 5])
def test_connect_will_retain_without_will_flag(level: int) -> None:
    """[MQTT-3.1.2-13] Will Flag 0 requires Will Retain 0."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x22, level), level)


def test_connect_311_password_without_user_name() -> None:
    """3.1.1 [MQTT-3.1.2-22]: User Name Flag 0 requires Password Flag 0 (MQTT 5 lifts this)."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x42, 4), V4)
    packet = grammar.decode(1, 0, connect_body(0x42, 5), V5)
    assert isinstance(packet, pk.Connect) and packet.password == b"p"


UNSUPPORTED = [
    (b"MQTT", 3),
    (b"MQTT", 6),
    (b"MQTT", 0),
    (b"MQTT", 255),
    (b"MQIsdp", 4),
    (b"MQIsdp", 5),
    (b"MQTX", 4),
    (b"mqtt", 5),
    (b"", 5),
]


@pytest.mark.parametrize(("name", "level"), UNSUPPORTED)
def test_connect_unsupported_protocol(name: bytes, level: int) -> None:
    """[MQTT-3.1.2-1] [MQTT-3.1.2-2] A protocol name/level this broker does not speak:
    Unsupported Protocol Version (0x84)."""
    body = s(name) + bytes([level]) + b"\x02\x00\x3c\x00" + s("c")
    assert_rejects(UnsupportedProtocolVersion, 0x84, 1, 0, body, V5)
    assert_rejects(UnsupportedProtocolVersion, 0x84, 1, 0, body, V4)


def test_connect_trailing_bytes() -> None:
    """A CONNECT body longer than its fields (remaining length too large) is malformed."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x02, 5) + b"\x00", V5)
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0xEE, 5) + b"x", V5)
    assert_rejects(MalformedPacket, 0x81, 1, 0, connect_body(0x02, 4) + b"\x00", V4)


@pytest.mark.parametrize(
    "body",
    [
        b"\x00\x04MQ",  # protocol name cut short
        b"\x00\x04MQTT\x05\x02\x00",  # keep alive cut short
        b"\x00\x04MQTT\x05\x02\x00\x3c",  # no property length
        b"\x00\x04MQTT\x05\x02\x00\x3c\x05\x11\x00",  # properties run past the end
        b"\x00\x04MQTT\x05\x02\x00\x3c\x00",  # no client identifier
        b"\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x05ab",  # client identifier runs past the end
        connect_body(0x06, 5, tail=s("c") + b"\x00" + s("w")),  # no will payload
        connect_body(0x06, 5, tail=s("c") + b"\x04\x18\x00"),  # will properties cut short
        connect_body(0x82, 5, tail=s("c")),  # user name flag but no user name
        connect_body(0x42, 5, tail=s("c") + b"\x00\x03p"),  # password runs past the end
    ],
)
def test_connect_truncated(body: bytes) -> None:
    """A CONNECT whose fields run past the end of the packet is malformed."""
    assert_rejects(MalformedPacket, 0x81, 1, 0, body, V5)


# ---------------------------------------------------------------------------------------------
# UTF-8 Encoded Strings (1.5.4)

BAD_UTF8 = [
    (b"\xff", "invalid byte"),
    (b"a\x80", "lone continuation byte"),
    (b"\xc3", "truncated sequence"),
    (b"\xed\xa0\x80", "surrogate U+D800"),
    (b"\xed\xbf\xbf", "surrogate U+DFFF"),
    (b"\xc0\x80", "overlong U+0000"),
    (b"\xe0\x80\xaf", "overlong solidus"),
    (b"\xf4\x90\x80\x80", "above U+10FFFF"),
    (b"\x00", "U+0000"),
    (b"a/\x00/b", "U+0000 inside"),
]


def string_sites(raw: bytes) -> list[tuple[int, int, bytes, int]]:
    """(type, flags, body, version) of packets carrying ``raw`` in each kind of string field."""
    return [
        (T.PUBLISH, 0, s(raw) + b"\x00", V5),  # topic name
        (T.PUBLISH, 2, s(raw) + b"\x00\x01", V4),
        (T.CONNECT, 0, connect_body(0x02, 5, tail=s(raw)), V5),  # client identifier
        (T.CONNECT, 0, connect_body(0x06, 4, tail=s("c") + s(raw) + s(b"")), V4),  # will topic
        (T.CONNECT, 0, connect_body(0x82, 5, tail=s("c") + s(raw)), V5),  # user name
        (T.SUBSCRIBE, 2, b"\x00\x01\x00" + s(raw) + b"\x00", V5),  # topic filter
        (T.UNSUBSCRIBE, 2, b"\x00\x01" + s(raw), V4),
        (T.PUBLISH, 0, s("t") + props(b"\x03" + s(raw)), V5),  # content type property
        (T.PUBACK, 0, b"\x00\x01\x80" + props(b"\x1f" + s(raw)), V5),  # reason string
        (T.DISCONNECT, 0, b"\x00" + props(b"\x1c" + s(raw)), V5),  # server reference
    ]


@pytest.mark.parametrize("raw", [b[0] for b in BAD_UTF8], ids=[b[1] for b in BAD_UTF8])
def test_ill_formed_utf8(raw: bytes) -> None:
    """[MQTT-1.5.4-1] [MQTT-1.5.4-2] [MQTT-3.1.3-4] [MQTT-3.1.3-11] [MQTT-3.1.3-12]
    [MQTT-3.3.2-1] [MQTT-3.8.3-1] [MQTT-3.10.3-1] Ill-formed UTF-8, surrogates and U+0000 in
    any UTF-8 Encoded String are a Malformed Packet."""
    for site in string_sites(raw):
        assert_rejects(MalformedPacket, 0x81, *site)


def test_well_formed_strings_at_the_same_sites_decode() -> None:
    """The sites above decode with a well-formed string (so the rejections are about UTF-8)."""
    for site in string_sites("é€𝄞".encode()):
        decode_all(*site)


def test_bom_is_kept() -> None:
    """[MQTT-1.5.4-3] EF BB BF is U+FEFF and is neither stripped nor skipped."""
    raw = b"\xef\xbb\xbfa/\xef\xbb\xbf"
    packet = decode_all(T.PUBLISH, 0, s(raw) + b"\x00", V5)
    assert isinstance(packet, pk.Publish) and packet.topic == "\ufeffa/\ufeff"
    assert grammar.encode(packet, V5) == b"\x30\x0b" + s(raw) + b"\x00"
    packet = decode_all(T.PUBLISH, 0, s(raw), V4)
    assert isinstance(packet, pk.Publish) and packet.topic == "\ufeffa/\ufeff"
    connect = grammar.decode(1, 0, connect_body(0x02, 5, tail=s(raw)), V5)
    assert isinstance(connect, pk.Connect) and connect.client_id == "\ufeffa/\ufeff"


# ---------------------------------------------------------------------------------------------
# Lengths inconsistent with content


TRUNCATED = [
    (T.PUBLISH, 0, b"", V5, "empty body"),
    (T.PUBLISH, 0, b"\x00", V4, "topic length cut short"),
    (T.PUBLISH, 0, b"\x00\x05ab", V5, "topic runs past the end"),
    (T.PUBLISH, 0, b"\x00\x05ab", V4, "topic runs past the end (3.1.1)"),
    (T.PUBLISH, 2, s("t") + b"\x00", V4, "packet identifier cut short"),
    (T.PUBLISH, 4, s("t"), V5, "no packet identifier"),
    (T.PUBLISH, 0, s("t"), V5, "no property length"),
    (T.PUBLISH, 0, s("t") + b"\x05\x01\x01", V5, "property length past the end"),
    (T.PUBLISH, 0, s("t") + b"\x04\x03\x00\x05ab" + b"cdef", V5, "string past property length"),
    (T.PUBLISH, 0, s("t") + b"\x03\x02\x00\x00" + b"xyz", V5, "four-byte value cut short"),
    (T.PUBLISH, 0, s("t") + b"\x01\x0b" + b"x", V5, "property without value"),
    (T.PUBLISH, 0, s("t") + b"\x02\x0b\x80" + b"\x01", V5, "VBI value cut short"),
    (T.PUBLISH, 0, s("t") + b"\x04\x26\x00\x01k" + b"\x00\x01v", V5, "pair cut short"),
    (T.PUBACK, 0, b"\x00", V5, "ack of 1 byte"),
    (T.PUBREL, 2, b"", V4, "empty ack"),
    (T.PUBACK, 0, b"\x00\x01\x00\x05\x1f\x00", V5, "ack properties past the end"),
    (T.PUBCOMP, 0, b"\x00\x01\x92\x03\x1f\x00\x05abc", V5, "ack string past the end"),
    (T.CONNACK, 0, b"\x00", V5, "CONNACK of 1 byte"),
    (T.CONNACK, 0, b"\x00\x00", V5, "CONNACK without property length"),
    (T.CONNACK, 0, b"\x00\x00\x03\x21\x00", V5, "CONNACK property cut short"),
    (T.SUBSCRIBE, 2, b"\x00\x01\x00" + s("t"), V5, "no subscription options"),
    (T.SUBSCRIBE, 2, b"\x00\x01" + s("t"), V4, "no requested QoS"),
    (T.SUBSCRIBE, 2, b"\x00\x01\x00\x00\x05ab\x00", V5, "filter past the end"),
    (T.SUBSCRIBE, 2, b"\x00", V4, "SUBSCRIBE of 1 byte"),
    (T.SUBACK, 0, b"\x00\x01\x04\x1f\x00", V5, "SUBACK properties past the end"),
    (T.UNSUBSCRIBE, 2, b"\x00\x01\x00\x00\x05ab", V5, "UNSUBSCRIBE filter past the end"),
    (T.UNSUBSCRIBE, 2, b"\x00\x01\x00", V4, "UNSUBSCRIBE filter length cut short"),
    (T.UNSUBACK, 0, b"\x00", V4, "UNSUBACK of 1 byte"),
    (T.UNSUBACK, 0, b"\x00\x01", V5, "UNSUBACK without property length"),
    (T.DISCONNECT, 0, b"\x00\x03\x11\x00", V5, "DISCONNECT property cut short"),
    (T.AUTH, 0, b"\x18\x05\x15\x00\x05ab", V5, "AUTH properties past the end"),
]


TRAILING = [
    (T.PUBACK, 0, b"\x00\x01\x00\x00\x00", V5, "PUBACK after empty properties"),
    (T.PUBREC, 0, b"\x00\x01\x10\x04\x1f\x00\x01x" + b"!", V5, "PUBREC after properties"),
    (T.PUBREL, 2, b"\x00\x01\x00", V4, "3.1.1 PUBREL of 3 bytes"),
    (T.PUBCOMP, 0, b"\x00\x01\x00\x00", V4, "3.1.1 PUBCOMP of 4 bytes"),
    (T.CONNACK, 0, b"\x00\x00\x00\x00", V5, "CONNACK after properties"),
    (T.CONNACK, 0, b"\x00\x00\x00", V4, "3.1.1 CONNACK of 3 bytes"),
    (T.UNSUBACK, 0, b"\x00\x01\x00", V4, "3.1.1 UNSUBACK of 3 bytes"),
    (T.DISCONNECT, 0, b"\x00\x00\x00", V5, "DISCONNECT after properties"),
    (T.DISCONNECT, 0, b"\x00", V4, "3.1.1 DISCONNECT with a body"),
    (T.AUTH, 0, b"\x18\x00\x00", V5, "AUTH after properties"),
    (T.PINGREQ, 0, b"\x00", V5, "PINGREQ with a body"),
    (T.PINGRESP, 0, b"\x00", V4, "PINGRESP with a body"),
]


@pytest.mark.parametrize(
    ("ptype", "flags", "body", "version"),
    [c[:4] for c in TRUNCATED + TRAILING],
    ids=[f"past the end: {c[4]}" for c in TRUNCATED] + [f"trailing: {c[4]}" for c in TRAILING],
)
def test_remaining_length_that_does_not_fit_the_content_is_malformed(
    ptype: int, flags: int, body: bytes, version: int
) -> None:
    """A field, string or property block longer than what remains of the packet (Remaining
    Length too small), or bytes after the last field of a packet with a fixed layout (Remaining
    Length too large), is a Malformed Packet."""
    assert_rejects(MalformedPacket, 0x81, ptype, flags, body, version)


def test_non_minimal_property_length() -> None:
    """[MQTT-1.5.5-1] A Property Length of 0 written 0x80 0x00 is not the shortest encoding."""
    cases = [
        (T.PUBLISH, 0, s("t") + b"\x80\x00" + b"p"),
        (T.PUBACK, 0, b"\x00\x01\x10\x80\x00"),
        (T.CONNACK, 0, b"\x00\x00\x80\x00"),
        (T.CONNECT, 0, b"\x00\x04MQTT\x05\x02\x00\x3c\x80\x00" + s("c")),
        (T.SUBSCRIBE, 2, b"\x00\x01\x80\x00" + s("t") + b"\x00"),
        (T.DISCONNECT, 0, b"\x00\x80\x00"),
    ]
    for ptype, flags, body in cases:
        assert_rejects(MalformedPacket, 0x81, ptype, flags, body, V5)


def test_property_length_longer_than_4_bytes() -> None:
    """A Property Length VBI of 5 bytes is malformed (1.5.5: at most 4 bytes)."""
    assert_rejects(MalformedPacket, 0x81, T.PUBLISH, 0, s("t") + b"\xff\xff\xff\xff\x01", V5)
    assert_rejects(MalformedPacket, 0x81, T.PUBACK, 0, b"\x00\x01\x00\x80\x80\x80\x80\x01", V5)


# ---------------------------------------------------------------------------------------------
# Packet identifiers (2.2.1)


@pytest.mark.parametrize("version", VERSIONS)
def test_packet_identifier_zero(version: int) -> None:
    """[MQTT-2.2.1-3] SUBSCRIBE, UNSUBSCRIBE and QoS > 0 PUBLISH need a non-zero Packet
    Identifier."""
    pl = b"\x00" if version == V5 else b""
    assert_rejects(ProtocolError, 0x82, T.PUBLISH, 2, s("t") + b"\x00\x00" + pl, version)
    assert_rejects(ProtocolError, 0x82, T.PUBLISH, 4, s("t") + b"\x00\x00" + pl + b"x", version)
    assert_rejects(
        ProtocolError, 0x82, T.SUBSCRIBE, 2, b"\x00\x00" + pl + s("t") + b"\x00", version
    )
    assert_rejects(ProtocolError, 0x82, T.UNSUBSCRIBE, 2, b"\x00\x00" + pl + s("t"), version)


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE and UNSUBSCRIBE payloads (3.8.3, 3.10.3)


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_without_filters(version: int) -> None:
    """[MQTT-3.8.3-2] A SUBSCRIBE without a Topic Filter is a Protocol Error."""
    body = b"\x00\x01" + (b"\x00" if version == V5 else b"")
    assert_rejects(ProtocolError, 0x82, T.SUBSCRIBE, 2, body, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_unsubscribe_without_filters(version: int) -> None:
    """[MQTT-3.10.3-2] An UNSUBSCRIBE without a Topic Filter is a Protocol Error."""
    body = b"\x00\x01" + (b"\x00" if version == V5 else b"")
    assert_rejects(ProtocolError, 0x82, T.UNSUBSCRIBE, 2, body, version)


def subscribe_v5(options: int) -> bytes:
    return b"\x00\x01\x00" + s("a") + b"\x00" + s("b") + bytes([options])


@pytest.mark.parametrize("options", [0x40, 0x80, 0xC0, 0x41, 0xAD])
def test_subscription_options_reserved_bits(options: int) -> None:
    """[MQTT-3.8.3-5] Reserved bits 6 and 7 of the Subscription Options must be 0."""
    assert_rejects(MalformedPacket, 0x81, T.SUBSCRIBE, 2, subscribe_v5(options), V5)


@pytest.mark.parametrize("options", [0x30, 0x31, 0x3E])
def test_retain_handling_3(options: int) -> None:
    """3.8.3.1: a Retain Handling value of 3 is a Protocol Error."""
    assert_rejects(ProtocolError, 0x82, T.SUBSCRIBE, 2, subscribe_v5(options), V5)


@pytest.mark.parametrize("options", [0x03, 0x07, 0x2F])
def test_subscription_maximum_qos_3(options: int) -> None:
    """3.8.3.1: "It is a Protocol Error if the Maximum QoS field has the value 3" (MQTT 5)."""
    assert_rejects(ProtocolError, 0x82, T.SUBSCRIBE, 2, subscribe_v5(options), V5)


@pytest.mark.parametrize("requested", [0x03, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x05])
def test_subscribe_311_reserved_bits_and_qos_3(requested: int) -> None:
    """3.1.1 [MQTT-3-8.3-4]: reserved bits non-zero or QoS not 0, 1 or 2 is malformed."""
    body = b"\x00\x01" + s("a") + b"\x00" + s("b") + bytes([requested])
    assert_rejects(MalformedPacket, 0x81, T.SUBSCRIBE, 2, body, V4)


def test_subscription_options_all_valid_values() -> None:
    """Every valid options byte decodes to its fields (bits 0-1, 2, 3, 4-5)."""
    for options in range(0x30):
        if options & 3 == 3:
            continue
        packet = grammar.decode(T.SUBSCRIBE, 2, subscribe_v5(options), V5)
        assert isinstance(packet, pk.Subscribe)
        request = packet.subscriptions[1]
        assert request.topic_filter == "b"
        assert (request.qos, request.no_local, request.retain_as_published) == (
            options & 3,
            bool(options & 4),
            bool(options & 8),
        )
        assert request.retain_handling == options >> 4


# ---------------------------------------------------------------------------------------------
# Reason codes (tables of sections 3.x.2.1, written out here from the spec)

SPEC_CODES: dict[int, frozenset[int]] = {
    T.CONNACK: frozenset(
        {
            0x00,
            0x80,
            0x81,
            0x82,
            0x83,
            0x84,
            0x85,
            0x86,
            0x87,
            0x88,
            0x89,
            0x8A,
            0x8C,
            0x90,
            0x95,
            0x97,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9F,
        }
    ),
    T.PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    T.PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    T.PUBREL: frozenset({0x00, 0x92}),
    T.PUBCOMP: frozenset({0x00, 0x92}),
    T.SUBACK: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    T.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    T.DISCONNECT: frozenset(
        {
            0x00,
            0x04,
            0x80,
            0x81,
            0x82,
            0x83,
            0x87,
            0x89,
            0x8B,
            0x8D,
            0x8E,
            0x8F,
            0x90,
            0x93,
            0x94,
            0x95,
            0x96,
            0x97,
            0x98,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9E,
            0x9F,
            0xA0,
            0xA1,
            0xA2,
        }
    ),
    T.AUTH: frozenset({0x00, 0x18, 0x19}),
}


def reason_body(ptype: int, code: int) -> tuple[int, bytes]:
    """(flags, body) of an MQTT 5 packet of ``ptype`` carrying reason code ``code``."""
    if ptype in (T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP):
        return REQUIRED_FLAGS[ptype], b"\x00\x07" + bytes([code])
    if ptype == T.CONNACK:
        return 0, bytes([0, code, 0])
    if ptype in (T.SUBACK, T.UNSUBACK):
        return 0, b"\x00\x07\x00\x00" + bytes([code])
    return 0, bytes([code])  # DISCONNECT, AUTH


def decoded_code(packet: pk.Packet) -> int:
    if isinstance(packet, (pk.Suback, pk.Unsuback)):
        return packet.reason_codes[-1]
    return packet.reason_code  # type: ignore[union-attr, no-any-return]


@pytest.mark.parametrize("ptype", list(SPEC_CODES), ids=[T(t).name for t in SPEC_CODES])
def test_reason_codes(ptype: int) -> None:
    """[MQTT-3.2.2-8] [MQTT-3.4.2-1] [MQTT-3.5.2-1] [MQTT-3.6.2-1] [MQTT-3.7.2-1]
    [MQTT-3.9.3-2] [MQTT-3.11.3-2] [MQTT-3.14.2-1] [MQTT-3.15.2-1] The codes of the packet's
    table decode; every other byte value is a Malformed Packet."""
    wrong: list[str] = []
    for code in range(256):
        flags, body = reason_body(ptype, code)
        if code in SPEC_CODES[ptype]:
            if decoded_code(decode_all(ptype, flags, body, V5)) != code:
                wrong.append(f"0x{code:02X} decoded to another code")
            continue
        try:
            assert_rejects(MalformedPacket, 0x81, ptype, flags, body, V5)
        except AssertionError as exc:
            wrong.append(f"0x{code:02X}: {exc}")
    assert not wrong, wrong


def test_suback_311_return_codes() -> None:
    """3.1.1 SUBACK return codes are 0x00, 0x01, 0x02 and 0x80 (3.9.3 of 3.1.1)."""
    for code in range(256):
        body = b"\x00\x07" + bytes([code])
        if code in (0, 1, 2, 0x80):
            assert grammar.decode(T.SUBACK, 0, body, V4) == pk.Suback(7, [code])
        else:
            assert_rejects(MalformedPacket, 0x81, T.SUBACK, 0, body, V4)


def test_reason_code_checked_with_properties_too() -> None:
    """An invalid code is malformed also when properties follow it."""
    assert_rejects(MalformedPacket, 0x81, T.PUBACK, 0, b"\x00\x01\x92\x00", V5)
    assert_rejects(MalformedPacket, 0x81, T.PUBREL, 2, b"\x00\x01\x10\x00", V5)
    assert_rejects(MalformedPacket, 0x81, T.DISCONNECT, 0, b"\x01\x00", V5)
    assert_rejects(MalformedPacket, 0x81, T.AUTH, 0, b"\x01\x00", V5)


@pytest.mark.parametrize("version", VERSIONS)
def test_connack_reserved_acknowledge_flags(version: int) -> None:
    """[MQTT-3.2.2-1] Bits 7-1 of the Connect Acknowledge Flags are reserved and 0."""
    for flags_byte in (0x02, 0x80, 0xFE, 0x03):
        body = bytes([flags_byte, 0]) + (b"\x00" if version == V5 else b"")
        assert_rejects(MalformedPacket, 0x81, T.CONNACK, 0, body, version)


# ---------------------------------------------------------------------------------------------
# The errors themselves


def test_error_classes_carry_their_reason_codes() -> None:
    assert MalformedPacket("x").reason_code == 0x81
    assert ProtocolError("x").reason_code == 0x82
    assert UnsupportedProtocolVersion("x").reason_code == 0x84
    assert MQTTError("x").reason_code == 0x80
    assert MalformedPacket("x", 0x95).reason_code == 0x95
    assert MalformedPacket("boom").message == "boom"
    for cls in (MalformedPacket, ProtocolError, UnsupportedProtocolVersion):
        assert issubclass(cls, MQTTError)


# ---------------------------------------------------------------------------------------------
# Robustness: whatever the bytes, grammar gives a packet or an MQTTError, nothing else


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """A valid packet of any type with a few random edits to its type, flags or body."""
    version = draw(st.sampled_from(VERSIONS))
    ptype, flags, raw = split(grammar.encode(draw(any_packet(version)), version))
    body = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["type", "flags", "set", "insert", "delete", "append"]))
        if kind == "type":
            ptype = draw(st.integers(1, 15))  # type 0: see test_reserved_packet_type_0
        elif kind == "flags":
            flags = draw(st.integers(0, 15))
        elif kind == "insert":
            body.insert(draw(st.integers(0, len(body))), draw(st.integers(0, 255)))
        elif kind == "append":
            body += draw(st.binary(min_size=1, max_size=4))
        elif body and kind == "set":
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        elif body:
            del body[draw(st.integers(0, len(body) - 1))]
    return ptype, flags, bytes(body), version


@settings(max_examples=200, deadline=None)
@given(damaged())
def test_grammar_raises_only_mqtt_errors(case: tuple[int, int, bytes, int]) -> None:
    """Damaged packets of every type decode or raise an MQTTError (never KeyError, struct or
    construct errors), so a connection can always answer with a reason code."""
    try:
        packet = grammar.decode(*case)
    except MQTTError:
        return
    assert packet.packet_type == case[0]


@pytest.mark.parametrize("version", [V4, V5])
def test_qos0_publish_with_dup_is_malformed(version: int) -> None:
    """[MQTT-3.3.1-2] DUP must be 0 on every QoS 0 PUBLISH; a set DUP is a malformed packet."""
    body = b"\x00\x01t" + (b"\x00" if version == V5 else b"") + b"x"
    assert_rejects(MalformedPacket, 0x81, 3, 0x08, body, version)
