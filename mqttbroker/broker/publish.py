"""PUBLISH from the client, and its inbound QoS flows: topic aliases, the property rules,
authorization, the publish rate, the retained quota, routing, then PUBACK, or PUBREC and later
PUBREL -> PUBCOMP (section 4.3). The hot path: a PUBLISH without properties is never turned
into a packet object, and a QoS 0 one is forwarded as the bytes received."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..protocol import fastpath
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError, ProtocolError
from ..protocol.fastpath import scan_publish
from ..protocol.packets import MQTT_5
from ..protocol.reasons import ReasonCode
from .aliases import TopicAliases
from .message import Message
from .topics import valid_topic_name

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("mqttbroker.connection")


def publish_fast(
    conn: Connection, first: int, data: bytes, pos: int, body: int, stop: int, now: float
) -> None:
    """The PUBLISH ``data[pos:stop]`` from the client (its first byte ``first``, its body
    from ``body``), read at ``now`` (and counted by the connection's framing). Without
    properties (the common case) it is sliced, no packet object made (fastpath.scan_publish);
    one with properties is decoded in full and goes through :func:`on_publish`."""
    topic_end, start, packet_id = scan_publish(first, data, body, stop, conn.version)
    if start < 0:
        packet = fastpath.decode_publish(first & 0x0F, data, body, stop, conn.version)
        on_publish(conn, packet, now)
        return
    qos = (first >> 1) & 3
    retain = (first & 1) != 0
    if qos:
        route(conn, data[body:topic_end], None, data[start:stop], qos, retain, packet_id, now)
    else:  # what a subscriber of the same version gets is this very packet
        route(conn, data[body:topic_end], None, data[start:stop], 0, retain, 0, now, data[pos:stop])


def on_publish(conn: Connection, packet: pk.Publish, now: float) -> None:
    """A PUBLISH with properties: topic aliases, property checks, then routing."""
    opts = conn.broker.options
    qos = packet.qos
    topic = packet.topic
    props = packet.properties
    alias = props.get(prop.TOPIC_ALIAS)
    if alias is not None:
        if not 0 < alias <= opts.topic_alias_maximum:
            raise MQTTError(
                f"topic alias {alias} out of range", ReasonCode.TOPIC_ALIAS_INVALID
            )  # MQTT-3.3.2-9, -12
        aliases = conn.aliases
        if topic:
            if aliases is None:
                aliases = conn.aliases = TopicAliases()
            aliases.inbound[alias] = topic
        else:
            known = None if aliases is None else aliases.inbound.get(alias)
            if known is None:
                raise ProtocolError(f"topic alias {alias} has no mapping")
            topic = known
    if prop.SUBSCRIPTION_IDENTIFIER in props:
        raise ProtocolError("PUBLISH from a client with a Subscription Identifier")  # 3.3.4-6
    if prop.RESPONSE_TOPIC in props and not valid_topic_name(props[prop.RESPONSE_TOPIC]):
        raise ProtocolError("Response Topic is not a valid topic name")  # MQTT-3.3.2-14
    if props.get(prop.PAYLOAD_FORMAT_INDICATOR) == 1:
        try:
            check_utf8_payload(packet.payload)
        except MQTTError:
            if not qos:
                raise
            refuse(
                conn,
                qos,
                packet.packet_id or 0,
                ReasonCode.PAYLOAD_FORMAT_INVALID,
                "payload is not UTF-8 as its Payload Format Indicator says",
            )
            return
    route(
        conn,
        fastpath.encode_topic(topic),
        props,
        packet.payload,
        qos,
        packet.retain,
        packet.packet_id or 0,
        now,
    )


def route(
    conn: Connection,
    raw_topic: bytes,
    props: dict[int, Any] | None,
    payload: bytes,
    qos: int,
    retain: bool,
    packet_id: int,
    now: float,
    raw: bytes | None = None,
) -> None:
    """Route one received message and acknowledge it. ``now``: the time of the read that
    brought it. ``raw_topic`` is the topic as on the wire, with its 2-byte length; ``raw``,
    when given, the whole QoS 0 packet as received (no properties), which subscribers of this
    client's version get unchanged."""
    broker = conn.broker
    opts = broker.options
    if qos > opts.maximum_qos:
        raise MQTTError(
            f"PUBLISH at QoS {qos} above the maximum", ReasonCode.QOS_NOT_SUPPORTED
        )  # MQTT-3.2.2-11
    if retain and not opts.retain_available:
        raise MQTTError(
            "retained PUBLISH not supported", ReasonCode.RETAIN_NOT_SUPPORTED
        )  # MQTT-3.2.2-14
    router = broker.router
    authorizer = broker.authorizer
    # A topic seen before (Router.lookup_raw's first step): its name is not decoded unless
    # something below needs it (else the message decodes it on first use, Message.topic).
    topic: str | None = None
    match = router.cache.get(raw_topic)
    if match is None:
        found = router.lookup_raw(raw_topic, None if authorizer is None else conn)
        if found is None:
            if raw_topic == b"\x00\x00":
                raise ProtocolError("PUBLISH with an empty topic and no topic alias")
            raise MQTTError("invalid topic name", ReasonCode.TOPIC_NAME_INVALID)  # 3.3.2-2
        topic, match = found
    if authorizer is not None:
        if topic is None:
            topic = raw_topic[2:].decode()
        if not conn.may_publish(topic):
            broker.stats.denied += 1
            conn.log_denied("publish to", topic)
            if qos:  # QoS 0 is dropped silently (and counted)
                refuse(
                    conn,
                    qos,
                    packet_id,
                    ReasonCode.NOT_AUTHORIZED,
                    "not authorized to publish to this topic",
                )
            return
    session = conn.session
    assert session is not None
    if qos:
        broker.stats.count_received(qos)
    else:  # the most frequent, counted without a call
        broker.stats.received_q0 += 1
    if opts.max_publish_rate and not conn.take_token(now):
        raise MQTTError(
            f"publishing faster than {opts.max_publish_rate:g} messages/s",
            ReasonCode.MESSAGE_RATE_TOO_HIGH,
        )
    if retain and payload and len(router.retained) >= opts.max_retained:
        if topic is None:
            topic = raw_topic[2:].decode()
        if router.retained.get(topic) is None:
            log.warning(
                "client %s: retained message on %r refused: max_retained (%d) reached",
                conn.client_id,
                topic,
                opts.max_retained,
            )
            broker.stats.denied += 1
            if qos:
                refuse(
                    conn, qos, packet_id, ReasonCode.QUOTA_EXCEEDED, "too many retained messages"
                )
            return
    if qos == 2:
        waiting = session.awaiting_release
        if packet_id not in waiting:
            if len(waiting) >= opts.receive_maximum:
                raise MQTTError(
                    "more unacknowledged QoS 2 messages than Receive Maximum",
                    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                )  # MQTT-3.3.4-7
            message = Message.received(topic, raw_topic, payload, qos, retain, props, now)
            conn.input.work += router.publish(message, match, session, now)
            session.await_release(packet_id)
        # else a resend before PUBREL: acknowledged again, not delivered twice (4.3.3-10)
        conn.send(fastpath.encode_ack(pk.PUBREC, packet_id, 0, None, conn.version))
        return
    if props is None:  # nothing for Message.received to take out: the constructor at once
        message = Message(
            topic, payload, qos, retain, None, None, raw_topic, None, raw, conn.version
        )
    else:
        message = Message.received(topic, raw_topic, payload, qos, retain, props, now)
    count = router.publish(message, match, session, now)
    conn.input.work += count
    if qos:
        code = ReasonCode.NO_MATCHING_SUBSCRIBERS if not count and conn.version == MQTT_5 else 0
        conn.send(fastpath.encode_ack(pk.PUBACK, packet_id, code, None, conn.version))


def refuse(conn: Connection, qos: int, packet_id: int, code: int, reason: str) -> None:
    """PUBACK/PUBREC with a failure code: the message is acknowledged, not delivered
    (MQTT-4.4.0-2). A Reason String says why, unless the client asked for none
    (MQTT-3.1.2-29) or it would not fit the client's Maximum Packet Size (MQTT-3.4.2-2)."""
    conn.send_explained(pk.PUBACK if qos == 1 else pk.PUBREC, packet_id, code, reason)


def on_pubrel(conn: Connection, packet_id: int) -> None:
    """PUBREL: the client releases a QoS 2 packet id; PUBCOMP in any case, with 0x92 (MQTT 5)
    when the id was not held."""
    session = conn.session
    assert session is not None
    if session.release(packet_id) or conn.version != MQTT_5:
        conn.send(fastpath.encode_ack(pk.PUBCOMP, packet_id, 0, None, conn.version))
    else:
        conn.send_explained(
            pk.PUBCOMP,
            packet_id,
            ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
            f"PUBREL for packet identifier {packet_id}: no QoS 2 message awaits it",
        )


def check_utf8_payload(payload: bytes) -> None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        raise MQTTError(
            "payload is not UTF-8 although its Payload Format Indicator says so",
            ReasonCode.PAYLOAD_FORMAT_INVALID,
        ) from None
