"""The MQTT wire format, and nothing else: bytes <-> packet objects. No asyncio, no broker state."""

from __future__ import annotations

from . import fastpath, grammar
from .errors import MalformedPacket
from .packets import Connack, Packet, PacketType, Suback, Unsuback

_HOT: frozenset[int] = frozenset(
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


def decode_packet(first_byte: int, body: bytes, version: int) -> Packet:
    """Decode one packet body given its fixed header's first byte (fast path for hot packets)."""
    ptype = first_byte >> 4
    if ptype in _HOT:
        return fastpath.decode(ptype, first_byte & 0x0F, body, 0, len(body), version)
    if ptype == PacketType.CONNECT:
        return fastpath.decode_connect(first_byte & 0x0F, body, 0, len(body))
    if ptype == PacketType.SUBSCRIBE:
        return fastpath.decode_subscribe(first_byte & 0x0F, body, 0, len(body), version)
    if ptype == 0:
        raise MalformedPacket("reserved packet type 0")
    return grammar.decode(ptype, first_byte & 0x0F, body, version)


def encode_packet(packet: Packet, version: int) -> bytes:
    """Encode a whole packet (fixed header included) for a connection at ``version``."""
    if packet.packet_type in _HOT:
        return fastpath.encode(packet, version)
    if isinstance(packet, Connack):
        return fastpath.encode_connack(packet, version)
    if isinstance(packet, (Suback, Unsuback)):
        return fastpath.encode_suback(packet, version)
    return grammar.encode(packet, version)
