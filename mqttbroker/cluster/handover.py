"""A session moving between nodes: what the old owner sends, and how the new one takes it in.

When a client connects to a node and the lease of its client id (``client:<id>`` in Redis) names
another node that is alive, the new node asks that one (on its control channel) to hand the
session over, for the client's user (the request: client id, reply list, Clean Start, user
name, the asking node, the counters of what it let go of, see sequence.py; what needs no
session, ``client_id_pattern``, was checked before asking). The old node checks the session's owner as one node does (``Broker.check_owner``):
another user's session is refused (the answer ``{"refused": <reason code>, "reason": <text>}``,
its client and it left as they were, and the new node refuses the CONNECT with that code) or,
where the rules let that user have it, discarded. Otherwise it closes the client's connection
there (DISCONNECT 0x8E), writes the session in this form to the reply list the new node waits
on, the client id moving to the new node in the same script (link.REPLY_SCRIPT), and forgets
it; the new node builds it again and then lets the client's CONNECT go on, which resumes it
(Session Present 1).

The form is JSON: the session's owner, expiry, subscriptions with their options, its queued and
in-flight QoS 1/2 messages (each an MQTT 5 PUBLISH, hex) with their packet ids and QoS 2 state
(a queued one also with how long it has waited, so that its age in the queue goes on there),
and the QoS 2 packet ids it has not released; the counters of the messages routed by the old
node and the nodes the session was at before it (``seen``, one table per node, see
sequence.Came: the new node routes the session what it routed itself meanwhile and those nodes
had not), and the ids of the messages forwarded to it on its way (``got``).

A persistent session is also kept in Redis while it lives (``session:<client id>``, a hash
written by store.py, one field per part, so that a change is one field written): ``s`` its
owner and expiry, ``f:<filter>`` a subscription, ``d:<seq>`` a queued or in-flight message (its
state in JSON, a newline, the MQTT 5 PUBLISH), ``r:<packet id>`` an unreleased QoS 2 id, ``w``
its will (armed while its client is connected, or waiting out its delay: wall-clock time),
``p`` its next packet id as of the last write of its messages, ``g:<message id>`` a message
forwarded to it where it is or was (node.py ``_forwarded``; ``got`` in the hand-over form),
and ``h``, while the session is on its way to another node, the answer that node got (written
with it by link.REPLY_SCRIPT; gone with the new node's first write, which replaces the hash
whole): a node adopting the new one, lost before that write, builds the session from it.
Otherwise :func:`from_hash` turns that hash into the form above, so that a node adopting the sessions
of a node that is gone builds them as it builds a session handed over; its new packet ids start
PACKET_ID_MARGIN past ``p`` (the node gone may have sent messages under the next ones before it
wrote them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..broker.session import NEVER, Delivery, Session
from ..broker.topics import Subscription
from ..protocol.errors import MQTTError
from ..protocol.fastpath import decode_properties, encode_properties
from ..protocol.packets import MQTT_5, Will
from ..protocol.properties import WILL
from ..protocol.properties import PropertyId as Prop
from .sequence import Came

if TYPE_CHECKING:
    from ..broker.core import Broker


# How far past the next packet id a node last wrote (the ``p`` field) the node adopting the
# session starts: more than the ids a node gives out between two writes.
PACKET_ID_MARGIN = 4096


def _delivery_state(delivery: Delivery) -> list[Any]:
    return [
        delivery.qos,
        delivery.retain,
        list(delivery.sub_ids),
        delivery.packet_id,
        delivery.released,
        delivery.share,
    ]


def _subscription_state(sub: Subscription) -> list[Any]:
    return [
        sub.topic_filter,
        sub.qos,
        sub.no_local,
        sub.retain_as_published,
        sub.retain_handling,
        sub.identifier,
    ]


def serialise(
    session: Session, now: float, seen: Came | None = None, got: Iterable[str] = ()
) -> bytes:
    """The session as a hand-over's answer; ``seen``: for each node it was at, the counters
    of each origin it got every message sent there up to (sequence.Came), for the new node
    to route it the rest;
    ``got``: the ids of the messages forwarded to it where it was (above those counters,
    some of them: the new node routes it none of them again)."""
    from .node import encode

    deliveries = []
    for delivery in [*session.inflight.values(), *session.queue]:
        if delivery.message.expired(now):
            continue
        state = [encode(delivery.message, now).hex(), *_delivery_state(delivery)]
        if delivery.packet_id is None:  # queued: how long it has waited (the clocks differ)
            state.append(max(0.0, now - delivery.queued_at))
        deliveries.append(state)
    return json.dumps(
        {
            "username": session.username,
            "expiry": session.expiry_interval,
            "subscriptions": [_subscription_state(s) for s in session.subscriptions.values()],
            "deliveries": deliveries,
            "releases": sorted(session.awaiting_release),
            "next_packet_id": session.next_packet_id,
            "seen": seen or {},
            "got": sorted(got),
        }
    ).encode()


# -- the session's hash in Redis ------------------------------------------------------------


def session_value(session: Session) -> bytes:
    return json.dumps([session.username, session.expiry_interval]).encode()


def subscription_value(sub: Subscription) -> bytes:
    return json.dumps(_subscription_state(sub)).encode()


def delivery_value(delivery: Delivery, now: float) -> bytes:
    from .node import encode

    state = json.dumps(_delivery_state(delivery)).encode()
    return state + b"\n" + encode(delivery.message, now)


def will_value(state: tuple[Will, float | None, int], now: float) -> bytes:
    """A will as ``save_will`` gave it (``due`` on the broker's clock, None while its client
    is connected) with the protocol version of its connection."""
    will, due, version = state
    wall_due = None if due is None else time.time() + (due - now)
    props = encode_properties(will.properties).hex()
    return json.dumps(
        [will.topic, will.payload.hex(), will.qos, will.retain, props, version, wall_due]
    ).encode()


def _restore_will(session: Session, state: list[Any], now: float) -> Will:
    """The will of a session whose client's connection is gone: due when its delay runs out
    (counted from now when its client was connected)."""
    topic, payload, qos, retain, props, version, wall_due = state
    raw = bytes.fromhex(props)
    properties = decode_properties(raw, 0, len(raw), WILL)[0] if raw != b"\x00" else {}
    session.will = will = Will(topic, bytes.fromhex(payload), qos, retain, properties)
    if wall_due is not None:
        session.will_due = now + max(0.0, wall_due - time.time())
    else:
        delay = properties.get(Prop.WILL_DELAY_INTERVAL, 0)
        session.will_due = now + (delay if version == MQTT_5 else 0)
    return will


def from_hash(client_id: str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """The handover form of a session kept in Redis (see above); MQTTError if it is not
    readable."""
    try:
        username, expiry = json.loads(fields[b"s"])
        subscriptions = []
        deliveries: list[tuple[int, list[Any]]] = []
        releases = []
        forwarded = []
        next_packet_id = 1
        written_next = int(fields.get(b"p", b"0"))
        will = json.loads(fields[b"w"]) if b"w" in fields else None
        for name, value in fields.items():
            kind, _, key = name.partition(b":")
            if kind == b"f":
                subscriptions.append(json.loads(value))
            elif kind == b"d":
                state, _, packet = value.partition(b"\n")
                delivery = [packet.hex(), *json.loads(state)]
                deliveries.append((int(key), delivery))
                if delivery[4] is not None:
                    next_packet_id = max(next_packet_id, delivery[4] % 65535 + 1)
            elif kind == b"r":
                releases.append(int(key))
            elif kind == b"g":
                forwarded.append(key.decode())
        if written_next:
            # The node may have sent PUBLISHes under the ids after it before it wrote them
            # (its client holds the QoS 2 ones it has not seen released): new ones start past.
            next_packet_id = (max(next_packet_id, written_next) + PACKET_ID_MARGIN - 1) % 65535 + 1
    except (KeyError, ValueError, TypeError) as exc:
        raise MQTTError(f"session of {client_id} in Redis not readable: {exc}") from None
    return {
        "username": username,
        "expiry": expiry,
        "subscriptions": subscriptions,
        "deliveries": [d for _, d in sorted(deliveries, key=lambda item: item[0])],
        "releases": releases,
        "next_packet_id": next_packet_id,
        "will": will,
        "forwarded": forwarded,
    }


def forget(broker: Broker, session: Session) -> None:
    """Remove a session handed over to another node from this one: no will (its client is
    connected elsewhere, MQTT-3.1.3-9), and its messages went with it (no shared hand-over)."""
    session.will = session.will_due = None
    session.queue.clear()
    session.inflight.clear()
    broker.end_session(session, broker.clock())


def restore(
    broker: Broker, client_id: str, data: bytes | dict[str, Any], away: bool = False
) -> Session:
    """Build the session sent by another node (or read from Redis: ``data`` a dict) into
    ``broker`` (replacing a stale local one), recorded in the store when it is persistent;
    MQTTError if ``data`` does not make sense. ``away``: its client is not connecting now (an
    adopted session), so its expiry runs from now."""
    from .node import decode

    try:
        state: dict[str, Any] = json.loads(data) if isinstance(data, bytes) else data
        now = broker.clock()
        stale = broker.sessions.get(client_id)
        if stale is not None:
            forget(broker, stale)
        store = broker.store
        session = Session(client_id, broker.options, store, broker.backlog)
        session.username = state["username"]
        session.expiry_interval = int(state["expiry"])
        persistent = session.persistent
        if away and session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
        broker.sessions[client_id] = session
        if persistent:
            store.save_session(session)
        for topic_filter, qos, no_local, rap, rh, ident in state["subscriptions"]:
            sub = Subscription(
                session,
                topic_filter,
                qos,
                no_local=no_local,
                retain_as_published=rap,
                retain_handling=rh,
                identifier=ident,
            )
            broker.router.subscribe(sub)
            session.add_subscription(sub)
        for packet, qos, retain, sub_ids, packet_id, released, share, *age in state["deliveries"]:
            delivery = Delivery(
                decode(bytes.fromhex(packet), now), qos, retain, tuple(sub_ids), share
            )
            delivery.released = released
            if packet_id is not None:
                delivery.packet_id = packet_id
                session.track(packet_id, delivery)
            else:  # (its age goes on from what it was where it waited; from Redis: from now)
                delivery.queued_at = now - float(age[0]) if age else now
                session.append_queued(delivery)
            if persistent:
                store.save_delivery(session, delivery)
        for packet_id in state["releases"]:
            session.await_release(packet_id)
        session.next_packet_id = int(state["next_packet_id"])
        if state.get("will") is not None:  # (adopted: its client's connection is gone)
            will = _restore_will(session, state["will"], now)
            if persistent:
                store.save_will(session, will, session.will_due)
    except (ValueError, KeyError, TypeError) as exc:
        raise MQTTError(f"session of {client_id} from another node not readable: {exc}") from None
    return session
