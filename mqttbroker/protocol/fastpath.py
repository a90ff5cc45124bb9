"""Hand-written codec: decoders of every packet a client sends (:func:`decode_packet`, the one
dispatcher), encoders of the packets a busy broker sends most (PUBLISH, the acknowledgements,
CONNACK, SUBACK, UNSUBACK), and the fixed header, Variable Byte Integers and properties they need.

It produces and accepts exactly what ``grammar.py`` does (tests/protocol/test_fastpath.py checks
it with hypothesis) but slices bytes directly instead of going through construct.
"""

from __future__ import annotations

from typing import Any

from . import grammar
from . import packets as pk
from .errors import LimitExceeded, MalformedPacket, ProtocolError
from .packets import MQTT_5, PacketType
from .properties import SPEC, WILL, PropertyType, collect, pairs, properties_cap, too_many
from .reasons import ACK_REASON_CODES, AUTH_CODES, DISCONNECT_CODES, ReasonCode
from .rules import check_protocol, subscription_request

MAX_VBI = 268_435_455

_T = PropertyType
_TYPE_OF: dict[int, int] = {pid: spec[0] for pid, spec in SPEC.items()}


def _encode_vbi(value: int) -> bytes:
    if not 0 <= value <= MAX_VBI:
        raise ValueError(f"{value} does not fit a Variable Byte Integer")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_VBI_TABLE = [_encode_vbi(n) for n in range(16384)]
# Every one-byte bytes object: a table lookup, where building one from a tuple costs a generic
# call of the bytes type (a CONNACK would pay two). The
# first byte of a PUBLISH by its flags (DUP, QoS, RETAIN) is one of them.
_BYTES = [bytes((value,)) for value in range(256)]
_PUBLISH_FIRST = _BYTES[0x30:0x40]


def encode_vbi(value: int) -> bytes:
    """Variable Byte Integer (section 1.5.5); values up to 16383 come from a table."""
    if 0 <= value < 16384:
        return _VBI_TABLE[value]
    return _encode_vbi(value)


