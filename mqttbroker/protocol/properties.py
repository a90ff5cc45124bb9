"""MQTT 5.0 properties (section 2.2.2.2): identifier, wire type, and the packets that may carry
each one. A packet's properties are held as a plain ``dict`` keyed by :class:`PropertyId`; the two
properties that may repeat (User Property, and Subscription Identifier in PUBLISH) hold a list."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final

from .errors import LimitExceeded, MalformedPacket, ProtocolError
from .packets import PacketType as P


class PropertyType(IntEnum):
    BYTE = 1
    TWO_BYTE = 2
    FOUR_BYTE = 3
    VBI = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


# The property identifiers as plain ints (``Final``: compiled code reads them as literals,
# where a member of an IntEnum is an attribute lookup through the enum's metaclass each
# time); the enum below gives them names.
PAYLOAD_FORMAT_INDICATOR: Final = 0x01
MESSAGE_EXPIRY_INTERVAL: Final = 0x02
CONTENT_TYPE: Final = 0x03
RESPONSE_TOPIC: Final = 0x08
CORRELATION_DATA: Final = 0x09
SUBSCRIPTION_IDENTIFIER: Final = 0x0B
SESSION_EXPIRY_INTERVAL: Final = 0x11
ASSIGNED_CLIENT_IDENTIFIER: Final = 0x12
SERVER_KEEP_ALIVE: Final = 0x13
AUTHENTICATION_METHOD: Final = 0x15
AUTHENTICATION_DATA: Final = 0x16
REQUEST_PROBLEM_INFORMATION: Final = 0x17
WILL_DELAY_INTERVAL: Final = 0x18
REQUEST_RESPONSE_INFORMATION: Final = 0x19
RESPONSE_INFORMATION: Final = 0x1A
SERVER_REFERENCE: Final = 0x1C
REASON_STRING: Final = 0x1F
RECEIVE_MAXIMUM: Final = 0x21
TOPIC_ALIAS_MAXIMUM: Final = 0x22
TOPIC_ALIAS: Final = 0x23
MAXIMUM_QOS: Final = 0x24
RETAIN_AVAILABLE: Final = 0x25
USER_PROPERTY: Final = 0x26
MAXIMUM_PACKET_SIZE: Final = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE: Final = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE: Final = 0x29
SHARED_SUBSCRIPTION_AVAILABLE: Final = 0x2A


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = PAYLOAD_FORMAT_INDICATOR
    MESSAGE_EXPIRY_INTERVAL = MESSAGE_EXPIRY_INTERVAL
    CONTENT_TYPE = CONTENT_TYPE
    RESPONSE_TOPIC = RESPONSE_TOPIC
    CORRELATION_DATA = CORRELATION_DATA
    SUBSCRIPTION_IDENTIFIER = SUBSCRIPTION_IDENTIFIER
    SESSION_EXPIRY_INTERVAL = SESSION_EXPIRY_INTERVAL
    ASSIGNED_CLIENT_IDENTIFIER = ASSIGNED_CLIENT_IDENTIFIER
    SERVER_KEEP_ALIVE = SERVER_KEEP_ALIVE
    AUTHENTICATION_METHOD = AUTHENTICATION_METHOD
    AUTHENTICATION_DATA = AUTHENTICATION_DATA
    REQUEST_PROBLEM_INFORMATION = REQUEST_PROBLEM_INFORMATION
    WILL_DELAY_INTERVAL = WILL_DELAY_INTERVAL
    REQUEST_RESPONSE_INFORMATION = REQUEST_RESPONSE_INFORMATION
    RESPONSE_INFORMATION = RESPONSE_INFORMATION
    SERVER_REFERENCE = SERVER_REFERENCE
    REASON_STRING = REASON_STRING
    RECEIVE_MAXIMUM = RECEIVE_MAXIMUM
    TOPIC_ALIAS_MAXIMUM = TOPIC_ALIAS_MAXIMUM
    TOPIC_ALIAS = TOPIC_ALIAS
    MAXIMUM_QOS = MAXIMUM_QOS
    RETAIN_AVAILABLE = RETAIN_AVAILABLE
    USER_PROPERTY = USER_PROPERTY
    MAXIMUM_PACKET_SIZE = MAXIMUM_PACKET_SIZE
    WILDCARD_SUBSCRIPTION_AVAILABLE = WILDCARD_SUBSCRIPTION_AVAILABLE
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = SUBSCRIPTION_IDENTIFIER_AVAILABLE
    SHARED_SUBSCRIPTION_AVAILABLE = SHARED_SUBSCRIPTION_AVAILABLE


# Pseudo packet type for the Will Properties of a CONNECT payload.
WILL = 0

_T = PropertyType
_I = PropertyId

# id -> (wire type, packet types that may carry it)
SPEC: dict[int, tuple[PropertyType, frozenset[int]]] = {
    _I.PAYLOAD_FORMAT_INDICATOR: (_T.BYTE, frozenset({P.PUBLISH, WILL})),
    _I.MESSAGE_EXPIRY_INTERVAL: (_T.FOUR_BYTE, frozenset({P.PUBLISH, WILL})),
    _I.CONTENT_TYPE: (_T.UTF8, frozenset({P.PUBLISH, WILL})),
    _I.RESPONSE_TOPIC: (_T.UTF8, frozenset({P.PUBLISH, WILL})),
    _I.CORRELATION_DATA: (_T.BINARY, frozenset({P.PUBLISH, WILL})),
    _I.SUBSCRIPTION_IDENTIFIER: (_T.VBI, frozenset({P.PUBLISH, P.SUBSCRIBE})),
    _I.SESSION_EXPIRY_INTERVAL: (_T.FOUR_BYTE, frozenset({P.CONNECT, P.CONNACK, P.DISCONNECT})),
    _I.ASSIGNED_CLIENT_IDENTIFIER: (_T.UTF8, frozenset({P.CONNACK})),
    _I.SERVER_KEEP_ALIVE: (_T.TWO_BYTE, frozenset({P.CONNACK})),
    _I.AUTHENTICATION_METHOD: (_T.UTF8, frozenset({P.CONNECT, P.CONNACK, P.AUTH})),
    _I.AUTHENTICATION_DATA: (_T.BINARY, frozenset({P.CONNECT, P.CONNACK, P.AUTH})),
    _I.REQUEST_PROBLEM_INFORMATION: (_T.BYTE, frozenset({P.CONNECT})),
    _I.WILL_DELAY_INTERVAL: (_T.FOUR_BYTE, frozenset({WILL})),
    _I.REQUEST_RESPONSE_INFORMATION: (_T.BYTE, frozenset({P.CONNECT})),
    _I.RESPONSE_INFORMATION: (_T.UTF8, frozenset({P.CONNACK})),
    _I.SERVER_REFERENCE: (_T.UTF8, frozenset({P.CONNACK, P.DISCONNECT})),
    _I.REASON_STRING: (
        _T.UTF8,
        frozenset(
            {
                P.CONNACK,
                P.PUBACK,
                P.PUBREC,
                P.PUBREL,
                P.PUBCOMP,
                P.SUBACK,
                P.UNSUBACK,
                P.DISCONNECT,
                P.AUTH,
            }
        ),
    ),
    _I.RECEIVE_MAXIMUM: (_T.TWO_BYTE, frozenset({P.CONNECT, P.CONNACK})),
    _I.TOPIC_ALIAS_MAXIMUM: (_T.TWO_BYTE, frozenset({P.CONNECT, P.CONNACK})),
    _I.TOPIC_ALIAS: (_T.TWO_BYTE, frozenset({P.PUBLISH})),
    _I.MAXIMUM_QOS: (_T.BYTE, frozenset({P.CONNACK})),
    _I.RETAIN_AVAILABLE: (_T.BYTE, frozenset({P.CONNACK})),
    _I.USER_PROPERTY: (
        _T.UTF8_PAIR,
        frozenset(
            {
                P.CONNECT,
                P.CONNACK,
                P.PUBLISH,
                WILL,
                P.PUBACK,
                P.PUBREC,
                P.PUBREL,
                P.PUBCOMP,
                P.SUBSCRIBE,
                P.SUBACK,
                P.UNSUBSCRIBE,
                P.UNSUBACK,
                P.DISCONNECT,
                P.AUTH,
            }
        ),
    ),
    _I.MAXIMUM_PACKET_SIZE: (_T.FOUR_BYTE, frozenset({P.CONNECT, P.CONNACK})),
    _I.WILDCARD_SUBSCRIPTION_AVAILABLE: (_T.BYTE, frozenset({P.CONNACK})),
    _I.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_T.BYTE, frozenset({P.CONNACK})),
    _I.SHARED_SUBSCRIPTION_AVAILABLE: (_T.BYTE, frozenset({P.CONNACK})),
}

# Properties whose value in the dict is a list because they may appear more than once
# (User Property anywhere; Subscription Identifier in PUBLISH only, enforced in collect()).
REPEATABLE = frozenset({_I.USER_PROPERTY, _I.SUBSCRIPTION_IDENTIFIER})

Properties = dict[int, Any]


def _bit(v: int) -> bool:
    return v in (0, 1)


def _nonzero(v: int) -> bool:
    return v != 0


# Value rules the spec states for single properties; a violation is a Protocol Error.
_CHECKS: dict[int, Any] = {
    _I.PAYLOAD_FORMAT_INDICATOR: _bit,
    _I.REQUEST_PROBLEM_INFORMATION: _bit,
    _I.REQUEST_RESPONSE_INFORMATION: _bit,
    _I.MAXIMUM_QOS: _bit,
    _I.RETAIN_AVAILABLE: _bit,
    _I.WILDCARD_SUBSCRIPTION_AVAILABLE: _bit,
    _I.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _bit,
    _I.SHARED_SUBSCRIPTION_AVAILABLE: _bit,
    _I.RECEIVE_MAXIMUM: _nonzero,
    _I.MAXIMUM_PACKET_SIZE: _nonzero,
    _I.SUBSCRIPTION_IDENTIFIER: _nonzero,
}


# User Properties one packet may carry (0: no limit): the broker sets it from its
# max_user_properties. The spec sets none, but decoding a megabyte of empty ones costs the event
# loop half a second, before any credential is checked.
_user_properties = 64


def limit_user_properties(count: int) -> None:
    global _user_properties
    _user_properties = count


def properties_cap() -> int:
    """How many properties a decoder may read before it calls :func:`too_many` (0: no cap):
    the User Property limit plus one of each other property."""
    return _user_properties + len(SPEC) if _user_properties else 0


def too_many(found: list[tuple[int, Any]], packet_type: int) -> None:
    """A decoder read more than :func:`properties_cap` properties: a property repeated that
    may not be is the Protocol Error it is; else there are too many User Properties."""
    collect(found, packet_type)
    raise LimitExceeded(f"more than {_user_properties} User Properties")


def collect(pairs: list[tuple[int, Any]], packet_type: int) -> Properties:
    """Fold decoded (id, value) pairs into a properties dict, enforcing the spec's rules: the
    property must be allowed in this packet, and may appear only once unless it repeats. Raises
    ProtocolError (0x82): the spec calls both a Protocol Error (section 2.2.2.2); LimitExceeded
    (0x83) past the User Property limit."""
    props: Properties = {}
    for pid, value in pairs:
        spec = SPEC.get(pid)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        if packet_type not in spec[1]:
            raise ProtocolError(f"property {PropertyId(pid).name} is not allowed in this packet")
        check = _CHECKS.get(pid)
        if check is not None and not check(value):
            raise ProtocolError(f"property {PropertyId(pid).name} has invalid value {value!r}")
        if pid in REPEATABLE and not (
            pid == _I.SUBSCRIPTION_IDENTIFIER and packet_type != P.PUBLISH
        ):
            props.setdefault(pid, []).append(value)
        elif pid in props:
            raise ProtocolError(f"property {PropertyId(pid).name} appears more than once")
        else:
            props[pid] = value
    users = props.get(_I.USER_PROPERTY)
    if users is not None and _user_properties and len(users) > _user_properties:
        raise LimitExceeded(f"more than {_user_properties} User Properties")
    return props


def pairs(props: Properties) -> list[tuple[int, Any]]:
    """The inverse of :func:`collect`: (id, value) pairs in wire order (lists expanded in order)."""
    out: list[tuple[int, Any]] = []
    for pid, value in props.items():
        if isinstance(value, list):
            out.extend((pid, v) for v in value)
        else:
            out.append((pid, value))
    return out
