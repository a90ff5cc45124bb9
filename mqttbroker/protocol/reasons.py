"""Reason codes of MQTT 5.0 (section 2.4) and the 3.1.1 CONNACK return codes."""

from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """Every MQTT 5.0 reason code. Codes shared by several packets are aliases of one value."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


# Which reason codes each packet may carry (section 3.x.2.1 tables).
CONNACK_CODES = frozenset(
    {
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
    }
)
PUBACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
PUBREC_CODES = PUBACK_CODES
PUBREL_CODES = frozenset({0x00, 0x92})
PUBCOMP_CODES = PUBREL_CODES
SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
UNSUBACK_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_CODES = frozenset(
    {
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
    }
)
AUTH_CODES = frozenset({0x00, 0x18, 0x19})
# By packet type: PUBACK 4, PUBREC 5, PUBREL 6, PUBCOMP 7.
ACK_REASON_CODES: dict[int, frozenset[int]] = {
    4: PUBACK_CODES,
    5: PUBREC_CODES,
    6: PUBREL_CODES,
    7: PUBCOMP_CODES,
}


def v311_connack_code(reason: int) -> int:
    """Map an MQTT 5 CONNACK reason code onto the nearest MQTT 3.1.1 return code (section 3.2.2.3
    of 3.1.1): 1 unacceptable protocol version, 2 identifier rejected, 3 server unavailable,
    4 bad user name or password, 5 not authorized."""
    if reason == 0:
        return 0
    if reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
        return 1
    if reason == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID:
        return 2
    if reason == ReasonCode.BAD_USER_NAME_OR_PASSWORD:
        return 4
    if reason in (ReasonCode.NOT_AUTHORIZED, ReasonCode.BANNED):
        return 5
    return 3
