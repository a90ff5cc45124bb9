"""The wire grammar of every MQTT 5.0 and 3.1.1 control packet, written with ``construct``.

This module is the reference codec: it reads like the spec's sections 2 and 3 and decodes or
encodes any packet. It is about 30x slower than hand-written slicing, so the hot packets (PUBLISH,
the four acknowledgements, PINGREQ/PINGRESP) also have a fast path in ``fastpath.py``; a
property-based test checks that the two agree in both directions.

Entry points: :func:`decode` (packet type and flags from the fixed header, the body bytes and the
protocol level) and :func:`encode` (a packet dataclass and the protocol level, giving the whole
packet with its fixed header).
"""

from __future__ import annotations

from typing import Any

from construct import (
    Adapter,
    BitsInteger,
    BitStruct,
    Byte,
    Construct,
    ConstructError,
    Flag,
    GreedyBytes,
    If,
    Int16ub,
    Int32ub,
    ListContainer,
    Prefixed,
    Sequence,
    Struct,
    Subconstruct,
    Switch,
    Terminated,
    VarInt,
    this,
)
from construct.core import stream_iseof, stream_read

from . import packets as pk
from .errors import MalformedPacket, MQTTError, ProtocolError
from .packets import MQTT_5, PacketType
from .properties import SPEC, WILL, PropertyType, collect, pairs, properties_cap, too_many
from .reasons import (
    ACK_REASON_CODES,
    AUTH_CODES,
    CONNACK_CODES,
    DISCONNECT_CODES,
    SUBACK_CODES,
    UNSUBACK_CODES,
)
from .rules import check_protocol, subscription_request

# ---------------------------------------------------------------------------------------------
# Data types (section 1.5)


class _VariableByteInteger(Construct):
    """Section 1.5.5: 7 bits per byte, least significant first, at most 4 bytes, and (MQTT-1.5.5-1)
    the shortest encoding."""

    def _parse(self, stream: Any, context: Any, path: Any) -> int:
        value = 0
        shift = 0
        for index in range(4):
            byte = stream_read(stream, 1, path)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if index and not byte:
                    raise MalformedPacket("Variable Byte Integer is not minimally encoded")
                return int(value)
            shift += 7
        raise MalformedPacket("Variable Byte Integer is longer than 4 bytes")

    def _build(self, obj: int, stream: Any, context: Any, path: Any) -> int:
        if not 0 <= obj <= 268_435_455:
            raise ValueError(f"{obj} does not fit a Variable Byte Integer")
        return int(VarInt._build(obj, stream, context, path))  # the same 7-bit groups


VBI = _VariableByteInteger()


class _Utf8(Adapter):
    """Section 1.5.4: well-formed UTF-8 (no surrogates, MQTT-1.5.4-1), no U+0000 (MQTT-1.5.4-2);
    a BOM is kept as U+FEFF (MQTT-1.5.4-3), which Python's strict 'utf-8' codec does."""

    def _decode(self, obj: bytes, context: Any, path: Any) -> str:
        try:
            text = obj.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedPacket(f"string is not well-formed UTF-8: {exc.reason}") from None
        if "\x00" in text:
            raise MalformedPacket("string contains U+0000")
        return text

    def _encode(self, obj: str, context: Any, path: Any) -> bytes:
        return obj.encode("utf-8")


UTF8 = _Utf8(Prefixed(Int16ub, GreedyBytes))
Binary = Prefixed(Int16ub, GreedyBytes)


class _UnknownProperty(Construct):
    def _parse(self, stream: Any, context: Any, path: Any) -> None:
        raise MalformedPacket(f"unknown property identifier 0x{context.id:02X}")

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> None:
        raise ValueError(f"unknown property identifier 0x{context.id:02X}")


class _UntilEnd(Subconstruct):
    """Repeat ``subcon`` until its stream is exhausted; unlike GreedyRange, errors propagate."""

    def _parse(self, stream: Any, context: Any, path: Any) -> ListContainer:
        items = ListContainer()
        while not stream_iseof(stream):
            items.append(self.subcon._parsereport(stream, context, path))
        return items

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> Any:
        for item in obj:
            self.subcon._build(item, stream, context, path)
        return obj


