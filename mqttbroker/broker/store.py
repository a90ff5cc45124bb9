"""The interface between the broker's state and a durable store.

The broker keeps all of its state in memory and tells the store about every change that a restart
must not lose: sessions of non-zero expiry, their subscriptions, the QoS 1/2 messages queued or in
flight to them, the QoS 2 packet ids they have not released, their wills, and retained messages.
The calls are synchronous and cheap (a store records them and writes them in batches); a
connection whose input caused writes holds its output until :meth:`Store.after_commit` says the
batch is on disk, so an acknowledgement always means "stored". A durable store may leave out of
``writes`` the changes no acknowledgement waits for (a delivered message's removal, a QoS 1
message's packet id, a known session's clock) and commit them a little later, with the next
batch: losing one sends a message again, never loses what was acknowledged
(storage/sqlite/batch.py, ``_defer``).

At start the store hands back what it kept as plain records (:class:`Restored`), and the
broker builds its sessions from them (:meth:`Broker.restore <mqttbroker.broker.core.Broker.restore>`):
the store never fills a session itself.

A session, a delivery and a message each carry one integer for the store, ``stored`` (0: the
store has no record of it). Only the store gives it a meaning (a durable store: the row's key,
or the next key of the session's deliveries); the broker copies it from the records at restore
and reads nothing from it but "is there a record" (then a delete is due). A delivery's is unique
within its session in every store, and the same after a restart in a durable one.

This base class is the memory-only store (``--memory``): it records nothing and every commit has
already happened. ``mqttbroker.storage.sqlite.SQLiteStore`` is the durable one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocol.packets import Will
    from .message import Message
    from .session import Delivery, Session
    from .topics import Subscription


@dataclass(slots=True)
class SubscriptionRecord:
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    identifier: int | None


@dataclass(slots=True)
class DeliveryRecord:
    """A QoS 1/2 message queued for a session (``packet_id`` None) or in flight to it.
    ``message`` is shared by every record of one stored message."""

    stored: int  # the store's key (Delivery.stored); the records come in their order
    message: Message
    qos: int
    retain: bool
    sub_ids: tuple[int, ...]
    packet_id: int | None
    released: bool
    share: str | None


@dataclass(slots=True)
class SessionRecord:
    """A persistent session as stored. Times are on the broker's clock; ``expires_at`` and
    ``will_due`` are None for a session whose client was connected when the broker stopped."""

    client_id: str
    expiry_interval: int
    expires_at: float | None
    username: str | None
    stored: int = 0  # the store's handle (Session.stored)
    subscriptions: list[SubscriptionRecord] = field(default_factory=list)
    deliveries: list[DeliveryRecord] = field(default_factory=list)  # in their order
    releases: list[int] = field(default_factory=list)  # inbound QoS 2 ids awaiting PUBREL
    will: Will | None = None
    will_version: int = 5  # the protocol version of the connection that set the will
    will_due: float | None = None


@dataclass(slots=True)
class Restored:
    """Everything a store kept from the previous run."""

    sessions: list[SessionRecord] = field(default_factory=list)
    retained: list[Message] = field(default_factory=list)


class Store:
    # Number of changes recorded so far; a connection compares it before and after its input.
    writes = 0

    async def load(self, clock: Callable[[], float]) -> Restored:
        """Open the store and hand back what it kept, with times on ``clock`` (called once,
        before listening); the broker builds its state from it."""
        return Restored()

    async def close(self) -> None:
        """Write what is pending and close."""

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every change recorded so far is durable."""
        callback()

    def save_session(self, session: Session, early: bool = False) -> None:
        """A session to keep (new, or its expiry changed). A store that records it marks it
        with a handle (``session.stored`` not 0): only such a session is deleted later.
        ``early``: resumed within the first half of its expiry interval, so that the record
        the store has is as safe to restore from for a while (see storage/sqlite/store.py)."""

    def delete_session(self, session: Session) -> None:
        """The session ended: forget it with everything that belongs to it. The broker calls
        this only for a session the store recorded (``session.stored`` not 0)."""

    def save_subscription(self, session: Session, sub: Subscription) -> None: ...

    def delete_subscription(self, session: Session, topic_filter: str) -> None: ...

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        """A QoS 1/2 message queued for, or in flight to, a persistent session (new or changed:
        packet id assigned, PUBREL sent). A new one gets its key (``delivery.stored``)."""
        if not delivery.stored:
            delivery.stored = session.stored = session.stored + 1

    def delete_delivery(self, session: Session, delivery: Delivery) -> None: ...

    def save_release(self, session: Session, packet_id: int) -> None:
        """An inbound QoS 2 packet id awaiting PUBREL."""

    def delete_release(self, session: Session, packet_id: int) -> None: ...

    def save_retained(self, message: Message) -> None: ...

    def delete_retained(self, topic: str) -> None: ...

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
        """The will of a persistent session: armed while connected (``due`` None), or waiting
        out its delay until the broker-clock time ``due``."""

    def delete_will(self, session: Session) -> None: ...
