"""One dataclass per MQTT control packet. Fields use the spec's names; properties are a dict keyed
by PropertyId (see properties.py). The same classes serve MQTT 5.0 and 3.1.1: fields that 3.1.1
lacks (properties, most reason codes) are simply left at their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Final

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


def _props() -> dict[int, Any]:
    return {}


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Connect:
    packet_type: ClassVar[int] = PacketType.CONNECT
    client_id: str = ""
    protocol_level: int = MQTT_5
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Connack:
    packet_type: ClassVar[int] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Publish:
    packet_type: ClassVar[int] = PacketType.PUBLISH
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL and PUBCOMP share one shape (sections 3.4 to 3.7)."""

    packet_type: ClassVar[int] = 0  # set by each subclass
    packet_id: int
    reason_code: int = 0
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Puback(Ack):
    packet_type: ClassVar[int] = PacketType.PUBACK


@dataclass(slots=True)
class Pubrec(Ack):
    packet_type: ClassVar[int] = PacketType.PUBREC


@dataclass(slots=True)
class Pubrel(Ack):
    packet_type: ClassVar[int] = PacketType.PUBREL


@dataclass(slots=True)
class Pubcomp(Ack):
    packet_type: ClassVar[int] = PacketType.PUBCOMP


@dataclass(slots=True)
class SubscriptionRequest:
    """One Topic Filter and its Subscription Options (section 3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_type: ClassVar[int] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Suback:
    packet_type: ClassVar[int] = PacketType.SUBACK
    packet_id: int
    reason_codes: list[int]
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Unsubscribe:
    packet_type: ClassVar[int] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str]
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Unsuback:
    packet_type: ClassVar[int] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Pingreq:
    packet_type: ClassVar[int] = PacketType.PINGREQ


@dataclass(slots=True)
class Pingresp:
    packet_type: ClassVar[int] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    packet_type: ClassVar[int] = PacketType.DISCONNECT
    reason_code: int = 0
    properties: dict[int, Any] = field(default_factory=_props)


@dataclass(slots=True)
class Auth:
    packet_type: ClassVar[int] = PacketType.AUTH
    reason_code: int = 0
    properties: dict[int, Any] = field(default_factory=_props)


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
