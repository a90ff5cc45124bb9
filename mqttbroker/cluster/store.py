"""The store of a cluster node: the node's own store, plus the messages it forwarded.

A connection holds its output (acknowledgements among it) while the store has writes its input
caused that are not durable yet (``Store.writes``, ``Store.after_commit``). Forwarding a QoS 1/2
message to another node's stream is such a write: the acknowledgement to its publisher waits
until Redis has added it to the stream, and until the node's own store has committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..broker.store import Restored, Store

if TYPE_CHECKING:
    from ..broker.message import Message
    from ..broker.session import Delivery, Session
    from ..broker.topics import Subscription
    from ..protocol.packets import Will


class ClusterStore(Store):
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.forwards = 0  # QoS 1/2 messages and route changes handed to Redis so far
        # Set by the node: whether Redis has forwards not yet confirmed, and where callbacks
        # wait for them (in order).
        self.redis_pending: Callable[[], bool] = lambda: False
        self.redis_waiters: list[Callable[[], None]] = []

    @property
    def writes(self) -> int:
        return self.inner.writes + self.forwards

    @writes.setter
    def writes(self, value: int) -> None:
        raise AttributeError("a cluster store counts the writes of the store it wraps")

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Once Redis has every forward so far, then once the node's store has committed. The
        callbacks run in the order they came (a connection relies on it)."""
        if self.redis_waiters or self.redis_pending():
            self.redis_waiters.append(callback)
        else:
            self.inner.after_commit(callback)

    def redis_done(self, waiters: list[Callable[[], None]]) -> None:
        """The forwards ``waiters`` waited for are in Redis."""
        for callback in waiters:
            self.inner.after_commit(callback)

    async def load(self, clock: Callable[[], float]) -> Restored:
        return await self.inner.load(clock)

    async def close(self) -> None:
        await self.inner.close()

    def save_session(self, session: Session) -> None:
        self.inner.save_session(session)

    def delete_session(self, session: Session) -> None:
        self.inner.delete_session(session)

    def save_subscription(self, session: Session, sub: Subscription) -> None:
        self.inner.save_subscription(session, sub)

    def delete_subscription(self, session: Session, topic_filter: str) -> None:
        self.inner.delete_subscription(session, topic_filter)

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        self.inner.save_delivery(session, delivery)

    def delete_delivery(self, session: Session, delivery: Delivery) -> None:
        self.inner.delete_delivery(session, delivery)

    def save_release(self, session: Session, packet_id: int) -> None:
        self.inner.save_release(session, packet_id)

    def delete_release(self, session: Session, packet_id: int) -> None:
        self.inner.delete_release(session, packet_id)

    def save_retained(self, message: Message) -> None:
        self.inner.save_retained(message)

    def delete_retained(self, topic: str) -> None:
        self.inner.delete_retained(topic)

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
        self.inner.save_will(session, will, due)

    def delete_will(self, session: Session) -> None:
        self.inner.delete_will(session)
