"""The interface between the broker's state and a durable store.

The broker keeps all of its state in memory and tells the store about every change that a restart
must not lose: sessions of non-zero expiry, their subscriptions, the QoS 1/2 messages queued or in
flight to them, the QoS 2 packet ids they have not released, their wills, and retained messages.
The calls are synchronous and cheap (a store records them and writes them in batches); a
connection whose input caused writes holds its output until :meth:`Store.after_commit` says the
batch is on disk, so an acknowledgement always means "stored".

This base class is the memory-only store (``--memory``): it records nothing and every commit has
already happened. ``mqttbroker.storage.sqlite.SQLiteStore`` is the durable one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocol.packets import Will
    from .core import Broker
    from .message import Message
    from .session import Delivery, Session
    from .topics import Subscription


class Store:
    # Number of changes recorded so far; a connection compares it before and after its input.
    writes = 0

    async def load(self, broker: Broker) -> None:
        """Restore the stored state into ``broker`` (called once, before listening)."""

    async def close(self) -> None:
        """Write what is pending and close."""

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every change recorded so far is durable."""
        callback()

    def save_session(self, session: Session) -> None: ...

    def delete_session(self, session: Session) -> None:
        """The session ended: forget it with everything that belongs to it."""

    def save_subscription(self, session: Session, sub: Subscription) -> None: ...

    def delete_subscription(self, session: Session, topic_filter: str) -> None: ...

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        """A QoS 1/2 message queued for, or in flight to, a persistent session (new or changed:
        packet id assigned, PUBREL sent)."""

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
