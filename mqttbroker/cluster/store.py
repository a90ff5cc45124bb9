"""The store of a cluster node: the node's own store, plus what Redis must have.

A connection holds its output (acknowledgements among it) while the store has writes its input
caused that are not durable yet (``Store.writes``, ``Store.after_commit``). Forwarding a QoS 1/2
message to another node's stream is such a write: the acknowledgement to its publisher waits
until Redis has added it to the stream, and until the node's own store has committed.

So is every change to a persistent session: besides the node's own store, it goes to the
session's hash in Redis (``session:<client id>``, see handover.py), so that another node can
adopt the session when this one is lost. Changes wait here (``changes``, the newest per field)
until the node's writer sends them with its next batch; while Redis is unreachable they wait
on, and acknowledgements wait for the node's own store only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..broker.store import Restored, Store
from ..protocol.packets import MQTT_5
from .handover import delivery_value, session_value, subscription_value, will_value

if TYPE_CHECKING:
    from ..broker.message import Message
    from ..broker.session import Delivery, Session
    from ..broker.topics import Subscription
    from ..protocol.packets import Will


# What ``SessionChanges.wipe`` asks for before the fields are written.
KEEP, END, REWRITE = range(3)

# A session's changes, written only by the node that owns it under the lease it holds (the
# fencing token): KEYS lease of the writing node, client:<id>, session:<id>, owned:<node>;
# ARGV its token, its node id, the client id, the wipe (KEEP, END, REWRITE), the "s" field (""
# if unchanged), the number of fields removed, their names, then the fields set (name, value).
# -1: the lease is not that token's any more (the node was adopted, or its lease ran out):
# nothing written; 0: another node owns the client id now: nothing written; 1: written. An END
# removes the hash unless another node owns the client id. A hand-over's answer kept in the hash
# (``h``, link.REPLY_SCRIPT) goes with any write of the node owning the session: it has the
# session now (built from that answer, or a new one if it never was).
FENCED_WRITE = """
local lease = redis.call('GET', KEYS[1])
if not lease or string.match(lease, '^[^/]*') ~= ARGV[1] then return -1 end
local owner = redis.call('GET', KEYS[2])
if ARGV[4] == '1' then
  redis.call('SREM', KEYS[4], ARGV[3])
  if not owner or owner == ARGV[2] then redis.call('DEL', KEYS[3]) end
  return 1
end
if owner ~= ARGV[2] then return 0 end
if ARGV[4] == '2' then redis.call('DEL', KEYS[3]) else redis.call('HDEL', KEYS[3], 'h') end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[3], 's', ARGV[5])
  redis.call('SADD', KEYS[4], ARGV[3])
end
local removed = tonumber(ARGV[6])
local i = 7
while i < 7 + removed do
  redis.call('HDEL', KEYS[3], unpack(ARGV, i, math.min(i + 999, 6 + removed)))
  i = i + 1000
