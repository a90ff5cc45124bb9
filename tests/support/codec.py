"""Whole-packet encode and decode for tests, on top of the broker's codec.

The broker never needs to encode an arbitrary packet object, nor to decode a body without a
buffer around it; tests do, to build input and read output.
"""

from __future__ import annotations

from typing import Any

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk

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


def connect_bytes(client_id: str = "c", level: int = pk.MQTT_5, **fields: Any) -> bytes:
    """A CONNECT of ``client_id`` at protocol ``level`` (``fields``: those of pk.Connect),
    encoded with the grammar."""
    return grammar.encode(pk.Connect(client_id=client_id, protocol_level=level, **fields), level)