class _PropertyList(_UntilEnd):
    """Properties until the end, but no more than one past :func:`properties_cap`: the caller
    (``_props``) refuses the packet then, without the rest decoded."""

    def _parse(self, stream: Any, context: Any, path: Any) -> ListContainer:
        items = ListContainer()
        cap = properties_cap()
        while not stream_iseof(stream) and (not cap or len(items) <= cap):
            items.append(self.subcon._parsereport(stream, context, path))
        return items


_PROPERTY_VALUE = {
    PropertyType.BYTE: Byte,
    PropertyType.TWO_BYTE: Int16ub,
    PropertyType.FOUR_BYTE: Int32ub,
    PropertyType.VBI: VBI,
    PropertyType.UTF8: UTF8,
    PropertyType.BINARY: Binary,
    PropertyType.UTF8_PAIR: Sequence(UTF8, UTF8),
}
_TYPE_OF = {pid: spec[0] for pid, spec in SPEC.items()}

Property = Struct(
    "id" / VBI,
    "value" / Switch(lambda ctx: _TYPE_OF.get(ctx.id), _PROPERTY_VALUE, default=_UnknownProperty()),
)
# Section 2.2.2: Property Length (VBI) then the properties.
Properties = Prefixed(VBI, _PropertyList(Property))


def _v5(ctx: Any) -> bool:
    return bool(ctx._params.version == MQTT_5)


# ---------------------------------------------------------------------------------------------
# Packets (section 3). Each body is parsed with params: version, flags, length.

ConnectHeader = Struct("protocol_name" / UTF8, "protocol_level" / Byte)

Connect = Struct(
    "protocol_name" / UTF8,
    "protocol_level" / Byte,
    "flags"
    / BitStruct(
        "username" / Flag,
        "password" / Flag,
        "will_retain" / Flag,
        "will_qos" / BitsInteger(2),
        "will_flag" / Flag,
        "clean_start" / Flag,
        "reserved" / Flag,
    ),
    "keep_alive" / Int16ub,
    "properties" / If(this.protocol_level == MQTT_5, Properties),
    "client_id" / UTF8,
    "will_properties" / If(lambda c: c.flags.will_flag and c.protocol_level == MQTT_5, Properties),
    "will_topic" / If(this.flags.will_flag, UTF8),
    "will_payload" / If(this.flags.will_flag, Binary),
    "username" / If(this.flags.username, UTF8),
    "password" / If(this.flags.password, Binary),
    Terminated,
)

Connack = Struct(
    "flags" / Byte,
    "reason_code" / Byte,
    "properties" / If(_v5, Properties),
    Terminated,
)

Publish = Struct(
    "topic" / UTF8,
    "packet_id" / If(lambda c: (c._params.flags >> 1) & 3, Int16ub),
    "properties" / If(_v5, Properties),
    "payload" / GreedyBytes,
)

# PUBACK, PUBREC, PUBREL, PUBCOMP: the reason code may be omitted when it is 0x00 and there are no
# properties (remaining length 2); the properties may be omitted when the length is 3.
Ack = Struct(
    "packet_id" / Int16ub,
    "reason_code" / If(lambda c: _v5(c) and c._params.length > 2, Byte),
    "properties" / If(lambda c: _v5(c) and c._params.length > 3, Properties),
    Terminated,
)

Subscribe = Struct(
    "packet_id" / Int16ub,
    "properties" / If(_v5, Properties),
    "subscriptions" / _UntilEnd(Struct("topic_filter" / UTF8, "options" / Byte)),
)

Suback = Struct(
    "packet_id" / Int16ub,
    "properties" / If(_v5, Properties),
    "reason_codes" / GreedyBytes,
)

Unsubscribe = Struct(
    "packet_id" / Int16ub,
    "properties" / If(_v5, Properties),
    "topic_filters" / _UntilEnd(UTF8),
)

Unsuback = Struct(
    "packet_id" / Int16ub,
    "properties" / If(_v5, Properties),
    "reason_codes" / If(_v5, GreedyBytes),
    Terminated,
)

Empty = Struct(Terminated)

# DISCONNECT and AUTH: reason code omitted when 0x00 with no properties (length 0); properties
# omitted when the length is 1. In 3.1.1 DISCONNECT is empty and AUTH does not exist.
ReasonOnly = Struct(
    "reason_code" / If(lambda c: _v5(c) and c._params.length > 0, Byte),
    "properties" / If(lambda c: _v5(c) and c._params.length > 1, Properties),
    Terminated,
)