end
i = 7 + removed
while i <= #ARGV do
  redis.call('HSET', KEYS[3], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  i = i + 1000
end
return 1
"""


FENCED_WRITE_SHA = hashlib.sha1(FENCED_WRITE.encode()).hexdigest()


class SessionChanges:
    """One session's changes not yet in Redis: ``wipe`` (END: the session ended here, its hash
    goes unless another node owns the client id now; REWRITE: this node rebuilt it, its hash is
    written afresh), then ``fields`` (name -> the object whose state it holds; None: removed)."""

    __slots__ = ("session", "wipe", "fields", "fresh", "meta")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.wipe = KEEP
        self.meta = False  # the "s" field (owner, expiry) to write
        self.fields: dict[str, Any] = {}
        # Messages first stored since the last write: removed again before it, Redis never
        # hears of them (a message delivered and acknowledged between two writes).
        self.fresh: set[str] = set()


class ClusterStore(Store):
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.forwards = 0  # QoS 1/2 messages, route and session changes handed to Redis
        # Set by the node: whether Redis has forwards not yet confirmed, and where callbacks
        # wait for them (in order).
        self.redis_pending: Callable[[], bool] = lambda: False
        self.redis_waiters: list[Callable[[], None]] = []
        # Set by the node: how it learns of a change below (it counts it as a forward while
        # Redis is reachable).
        self.changed: Callable[[], None] = lambda: None
        self.changes: dict[str, SessionChanges] = {}  # client id -> changes not yet in Redis
        # Client id -> the ids (``<origin>\x1d<counter>``, sequence.py) of the messages
        # forwarded to its session here by the node it came from (node.py ``_forwarded``), and
        # where it was before (a hand-over's answer names them), for its stay here: written
        # with the session (fields ``g:<id>``, in the same script as the delivery), so that a
        # node adopting it routes none of them again.
        self.forwards_got: dict[str, set[str]] = {}

    def _change(self, session: Session) -> SessionChanges:
        change = self.changes.get(session.client_id)
        if change is None or change.session is not session:
            # (another session of that id had changes waiting: this one replaces it)
            replaced = change is not None
            change = self.changes[session.client_id] = SessionChanges(session)
            if replaced:
                change.wipe = REWRITE
        self.changed()
        return change

    def rewrite_all(self, session: Session) -> None:
        """Write ``session`` to Redis whole (at start, and when Redis is back: it may have lost
        it)."""
        change = self._change(session)
        change.wipe = REWRITE
        fields = change.fields
        fields.clear()
        change.fresh.clear()
        for sub in session.subscriptions.values():
            fields["f:" + sub.topic_filter] = sub
        for delivery in [*session.inflight.values(), *session.queue]:
            if delivery.stored:
                fields[f"d:{delivery.stored}"] = delivery
        for packet_id in session.awaiting_release:
            fields[f"r:{packet_id}"] = True
        for ident in self.forwards_got.get(session.client_id, ()):
            fields["g:" + ident] = True
        conn = session.connection
        if session.will is not None:
            fields["w"] = (session.will, session.will_due, MQTT_5)
        elif conn is not None and conn.will is not None:
            fields["w"] = (conn.will, None, conn.version)

    def forward_routed(self, session: Session, ident: str) -> None:
        """A message forwarded to ``session`` (its id ``ident``) was routed to it here."""
        got = self.forwards_got.get(session.client_id)
        if got is None:
            got = self.forwards_got[session.client_id] = set()
        got.add(ident)
        if session.persistent and session.sink is None:
            self._change(session).fields["g:" + ident] = True

    def put_back(self, changes: dict[str, SessionChanges]) -> None:
        """Changes that did not reach Redis: before those that came since."""
        for client_id, old in changes.items():
            new = self.changes.get(client_id)
            if new is None:
                self.changes[client_id] = old
            elif new.session is old.session and new.wipe == KEEP:
                new.wipe = old.wipe
                new.meta = new.meta or old.meta
                new.fields = {**old.fields, **new.fields}
                new.fresh |= old.fresh

    def take_changes(self) -> dict[str, SessionChanges]:
        changes, self.changes = self.changes, {}
        return changes

    @staticmethod
    def write_changes(
        pipe: Any,
        changes: dict[str, SessionChanges],
        node_id: str,
        prefix: str,
        now: float,
        token: str,
    ) -> list[tuple[int, str]]:
        """Add ``changes`` to the Redis pipeline ``pipe``, each session's in one script that
        checks the fencing token first (``FENCED_WRITE``): where their results will be in the
        pipeline's, with their client ids."""
        owned = f"{prefix}owned:{node_id}"
        lease = f"{prefix}node:{node_id}"
        written: list[tuple[int, str]] = []
        for client_id, change in changes.items():
            session = change.session
            wipe = change.wipe
            meta = b""
            if wipe != END and (change.meta or wipe == REWRITE):
                meta = session_value(session)
            removed: list[str] = []
            values: list[Any] = []
            delivered = False
            for name, thing in change.fields.items():
                if thing is None:
                    removed.append(name)
                    continue
                values.append(name)
                if name[0] == "d":
                    delivered = True
                    values.append(delivery_value(thing, now))
                elif name[0] == "f":
                    values.append(subscription_value(thing))
                elif name == "w":
                    values.append(will_value(thing, now))
                else:
                    values.append(b"1")
            if wipe == KEEP and not meta and not removed and not values:
                continue
            if delivered or (removed and wipe != END):
                # (the next packet id: see handover.from_hash)
                values += ["p", str(session.next_packet_id)]
            written.append((len(pipe.command_stack), client_id))
            pipe.evalsha(
                FENCED_WRITE_SHA,
                4,
                lease,
                f"{prefix}client:{client_id}",
                f"{prefix}session:{client_id}",
                owned,
                token,
                node_id,
                client_id,
                wipe,
                meta,
                len(removed),
                *removed,
                *values,
            )
        return written

    @property
    def failing(self) -> bool:
        """Whether the node's store cannot commit (for /readyz)."""
        return bool(getattr(self.inner, "failing", False))

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

    def save_session(self, session: Session, early: bool = False) -> None:
        self.inner.save_session(session, early)
        if session.sink is None:  # (an integration's session is this node's own)
            if not session.stored:  # (the memory store does not mark it: Redis has it now)
                session.stored = 1
            self._change(session).meta = True

    def delete_session(self, session: Session) -> None:
        stored = session.stored
        self.forwards_got.pop(session.client_id, None)
        self.inner.delete_session(session)
        session.stored = 0
        for delivery in [*session.inflight.values(), *session.queue]:
            delivery.stored = 0
        if stored and session.sink is None:
            change = self._change(session)
            change.wipe = END
            change.meta = False
            change.fields.clear()
            change.fresh.clear()

    def save_subscription(self, session: Session, sub: Subscription) -> None:
        self.inner.save_subscription(session, sub)
        if session.sink is None:
            self._change(session).fields["f:" + sub.topic_filter] = sub

    def delete_subscription(self, session: Session, topic_filter: str) -> None:
        self.inner.delete_subscription(session, topic_filter)
        if session.sink is None:
            self._change(session).fields["f:" + topic_filter] = None

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        new = not delivery.stored
        self.inner.save_delivery(session, delivery)  # (every store gives it its key)
        if session.sink is None:
            change = self._change(session)
            name = f"d:{delivery.stored}"
            change.fields[name] = delivery
            if new:
                change.fresh.add(name)
            conn = session.connection
            if (
                delivery.qos == 2
                and delivery.packet_id is not None
                and not delivery.released
                and conn is not None
            ):
                # A QoS 2 PUBLISH just sent: it leaves once Redis has it under its packet id.
                # A node adopting the session sends it again under that id (the client knows
                # it), where, sent before, it would route it again under a new one (a copy).
                conn.hold_output()

    def delete_delivery(self, session: Session, delivery: Delivery) -> None:
        if not delivery.stored:
            return
        name = f"d:{delivery.stored}"
        self.inner.delete_delivery(session, delivery)
        delivery.stored = 0
        if session.sink is None:
            change = self._change(session)
            if name in change.fresh:
                change.fresh.discard(name)
                del change.fields[name]
            else:
                change.fields[name] = None

    def save_release(self, session: Session, packet_id: int) -> None:
        self.inner.save_release(session, packet_id)
        if session.sink is None:
            self._change(session).fields[f"r:{packet_id}"] = True

    def delete_release(self, session: Session, packet_id: int) -> None:
        self.inner.delete_release(session, packet_id)
        if session.sink is None:
            self._change(session).fields[f"r:{packet_id}"] = None

    def save_retained(self, message: Message) -> None:
        self.inner.save_retained(message)

    def delete_retained(self, topic: str) -> None:
        self.inner.delete_retained(topic)

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
        self.inner.save_will(session, will, due)
        if session.sink is None:
            conn = session.connection
            version = conn.version if conn is not None else MQTT_5
            self._change(session).fields["w"] = (will, due, version)

    def delete_will(self, session: Session) -> None:
        self.inner.delete_will(session)
        if session.sink is None:
            self._change(session).fields["w"] = None