def _scan_vbi(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """The Variable Byte Integer at ``pos``: (value, position after it), or (-1, end) when it
    runs past ``end``. Raises MalformedPacket, naming it ``what``, if it is longer than 4 bytes
    or not minimally encoded."""
    value = 0
    shift = 0
    for index in range(4):
        if pos >= end:
            return -1, end
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if index and not byte:
                raise MalformedPacket(f"{what} is not minimally encoded")
            return value, pos
        shift += 7
    raise MalformedPacket(f"{what} is longer than 4 bytes")


def decode_vbi(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at ``pos``; returns (value, position after it). Raises
    MalformedPacket if it runs past ``end``, is longer than 4 bytes or is not minimal."""
    value, pos = _scan_vbi(data, pos, end, "Variable Byte Integer")
    if value < 0:
        raise MalformedPacket("truncated Variable Byte Integer")
    return value, pos


def read_fixed_header(data: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """Read the Remaining Length after the first byte at ``pos``. Returns (remaining length,
    position of the body), or None when more bytes are needed to know. Raises MalformedPacket for
    an over-long or non-minimal length."""
    value, body = _scan_vbi(data, pos + 1, end, "Remaining Length")
    return None if value < 0 else (value, body)


def fixed_header_size(remaining_length: int) -> int:
    """Bytes of the fixed header in front of a body of ``remaining_length`` bytes (the length is
    always minimally encoded)."""
    if remaining_length < 128:
        return 2
    if remaining_length < 16_384:
        return 3
    return 4 if remaining_length < 2_097_152 else 5


# ---------------------------------------------------------------------------------------------
# Strings and properties


def _field_end(data: bytes, pos: int, end: int, what: str) -> int:
    """Where the field at ``pos`` ends: a Two Byte Integer length, then that many bytes."""
    if pos + 2 > end:
        raise MalformedPacket(f"truncated {what} length")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise MalformedPacket(f"{what} runs past the end of the packet")
    return stop


def _utf8(data: bytes, pos: int, end: int) -> tuple[str, int]:
    stop = _field_end(data, pos, end, "string")
    try:
        text = data[pos + 2 : stop].decode()
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"string is not well-formed UTF-8: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text, stop


def _binary(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    stop = _field_end(data, pos, end, "binary data")
    return bytes(data[pos + 2 : stop]), stop


def decode_properties(
    data: bytes, pos: int, end: int, packet_type: int
) -> tuple[dict[int, Any], int]:
    """Decode a Property Length and the properties after it; returns (properties, position after)."""
    length, pos = decode_vbi(data, pos, end)
    if not length:  # most packets: nothing to collect or check
        return {}, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("properties run past the end of the packet")
    found: list[tuple[int, Any]] = []
    cap = properties_cap() or -1
    while pos < stop:
        if len(found) == cap:
            too_many(found, packet_type)
        pid, pos = decode_vbi(data, pos, stop)
        kind = _TYPE_OF.get(pid)
        value: Any
        if kind is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        if kind == _T.BYTE:
            if pos + 1 > stop:
                raise MalformedPacket("truncated property")
            value = data[pos]
            pos += 1
        elif kind == _T.TWO_BYTE:
            if pos + 2 > stop:
                raise MalformedPacket("truncated property")
            value = (data[pos] << 8) | data[pos + 1]
            pos += 2
        elif kind == _T.FOUR_BYTE:
            if pos + 4 > stop:
                raise MalformedPacket("truncated property")
            value = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
        elif kind == _T.VBI:
            value, pos = decode_vbi(data, pos, stop)
        elif kind == _T.UTF8:
            value, pos = _utf8(data, pos, stop)
        elif kind == _T.BINARY:
            value, pos = _binary(data, pos, stop)
        else:
            name, pos = _utf8(data, pos, stop)
            text, pos = _utf8(data, pos, stop)
            value = (name, text)
        found.append((pid, value))
    return collect(found, packet_type), stop


def _put_utf8(out: bytearray, text: str) -> None:
    raw = text.encode()
    if len(raw) > 65535:
        raise ValueError("string longer than 65535 bytes")
    out += len(raw).to_bytes(2, "big")
    out += raw


def encode_properties(props: dict[int, Any]) -> bytes:
    """Property Length followed by the properties (b'\\x00' when there are none)."""
    if not props:
        return b"\x00"
    out = bytearray()
    for pid, value in pairs(props):
        kind = _TYPE_OF[pid]
        out += encode_vbi(pid)
        if kind == _T.BYTE:
            out.append(value)
        elif kind == _T.TWO_BYTE:
            out += value.to_bytes(2, "big")
        elif kind == _T.FOUR_BYTE:
            out += value.to_bytes(4, "big")
        elif kind == _T.VBI:
            out += encode_vbi(value)
        elif kind == _T.UTF8:
            _put_utf8(out, value)
        elif kind == _T.BINARY:
            if len(value) > 65535:
                raise ValueError("binary data longer than 65535 bytes")
            out += len(value).to_bytes(2, "big")
            out += value
        else:
            _put_utf8(out, value[0])
            _put_utf8(out, value[1])
    return encode_vbi(len(out)) + bytes(out)


# ---------------------------------------------------------------------------------------------
# PUBLISH


def decode_publish(flags: int, data: bytes, pos: int, end: int, version: int) -> pk.Publish:
    """Decode the body of a PUBLISH that lies in ``data[pos:end]``."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if not qos and flags & 8:
        raise MalformedPacket("QoS 0 PUBLISH with DUP set")  # MQTT-3.3.1-2
    topic, p = _utf8(data, pos, end)
    packet_id = None
    if qos:
        if p + 2 > end:
            raise MalformedPacket("truncated packet identifier")
        packet_id = (data[p] << 8) | data[p + 1]
        p += 2
    if version == MQTT_5:
        if p >= end:
            raise MalformedPacket("missing property length")
        if data[p]:
            props, p = decode_properties(data, p, end, pk.PUBLISH)
        else:
            props = {}
            p += 1
    else:
        props = {}
    if packet_id == 0:
        raise ProtocolError("PUBLISH with packet identifier 0")
    return pk.Publish(topic, data[p:end], qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def scan_publish(
    first: int, data: bytes, body: int, stop: int, version: int
) -> tuple[int, int, int]:
    """Slice the PUBLISH whose fixed header starts with ``first`` and whose body is
    ``data[body:stop]``, without building a packet: (end of the topic, start of the payload,
    packet id or 0). The topic is ``data[body + 2 : topic_end]``, not checked here (the router
    checks a topic once, when it is new to its cache). A start of -1 means the PUBLISH has
    properties: decode it with :func:`decode_publish`. The same errors as decode_publish."""
    if stop - body < 2:
        raise MalformedPacket("truncated PUBLISH")
    pos = topic_end = body + 2 + ((data[body] << 8) | data[body + 1])
    if topic_end > stop:
        raise MalformedPacket("topic runs past the end of the PUBLISH")
    qos = (first >> 1) & 3
    packet_id = 0
    if qos:
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")  # MQTT-3.3.1-4
        if pos + 2 > stop:
            raise MalformedPacket("truncated PUBLISH")
        packet_id = (data[pos] << 8) | data[pos + 1]
        if not packet_id:
            raise ProtocolError("PUBLISH with packet identifier 0")
        pos += 2
    elif first & 8:
        raise MalformedPacket("QoS 0 PUBLISH with DUP set")  # MQTT-3.3.1-2
    if version == MQTT_5:
        if pos >= stop:
            raise MalformedPacket("PUBLISH without a property length")
        if data[pos]:
            return topic_end, -1, packet_id
        pos += 1
    return topic_end, pos, packet_id


def encode_publish_raw(
    flags: int, topic: bytes, packet_id: int | None, props: bytes | None, payload: bytes
) -> bytes:
    """Assemble a PUBLISH from parts already encoded: ``topic`` with its 2-byte length, ``props``
    with its Property Length (None for MQTT 3.1.1). The router uses this to encode once."""
    if packet_id is None:
        remaining = len(topic) + len(payload) + (len(props) if props is not None else 0)
        head = _PUBLISH_FIRST[flags] + encode_vbi(remaining)
        if props is None:
            return head + topic + payload
        return b"".join((head, topic, props, payload))
    remaining = len(topic) + 2 + len(payload) + (len(props) if props is not None else 0)
    return b"".join(
        (
            _PUBLISH_FIRST[flags],
            encode_vbi(remaining),
            topic,
            packet_id.to_bytes(2, "big"),
            props if props is not None else b"",
            payload,
        )
    )


def encode_topic(topic: str) -> bytes:
    raw = topic.encode()
    if len(raw) > 65535:
        raise ValueError("topic longer than 65535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def encode_publish(packet: pk.Publish, version: int) -> bytes:
    if packet.qos and not packet.packet_id:
        raise ValueError("a QoS 1 or 2 PUBLISH needs a non-zero packet identifier")
    flags = (packet.dup << 3) | (packet.qos << 1) | packet.retain
    props = encode_properties(packet.properties) if version == MQTT_5 else None
    return encode_publish_raw(
        flags,
        encode_topic(packet.topic),
        packet.packet_id if packet.qos else None,
        props,
        packet.payload,
    )


# ---------------------------------------------------------------------------------------------
# PUBACK, PUBREC, PUBREL, PUBCOMP

_ACK_FLAGS: dict[int, int] = {
    pk.PUBACK: 0,
    pk.PUBREC: 0,
    pk.PUBREL: 2,
    pk.PUBCOMP: 0,
}


def decode_ack(
    packet_type: int, flags: int, data: bytes, pos: int, end: int, version: int
) -> pk.Ack:
    if flags != _ACK_FLAGS[packet_type]:
        raise MalformedPacket(f"reserved fixed-header flags of packet type {packet_type} are wrong")
    size = end - pos
    if size < 2:
        raise MalformedPacket("acknowledgement shorter than 2 bytes")
    packet_id = (data[pos] << 8) | data[pos + 1]
    if size == 2:
        return pk.ACK_CLASSES[packet_type](packet_id)
    if version != MQTT_5:
        raise MalformedPacket("acknowledgement longer than 2 bytes")
    code = data[pos + 2]
    if code not in ACK_REASON_CODES[packet_type]:
        raise MalformedPacket(f"0x{code:02X} is not a {PacketType(packet_type).name} reason code")
    props: dict[int, Any] = {}
    if size > 3:
        length, p = decode_vbi(data, pos + 3, end)
        if p + length != end:
            raise MalformedPacket("property length does not match the packet's length")
        props = decode_properties(data, pos + 3, end, packet_type)[0]
    return pk.ACK_CLASSES[packet_type](packet_id, code, props)


def decode_reason_only(
    packet_type: int, flags: int, data: bytes, pos: int, end: int, version: int
) -> pk.Disconnect | pk.Auth:
    """DISCONNECT or AUTH: a reason code (omitted when 0x00 and no properties follow), then
    properties (omitted when none); in MQTT 3.1.1 a DISCONNECT is empty and AUTH does not
    exist. The same result and errors as grammar.decode."""
    if flags:
        raise MalformedPacket(f"reserved fixed-header flags of packet type {packet_type} are wrong")
    disconnect = packet_type == pk.DISCONNECT
    if version != MQTT_5:
        if not disconnect:
            raise MalformedPacket("AUTH does not exist before MQTT 5")
        if end != pos:
            raise MalformedPacket("DISCONNECT with a body in MQTT 3.1.1")
        return pk.Disconnect()
    code = data[pos] if end > pos else 0
    if code not in (DISCONNECT_CODES if disconnect else AUTH_CODES):
        name = "DISCONNECT" if disconnect else "AUTH"
        raise MalformedPacket(f"0x{code:02X} is not a {name} reason code")
    props: dict[int, Any] = {}
    if end - pos > 1:
        length, p = decode_vbi(data, pos + 1, end)
        if p + length != end:
            raise MalformedPacket("property length does not match the packet's length")
        props = decode_properties(data, pos + 1, end, packet_type)[0]
    return pk.Disconnect(code, props) if disconnect else pk.Auth(code, props)


def encode_ack(
    packet_type: int,
    packet_id: int,
    reason_code: int = 0,
    properties: dict[int, Any] | None = None,
    version: int = MQTT_5,
) -> bytes:
    first = (packet_type << 4) | _ACK_FLAGS[packet_type]
    # int.to_bytes: a method call, where bytes() of a tuple is a generic call of the type
    if version != MQTT_5 or (not reason_code and not properties):
        return ((first << 24) | (2 << 16) | packet_id).to_bytes(4, "big")
    if not properties:
        return ((first << 32) | (3 << 24) | (packet_id << 8) | reason_code).to_bytes(5, "big")
    props = encode_properties(properties)
    return (
        _BYTES[first]
        + encode_vbi(3 + len(props))
        + ((packet_id << 8) | reason_code).to_bytes(3, "big")
        + props
    )


PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"


# ---------------------------------------------------------------------------------------------
# Connection storms: CONNECT and SUBSCRIBE in, CONNACK, SUBACK and UNSUBACK out. Thousands of
# clients connecting and subscribing at once make these hot too (construct takes ~0.2 ms each).


def connect_version(body: bytes) -> int:
    """The protocol level at the start of a CONNECT body (3.1's "MQIsdp" included, 5 for any
    level above; the level as sent below 5), or -1 when the body does not start like a
    CONNECT: learnt before the body is decoded, so that a refusal is answered in the client's
    own version."""
    if body[:6] == b"\x00\x04MQTT" and len(body) > 6:
        return MQTT_5 if body[6] >= MQTT_5 else body[6]
    if body[:8] == b"\x00\x06MQIsdp":
        return pk.MQTT_3_1
    return -1


def decode_connect(flags: int, data: bytes, pos: int, end: int) -> pk.Connect:
    """Decode a CONNECT body; the same result and errors as grammar.decode."""
    if flags:
        raise MalformedPacket("reserved fixed-header flags of packet type 1 are wrong")
    name, p = _utf8(data, pos, end)
    if p + 4 > end:
        raise MalformedPacket("truncated CONNECT variable header")
    level = data[p]
    check_protocol(name, level)
    connect_flags = data[p + 1]
    keep_alive = (data[p + 2] << 8) | data[p + 3]
    p += 4
    props: dict[int, Any] = {}
    if level == MQTT_5:
        props, p = decode_properties(data, p, end, pk.CONNECT)
    client_id, p = _utf8(data, p, end)
    will_flag = connect_flags & 0x04
    will_qos = (connect_flags >> 3) & 3
    will_retain = bool(connect_flags & 0x20)
    will = None
    if will_flag:
        will_props: dict[int, Any] = {}
        if level == MQTT_5:
            will_props, p = decode_properties(data, p, end, WILL)
        will_topic, p = _utf8(data, p, end)
        will_payload, p = _binary(data, p, end)
        will = pk.Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if connect_flags & 0x80:
        username, p = _utf8(data, p, end)
    if connect_flags & 0x40:
        password, p = _binary(data, p, end)
    if p != end:
        raise MalformedPacket("bytes after the end of the CONNECT payload")
    if connect_flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is not 0")  # MQTT-3.1.2-3
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("Will QoS/Retain set without the Will Flag")  # MQTT-3.1.2-11/-13
    if will_qos == 3:
        raise MalformedPacket("Will QoS 3")  # MQTT-3.1.2-12
    if level != MQTT_5 and password is not None and username is None:
        raise MalformedPacket("password without user name (MQTT 3.1.1)")
    return pk.Connect(
        client_id,
        level,
        name,
        bool(connect_flags & 0x02),
        keep_alive,
        username,
        password,
        will,
        props,
    )


def _decode_filters(
    packet_type: int, flags: int, data: bytes, pos: int, end: int, version: int, max_filters: int
) -> tuple[int, list[tuple[str, int]], dict[int, Any]]:
    """The packet identifier, the (topic filter, options byte) pairs and the properties of a
    SUBSCRIBE or an UNSUBSCRIBE (whose filters have no options byte: 0); the same errors as
    grammar.decode. More than ``max_filters`` topic filters (0: no limit) is refused whole, as
    soon as the next one starts: LimitExceeded with 0x97, Quota exceeded."""
    name = "SUBSCRIBE" if packet_type == pk.SUBSCRIBE else "UNSUBSCRIBE"
    if flags != 2:
        raise MalformedPacket(f"reserved fixed-header flags of packet type {packet_type} are wrong")
    if pos + 2 > end:
        raise MalformedPacket("truncated packet identifier")
    packet_id = (data[pos] << 8) | data[pos + 1]
    p = pos + 2
    props: dict[int, Any] = {}
    if version == MQTT_5:
        props, p = decode_properties(data, p, end, packet_type)
    with_options = packet_type == pk.SUBSCRIBE
    entries: list[tuple[str, int]] = []
    limit = max_filters or -1
    while p < end:
        if len(entries) == limit:
            raise LimitExceeded(
                f"{name} with more than {max_filters} topic filters", ReasonCode.QUOTA_EXCEEDED
            )
        topic_filter, p = _utf8(data, p, end)
        options = 0
        if with_options:
            if p >= end:
                raise MalformedPacket("topic filter without subscription options")
            options = data[p]
            p += 1
        entries.append((topic_filter, options))
    if packet_id == 0:
        raise ProtocolError(f"{name} with packet identifier 0")
    if not entries:
        raise ProtocolError(f"{name} with no topic filter")  # MQTT-3.8.3-2, MQTT-3.10.3-2
    return packet_id, entries, props


def decode_subscribe(
    flags: int, data: bytes, pos: int, end: int, version: int, max_filters: int = 0
) -> pk.Subscribe:
    """Decode a SUBSCRIBE body (see _decode_filters)."""
    packet_id, entries, props = _decode_filters(
        pk.SUBSCRIBE, flags, data, pos, end, version, max_filters
    )
    requests = [subscription_request(f, options, version) for f, options in entries]
    return pk.Subscribe(packet_id, requests, props)


def decode_unsubscribe(
    flags: int, data: bytes, pos: int, end: int, version: int, max_filters: int = 0
) -> pk.Unsubscribe:
    """Decode an UNSUBSCRIBE body (see _decode_filters)."""
    packet_id, entries, props = _decode_filters(
        pk.UNSUBSCRIBE, flags, data, pos, end, version, max_filters
    )
    return pk.Unsubscribe(packet_id, [f for f, _ in entries], props)


def _with_header(first: int, body: bytes) -> bytes:
    return _BYTES[first] + encode_vbi(len(body)) + body


def encode_connack(packet: pk.Connack, version: int) -> bytes:
    body = ((256 if packet.session_present else 0) | packet.reason_code).to_bytes(2, "big")
    if version == MQTT_5:
        body += encode_properties(packet.properties)
    return _with_header(0x20, body)


def encode_suback(packet: pk.Suback | pk.Unsuback, version: int) -> bytes:
    """SUBACK, or UNSUBACK (whose reason codes exist in MQTT 5 only)."""
    first = 0x90 if isinstance(packet, pk.Suback) else 0xB0
    body = packet.packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += encode_properties(packet.properties)
    if version == MQTT_5 or first == 0x90:
        codes = packet.reason_codes
        # one filter (most requests): a table lookup, not bytes() of a list
        body += _BYTES[codes[0]] if len(codes) == 1 else bytes(codes)
    return _with_header(first, body)


# ---------------------------------------------------------------------------------------------
# The one dispatcher: what the broker's connection calls for every packet it receives.


def decode_packet(
    first: int, data: bytes, pos: int, end: int, version: int, max_filters: int = 0
) -> pk.Packet:
    """Decode the packet whose fixed header's first byte is ``first`` and whose body is
    ``data[pos:end]``, for a connection at ``version``: every packet a client sends by the
    hand-written code above (the grammar decodes only what a server sends: CONNACK, SUBACK,
    UNSUBACK).
    A SUBSCRIBE or UNSUBSCRIBE of more than ``max_filters`` filters (0: no limit) is refused
    whole (LimitExceeded, 0x97). (The broker slices a PUBLISH without properties with
    :func:`scan_publish` instead, without a packet object.)"""
    ptype = first >> 4
    flags = first & 0x0F
    if ptype == pk.PUBLISH:
        return decode_publish(flags, data, pos, end, version)
    if pk.PUBACK <= ptype <= pk.PUBCOMP:
        return decode_ack(ptype, flags, data, pos, end, version)
    if ptype == pk.PINGREQ or ptype == pk.PINGRESP:
        if flags or end != pos:
            raise MalformedPacket("PINGREQ/PINGRESP with flags or a body")
        return pk.Pingreq() if ptype == pk.PINGREQ else pk.Pingresp()
    if ptype == pk.CONNECT:
        return decode_connect(flags, data, pos, end)
    if ptype == pk.SUBSCRIBE:
        return decode_subscribe(flags, data, pos, end, version, max_filters)
    if ptype == pk.DISCONNECT or ptype == pk.AUTH:
        return decode_reason_only(ptype, flags, data, pos, end, version)
    if ptype == pk.UNSUBSCRIBE:
        return decode_unsubscribe(flags, data, pos, end, version, max_filters)
    if ptype == 0:
        raise MalformedPacket("reserved packet type 0")
    return grammar.decode(ptype, flags, data[pos:end], version)
