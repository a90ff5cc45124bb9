"""One client's session state (section 4.1): subscriptions, the QoS 1/2 messages in flight to it,
the queue of messages waiting for it, the QoS 2 packet ids it has sent and not yet released, its
expiry and its will. It lives on while the client is away, for the Session Expiry Interval.

Sans-I/O: a session talks to its client only through ``self.connection`` (a
:class:`~mqttbroker.broker.connection.Connection`, or None while the client is away).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from .deliver import send_publish, send_pubrel
from .message import Message
from .options import BrokerOptions
from .store import DeliveryRecord, Store
from .topics import Subscription

if TYPE_CHECKING:
    from ..protocol.packets import Will
    from .connection import Connection
    from .sink import Sink

log = logging.getLogger("mqttbroker.session")

NEVER = 0xFFFFFFFF

# Seconds between two log lines about one session's dropped messages.
DROP_LOG_INTERVAL = 10.0


def filter_size(topic_filter: str) -> int:
    """What a subscription's filter counts against ``max_subscription_bytes``."""
    return len(topic_filter.encode("utf-8"))


# Compiled, not tracked by the cycle collector: it refers to its message and to numbers and
# strings only, none of which can refer back to it.
@mypyc_attr(acyclic=True)
class Delivery:
    """One message on its way to one session: queued, or in flight under a packet id."""

    __slots__ = (
        "message",
        "qos",
        "retain",
        "sub_ids",
        "released",
        "packet_id",
        "stored",
        "held",
        "share",
        "queued_at",
    )

    def __init__(
        self,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        share: str | None = None,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.released = False  # QoS 2: PUBREC received and PUBREL sent; awaiting PUBCOMP
        self.packet_id: int | None = None  # set while in flight
        # The store's key for it (0: none), unique within the session and, in a durable store,
        # the same after a restart; only the store sets it (broker/store.py).
        self.stored = 0
        self.held = False  # in flight, but its resend waits for room in the receive window
        # The shared subscription it came through ("$share/<group>/<filter>"), if any: when the
        # session ends first, the message goes to another member of that group as it is then.
        self.share = share
        self.queued_at = 0.0  # clock() when it joined the session's queue (its age there)


_MEMORY = Store()
# What a session that has never queued a message shows as its queue, a session that never
# held an inbound QoS 2 id as ``awaiting_release``, and one without subscriptions as
# ``subscriptions``: shared, since many sessions never need them (an empty deque holds a
# block of 64 slots). The queue takes nothing (maxlen 0): messages are
# queued through append_queued, which gives the session its own deque first.
_NO_QUEUE: deque[Delivery] = deque(maxlen=0)
_NO_RELEASES: frozenset[int] = frozenset()
_NO_SUBSCRIPTIONS: Mapping[str, Subscription] = MappingProxyType({})  # read-only
# Shared by every session with nothing in flight, never written: Session.track gives a
# session its own dict for its first delivery in flight (an idle client's is not 64 bytes).
# So ``inflight`` may be another dict after anything that sends: read it, do not keep it.
_NO_INFLIGHT: dict[int, Delivery] = {}


@mypyc_attr(acyclic=True)
class Drops:
    """A session's drops not logged yet (Session.report_drops), made at its first drop: a
    session that drops nothing, nearly all, keeps none of this."""

    __slots__ = ("unlogged", "why", "log_next")

    def __init__(self) -> None:
        self.unlogged = 0  # since the last log line about them
        self.why = ""
        self.log_next = float("-inf")  # no line about drops before this time


class Session:
    __slots__ = (
        "client_id",
        "options",
        "subscriptions",
        "connection",
        "expiry_interval",
        "expires_at",
        "inflight",
        "queue",
        "queued_bytes",
        "next_packet_id",
        "awaiting_release",
        "will",
        "will_due",
        "dropped",
        "drops",
        "store",
        "held",
        "stored",
        "username",
        "counted",
        "subscription_bytes",
        "sink",
        "backlog",
    )

    def __init__(
        self,
        client_id: str,
        options: BrokerOptions,
        store: Store | None = None,
        backlog: dict[Session, None] | None = None,
    ) -> None:
        self.client_id = client_id
        self.options = options
        self.store = store or _MEMORY
        self.held = 0  # in-flight deliveries whose resend is held (see resend)
        self.stored = 0  # the store's handle (0: it has no record); only the store sets it
        self.username: str | None = None  # its owner: the user that created it
        self.counted = False  # counted against max_sessions (see Broker.attach)
        self.subscription_bytes = 0  # the filter_size of its subscriptions, summed
        # Topic filter -> subscription (its own dict from the first subscription on).
        self.subscriptions: Mapping[str, Subscription] = _NO_SUBSCRIPTIONS
        self.connection: Connection | None = None
        self.expiry_interval = 0
        self.expires_at: float | None = None  # set while the client is away
        # Deliveries in flight by packet id (insertion order is sending order; see track).
        self.inflight: dict[int, Delivery] = _NO_INFLIGHT
        self.queue: deque[Delivery] = _NO_QUEUE  # its own deque from the first queued message on
        self.queued_bytes = 0
        self.next_packet_id = 1
        # Inbound QoS 2 ids before PUBREL (its own set from the first one on).
        self.awaiting_release: set[int] | frozenset[int] = _NO_RELEASES
        self.will: Will | None = None  # a will waiting out its Will Delay Interval
        self.will_due: float | None = None
        self.dropped = 0  # messages dropped for this session, in all
        self.drops: Drops | None = None
        # An integration (bridge, webhook) that takes this session's queue instead of a network
        # connection (see sink.py); such a session never has a connection.
        self.sink: Sink | None = None
        # The broker's index of the sessions with queued messages (Broker.backlog): joined
        # when the queue becomes non-empty, left by whatever empties it (queue_emptied).
        self.backlog = backlog

    @property
    def persistent(self) -> bool:
        """Whether the session outlives its connection (a non-zero Session Expiry Interval):
        then, and only then, the store keeps it and everything that belongs to it."""
        return self.expiry_interval != 0

    # -- subscriptions ----------------------------------------------------------------------

    def subscription_growth(self, topic_filter: str) -> int:
        """What subscribing to ``topic_filter`` adds to ``subscription_bytes`` (nothing when
        it replaces a subscription of the same filter)."""
        return 0 if topic_filter in self.subscriptions else filter_size(topic_filter)

    def add_subscription(self, sub: Subscription, save: bool = True) -> None:
        """Hold ``sub``, in place of any subscription of the same filter (MQTT-3.8.4-3); the
        caller puts it in the router. ``save`` False: restored from the store, which has it."""
        self.subscription_bytes += self.subscription_growth(sub.topic_filter)
        subscriptions = self.subscriptions
        if not isinstance(subscriptions, dict):
            subscriptions = self.subscriptions = {}
        subscriptions[sub.topic_filter] = sub
        if save and self.persistent:
            self.store.save_subscription(self, sub)

    def clear_subscriptions(self) -> None:
        """Forget every subscription (the caller took them out of the router)."""
        self.subscriptions = _NO_SUBSCRIPTIONS
        self.subscription_bytes = 0

    def remove_subscription(self, topic_filter: str) -> Subscription | None:
        """Drop the subscription of exactly ``topic_filter`` (compared literally, MQTT-3.10.4-1)
        and return it for the caller to take out of the router; None if there was none."""
        subscriptions = self.subscriptions
        if not isinstance(subscriptions, dict):
            return None
        sub: Subscription | None = subscriptions.pop(topic_filter, None)
        if sub is not None:
            self.subscription_bytes -= filter_size(topic_filter)
            if self.persistent:
                self.store.delete_subscription(self, topic_filter)
        return sub

    # -- QoS 2 from the client --------------------------------------------------------------

    def await_release(self, packet_id: int) -> bool:
        """An inbound QoS 2 PUBLISH under ``packet_id`` was routed: its id is held until PUBREL
        (MQTT-4.3.3-9). False if it was held already: a resend, not routed again (-10)."""
        waiting = self.awaiting_release
        if packet_id in waiting:
            return False
        if isinstance(waiting, frozenset):
            waiting = self.awaiting_release = set()
        waiting.add(packet_id)
        if self.persistent:
            self.store.save_release(self, packet_id)
        return True

    def release(self, packet_id: int) -> bool:
        """PUBREL: the id is free again. False if it was not held."""
        waiting = self.awaiting_release
        if packet_id not in waiting or isinstance(waiting, frozenset):
            return False
        waiting.discard(packet_id)
        if self.persistent:
            self.store.delete_release(self, packet_id)
        return True

    # -- delivery ---------------------------------------------------------------------------

    def restore_delivery(self, record: DeliveryRecord, now: float) -> None:
        """Put back a message the store kept for this session (records come in their order):
        in flight under its packet id, or queued (its age there counts from ``now``)."""
        delivery = Delivery(record.message, record.qos, record.retain, record.sub_ids, record.share)
        delivery.stored = record.stored
        delivery.released = record.released
        packet_id = record.packet_id
        if packet_id is not None:
            delivery.packet_id = packet_id
            self.track(packet_id, delivery)
            self.next_packet_id = packet_id % 65535 + 1
        else:
            delivery.queued_at = now
            self.append_queued(delivery)

    def restore_releases(self, packet_ids: list[int]) -> None:
        """Put back the inbound QoS 2 ids the store kept (awaiting PUBREL)."""
        if packet_ids:
            self.awaiting_release = set(packet_ids)

    def track(self, packet_id: int, delivery: Delivery) -> None:
        """Put ``delivery`` in flight under ``packet_id``: the one way into ``inflight``."""
        inflight = self.inflight
        if inflight is _NO_INFLIGHT:
            inflight = self.inflight = {}
        inflight[packet_id] = delivery

    def append_queued(self, delivery: Delivery) -> None:
        """Put ``delivery`` at the end of the queue, as it is (no limit checked, nothing
        stored): for messages coming back from the store or from another node."""
        queue = self.queue
        if queue is _NO_QUEUE:
            queue = self.queue = deque()
        if not queue and self.backlog is not None:
            self.backlog[self] = None
        queue.append(delivery)
        self.queued_bytes += delivery.message.size

    def deliver(
        self,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
        share: str | None = None,
    ) -> None:
        """Hand one matched message to this session (MQTT-4.5.0-1)."""
        conn = self.connection
        if conn is None or conn.output.paused:
            if qos or self.options.queue_qos0:
                self._enqueue(Delivery(message, qos, retain, sub_ids, share), now)
                if self.sink is not None:
                    self.sink.wake()
            elif conn is not None:
                self._count_drop("client is not reading", now)
            return
        if not qos:
            send_publish(conn, message, 0, retain, False, None, sub_ids, now)
        elif not self.queue and len(self.inflight) < conn.limits.send_quota:
            self._start(Delivery(message, qos, retain, sub_ids, share), conn, now)
        else:
            self._enqueue(Delivery(message, qos, retain, sub_ids, share), now)

    def _start(self, delivery: Delivery, conn: Connection, now: float) -> None:
        packet_id = self._allocate_packet_id()
        if send_publish(
            conn,
            delivery.message,
            delivery.qos,
            delivery.retain,
            False,
            packet_id,
            delivery.sub_ids,
            now,
        ):
            delivery.packet_id = packet_id
            self.track(packet_id, delivery)
            if self.persistent:
                self.store.save_delivery(self, delivery)
        elif delivery.stored:
            # too large for this client: dropped as though delivered (MQTT-3.1.2-25)
            self.store.delete_delivery(self, delivery)

    def _finish(self, packet_id: int, delivery: Delivery, now: float, refill: bool = True) -> None:
        del self.inflight[packet_id]
        if delivery.stored:
            self.store.delete_delivery(self, delivery)
        if delivery.held:
            delivery.held = False
            self.held -= 1
        if refill:
            self._refill(now)

    def _refill(self, now: float) -> None:
        """Use the room in the client's receive window: first the in-flight messages whose
        resend was held (in their order, MQTT-4.4.0-1), then the queue (MQTT-3.3.4-9)."""
        conn = self.connection
        if conn is None:
            return
        while self.held and len(self.inflight) - self.held < conn.limits.send_quota:
            packet_id, delivery = next((p, d) for p, d in self.inflight.items() if d.held)
            delivery.held = False
            self.held -= 1
            if not self._send_again(conn, packet_id, delivery, now):
                self._finish(packet_id, delivery, now, refill=False)
        if not self.held and self.queue:
            self.drain(now)

    def _allocate_packet_id(self) -> int:
        """A non-zero id not in use by a message in flight (MQTT-2.2.1-4)."""
        packet_id = self.next_packet_id
        inflight = self.inflight
        while packet_id in inflight:
            packet_id = packet_id % 65535 + 1
        self.next_packet_id = packet_id % 65535 + 1
        return packet_id

    def _enqueue(self, delivery: Delivery, now: float) -> None:
        opts = self.options
        size = delivery.message.size
        if (
            len(self.queue) >= opts.max_queued_messages
            or self.queued_bytes + size > opts.max_queued_bytes
        ):
            self._count_drop("queue full", now)
            return
        delivery.queued_at = now
        self.append_queued(delivery)
        if self.persistent:
            self.store.save_delivery(self, delivery)

    def _count_drop(self, why: str, now: float) -> None:
        """One message not delivered (its publisher was acknowledged all the same: the drop is
        this session's queue policy). Logged at the first drop, then at most once per
        DROP_LOG_INTERVAL while drops go on; :meth:`report_drops` logs what is left."""
        self.dropped += 1
        drops = self.drops
        if drops is None:
            drops = self.drops = Drops()
        drops.unlogged += 1
        drops.why = why
        if now >= drops.log_next:
            self.report_drops(now)

    def report_drops(self, now: float) -> None:
        """Log the drops not logged yet (the broker's tick calls it once the interval is over:
        the end of a burst is reported too)."""
        drops = self.drops
        assert drops is not None
        log.warning(
            "session %s: %d messages dropped (%s); %d dropped in all",
            self.client_id,
            drops.unlogged,
            drops.why,
            self.dropped,
        )
        drops.unlogged = 0
        drops.log_next = now + DROP_LOG_INTERVAL

    def drop_unreadable(self, can_read: Callable[[str], bool], now: float) -> int:
        """Drop the queued messages whose topic ``can_read`` refuses, and such messages in
        flight that the client has not received yet (no PUBREL sent); returns how many. They
        count as dropped (the caller logs them)."""
        verdicts: dict[str, bool] = {}

        def readable(delivery: Delivery) -> bool:
            topic = delivery.message.topic
            verdict = verdicts.get(topic)
            if verdict is None:
                verdict = verdicts[topic] = can_read(topic)
            return verdict

        count = 0
        for packet_id, delivery in list(self.inflight.items()):
            if not delivery.released and not readable(delivery):
                self._finish(packet_id, delivery, now, refill=False)
                count += 1
        kept: deque[Delivery] = deque()
        for delivery in self.queue:
            if readable(delivery):
                kept.append(delivery)
                continue
            self.queued_bytes -= delivery.message.size
            if delivery.stored:
                self.store.delete_delivery(self, delivery)
            count += 1
        if count:
            self.queue = kept
            self.queue_emptied()
            self.dropped += count
            self._refill(now)
        return count

    def queue_emptied(self) -> None:
        """Leave the broker's backlog index if the queue is now empty; called by everything
        that takes messages out of it, so that every session in the index has queued messages."""
        if not self.queue and self.backlog is not None:
            self.backlog.pop(self, None)

    def drain(self, now: float) -> None:
        """Send queued messages while the client's receive window allows (MQTT-3.3.4-9)."""
        conn = self.connection
        queue = self.queue
        if conn is None:
            return
        quota = conn.limits.send_quota
        while queue and not conn.output.paused:
            delivery = queue[0]
            # (not a local: the first delivery in flight gives the session a dict of its own)
            if delivery.qos and len(self.inflight) >= quota:
                break
            queue.popleft()
            self.queued_bytes -= delivery.message.size
            if delivery.message.expired(now):  # MQTT-3.3.2-5
                if delivery.stored:
                    self.store.delete_delivery(self, delivery)
            elif delivery.qos:
                self._start(delivery, conn, now)
            else:
                send_publish(
                    conn, delivery.message, 0, delivery.retain, False, None, delivery.sub_ids, now
                )
                if delivery.stored:
                    self.store.delete_delivery(self, delivery)
        self.queue_emptied()

    def resend(self, now: float) -> None:
        """On resuming a session: every unacknowledged PUBLISH again with DUP set, and every
        PUBREL, in their original order (MQTT-4.4.0-1); then the queue."""
        conn = self.connection
        if conn is None:
            return
        # The new connection's Receive Maximum bounds the PUBLISHes resent now (MQTT-3.3.4-9);
        # the others keep their packet ids and go out as acknowledgements make room.
        room = conn.limits.send_quota
        too_large = []
        for packet_id, delivery in list(self.inflight.items()):
            if delivery.released:
                send_pubrel(conn, packet_id)
                room -= 1
            elif room > 0:
                if delivery.held:
                    delivery.held = False
                    self.held -= 1
                if self._send_again(conn, packet_id, delivery, now):
                    room -= 1
                else:
                    too_large.append((packet_id, delivery))
            elif not delivery.held:
                delivery.held = True
                self.held += 1
        # Dropped only after the loop, so that nothing is sent out of order meanwhile.
        for packet_id, delivery in too_large:
            self._finish(packet_id, delivery, now, refill=False)
        self._refill(now)
        if not self.queue and self.queue is not _NO_QUEUE:
            # Emptied on resuming (a device back for what waited for it, the common case): the
            # empty deque (its block of 64 slots: 760 bytes) goes; a message queued later makes
            # another. Here only, once per resumption, not as each drain empties the queue.
            self.queue = _NO_QUEUE

    @staticmethod
    def _send_again(conn: Connection, packet_id: int, delivery: Delivery, now: float) -> bool:
        """Send an in-flight PUBLISH again, DUP set; False if it no longer fits the client's
        Maximum Packet Size (it is then dropped as delivered, MQTT-3.1.2-25)."""
        return send_publish(
            conn,
            delivery.message,
            delivery.qos,
            delivery.retain,
            True,
            packet_id,
            delivery.sub_ids,
            now,
        )

    # -- acknowledgements from the client ---------------------------------------------------

    def acknowledge(self, packet_id: int, now: float) -> bool:
        """PUBACK: the QoS 1 message is delivered. False if no QoS 1 message had that id."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 1:
            return False
        self._finish(packet_id, delivery, now)
        return True

    def received(self, packet_id: int, reason_code: int, now: float) -> bool:
        """PUBREC for a QoS 2 message in flight: True if a PUBREL is to be sent."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 2:
            return False
        if reason_code >= 0x80:  # refused: acknowledged, not retransmitted (MQTT-4.4.0-2)
            self._finish(packet_id, delivery, now)
            return False
        if not delivery.released:
            delivery.released = True
            if delivery.stored:
                self.store.save_delivery(self, delivery)
        return True

    def completed(self, packet_id: int, now: float) -> bool:
        """PUBCOMP: the QoS 2 exchange is over."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or not delivery.released:
            return False
        self._finish(packet_id, delivery, now)
        return True

    def __repr__(self) -> str:
        state = "online" if self.connection else "offline"
        return f"Session({self.client_id!r}, {state}, {len(self.subscriptions)} subscriptions)"