BODY: dict[int, Construct] = {
    PacketType.CONNECT: Connect,
    PacketType.CONNACK: Connack,
    PacketType.PUBLISH: Publish,
    PacketType.PUBACK: Ack,
    PacketType.PUBREC: Ack,
    PacketType.PUBREL: Ack,
    PacketType.PUBCOMP: Ack,
    PacketType.SUBSCRIBE: Subscribe,
    PacketType.SUBACK: Suback,
    PacketType.UNSUBSCRIBE: Unsubscribe,
    PacketType.UNSUBACK: Unsuback,
    PacketType.PINGREQ: Empty,
    PacketType.PINGRESP: Empty,
    PacketType.DISCONNECT: ReasonOnly,
    PacketType.AUTH: ReasonOnly,
}

# ---------------------------------------------------------------------------------------------
# Decoding


def _props(raw: Any, packet_type: int) -> dict[int, Any]:
    if raw is None:
        return {}
    found = [(e.id, tuple(e.value) if isinstance(e.value, list) else e.value) for e in raw]
    cap = properties_cap()
    if cap and len(found) > cap:
        too_many(found, packet_type)
    return collect(found, packet_type)


def _check_code(code: int, allowed: frozenset[int], what: str) -> int:
    if code not in allowed:
        raise MalformedPacket(f"0x{code:02X} is not a {what} reason code")
    return code


def decode(packet_type: int, flags: int, body: bytes, version: int) -> pk.Packet:
    """Decode one packet body. ``version`` is the connection's protocol level (CONNECT carries its
    own). Raises MalformedPacket / ProtocolError / UnsupportedProtocolVersion."""
    if packet_type not in BODY:
        raise MalformedPacket(f"reserved packet type {packet_type}")
    required = pk.REQUIRED_FLAGS.get(packet_type)
    if required is not None and flags != required:
        raise MalformedPacket(f"reserved fixed-header flags of packet type {packet_type} are wrong")
    if packet_type == PacketType.AUTH and version != MQTT_5:
        raise MalformedPacket("AUTH does not exist before MQTT 5")
    if packet_type == PacketType.PUBLISH and (flags >> 1) & 3 == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if packet_type == PacketType.PUBLISH and flags & 0x0E == 0x08:
        raise MalformedPacket("QoS 0 PUBLISH with DUP set")  # MQTT-3.3.1-2
    try:
        if packet_type == PacketType.CONNECT:
            head = ConnectHeader.parse(body)
            check_protocol(head.protocol_name, head.protocol_level)
            version = head.protocol_level
        raw = BODY[packet_type].parse(body, version=version, flags=flags, length=len(body))
    except MQTTError:
        raise
    except ConstructError as exc:
        raise MalformedPacket(f"malformed packet: {exc}") from None
    return _to_packet(packet_type, flags, raw, version)


