"""The seam between the broker and its integrations (bridges, webhooks): an integration is an
internal subscriber, a *sink*, that the broker delivers to instead of a network connection.

Each sink owns a persistent session under a reserved client id (``$bridge/<name>``,
``$webhook/<name>``; no network client may use one) whose subscriptions are the integration's
topic rules. That session never has a connection, so the router queues every message it matches
there, exactly as for an offline client: in the durable store, bounded by the integration's own
``max_queued_messages``/``max_queued_bytes`` (drops counted), QoS 0 included. Queuing wakes the
sink (one attribute check in ``Session.deliver``, on the offline branch only), which takes
deliveries into flight (:meth:`Outbox.take`: under a packet id, stored) and removes each only when
the far side has acknowledged it (:meth:`Outbox.done`): a remote broker's PUBACK/PUBCOMP, an HTTP
endpoint's 2xx. A restart or a ``kill -9`` finds them queued or in flight again.

Messages coming *in* (a bridge's inbound rules, a webhook's dead letters) are published with the
sink's session as the publisher (:meth:`Outbox.publish`), through the checks a client's PUBLISH
passes; the sink's own subscriptions have No Local, so a message never goes back out the way it
came in.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..protocol.fastpath import encode_topic
from ..protocol.reasons import ReasonCode
from .message import Message
from .session import NEVER, Delivery, Session
from .topics import Subscription

if TYPE_CHECKING:
    from .core import Broker

log = logging.getLogger("mqttbroker.sink")

# Client ids of the integrations' sessions; a network client asking for one is refused (0x85).
RESERVED_PREFIXES = ("$bridge/", "$webhook/")


class Sink:
    """What the broker needs from an integration."""

    def wake(self) -> None:
        """Messages were queued for the sink's session: take them when ready."""
        raise NotImplementedError


class Outbox:
    """One integration's session, used as its durable queue."""

    def __init__(
        self, broker: Broker, client_id: str, sink: Sink, max_messages: int, max_bytes: int
    ) -> None:
        self.broker = broker
        session = broker.sessions.get(client_id)
        if session is None:  # new; else restored from the store with its queue
            session = broker.sessions[client_id] = Session(
                client_id, broker.options, broker.store, broker.backlog
            )
        session.options = dataclasses.replace(
            broker.options,
            queue_qos0=True,
            max_queued_messages=max_messages,
            max_queued_bytes=max_bytes,
        )
        session.expiry_interval = NEVER
        session.expires_at = None
        session.sink = sink
        broker.store.save_session(session)
        self.session = session

    def subscribe(self, filters: dict[str, int]) -> None:
        """Make the session's subscriptions exactly ``filters`` (topic filter -> QoS), No Local
        and Retain As Published each; those of an earlier configuration go."""
        broker = self.broker
        session = self.session
        for topic_filter in list(session.subscriptions):
            if topic_filter not in filters:
                gone = session.remove_subscription(topic_filter)
                assert gone is not None
                broker.router.unsubscribe(gone)
        for topic_filter, qos in filters.items():
            old = session.subscriptions.get(topic_filter)
            if old is not None and old.qos == qos:
                continue
            sub = Subscription(session, topic_filter, qos, no_local=True, retain_as_published=True)
            broker.router.subscribe(sub)
            session.add_subscription(sub)

    # -- outbound: the queue ----------------------------------------------------------------

    def take(self) -> tuple[int, Delivery] | None:
        """The next queued delivery, now in flight under a packet id (and stored so); None
        when the queue is empty. Expired messages are dropped on the way (MQTT-3.3.2-5)."""
        session = self.session
        queue = session.queue
        now = self.broker.clock()
        store = self.broker.store
        while queue:
            delivery = queue.popleft()
            if not queue:
                session.queue_emptied()
            session.queued_bytes -= delivery.message.size
            if delivery.message.expired(now):
                store.delete_delivery(session, delivery)
                continue
            packet_id = session._allocate_packet_id()
            delivery.packet_id = packet_id
            session.track(packet_id, delivery)
            store.save_delivery(session, delivery)
            return packet_id, delivery
        return None

    def done(self, packet_id: int) -> bool:
        """The far side has the delivery ``packet_id``: it leaves the store. False if unknown."""
        session = self.session
        delivery = session.inflight.get(packet_id)
        if delivery is None:
            return False
        session._finish(packet_id, delivery, self.broker.clock())
        return True

    @property
    def pending(self) -> int:
        """Deliveries queued or in flight."""
        return len(self.session.queue) + len(self.session.inflight)

    # -- inbound: publishing into the broker ------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: dict[int, Any] | None,
    ) -> int:
        """Publish a message into the broker as the sink's session: the authorizer, the topic
        rules and limits, the retained limit, then routing. The reason code a client's PUBACK
        would carry (0, 0x10 no subscribers, or a refusal >= 0x80). The caller acknowledges
        after ``store.after_commit``, as the broker does for a client."""
        broker = self.broker
        session = self.session
        router = broker.router
        authorizer = broker.authorizer
        if authorizer is not None and not authorizer.can_publish(
            session.client_id, session.username, topic
        ):
            broker.stats.denied += 1
            return ReasonCode.NOT_AUTHORIZED
        match = router.lookup(topic)
        if match is None:
            return ReasonCode.TOPIC_NAME_INVALID
        if retain and not broker.options.retain_available:
            retain = False
        if (
            retain
            and payload
            and len(router.retained) >= broker.options.max_retained
            and router.retained.get(topic) is None
        ):
            broker.stats.denied += 1
            return ReasonCode.QUOTA_EXCEEDED
        now = broker.clock()
        broker.stats.count_received(qos)
        message = Message.received(
            topic, encode_topic(topic), payload, qos, retain, properties, now
        )
        count = router.publish(message, match, session, now)
        return ReasonCode.SUCCESS if count else ReasonCode.NO_MATCHING_SUBSCRIBERS


def retire(broker: Broker, keep: set[str]) -> None:
    """End the sessions of integrations no longer configured (their queues go with them)."""
    now = broker.clock()
    for client_id, session in list(broker.sessions.items()):
        if client_id.startswith(RESERVED_PREFIXES) and client_id not in keep:
            log.info("%s is no longer configured: its session and queue are removed", client_id)
            broker.end_session(session, now)
