"""Variable Byte Integers (1.5.5) and the fixed header's Remaining Length (2.1.4), in both codecs:
fastpath.encode_vbi / decode_vbi / read_fixed_header and grammar.VBI."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.clients import vbi
from support.codec import encode_hot

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol.errors import MalformedPacket

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
