"""A small, independent MQTT codec and a raw socket client for black-box conformance tests.

Deliberately separate from ``mqttbroker.protocol``: the suite must judge any broker (``--broker``,
``--mosquitto``) and must not share a codec bug with the broker it checks. Builders take raw
``bytes`` wherever a test needs to send something the spec forbids (invalid UTF-8, odd flags).

Every packet the broker sends is parsed strictly (:func:`parse`): fixed-header flags, minimal
Variable Byte Integers, well-formed UTF-8 without U+0000, defined reason codes, properties allowed
in that packet. A violation fails the test with :class:`BrokerViolation`.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Seconds to wait for a packet the broker must send, and the quiet window used to conclude that
# it sends nothing (only where no later event can serve as a barrier).
WAIT = 3.0
QUIET = 0.3
# Testing a cluster (--cluster): a message acknowledged by one node reaches a subscriber on
# another a moment later (through Redis), so the PINGREQ barrier waits this long first.
SETTLE = 0.0

MQTT_311 = 4
MQTT_5 = 5

# Packet types.
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}

# Fixed-header flags every packet but PUBLISH must carry (section 2.1.3).
FLAGS = {t: 0 for t in NAMES}
FLAGS.update({PUBREL: 2, SUBSCRIBE: 2, UNSUBSCRIBE: 2})


class P:
    """Property identifiers (section 2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


_BYTE, _U16, _U32, _VBI, _STR, _BIN, _PAIR = range(7)
PROPERTY_TYPES = {
    0x01: _BYTE,
    0x02: _U32,
    0x03: _STR,
    0x08: _STR,
    0x09: _BIN,
    0x0B: _VBI,
    0x11: _U32,
    0x12: _STR,
    0x13: _U16,
    0x15: _STR,
    0x16: _BIN,
    0x17: _BYTE,
    0x18: _U32,
    0x19: _BYTE,
    0x1A: _STR,
    0x1C: _STR,
    0x1F: _STR,
    0x21: _U16,
    0x22: _U16,
    0x23: _U16,
    0x24: _BYTE,
    0x25: _BYTE,
    0x26: _PAIR,
    0x27: _U32,
    0x28: _BYTE,
    0x29: _BYTE,
    0x2A: _BYTE,
}

# Properties a server may put in each packet it sends (section 2.2.2.2 table).
SERVER_PROPERTIES = {
    CONNACK: {
        0x11,
        0x12,
        0x13,
        0x15,
        0x16,
        0x1A,
        0x1C,
        0x1F,
        0x21,
        0x22,
        0x24,
        0x25,
        0x26,
        0x27,
        0x28,
        0x29,
        0x2A,
    },
    PUBLISH: {0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x23, 0x26},
    PUBACK: {0x1F, 0x26},
    PUBREC: {0x1F, 0x26},
    PUBREL: {0x1F, 0x26},
    PUBCOMP: {0x1F, 0x26},
    SUBACK: {0x1F, 0x26},
    UNSUBACK: {0x1F, 0x26},
    DISCONNECT: {0x1C, 0x1F, 0x26},  # never Session Expiry Interval from a server (3.14.2-2)
    AUTH: {0x15, 0x16, 0x1F, 0x26},
}
REPEATABLE = {P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER}

# Reason codes each packet may carry (sections 3.2.2.2, 3.4.2.1 ... 3.15.2.1).
REASON_CODES = {
    CONNACK: {
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
    },
    PUBACK: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
    PUBREC: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
    PUBREL: {0x00, 0x92},
    PUBCOMP: {0x00, 0x92},
    SUBACK: {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2},
    UNSUBACK: {0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91},
    DISCONNECT: {
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
    },
    AUTH: {0x00, 0x18, 0x19},
}
# MQTT 3.1.1 CONNACK return codes and SUBACK codes.
V311_CONNACK_CODES = {0, 1, 2, 3, 4, 5}
V311_SUBACK_CODES = {0, 1, 2, 0x80}


class BrokerViolation(AssertionError):
    """The broker sent bytes the spec does not allow."""


class ConnectionClosed(AssertionError):
    """The broker closed the connection while the test expected a packet."""


class NoPacket(AssertionError):
    """No packet arrived within the time allowed."""


# -- encoding -------------------------------------------------------------------------------------


def vbi(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def u16(value: int) -> bytes:
    return struct.pack("!H", value)


def u32(value: int) -> bytes:
    return struct.pack("!I", value)


def string(value: str | bytes) -> bytes:
    """A UTF-8 Encoded String; ``bytes`` are sent as they are (for malformed-input tests)."""
    data = value.encode() if isinstance(value, str) else value
    return u16(len(data)) + data


def binary(value: bytes) -> bytes:
    return u16(len(value)) + value


Props = Sequence[tuple[int, Any]]


def properties(props: Props | None) -> bytes:
    """Properties with their length prefix; ``props`` is a list of (id, value) in wire order."""
    body = bytearray()
    for pid, value in props or ():
        body += vbi(pid)
        kind = PROPERTY_TYPES[pid]
        if kind == _BYTE:
            body.append(value)
        elif kind == _U16:
            body += u16(value)
        elif kind == _U32:
            body += u32(value)
        elif kind == _VBI:
            body += vbi(value)
        elif kind == _STR:
            body += string(value)
        elif kind == _BIN:
            body += binary(value)
        else:
            body += string(value[0]) + string(value[1])
    return vbi(len(body)) + bytes(body)


def packet(first_byte: int, body: bytes) -> bytes:
    """A whole packet: first byte, Remaining Length, body."""
    return bytes([first_byte]) + vbi(len(body)) + body


def body_of(raw: bytes) -> bytes:
    """The bytes after a packet's fixed header."""
    pos = 1
    while raw[pos] & 0x80:
        pos += 1
    return raw[pos + 1 :]


def with_body(raw: bytes, body: bytes) -> bytes:
    """``raw``'s first byte with another body (Remaining Length recomputed)."""
    return packet(raw[0], body)


def connect(
    client_id: str | bytes = "",
    *,
    version: int = MQTT_5,
    clean_start: bool = True,
    keepalive: int = 60,
    props: Props | None = None,
    will_topic: str | bytes | None = None,
    will_payload: bytes = b"",
    will_qos: int = 0,
    will_retain: bool = False,
    will_props: Props | None = None,
    username: str | bytes | None = None,
    password: bytes | None = None,
    protocol_name: str | bytes = "MQTT",
    flags: int | None = None,
) -> bytes:
    """CONNECT; ``flags`` overrides the computed Connect Flags byte."""
    if flags is None:
        flags = (clean_start << 1) | (will_qos << 3) | (will_retain << 5)
        flags |= (will_topic is not None) << 2
        flags |= (password is not None) << 6
        flags |= (username is not None) << 7
    body = string(protocol_name) + bytes([version, flags]) + u16(keepalive)
    if version == MQTT_5:
        body += properties(props)
    body += string(client_id)
    if will_topic is not None:
        if version == MQTT_5:
            body += properties(will_props)
        body += string(will_topic) + binary(will_payload)
    if username is not None:
        body += string(username)
    if password is not None:
        body += binary(password)
    return packet(0x10, body)


def publish(
    topic: str | bytes,
    payload: bytes = b"",
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    props: Props | None = None,
    version: int = MQTT_5,
) -> bytes:
    body = string(topic)
    if qos:
        body += u16(packet_id if packet_id is not None else 1)
    elif packet_id is not None:
        body += u16(packet_id)
    if version == MQTT_5:
        body += properties(props)
    return packet(0x30 | (dup << 3) | (qos << 1) | retain, body + payload)


def ack(
    ptype: int,
    packet_id: int,
    reason: int | None = None,
    props: Props | None = None,
    *,
    version: int = MQTT_5,
) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; the short form when there is no reason and no props."""
    body = u16(packet_id)
    if version == MQTT_5 and (reason is not None or props):
        body += bytes([reason or 0])
        if props:
            body += properties(props)
    return packet((ptype << 4) | FLAGS[ptype], body)


def sub_options(qos: int = 0, nl: bool = False, rap: bool = False, rh: int = 0) -> int:
    return qos | (nl << 2) | (rap << 3) | (rh << 4)


def subscribe(
    packet_id: int,
    filters: Iterable[tuple[str | bytes, int]],
    props: Props | None = None,
    *,
    version: int = MQTT_5,
) -> bytes:
    """SUBSCRIBE; ``filters`` holds (topic filter, subscription options byte) pairs."""
    body = u16(packet_id)
    if version == MQTT_5:
        body += properties(props)
    for topic_filter, options in filters:
        body += string(topic_filter) + bytes([options])
    return packet(0x82, body)


def unsubscribe(
    packet_id: int,
    filters: Iterable[str | bytes],
    props: Props | None = None,
    *,
    version: int = MQTT_5,
) -> bytes:
    body = u16(packet_id)
    if version == MQTT_5:
        body += properties(props)
    for topic_filter in filters:
        body += string(topic_filter)
    return packet(0xA2, body)


PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"


def disconnect(reason: int | None = None, props: Props | None = None) -> bytes:
    body = b""
    if reason is not None or props:
        body = bytes([reason or 0])
        if props:
            body += properties(props)
    return packet(0xE0, body)


def auth(reason: int = 0x18, props: Props | None = None) -> bytes:
    return packet(0xF0, bytes([reason]) + properties(props))


# -- decoding -------------------------------------------------------------------------------------


@dataclass
class Packet:
    type: int
    flags: int
    raw: bytes
    packet_id: int | None = None
    reason_code: int | None = None
    props: list[tuple[int, Any]] = field(default_factory=list)
    session_present: bool = False
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    dup: bool = False
    retain: bool = False
    reason_codes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, f"type {self.type}")

    def prop(self, pid: int, default: Any = None) -> Any:
        for key, value in self.props:
            if key == pid:
                return value
        return default

    def prop_all(self, pid: int) -> list[Any]:
        return [value for key, value in self.props if key == pid]

    def has(self, pid: int) -> bool:
        return any(key == pid for key, _ in self.props)

    def __repr__(self) -> str:
        parts = [self.name]
        if self.type == PUBLISH:
            parts.append(f"topic={self.topic!r} qos={self.qos} dup={int(self.dup)}")
            parts.append(f"retain={int(self.retain)} payload={self.payload[:40]!r}")
        if self.packet_id is not None:
            parts.append(f"id={self.packet_id}")
        if self.type == CONNACK:
            parts.append(f"sp={int(self.session_present)}")
        if self.reason_code is not None:
            parts.append(f"rc=0x{self.reason_code:02X}")
        if self.reason_codes:
            parts.append("codes=" + ",".join(f"0x{c:02X}" for c in self.reason_codes))
        if self.props:
            parts.append(f"props={self.props!r}")
        return "<" + " ".join(parts) + ">"


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def fail(self, why: str) -> BrokerViolation:
        return BrokerViolation(f"broker sent a malformed {self.what}: {why} ({self.data.hex(' ')})")

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if self.left() < n:
            raise self.fail("truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("!H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("!I", self.take(4))[0])

    def vbi(self) -> int:
        value = 0
        for index in range(4):
            byte = self.byte()
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                if index and not byte:
                    raise self.fail("Variable Byte Integer not minimally encoded [MQTT-1.5.5-1]")
                return value
        raise self.fail("Variable Byte Integer longer than 4 bytes")

    def string(self) -> str:
        data = self.take(self.u16())
        try:
            text = data.decode("utf-8")  # strict: rejects surrogates and overlongs
        except UnicodeDecodeError:
            raise self.fail(f"ill-formed UTF-8 string {data!r} [MQTT-1.5.4-1]") from None
        if "\x00" in text:
            raise self.fail(f"U+0000 in string {text!r} [MQTT-1.5.4-2]")
        return text

    def props(self, ptype: int) -> list[tuple[int, Any]]:
        length = self.vbi()
        end = self.pos + length
        if end > len(self.data):
            raise self.fail("property length beyond the packet")
        out: list[tuple[int, Any]] = []
        seen: set[int] = set()
        while self.pos < end:
            pid = self.vbi()
            kind = PROPERTY_TYPES.get(pid)
            if kind is None:
                raise self.fail(f"unknown property 0x{pid:02X}")
            if pid not in SERVER_PROPERTIES[ptype]:
                raise self.fail(f"property 0x{pid:02X} not allowed in {NAMES[ptype]}")
            if pid in seen and pid not in REPEATABLE:
                raise self.fail(f"property 0x{pid:02X} repeated")
            seen.add(pid)
            value: Any
            if kind == _BYTE:
                value = self.byte()
            elif kind == _U16:
                value = self.u16()
            elif kind == _U32:
                value = self.u32()
            elif kind == _VBI:
                value = self.vbi()
            elif kind == _STR:
                value = self.string()
            elif kind == _BIN:
                value = self.take(self.u16())
            else:
                value = (self.string(), self.string())
            out.append((pid, value))
        if self.pos != end:
            raise self.fail("properties overrun their length")
        return out


def _check_code(code: int, ptype: int, what: str, r: _Reader) -> int:
    if code not in REASON_CODES[ptype]:
        raise r.fail(f"undefined {what} reason code 0x{code:02X}")
    return code


def parse(raw: bytes, version: int = MQTT_5) -> Packet:
    """Parse one whole packet the broker sent, strictly."""
    first = raw[0]
    ptype, flags = first >> 4, first & 0x0F
    head = _Reader(raw, f"packet {raw[:1].hex()}")
    head.take(1)
    length = head.vbi()
    body = raw[head.pos :]
    assert len(body) == length
    if ptype not in NAMES or ptype in (CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ):
        raise BrokerViolation(f"a server never sends packet type {ptype} ({raw.hex(' ')})")
    if ptype == AUTH and version != MQTT_5:
        raise BrokerViolation("AUTH sent to an MQTT 3.1.1 client")
    if ptype != PUBLISH and flags != FLAGS[ptype]:
        raise BrokerViolation(
            f"{NAMES[ptype]} with reserved flags {flags:04b} [MQTT-2.1.3-1] ({raw.hex(' ')})"
        )
    r = _Reader(body, NAMES[ptype])
    pkt = Packet(ptype, flags, raw)
    v5 = version == MQTT_5
    if ptype == CONNACK:
        ack_flags = r.byte()
        if ack_flags & 0xFE:
            raise r.fail("Connect Acknowledge Flags bits 7-1 not 0 [MQTT-3.2.2-1]")
        pkt.session_present = bool(ack_flags & 1)
        code = r.byte()
        if v5:
            pkt.reason_code = _check_code(code, CONNACK, "CONNACK", r)
            pkt.props = r.props(CONNACK)
        else:
            if code not in V311_CONNACK_CODES:
                raise r.fail(f"undefined 3.1.1 return code {code}")
            pkt.reason_code = code
    elif ptype == PUBLISH:
        pkt.qos = (flags >> 1) & 3
        pkt.dup = bool(flags & 8)
        pkt.retain = bool(flags & 1)
        if pkt.qos == 3:
            raise r.fail("QoS 3 [MQTT-3.3.1-4]")
        if pkt.qos == 0 and pkt.dup:
            raise r.fail("DUP set on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
        pkt.topic = r.string()
        if pkt.qos:
            pkt.packet_id = r.u16()
            if not pkt.packet_id:
                raise r.fail("packet identifier 0 [MQTT-2.2.1-4]")
        if v5:
            pkt.props = r.props(PUBLISH)
            if 0 in pkt.prop_all(P.TOPIC_ALIAS):
                raise r.fail("Topic Alias 0 [MQTT-3.3.2-8]")
            if 0 in pkt.prop_all(P.SUBSCRIPTION_IDENTIFIER):
                raise r.fail("Subscription Identifier 0")
        pkt.payload = r.take(r.left())
        if pkt.topic == "" and not pkt.has(P.TOPIC_ALIAS):
            raise r.fail("empty topic without a Topic Alias")
        if any(c in pkt.topic for c in "+#"):
            raise r.fail(f"wildcard in Topic Name {pkt.topic!r} [MQTT-3.3.2-2]")
    elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        pkt.packet_id = r.u16()
        if not pkt.packet_id:
            raise r.fail("packet identifier 0")
        pkt.reason_code = 0
        if v5 and r.left():
            pkt.reason_code = _check_code(r.byte(), ptype, NAMES[ptype], r)
            if r.left():
                pkt.props = r.props(ptype)
        elif not v5 and r.left():
            raise r.fail("3.1.1 acknowledgement longer than 2 bytes")
    elif ptype in (SUBACK, UNSUBACK):
        pkt.packet_id = r.u16()
        if v5:
            pkt.props = r.props(ptype)
        codes = list(r.take(r.left()))
        if v5 or ptype == SUBACK:
            allowed = REASON_CODES[ptype] if v5 else V311_SUBACK_CODES
            for code in codes:
                if code not in allowed:
                    raise r.fail(f"undefined {NAMES[ptype]} reason code 0x{code:02X}")
            if not codes:
                raise r.fail("no reason codes")
        elif codes:
            raise r.fail("3.1.1 UNSUBACK with a payload")
        pkt.reason_codes = codes
    elif ptype == PINGRESP:
        if body:
            raise r.fail("PINGRESP with a body")
    elif ptype in (DISCONNECT, AUTH):
        if ptype == DISCONNECT and not v5:
            raise BrokerViolation("DISCONNECT sent to an MQTT 3.1.1 client")
        pkt.reason_code = 0
        if r.left():
            pkt.reason_code = _check_code(r.byte(), ptype, NAMES[ptype], r)
            if r.left():
                pkt.props = r.props(ptype)
    if r.left():
        raise r.fail(f"{r.left()} unexpected trailing bytes")
    return pkt


# -- the client -----------------------------------------------------------------------------------


class Client:
    """A raw MQTT client on a blocking socket: send bytes, read exactly one packet."""

    def __init__(self, address: tuple[str, int], version: int = MQTT_5, name: str = "") -> None:
        self.address = address
        self.version = version
        self.name = name
        self.sock = socket.create_connection(address, timeout=WAIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._eof = False
        # bytes per recv(): a client that reads one packet at a time leaves the rest in the
        # kernel, where a reset from the peer can discard it
        self.recv_size = 65536
        self._next_id = 0
        self._stash: list[Packet] = []
        self.connack: Packet | None = None
        self.client_id = ""
        self.log: list[str] = []

    def __repr__(self) -> str:
        return f"Client({self.name or self.client_id!r})"

    # raw I/O

    def send(self, data: bytes) -> None:
        self.log.append(f"-> {data[:64].hex(' ')}")
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False on EOF/reset. Raises NoPacket at the deadline."""
        if self._eof:
            return False
        chunk = self._recv(deadline)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _recv(self, deadline: float) -> bytes:
        """What the socket has, waiting up to ``deadline``; b"" at EOF or reset. Raises NoPacket
        at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NoPacket("timed out")
        self.sock.settimeout(remaining)
        try:
            return self.sock.recv(self.recv_size)
        except TimeoutError:
            raise NoPacket("timed out") from None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return b""

    def _frame(self) -> bytes | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        length = 0
        for index in range(1, 5):
            if index >= len(buf):
                return None
            byte = buf[index]
            length |= (byte & 0x7F) << (7 * (index - 1))
            if not byte & 0x80:
                end = index + 1 + length
                if len(buf) < end:
                    return None
                raw = bytes(buf[:end])
                del buf[:end]
                return raw
        raise BrokerViolation(f"Remaining Length longer than 4 bytes: {bytes(buf[:5]).hex()}")

    def read_raw(self, timeout: float = WAIT) -> bytes:
        """Exactly one packet's bytes. Raises NoPacket or ConnectionClosed."""
        deadline = time.monotonic() + timeout
        while True:
            raw = self._frame()
            if raw is not None:
                self.log.append(f"<- {raw[:64].hex(' ')}")
                return raw
            try:
                more = self._fill(deadline)
            except NoPacket:
                raise NoPacket(f"{self!r}: no packet within {timeout}s") from None
            if not more:
                if self._buf:
                    raise BrokerViolation(f"connection closed inside a packet: {self._buf.hex()}")
                raise ConnectionClosed(f"{self!r}: connection closed by the broker")

    def read(self, timeout: float = WAIT) -> Packet:
        if self._stash:
            return self._stash.pop(0)
        return parse(self.read_raw(timeout), self.version)

    def expect(self, ptype: int, timeout: float = WAIT, *, stash_publish: bool = False) -> Packet:
        """The next packet, which must be of type ``ptype``. With ``stash_publish``, PUBLISH
        packets that arrive first are kept for later reads (a client subscribed to its own
        topic may get its message before its acknowledgement)."""
        stashed: list[Packet] = []
        try:
            while True:
                pkt = self.read(timeout)
                if stash_publish and pkt.type == PUBLISH and ptype != PUBLISH:
                    stashed.append(pkt)
                    continue
                assert pkt.type == ptype, f"{self!r}: expected {NAMES[ptype]}, got {pkt!r}"
                return pkt
        finally:
            self._stash[:0] = stashed

    def expect_nothing(self, timeout: float = QUIET) -> None:
        """No packet and no close within ``timeout``."""
        try:
            pkt = self.read(timeout)
        except NoPacket:
            return
        raise AssertionError(f"{self!r}: expected nothing, got {pkt!r}")

    def is_closed(self, timeout: float = WAIT) -> bool:
        """True if the broker closes within ``timeout`` without sending anything else."""
        try:
            pkt = self.read(timeout)
        except ConnectionClosed:
            return True
        except NoPacket:
            return False
        raise AssertionError(f"{self!r}: expected the connection closed, got {pkt!r}")

    def expect_closed(self, timeout: float = WAIT) -> None:
        assert self.is_closed(timeout), f"{self!r}: connection still open after {timeout}s"

    def expect_disconnect(
        self,
        reasons: int | Iterable[int] | None = None,
        *,
        required: bool = False,
        timeout: float = WAIT,
    ) -> Packet | None:
        """The broker closes the connection, optionally sending DISCONNECT first (it SHOULD,
        section 4.13). If it does, its reason code must be one of ``reasons``, and nothing may
        follow it [MQTT-3.14.4-1, -2]. Any other packet fails the test."""
        pkt = self._last_packet("the DISCONNECT the spec requires", required, timeout)
        if pkt is None:
            return None
        assert pkt.type == DISCONNECT, f"{self!r}: expected DISCONNECT or close, got {pkt!r}"
        self._check_reason(pkt, "DISCONNECT", reasons)
        self.expect_closed(timeout)
        return pkt

    def expect_refused(
        self,
        reasons: int | Iterable[int] | None = None,
        *,
        required: bool = False,
        timeout: float = WAIT,
    ) -> Packet | None:
        """A refused CONNECT: maybe a CONNACK with one of ``reasons`` (0x80 or above, Session
        Present 0), then the connection closed. Never a DISCONNECT [MQTT-3.14.0-1]."""
        pkt = self._last_packet("a CONNACK", required, timeout)
        if pkt is None:
            return None
        assert pkt.type == CONNACK, f"{self!r}: expected CONNACK or close, got {pkt!r}"
        assert pkt.reason_code is not None
        if self.version == MQTT_5:
            assert pkt.reason_code >= 0x80, f"{self!r}: CONNECT accepted: {pkt!r}"
        else:
            assert pkt.reason_code != 0, f"{self!r}: CONNECT accepted: {pkt!r}"
        assert not pkt.session_present, "refusing CONNACK with Session Present 1 [MQTT-3.2.2-6]"
        self._check_reason(pkt, "CONNACK", reasons)
        self.expect_closed(timeout)
        return pkt

    def _last_packet(self, missing: str, required: bool, timeout: float) -> Packet | None:
        """The packet the broker sends before it closes the connection, or None if it closes
        without one (a failure when ``required``: the spec requires ``missing``)."""
        try:
            return self.read(timeout)
        except ConnectionClosed:
            assert not required, f"{self!r}: closed without {missing}"
            return None
        except NoPacket:
            raise AssertionError(f"{self!r}: connection still open after {timeout}s") from None

    def _check_reason(self, pkt: Packet, name: str, reasons: int | Iterable[int] | None) -> None:
        """``pkt``'s reason code is one of ``reasons`` (any, when none are given)."""
        allowed = {reasons} if isinstance(reasons, int) else set(reasons or ())
        if allowed:
            assert pkt.reason_code in allowed, (
                f"{self!r}: {name} reason 0x{pkt.reason_code:02X}, expected one of "
                + ", ".join(f"0x{c:02X}" for c in sorted(allowed))
            )

    # MQTT operations

    def next_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    def connect(self, client_id: str = "", **kw: Any) -> Packet:
        """Send CONNECT and expect a successful CONNACK; returns it."""
        kw.setdefault("version", self.version)
        self.send(connect(client_id, **kw))
        pkt = self.expect(CONNACK)
        assert pkt.reason_code == 0, f"{self!r}: CONNECT refused: {pkt!r}"
        self.connack = pkt
        self.client_id = client_id or pkt.prop(P.ASSIGNED_CLIENT_IDENTIFIER, "")
        return pkt

    def subscribe(
        self,
        *filters: str | tuple[str, int],
        qos: int = 0,
        props: Props | None = None,
        packet_id: int | None = None,
    ) -> Packet:
        """SUBSCRIBE and its SUBACK; a bare filter gets options ``qos``. Returns the SUBACK."""
        pairs = [(f, qos) if isinstance(f, str) else f for f in filters]
        pid = packet_id or self.next_id()
        self.send(subscribe(pid, pairs, props, version=self.version))
        pkt = self.expect(SUBACK)
        assert pkt.packet_id == pid, f"SUBACK id {pkt.packet_id} != {pid} [MQTT-3.8.4-2]"
        assert len(pkt.reason_codes) == len(pairs), f"{pkt!r} [MQTT-3.8.4-6]"
        return pkt

    def unsubscribe(self, *filters: str, packet_id: int | None = None) -> Packet:
        pid = packet_id or self.next_id()
        self.send(unsubscribe(pid, filters, version=self.version))
        pkt = self.expect(UNSUBACK)
        assert pkt.packet_id == pid, f"UNSUBACK id {pkt.packet_id} != {pid} [MQTT-3.10.4-5]"
        return pkt

    def publish(
        self, topic: str | bytes, payload: bytes = b"", qos: int = 0, **kw: Any
    ) -> int | None:
        """Send a PUBLISH (no waiting); returns its packet id."""
        pid = kw.pop("packet_id", None)
        if qos and pid is None:
            pid = self.next_id()
        kw.setdefault("version", self.version)
        self.send(publish(topic, payload, qos=qos, packet_id=pid, **kw))
        return pid

    def publish_acked(
        self, topic: str | bytes, payload: bytes = b"", qos: int = 0, **kw: Any
    ) -> Packet | None:
        """PUBLISH and complete its QoS flow; returns the PUBACK or PUBCOMP (None for QoS 0)."""
        pid = self.publish(topic, payload, qos, **kw)
        if qos == 0:
            return None
        if qos == 1:
            pkt = self.expect(PUBACK, stash_publish=True)
            assert pkt.packet_id == pid, f"PUBACK id {pkt.packet_id} != {pid} [MQTT-2.2.1-5]"
            return pkt
        rec = self.expect(PUBREC, stash_publish=True)
        assert rec.packet_id == pid, f"PUBREC id {rec.packet_id} != {pid} [MQTT-2.2.1-5]"
        self.send(ack(PUBREL, pid or 0, version=self.version))
        comp = self.expect(PUBCOMP, stash_publish=True)
        assert comp.packet_id == pid, f"PUBCOMP id {comp.packet_id} != {pid} [MQTT-2.2.1-5]"
        return comp

    def expect_publish(
        self, topic: str | None = None, payload: bytes | None = None, timeout: float = WAIT
    ) -> Packet:
        pkt = self.expect(PUBLISH, timeout)
        if topic is not None:
            assert pkt.topic == topic, f"{self!r}: PUBLISH on {pkt.topic!r}, expected {topic!r}"
        if payload is not None:
            assert pkt.payload == payload, f"{self!r}: payload {pkt.payload!r} != {payload!r}"
        return pkt

    def acknowledge(self, pkt: Packet) -> None:
        """Complete the receiver's side of a PUBLISH's QoS flow."""
        if pkt.qos == 1:
            self.send(ack(PUBACK, pkt.packet_id or 0, version=self.version))
        elif pkt.qos == 2:
            self.send(ack(PUBREC, pkt.packet_id or 0, version=self.version))
            rel = self.expect(PUBREL, stash_publish=True)
            assert rel.packet_id == pkt.packet_id, f"PUBREL id {rel.packet_id} [MQTT-4.3.3-4]"
            self.send(ack(PUBCOMP, pkt.packet_id or 0, version=self.version))

    def ping(self, timeout: float = WAIT) -> list[Packet]:
        """PINGREQ, then every packet up to the PINGRESP: a barrier that shows what the broker
        had queued for this client before it processed the PINGREQ."""
        if SETTLE:
            time.sleep(SETTLE)
        self.send(PINGREQ_BYTES)
        before: list[Packet] = []
        while True:
            pkt = self.read(timeout)
            if pkt.type == PINGRESP:
                return before
            before.append(pkt)

    def drain(self) -> list[Packet]:
        """The PUBLISH packets the broker had queued for this client (a PINGREQ barrier)."""
        packets = self.ping()
        others = [p for p in packets if p.type != PUBLISH]
        assert not others, f"{self!r}: unexpected {others!r}"
        return packets

    def disconnect(self, reason: int | None = None, props: Props | None = None) -> None:
        """A normal DISCONNECT, then close the socket."""
        try:
            self.send(disconnect(reason, props) if self.version == MQTT_5 else b"\xe0\x00")
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        """Drop the connection without DISCONNECT (the broker sees a network failure)."""
        try:
            self.sock.close()
        except OSError:
            pass


def read_any(clients: Sequence[Client], timeout: float = WAIT) -> tuple[Client, Packet]:
    """The first packet any of ``clients`` receives, and which one got it."""
    deadline = time.monotonic() + timeout
    while True:
        for client in clients:
            if client._stash:
                return client, client._stash.pop(0)
            raw = client._frame()
            if raw is not None:
                client.log.append(f"<- {raw[:64].hex(' ')}")
                return client, parse(raw, client.version)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NoPacket(f"none of {clients!r} received a packet within {timeout}s")
        ready, _, _ = select.select([c.sock for c in clients if not c._eof], [], [], remaining)
        for client in clients:
            if client.sock in ready and not client._fill(deadline):
                raise ConnectionClosed(f"{client!r}: connection closed by the broker")