def _to_packet(packet_type: int, flags: int, raw: Any, version: int) -> pk.Packet:
    T = PacketType
    if packet_type == T.PUBLISH:
        qos = (flags >> 1) & 3
        if qos and raw.packet_id == 0:
            raise ProtocolError("PUBLISH with packet identifier 0")
        return pk.Publish(
            topic=raw.topic,
            payload=raw.payload,
            qos=qos,
            retain=bool(flags & 1),
            dup=bool(flags & 8),
            packet_id=raw.packet_id,
            properties=_props(raw.properties, T.PUBLISH),
        )
    if packet_type in pk.ACK_CLASSES:
        code = 0 if raw.reason_code is None else raw.reason_code
        _check_code(code, ACK_REASON_CODES[packet_type], T(packet_type).name)
        return pk.ACK_CLASSES[packet_type](raw.packet_id, code, _props(raw.properties, packet_type))
    if packet_type == T.CONNECT:
        return _to_connect(raw)
    if packet_type == T.CONNACK:
        if raw.flags & 0xFE:
            raise MalformedPacket("reserved CONNACK acknowledge flags are not 0")
        if version == MQTT_5:
            _check_code(raw.reason_code, CONNACK_CODES, "CONNACK")
        return pk.Connack(bool(raw.flags & 1), raw.reason_code, _props(raw.properties, T.CONNACK))
    if packet_type == T.SUBSCRIBE:
        return _to_subscribe(raw, version)
    if packet_type == T.SUBACK:
        codes = list(raw.reason_codes)
        for code in codes:
            if version == MQTT_5:
                _check_code(code, SUBACK_CODES, "SUBACK")
            elif code not in (0, 1, 2, 0x80):
                raise MalformedPacket(f"0x{code:02X} is not a SUBACK return code")
        return pk.Suback(raw.packet_id, codes, _props(raw.properties, T.SUBACK))
    if packet_type == T.UNSUBSCRIBE:
        if raw.packet_id == 0:
            raise ProtocolError("UNSUBSCRIBE with packet identifier 0")
        if not raw.topic_filters:
            raise ProtocolError("UNSUBSCRIBE with no topic filter")
        return pk.Unsubscribe(
            raw.packet_id, list(raw.topic_filters), _props(raw.properties, T.UNSUBSCRIBE)
        )
    if packet_type == T.UNSUBACK:
        codes = list(raw.reason_codes or b"")
        for code in codes:
            _check_code(code, UNSUBACK_CODES, "UNSUBACK")
        return pk.Unsuback(raw.packet_id, codes, _props(raw.properties, T.UNSUBACK))
    if packet_type == T.PINGREQ:
        return pk.Pingreq()
    if packet_type == T.PINGRESP:
        return pk.Pingresp()
    if packet_type == T.DISCONNECT:
        code = 0 if raw.reason_code is None else raw.reason_code
        _check_code(code, DISCONNECT_CODES, "DISCONNECT")
        return pk.Disconnect(code, _props(raw.properties, T.DISCONNECT))
    if packet_type == T.AUTH:
        code = 0 if raw.reason_code is None else raw.reason_code
        _check_code(code, AUTH_CODES, "AUTH")
        return pk.Auth(code, _props(raw.properties, T.AUTH))
    raise MalformedPacket(f"reserved packet type {packet_type}")


def _to_connect(raw: Any) -> pk.Connect:
    f = raw.flags
    if f.reserved:
        raise MalformedPacket("CONNECT reserved flag is not 0")  # MQTT-3.1.2-3
    if not f.will_flag and (f.will_qos or f.will_retain):
        raise MalformedPacket("Will QoS/Retain set without the Will Flag")  # MQTT-3.1.2-11/-13
    if f.will_qos == 3:
        raise MalformedPacket("Will QoS 3")  # MQTT-3.1.2-12
    if raw.protocol_level != MQTT_5 and f.password and not f.username:
        raise MalformedPacket("password without user name (MQTT 3.1.1)")
    will = None
    if f.will_flag:
        will = pk.Will(
            topic=raw.will_topic,
            payload=raw.will_payload,
            qos=f.will_qos,
            retain=f.will_retain,
            properties=_props(raw.will_properties, WILL),
        )
    return pk.Connect(
        client_id=raw.client_id,
        protocol_level=raw.protocol_level,
        protocol_name=raw.protocol_name,
        clean_start=f.clean_start,
        keep_alive=raw.keep_alive,
        username=raw.username,
        password=raw.password,
        will=will,
        properties=_props(raw.properties, PacketType.CONNECT),
    )


def _to_subscribe(raw: Any, version: int) -> pk.Subscribe:
    if raw.packet_id == 0:
        raise ProtocolError("SUBSCRIBE with packet identifier 0")
    if not raw.subscriptions:
        raise ProtocolError("SUBSCRIBE with no topic filter")  # MQTT-3.8.3-2
    requests = [
        subscription_request(entry.topic_filter, entry.options, version)
        for entry in raw.subscriptions
    ]
    return pk.Subscribe(raw.packet_id, requests, _props(raw.properties, PacketType.SUBSCRIBE))


# ---------------------------------------------------------------------------------------------
# Encoding


def _raw_props(props: dict[int, Any]) -> list[dict[str, Any]]:
    return [{"id": pid, "value": value} for pid, value in pairs(props)]


def _fixed_header(packet_type: int, flags: int, body: bytes) -> bytes:
    return bytes([(packet_type << 4) | flags]) + bytes(VBI.build(len(body))) + body


def _build(con: Construct, obj: dict[str, Any], version: int, flags: int, length: int) -> bytes:
    return bytes(con.build(obj, version=version, flags=flags, length=length))


