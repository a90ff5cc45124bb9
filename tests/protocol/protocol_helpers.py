"""Helpers shared by the protocol tests: split a whole packet into its fixed header and body, check
one packet against golden bytes through every codec that handles it, build bodies by hand, and
assert that every decoder of a packet type rejects a body with the expected error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.clients import binary, vbi
from support.codec import decode_hot, decode_packet, encode_hot, encode_packet

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from mqttbroker.protocol.packets import PacketType

HOT = frozenset(
    {
        PacketType.PUBLISH,
        PacketType.PUBACK,
        PacketType.PUBREC,
        PacketType.PUBREL,
        PacketType.PUBCOMP,
        PacketType.PINGREQ,
        PacketType.PINGRESP,
    }
)

# Bytes around a body handed to the fast path, so that reading outside [pos, end) shows.
PAD_BEFORE = b"\xff\x00\x7f"
PAD_AFTER = b"\x00\xff\x80\x01"


def s(raw: bytes | str) -> bytes:
    """A UTF-8 Encoded String / Binary Data field: 2-byte big-endian length, then the bytes."""
    return binary(raw.encode() if isinstance(raw, str) else raw)


def props(raw: bytes) -> bytes:
    """Property Length then the given property bytes."""
    return vbi(len(raw)) + raw


def split(data: bytes) -> tuple[int, int, bytes]:
    """(packet type, flags, body) of one whole packet; asserts the Remaining Length matches."""
    header = fastpath.read_fixed_header(data, 0, len(data))
    assert header is not None, "incomplete fixed header"
    length, pos = header
    assert pos + length == len(data), f"remaining length {length} but {len(data) - pos} bytes"
    return data[0] >> 4, data[0] & 0x0F, data[pos:]


def check_golden(packet: pk.Packet, version: int, expected: bytes) -> None:
    """``expected`` (hand-written from the spec) is what every codec produces for ``packet`` and
    decodes back into ``packet``."""
    ptype, flags, body = split(expected)
    assert ptype == packet.packet_type
    assert grammar.encode(packet, version) == expected
    assert grammar.decode(ptype, flags, body, version) == packet
    assert encode_packet(packet, version) == expected
    assert decode_packet(expected[0], body, version) == packet
    if ptype in HOT:
        assert encode_hot(packet, version) == expected
        start = len(expected) - len(body)
        assert decode_hot(ptype, flags, expected, start, len(expected), version) == packet
        # The body somewhere inside a larger buffer: the decoder must stay within [pos, end).
        buffer = PAD_BEFORE + expected + PAD_AFTER
        pos = len(PAD_BEFORE) + start
        assert decode_hot(ptype, flags, buffer, pos, pos + len(body), version) == packet


def decoders(ptype: int, flags: int, body: bytes, version: int) -> list[Callable[[], pk.Packet]]:
    """Every decoder of this packet type, bound to ``body``: grammar always, the fast path for
    the hot packets (with the body inside a padded buffer)."""
    out: list[Callable[[], pk.Packet]] = [lambda: grammar.decode(ptype, flags, body, version)]
    if ptype in HOT:
        buffer = PAD_BEFORE + body + PAD_AFTER
        pos = len(PAD_BEFORE)
        out.append(lambda: decode_hot(ptype, flags, buffer, pos, pos + len(body), version))
    return out


def decode_all(ptype: int, flags: int, body: bytes, version: int) -> pk.Packet:
    """Decode with every decoder; they must agree. Returns the packet."""
    results = [decode() for decode in decoders(ptype, flags, body, version)]
    for other in results[1:]:
        assert other == results[0]
    return results[0]


def assert_rejects(
    error: type[MQTTError], code: int, ptype: int, flags: int, body: bytes, version: int
) -> None:
    """Every decoder of ``ptype`` raises exactly ``error`` carrying reason code ``code``."""
    for decode in decoders(ptype, flags, body, version):
        with pytest.raises(MQTTError) as info:
            decode()
        assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
        assert info.value.reason_code == code
