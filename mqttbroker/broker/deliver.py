"""PUBLISH to the client, and the acknowledgements of it: the encoded-once message written to
the connection's output buffer (with a Topic Alias when the client allows them), PUBREL, and
PUBACK/PUBREC/PUBCOMP from the client (the outbound QoS flows). Called by the session, which
owns the in-flight window and the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol import fastpath
from ..protocol import packets as pk
from ..protocol.packets import MQTT_5
from ..protocol.reasons import ReasonCode
from .aliases import TopicAliases
from .message import Message
from .state import CLOSED

if TYPE_CHECKING:
    from .connection import Connection


def send_publish(
    conn: Connection,
    message: Message,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    sub_ids: tuple[int, ...],
    now: float,
) -> bool:
    """Queue one PUBLISH to the client; False if it exceeds the client's Maximum Packet
    Size and was dropped instead (MQTT-3.1.2-24, -25). When the client allows Topic Aliases
    (``alias_maximum`` of them, MQTT-3.1.2-26), the topic goes out as one: the least recently
    used alias is reassigned when they are all taken."""
    # The fixed header's flags: RETAIN alone at QoS 0 without DUP, what nearly every delivery
    # is, so that it costs no shifts of a compiled int (nor a call of int() in Python).
    flags = (dup << 3) | (qos << 1) | retain if qos or dup else 1 if retain else 0
    limits = conn.limits
    alias_maximum = limits.alias_maximum
    if not alias_maximum:
        data = message.encode(conn.version, flags, packet_id, sub_ids, now)
        if len(data) > limits.max_send_size:
            return False
    else:
        known = conn.aliases
        if known is None:
            known = conn.aliases = TopicAliases()
        aliases = known.outbound
        topic = message.topic
        alias = aliases.get(topic)
        if alias is not None:
            aliases.move_to_end(topic)
            data = message.encode(conn.version, flags, packet_id, sub_ids, now, alias, False)
            if len(data) > limits.max_send_size:
                return False
        else:
            evicted = None
            if len(aliases) < alias_maximum:
                alias = len(aliases) + 1
            else:
                evicted = aliases.popitem(last=False)
                alias = evicted[1]
            data = message.encode(conn.version, flags, packet_id, sub_ids, now, alias)
            if len(data) > limits.max_send_size:
                if evicted is not None:  # not sent: the client still has the old mapping
                    aliases[evicted[0]] = evicted[1]
                    aliases.move_to_end(evicted[0], last=False)
                return False
            aliases[topic] = alias
    if conn.state != CLOSED:  # Connection.send, inline on this hot path
        output = conn.output
        output.publishes += 1
        if output.append(data):
            conn.broker.scheduler.mark_dirty(conn)
    return True


def send_pubrel(conn: Connection, packet_id: int) -> None:
    conn.send(fastpath.encode_ack(pk.PUBREL, packet_id, 0, None, conn.version))


def on_ack(conn: Connection, ptype: int, packet_id: int, reason_code: int, now: float) -> None:
    """PUBACK, PUBREC or PUBCOMP of ``packet_id`` for a PUBLISH sent to the client, read at
    ``now``: the outbound QoS 1/2 flows (section 4.3); the session frees the packet id and
    refills the receive window."""
    session = conn.session
    assert session is not None
    if ptype == pk.PUBACK:
        session.acknowledge(packet_id, now)
    elif ptype == pk.PUBREC:
        delivery = session.inflight.get(packet_id)
        if delivery is None or delivery.qos != 2:
            if conn.version == MQTT_5 and reason_code < 0x80:
                conn.send_explained(
                    pk.PUBREL,
                    packet_id,
                    ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
                    f"PUBREC for packet identifier {packet_id}: no QoS 2 message in flight",
                )
        elif session.received(packet_id, reason_code, now):
            send_pubrel(conn, packet_id)  # MQTT-4.3.3-4
    else:
        session.completed(packet_id, now)
