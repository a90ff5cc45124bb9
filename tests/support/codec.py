"""Whole-packet encode and decode for tests, on top of the broker's codec.

The broker never needs to encode an arbitrary packet object, nor to decode a body without a
buffer around it; tests do, to build input and read output. The codec's own tests add: split a
whole packet into its fixed header and body, check one packet against golden bytes through every
codec that handles it, build bodies by hand, and assert that every decoder of a packet type
rejects a body with the expected error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from support.clients import binary, vbi

HOT = frozenset(
    {
        pk.PacketType.PUBLISH,
        pk.PacketType.PUBACK,
        pk.PacketType.PUBREC,
        pk.PacketType.PUBREL,
        pk.PacketType.PUBCOMP,
        pk.PacketType.PINGREQ,
        pk.PacketType.PINGRESP,
        pk.PacketType.DISCONNECT,
        pk.PacketType.AUTH,
    }
)


def decode_packet(first_byte: int, body: bytes, version: int) -> pk.Packet:
    """Decode one packet body given its fixed header's first byte, as the broker does."""
    return fastpath.decode_packet(first_byte, body, 0, len(body), version)


def decode_hot(
    packet_type: int, flags: int, data: bytes, pos: int, end: int, version: int
) -> pk.Packet:
    """Decode a hot packet (PUBLISH, the four acks, PINGREQ, PINGRESP, DISCONNECT, AUTH) with
    the fast path."""
    if packet_type not in HOT:
        raise ValueError(f"packet type {packet_type} has no fast path")
    return fastpath.decode_packet(packet_type << 4 | flags, data, pos, end, version)


def encode_hot(packet: pk.Packet, version: int) -> bytes:
    """Encode a hot packet with the fast path; the same bytes grammar.encode gives."""
    if isinstance(packet, pk.Publish):
        return fastpath.encode_publish(packet, version)
    if isinstance(packet, pk.Ack):
        return fastpath.encode_ack(
            packet.packet_type, packet.packet_id, packet.reason_code, packet.properties, version
        )
    if isinstance(packet, pk.Pingreq):
        return fastpath.PINGREQ
    if isinstance(packet, pk.Pingresp):
        return fastpath.PINGRESP
    if isinstance(packet, (pk.Disconnect, pk.Auth)):
        return grammar.encode(packet, version)  # the broker encodes them with the grammar
    raise ValueError(f"{type(packet).__name__} has no fast path")


def encode_packet(packet: pk.Packet, version: int) -> bytes:
    """Encode a whole packet (fixed header included) for a connection at ``version``, with
    the encoder the broker uses for it."""
    if packet.packet_type in HOT:
        return encode_hot(packet, version)
    if isinstance(packet, pk.Connack):
        return fastpath.encode_connack(packet, version)
    if isinstance(packet, (pk.Suback, pk.Unsuback)):
        return fastpath.encode_suback(packet, version)
    return grammar.encode(packet, version)


def encoded_connect(client_id: str = "c", level: int = pk.MQTT_5, **fields: Any) -> bytes:
    """A CONNECT of ``client_id`` at protocol ``level`` (``fields``: those of pk.Connect),
    encoded with the grammar."""
    return grammar.encode(pk.Connect(client_id=client_id, protocol_level=level, **fields), level)


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
