"""A session moving between nodes: what the old owner sends, and how the new one takes it in.

When a client connects to a node and the lease of its client id (``client:<id>`` in Redis) names
another node that is alive, the new node asks that one (on its control channel) to hand the
session over. The old node closes the client's connection there (DISCONNECT 0x8E), writes the
session in this form to the reply list the new node waits on, and forgets it; the new node
builds it again and then lets the client's CONNECT go on, which resumes it (Session Present 1).

The form is JSON: the session's owner, expiry, subscriptions with their options, its queued and
in-flight QoS 1/2 messages (each an MQTT 5 PUBLISH, hex) with their packet ids and QoS 2 state,
and the QoS 2 packet ids it has not released.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..broker.session import Delivery, Session
from ..broker.topics import Subscription
from ..protocol.errors import MQTTError

if TYPE_CHECKING:
    from ..broker.core import Broker


def serialise(session: Session, now: float) -> bytes:
    from .node import encode

    deliveries = []
    for delivery in [*session.inflight.values(), *session.queue]:
        if delivery.message.expired(now):
            continue
        deliveries.append(
            [
                encode(delivery.message, now).hex(),
                delivery.qos,
                delivery.retain,
                list(delivery.sub_ids),
                delivery.packet_id,
                delivery.released,
                delivery.share,
            ]
        )
    return json.dumps(
        {
            "username": session.username,
            "expiry": session.expiry_interval,
            "subscriptions": [
                [
                    s.topic_filter,
                    s.qos,
                    s.no_local,
                    s.retain_as_published,
                    s.retain_handling,
                    s.identifier,
                ]
                for s in session.subscriptions.values()
            ],
            "deliveries": deliveries,
            "releases": sorted(session.awaiting_release),
            "next_packet_id": session.next_packet_id,
        }
    ).encode()


def forget(broker: Broker, session: Session) -> None:
    """Remove a session handed over to another node from this one: no will (its client is
    connected elsewhere, MQTT-3.1.3-9), and its messages went with it (no shared hand-over)."""
    session.will = session.will_due = None
    session.queue.clear()
    session.inflight.clear()
    broker.end_session(session, broker.clock())


def restore(broker: Broker, client_id: str, data: bytes) -> Session:
    """Build the session sent by another node into ``broker`` (replacing a stale local one),
    recorded in the store when it is persistent; MQTTError if ``data`` does not make sense."""
    from .node import decode

    try:
        state: dict[str, Any] = json.loads(data)
        now = broker.clock()
        stale = broker.sessions.get(client_id)
        if stale is not None:
            forget(broker, stale)
        store = broker.store
        session = Session(client_id, broker.options, store)
        session.username = state["username"]
        session.expiry_interval = int(state["expiry"])
        persistent = session.persistent
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
        for packet, qos, retain, sub_ids, packet_id, released, share in state["deliveries"]:
            delivery = Delivery(
                decode(bytes.fromhex(packet), now), qos, retain, tuple(sub_ids), share
            )
            delivery.released = released
            if packet_id is not None:
                delivery.packet_id = packet_id
                session.inflight[packet_id] = delivery
            else:
                session.queue.append(delivery)
                session.queued_bytes += delivery.message.size
            if persistent:
                store.save_delivery(session, delivery)
        for packet_id in state["releases"]:
            session.await_release(packet_id)
        session.next_packet_id = int(state["next_packet_id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MQTTError(f"session of {client_id} from another node not readable: {exc}") from None
    return session