def encode(packet: pk.Packet, version: int = MQTT_5) -> bytes:
    """Encode ``packet`` for a connection at protocol ``version`` (CONNECT uses its own level).
    Optional fields are omitted exactly where the spec allows (acks with reason 0x00 and no
    properties are 2 bytes; DISCONNECT/AUTH with 0x00 and none are empty)."""
    T = PacketType
    ptype = packet.packet_type
    flags = pk.REQUIRED_FLAGS.get(ptype, 0)
    v5 = version == MQTT_5
    if isinstance(packet, pk.Publish):
        if packet.qos and not packet.packet_id:
            raise ValueError("a QoS 1 or 2 PUBLISH needs a non-zero packet identifier")
        flags = (packet.dup << 3) | (packet.qos << 1) | packet.retain
        obj: dict[str, Any] = {
            "topic": packet.topic,
            "packet_id": packet.packet_id,
            "properties": _raw_props(packet.properties),
            "payload": packet.payload,
        }
        body = _build(Publish, obj, version, flags, 0)
    elif isinstance(packet, pk.Ack):
        length = 2
        if v5 and (packet.reason_code or packet.properties):
            length = 4 if packet.properties else 3
        obj = {
            "packet_id": packet.packet_id,
            "reason_code": packet.reason_code,
            "properties": _raw_props(packet.properties),
        }
        body = _build(Ack, obj, version, flags, length)
    elif isinstance(packet, pk.Connect):
        body = _build(Connect, _from_connect(packet), packet.protocol_level, flags, 0)
    elif isinstance(packet, pk.Connack):
        obj = {
            "flags": int(packet.session_present),
            "reason_code": packet.reason_code,
            "properties": _raw_props(packet.properties),
        }
        body = _build(Connack, obj, version, flags, 0)
    elif isinstance(packet, pk.Subscribe):
        subs = [
            {
                "topic_filter": s.topic_filter,
                "options": s.qos
                | (s.no_local << 2)
                | (s.retain_as_published << 3)
                | (s.retain_handling << 4),
            }
            for s in packet.subscriptions
        ]
        obj = {
            "packet_id": packet.packet_id,
            "properties": _raw_props(packet.properties),
            "subscriptions": subs,
        }
        body = _build(Subscribe, obj, version, flags, 0)
    elif isinstance(packet, (pk.Suback, pk.Unsuback)):
        obj = {
            "packet_id": packet.packet_id,
            "properties": _raw_props(packet.properties),
            "reason_codes": bytes(packet.reason_codes),
        }
        body = _build(Suback if ptype == T.SUBACK else Unsuback, obj, version, flags, 0)
    elif isinstance(packet, pk.Unsubscribe):
        obj = {
            "packet_id": packet.packet_id,
            "properties": _raw_props(packet.properties),
            "topic_filters": packet.topic_filters,
        }
        body = _build(Unsubscribe, obj, version, flags, 0)
    elif isinstance(packet, (pk.Pingreq, pk.Pingresp)):
        body = b""
    elif isinstance(packet, pk.ReasonOnly):
        if ptype == T.AUTH and not v5:
            raise ValueError("AUTH does not exist before MQTT 5")
        length = 0
        if v5 and (packet.reason_code or packet.properties):
            length = 2 if packet.properties else 1
        obj = {"reason_code": packet.reason_code, "properties": _raw_props(packet.properties)}
        body = _build(ReasonOnly, obj, version, flags, length)
    else:  # pragma: no cover - the union above is exhaustive
        raise TypeError(f"not a packet: {packet!r}")
    return _fixed_header(ptype, flags, body)


def _from_connect(packet: pk.Connect) -> dict[str, Any]:
    will = packet.will
    return {
        "protocol_name": packet.protocol_name,
        "protocol_level": packet.protocol_level,
        "flags": {
            "username": packet.username is not None,
            "password": packet.password is not None,
            "will_retain": bool(will and will.retain),
            "will_qos": will.qos if will else 0,
            "will_flag": will is not None,
            "clean_start": packet.clean_start,
            "reserved": False,
        },
        "keep_alive": packet.keep_alive,
        "properties": _raw_props(packet.properties),
        "client_id": packet.client_id,
        "will_properties": _raw_props(will.properties) if will else None,
        "will_topic": will.topic if will else None,
        "will_payload": will.payload if will else None,
        "username": packet.username,
        "password": packet.password,
    }
