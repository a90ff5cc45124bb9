"""The reason each Malformed Packet is refused with, as the fast path gives it (the client reads
it in the DISCONNECT's Reason String, the operator in the log): one case per check."""

from __future__ import annotations

import pytest

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MalformedPacket, ProtocolError


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


def test_encoder_refusals() -> None:
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
