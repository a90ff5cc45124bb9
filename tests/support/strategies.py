"""Hypothesis strategies for valid MQTT packets, shared by the protocol tests.

Every strategy here generates packets that survive an encode/decode round trip unchanged at the
protocol level they are drawn for: MQTT 3.1.1 packets carry no properties and no reason codes
that 3.1.1 cannot express, repeatable properties are non-empty lists, and property values obey the
value rules the spec gives (0/1 bytes, non-zero Receive Maximum, and so on).

Imported as ``support.strategies``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, PacketType
from mqttbroker.protocol.properties import WILL, PropertyId
from mqttbroker.protocol.reasons import (
    AUTH_CODES,
    CONNACK_CODES,
    DISCONNECT_CODES,
    PUBACK_CODES,
    PUBREL_CODES,
    SUBACK_CODES,
    UNSUBACK_CODES,
)

P = PropertyId
T = PacketType
VERSIONS = (MQTT_3_1_1, MQTT_5)
MAX_VBI = 268_435_455

# Any character a UTF-8 Encoded String may carry: no surrogates (MQTT-1.5.4-1), no U+0000
# (MQTT-1.5.4-2). Non-ASCII and astral characters are welcome.
_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")


def utf8(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(alphabet=_chars, max_size=max_size)


binary = st.binary(max_size=24)
packet_ids = st.integers(1, 65535)

# Which packet may carry which property, written out from the spec's table 2.2.2.2 (not taken
# from properties.SPEC, so that a mistake in that table shows up in the round trips).
ALLOWED: dict[int, frozenset[int]] = {
    T.CONNECT: frozenset(
        {
            P.SESSION_EXPIRY_INTERVAL,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.REQUEST_PROBLEM_INFORMATION,
            P.REQUEST_RESPONSE_INFORMATION,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
        }
    ),
    WILL: frozenset(
        {
            P.PAYLOAD_FORMAT_INDICATOR,
            P.MESSAGE_EXPIRY_INTERVAL,
            P.CONTENT_TYPE,
            P.RESPONSE_TOPIC,
            P.CORRELATION_DATA,
            P.WILL_DELAY_INTERVAL,
            P.USER_PROPERTY,
        }
    ),
    T.CONNACK: frozenset(
        {
            P.SESSION_EXPIRY_INTERVAL,
            P.ASSIGNED_CLIENT_IDENTIFIER,
            P.SERVER_KEEP_ALIVE,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.RESPONSE_INFORMATION,
            P.SERVER_REFERENCE,
            P.REASON_STRING,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.MAXIMUM_QOS,
            P.RETAIN_AVAILABLE,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
            P.WILDCARD_SUBSCRIPTION_AVAILABLE,
            P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            P.SHARED_SUBSCRIPTION_AVAILABLE,
        }
    ),
    T.PUBLISH: frozenset(
        {
            P.PAYLOAD_FORMAT_INDICATOR,
            P.MESSAGE_EXPIRY_INTERVAL,
            P.CONTENT_TYPE,
            P.RESPONSE_TOPIC,
            P.CORRELATION_DATA,
            P.SUBSCRIPTION_IDENTIFIER,
            P.TOPIC_ALIAS,
            P.USER_PROPERTY,
        }
    ),
    T.PUBACK: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.PUBREC: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.PUBREL: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.PUBCOMP: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.SUBSCRIBE: frozenset({P.SUBSCRIPTION_IDENTIFIER, P.USER_PROPERTY}),
    T.SUBACK: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.UNSUBSCRIBE: frozenset({P.USER_PROPERTY}),
    T.UNSUBACK: frozenset({P.REASON_STRING, P.USER_PROPERTY}),
    T.DISCONNECT: frozenset(
        {P.SESSION_EXPIRY_INTERVAL, P.SERVER_REFERENCE, P.REASON_STRING, P.USER_PROPERTY}
    ),
    T.AUTH: frozenset(
        {P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA, P.REASON_STRING, P.USER_PROPERTY}
    ),
}

# Wire type of each property (table 2.2.2.2); Subscription Identifier is the one Variable Byte
# Integer, User Property the one UTF-8 String Pair.
BYTE_PROPS = {
    P.PAYLOAD_FORMAT_INDICATOR,
    P.REQUEST_PROBLEM_INFORMATION,
    P.REQUEST_RESPONSE_INFORMATION,
    P.MAXIMUM_QOS,
    P.RETAIN_AVAILABLE,
    P.WILDCARD_SUBSCRIPTION_AVAILABLE,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    P.SHARED_SUBSCRIPTION_AVAILABLE,
}
TWO_BYTE_PROPS = {P.SERVER_KEEP_ALIVE, P.RECEIVE_MAXIMUM, P.TOPIC_ALIAS_MAXIMUM, P.TOPIC_ALIAS}
FOUR_BYTE_PROPS = {
    P.MESSAGE_EXPIRY_INTERVAL,
    P.SESSION_EXPIRY_INTERVAL,
    P.WILL_DELAY_INTERVAL,
    P.MAXIMUM_PACKET_SIZE,
}
UTF8_PROPS = {
    P.CONTENT_TYPE,
    P.RESPONSE_TOPIC,
    P.ASSIGNED_CLIENT_IDENTIFIER,
    P.AUTHENTICATION_METHOD,
    P.RESPONSE_INFORMATION,
    P.SERVER_REFERENCE,
    P.REASON_STRING,
}
BINARY_PROPS = {P.CORRELATION_DATA, P.AUTHENTICATION_DATA}


def property_value(pid: int, packet_type: int) -> st.SearchStrategy[Any]:
    """A valid value of property ``pid`` as it appears in the dict of ``packet_type``."""
    base: st.SearchStrategy[Any]
    if pid in BYTE_PROPS:
        base = st.integers(0, 1)  # every Byte property is 0 or 1 (Maximum QoS too)
    elif pid in TWO_BYTE_PROPS:
        base = st.integers(1 if pid == P.RECEIVE_MAXIMUM else 0, 65535)
    elif pid in FOUR_BYTE_PROPS:
        base = st.integers(1 if pid == P.MAXIMUM_PACKET_SIZE else 0, 2**32 - 1)
    elif pid == P.SUBSCRIPTION_IDENTIFIER:
        base = st.integers(1, MAX_VBI)
    elif pid in UTF8_PROPS:
        base = utf8()
    elif pid in BINARY_PROPS:
        base = binary
    elif pid == P.USER_PROPERTY:
        base = st.tuples(utf8(8), utf8(8))
    else:  # pragma: no cover - the sets above cover every property
        raise AssertionError(pid)
    repeats = pid == P.USER_PROPERTY or (
        pid == P.SUBSCRIPTION_IDENTIFIER and packet_type == T.PUBLISH
    )
    if repeats:
        return st.lists(base, min_size=1, max_size=3)
    return base


def properties(packet_type: int) -> st.SearchStrategy[dict[int, Any]]:
    """A properties dict holding any subset of the properties ``packet_type`` may carry."""
    optional = {pid: property_value(pid, packet_type) for pid in sorted(ALLOWED[packet_type])}
    return st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]


def _props_or_empty(packet_type: int, version: int) -> st.SearchStrategy[dict[int, Any]]:
    return properties(packet_type) if version == MQTT_5 else st.just({})


# ---------------------------------------------------------------------------------------------
# Packets


@st.composite
def publishes(draw: st.DrawFn, version: int) -> pk.Publish:
    qos = draw(st.integers(0, 2))
    return pk.Publish(
        topic=draw(utf8(20)),
        payload=draw(st.binary(max_size=64)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,  # MQTT-3.3.1-2: never on QoS 0
        packet_id=draw(packet_ids) if qos else None,
        properties=draw(_props_or_empty(T.PUBLISH, version)),
    )


_ACK_CODES = {
    pk.Puback: PUBACK_CODES,
    pk.Pubrec: PUBACK_CODES,
    pk.Pubrel: PUBREL_CODES,
    pk.Pubcomp: PUBREL_CODES,
}
ACK_CLASSES = tuple(_ACK_CODES)


@st.composite
def acks(draw: st.DrawFn, version: int, cls: type[pk.Ack] | None = None) -> pk.Ack:
    if cls is None:
        cls = draw(st.sampled_from(ACK_CLASSES))
    packet_id = draw(st.integers(0, 65535))
    if version != MQTT_5:
        return cls(packet_id)
    code = draw(st.sampled_from(sorted(_ACK_CODES[cls])))
    return cls(packet_id, code, draw(properties(cls(packet_id).packet_type)))


@st.composite
def wills(draw: st.DrawFn, version: int) -> pk.Will:
    return pk.Will(
        topic=draw(utf8(20)),
        payload=draw(binary),
        qos=draw(st.integers(0, 2)),
        retain=draw(st.booleans()),
        properties=draw(_props_or_empty(WILL, version)),
    )


@st.composite
def connects(draw: st.DrawFn, version: int) -> pk.Connect:
    level = version
    name = "MQTT"
    if version == MQTT_3_1_1 and draw(st.booleans()):
        level, name = MQTT_3_1, "MQIsdp"
    username = draw(st.none() | utf8())
    if version != MQTT_5 and username is None:
        password = None  # 3.1.1: no password without a user name
    else:
        password = draw(st.none() | binary)
    return pk.Connect(
        client_id=draw(utf8(23)),
        protocol_level=level,
        protocol_name=name,
        clean_start=draw(st.booleans()),
        keep_alive=draw(st.integers(0, 65535)),
        username=username,
        password=password,
        will=draw(st.none() | wills(version)),
        properties=draw(_props_or_empty(T.CONNECT, version)),
    )


@st.composite
def connacks(draw: st.DrawFn, version: int) -> pk.Connack:
    if version == MQTT_5:
        code = draw(st.sampled_from(sorted(CONNACK_CODES)))
    else:
        code = draw(st.integers(0, 5))
    return pk.Connack(draw(st.booleans()), code, draw(_props_or_empty(T.CONNACK, version)))


@st.composite
def subscription_requests(draw: st.DrawFn, version: int) -> pk.SubscriptionRequest:
    if version != MQTT_5:
        return pk.SubscriptionRequest(draw(utf8(20)), qos=draw(st.integers(0, 2)))
    return pk.SubscriptionRequest(
        draw(utf8(20)),
        qos=draw(st.integers(0, 2)),
        no_local=draw(st.booleans()),
        retain_as_published=draw(st.booleans()),
        retain_handling=draw(st.integers(0, 2)),
    )


@st.composite
def subscribes(draw: st.DrawFn, version: int) -> pk.Subscribe:
    return pk.Subscribe(
        draw(packet_ids),
        draw(st.lists(subscription_requests(version), min_size=1, max_size=4)),
        draw(_props_or_empty(T.SUBSCRIBE, version)),
    )


@st.composite
def subacks(draw: st.DrawFn, version: int) -> pk.Suback:
    allowed = sorted(SUBACK_CODES) if version == MQTT_5 else [0, 1, 2, 0x80]
    return pk.Suback(
        draw(packet_ids),
        draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=4)),
        draw(_props_or_empty(T.SUBACK, version)),
    )


@st.composite
def unsubscribes(draw: st.DrawFn, version: int) -> pk.Unsubscribe:
    return pk.Unsubscribe(
        draw(packet_ids),
        draw(st.lists(utf8(20), min_size=1, max_size=4)),
        draw(_props_or_empty(T.UNSUBSCRIBE, version)),
    )


@st.composite
def unsubacks(draw: st.DrawFn, version: int) -> pk.Unsuback:
    if version != MQTT_5:
        return pk.Unsuback(draw(packet_ids))
    return pk.Unsuback(
        draw(packet_ids),
        draw(st.lists(st.sampled_from(sorted(UNSUBACK_CODES)), min_size=1, max_size=4)),
        draw(properties(T.UNSUBACK)),
    )


@st.composite
def disconnects(draw: st.DrawFn, version: int) -> pk.Disconnect:
    if version != MQTT_5:
        return pk.Disconnect()
    return pk.Disconnect(
        draw(st.sampled_from(sorted(DISCONNECT_CODES))), draw(properties(T.DISCONNECT))
    )


@st.composite
def auths(draw: st.DrawFn) -> pk.Auth:
    return pk.Auth(draw(st.sampled_from(sorted(AUTH_CODES))), draw(properties(T.AUTH)))


def any_packet(version: int) -> st.SearchStrategy[pk.Packet]:
    """Any packet that exists at ``version`` (AUTH only in MQTT 5)."""
    return st.one_of(
        hot_packet(version),
        connects(version),
        connacks(version),
        subscribes(version),
        subacks(version),
        unsubscribes(version),
        unsubacks(version),
    )


def hot_packet(version: int) -> st.SearchStrategy[pk.Packet]:
    """A packet of the fast path: PUBLISH, the four acks, PINGREQ, PINGRESP, DISCONNECT and
    (MQTT 5) AUTH."""
    options = [
        publishes(version),
        acks(version),
        st.just(pk.Pingreq()),
        st.just(pk.Pingresp()),
        disconnects(version),
    ]
    if version == MQTT_5:
        options.append(auths())
    return st.one_of(options)
