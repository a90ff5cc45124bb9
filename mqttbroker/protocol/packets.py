"""One dataclass per MQTT control packet. Fields use the spec's names; properties are a dict keyed
by PropertyId (see properties.py). The same classes serve MQTT 5.0 and 3.1.1: fields that 3.1.1
lacks (properties, most reason codes) are simply left at their defaults."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

# The packet types as plain ints (``Final``: compiled code reads them as literals, where a
# member of an IntEnum is an attribute lookup through the enum's metaclass each time); the
# enum below gives them names.
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
PUBREC: Final = 5
PUBREL: Final = 6
PUBCOMP: Final = 7
SUBSCRIBE: Final = 8
SUBACK: Final = 9
UNSUBSCRIBE: Final = 10
UNSUBACK: Final = 11
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14
AUTH: Final = 15


class PacketType(IntEnum):
    CONNECT = CONNECT
    CONNACK = CONNACK
    PUBLISH = PUBLISH
    PUBACK = PUBACK
    PUBREC = PUBREC
    PUBREL = PUBREL
    PUBCOMP = PUBCOMP
    SUBSCRIBE = SUBSCRIBE
    SUBACK = SUBACK
    UNSUBSCRIBE = UNSUBSCRIBE
    UNSUBACK = UNSUBACK
    PINGREQ = PINGREQ
    PINGRESP = PINGRESP
    DISCONNECT = DISCONNECT
    AUTH = AUTH


# Protocol levels (CONNECT byte 7).
MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5


# Every packet class is a dataclass (``__eq__`` and ``__repr__``) with an ``__init__`` of its own:
# compiled, this module then builds packets in C, where the ``__init__`` that ``dataclasses``
# generates would run as interpreted code for every packet decoded. A properties argument of
# None stands for a new empty dict.


class _Packet:
    """What every packet class has: its ``packet_type``, looked up by class in PACKET_TYPES."""

    __slots__ = ()

    @property
    def packet_type(self) -> int:
        return PACKET_TYPES[type(self)]


@dataclass(slots=True, init=False)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[int, Any]

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Connect(_Packet):
    client_id: str
    protocol_level: int
    protocol_name: str
    clean_start: bool
    keep_alive: int
    username: str | None
    password: bytes | None
    will: Will | None
    properties: dict[int, Any]

    def __init__(
        self,
        client_id: str = "",
        protocol_level: int = MQTT_5,
        protocol_name: str = "MQTT",
        clean_start: bool = True,
        keep_alive: int = 60,
        username: str | None = None,
        password: bytes | None = None,
        will: Will | None = None,
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.client_id = client_id
        self.protocol_level = protocol_level
        self.protocol_name = protocol_name
        self.clean_start = clean_start
        self.keep_alive = keep_alive
        self.username = username
        self.password = password
        self.will = will
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Connack(_Packet):
    session_present: bool
    reason_code: int
    properties: dict[int, Any]

    def __init__(
        self,
        session_present: bool = False,
        reason_code: int = 0,
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Publish(_Packet):
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None
    properties: dict[int, Any]

    def __init__(
        self,
        topic: str = "",
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Ack(_Packet):
    """PUBACK, PUBREC, PUBREL and PUBCOMP share one shape (sections 3.4 to 3.7)."""

    packet_id: int
    reason_code: int
    properties: dict[int, Any]

    def __init__(
        self, packet_id: int, reason_code: int = 0, properties: dict[int, Any] | None = None
    ) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


class Puback(Ack):
    __slots__ = ()


class Pubrec(Ack):
    __slots__ = ()


class Pubrel(Ack):
    __slots__ = ()


class Pubcomp(Ack):
    __slots__ = ()


@dataclass(slots=True, init=False)
class SubscriptionRequest:
    """One Topic Filter and its Subscription Options (section 3.8.3.1)."""

    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int

    def __init__(
        self,
        topic_filter: str,
        qos: int = 0,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
    ) -> None:
        self.topic_filter = topic_filter
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling


@dataclass(slots=True, init=False)
class Subscribe(_Packet):
    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: dict[int, Any]

    def __init__(
        self,
        packet_id: int,
        subscriptions: list[SubscriptionRequest],
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.packet_id = packet_id
        self.subscriptions = subscriptions
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Suback(_Packet):
    packet_id: int
    reason_codes: list[int]
    properties: dict[int, Any]

    def __init__(
        self, packet_id: int, reason_codes: list[int], properties: dict[int, Any] | None = None
    ) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Unsubscribe(_Packet):
    packet_id: int
    topic_filters: list[str]
    properties: dict[int, Any]

    def __init__(
        self, packet_id: int, topic_filters: list[str], properties: dict[int, Any] | None = None
    ) -> None:
        self.packet_id = packet_id
        self.topic_filters = topic_filters
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Unsuback(_Packet):
    packet_id: int
    reason_codes: list[int]
    properties: dict[int, Any]

    def __init__(
        self,
        packet_id: int,
        reason_codes: list[int] | None = None,
        properties: dict[int, Any] | None = None,
    ) -> None:
        self.packet_id = packet_id
        self.reason_codes = [] if reason_codes is None else reason_codes
        self.properties = {} if properties is None else properties


@dataclass(slots=True)
class Pingreq(_Packet):
    """PINGREQ (section 3.12): nothing but its type."""


@dataclass(slots=True)
class Pingresp(_Packet):
    """PINGRESP (section 3.13): nothing but its type."""


@dataclass(slots=True, init=False)
class ReasonOnly(_Packet):
    """DISCONNECT and AUTH share one shape (sections 3.14 and 3.15)."""

    reason_code: int
    properties: dict[int, Any]

    def __init__(self, reason_code: int = 0, properties: dict[int, Any] | None = None) -> None:
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


class Disconnect(ReasonOnly):
    __slots__ = ()


class Auth(ReasonOnly):
    __slots__ = ()


# The packet type of each class (0: the shared base of several).
PACKET_TYPES: dict[type, int] = {
    Connect: CONNECT,
    Connack: CONNACK,
    Publish: PUBLISH,
    Ack: 0,
    Puback: PUBACK,
    Pubrec: PUBREC,
    Pubrel: PUBREL,
    Pubcomp: PUBCOMP,
    Subscribe: SUBSCRIBE,
    Suback: SUBACK,
    Unsubscribe: UNSUBSCRIBE,
    Unsuback: UNSUBACK,
    Pingreq: PINGREQ,
    Pingresp: PINGRESP,
    ReasonOnly: 0,
    Disconnect: DISCONNECT,
    Auth: AUTH,
}

# PUBACK, PUBREC, PUBREL and PUBCOMP by packet type.
ACK_CLASSES: dict[int, type[Ack]] = {
    PacketType.PUBACK: Puback,
    PacketType.PUBREC: Pubrec,
    PacketType.PUBREL: Pubrel,
    PacketType.PUBCOMP: Pubcomp,
}

Packet = (
    Ack
    | Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)

# Fixed-header flag bits (low nibble) every packet but PUBLISH must carry (section 2.1.3).
REQUIRED_FLAGS: dict[int, int] = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 2,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 2,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
    PacketType.AUTH: 0,
}
