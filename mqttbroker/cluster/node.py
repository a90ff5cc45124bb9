"""One node's link to the cluster: the broker's backplane on Redis.

Redis keys (``mqttbroker:`` prefix):

- ``node:<id>``: the node's lease, ``<token>/<CLIENT ID>/<run_id>`` (a random token, new each
  time the node takes it, and the Redis connection it is renewed on, see ``_holder_gone``),
  expiring after ``node_ttl`` unless renewed; a second node with the same id finds it taken
  and does not start. The token is the node's fencing token: every session write checks it
  (store.FENCED_WRITE), and a node adopting this one holds the lease under its own.
- ``nodes``: the ids of every node that ever joined; ``routes:<id>``: a hash of that node's topic
  filters (value: its subscriptions to the filter when last written).
- ``stream:<id>``: the QoS 1/2 messages for node ``<id>`` (consumer group ``deliver``), trimmed
  to about ``stream_max_length`` entries; an entry holds the messages for that node of one write
  (up to about 64 KiB of them).
- ``retained``: a hash of every retained message (topic -> MQTT 5 PUBLISH).
- ``client:<client id>``: the node that owns the client id (set when its CONNECT is accepted,
  given back when the node that had the session refused it, removed when its session ends
  there); ``handover:<token>``: a session on its way, or the refusal (handover.py).
- ``session:<client id>``: a persistent session as its node last committed it (a hash, see
  handover.py; written by store.py); ``owned:<id>``: the client ids of node ``<id>``'s persistent
  sessions. A node that is gone (its lease expired) is adopted by the first other node one of
  its clients connects to, or once it has been gone ``adopt_after`` seconds (``_sweep``): that
  node takes its sessions from there and the messages left in its stream, and removes its
  routes and stream (``_adopt``).

Channels: ``routes`` (``+<id>\\0<filter>`` and ``-<id>\\0<filter>``: a node's first subscription
to a filter and the end of its last), ``pub:<id>`` (QoS 0 messages for node ``<id>``),
``retained`` (``<id>\\0<PUBLISH>``: a retained message set or cleared), ``ctl:<id>`` (requests to
node ``<id>``: hand a session over).

A message crosses nodes as an MQTT 5 PUBLISH (the encoding the broker has anyway), and only to the
nodes whose filters match its topic, framed with what it is for there (``_arrived_one``). All
writes go through one task, in order, pipelined: one round trip per batch whatever its size, and
the messages of a batch for one node travel as one stream entry (QoS 1/2) or one pub/sub message
(QoS 0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sqlite3
from collections.abc import Awaitable, Callable, Collection, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import RedisError, ResponseError

from ..broker.backplane import Backplane
from ..broker.message import Message
from ..config import StartError
from ..protocol import fastpath
from ..protocol.errors import MQTTError
from ..protocol.packets import MQTT_5
from ..protocol.reasons import ReasonCode
from .handover import forget, from_hash, restore, serialise
from .link import (
    FENCED_XADD,
    FENCED_XADD_SHA,
    LEAVE_SCRIPT,
    RELEASE_SCRIPT,
    REPLY_SCRIPT,
    SEEN_SCRIPT,
    SEEN_SHA,
    TAKE_SCRIPT,
    Link,
)
from .outbox import Outbox
from .ownership import (
    LEASE_GONE,
    RENEWED,
    Act,
    Answer,
    Lease,
    Seen,
    Step,
    answer_kind,
    claim_step,
    serves_while_redis_down,
)
from .redis_client import redis_client
from .routes import RouteTable
from .sequence import (
    REPLAY_SECONDS,
    Came,
    Recent,
    Routed,
    covered,
    highest,
    new_origin,
    newest,
    parse_id,
    sent_to,
)
from .store import FENCED_WRITE, ClusterStore, SessionChanges

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..broker.session import Session
    from ..broker.topics import SharedGroup
    from ..config import ClusterConfig

log = logging.getLogger("mqttbroker.cluster")

PREFIX = "mqttbroker:"
GROUP = "deliver"
ROUTES = PREFIX + "routes"
RETAINED = PREFIX + "retained"
READ_COUNT = 512  # stream entries read at once
RETRY_SECONDS = 0.5  # between tries while Redis is unreachable

# QoS 0 copies for other nodes that may wait for one write to Redis; past it they are dropped
# (QoS 0 is at most once), so a node publishing faster than Redis takes keeps its memory.
MAX_QOS0_WAITING = 100_000
ENTRY_BYTES = 65536  # messages for one node share a stream entry (or pub/sub message) up to this
GOT_MAX = 1000  # the ids of forwards a session got that go with it when it moves, at most
HANDOVER_SECONDS = 5.0  # how long a node waits for another to hand a session over
ASK_SLICE = 0.5  # ... looking every so often whether it is gone meanwhile

# Writes, in the order they were asked for.
_XADD, _PUB, _ROUTE, _RETAIN, _XACK, _REPLY, _RELEASE = range(7)
# A client id whose session did not come from another node (ClusterNode._came_with).
_NOT_CAME: Came = {}


async def kept_running(work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work``, a loop that ends only when cancelled, and start it again after an error
    it did not expect: logged with its traceback, and the node goes on (a node whose writer
    stopped would hold every acknowledgement, one whose reader stopped would miss every
    message from the other nodes, and nothing would say why)."""
    task = asyncio.current_task()
    while True:
        try:
            await work()
            return
        except Exception:
            if task is not None and task.cancelling():
                # Stopping: a Redis call cut short by the cancel may surface as its own error
                # (redis-py turns a connection closed under a blocking read into one).
                return
            log.exception("cluster: error in %s, started again", work.__name__.strip("_"))
            await asyncio.sleep(RETRY_SECONDS)


def redacted(url: str) -> str:
    """``url`` without its password, as logs and errors show it."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def decode(data: bytes, now: float) -> Message:
    """A message as it crossed from another node (an MQTT 5 PUBLISH); MQTTError if it is not
    one."""
    found = fastpath.read_fixed_header(data, 0, len(data))
    if found is None or found[0] + found[1] != len(data) or data[0] >> 4 != 3:
        raise MQTTError("not a PUBLISH packet")
    length, pos = found
    packet = fastpath.decode_publish(data[0] & 0x0F, data, pos, pos + length, MQTT_5)
    topic = packet.topic
    return Message.received(
        topic,
        fastpath.encode_topic(topic),
        packet.payload,
        packet.qos,
        packet.retain,
        packet.properties or None,
        now,
    )


def readable(packet: bytes, now: float) -> Message | None:
    """A message from another node (its PUBLISH), or None, logged, if it is not readable."""
    try:
        return decode(packet, now)
    except MQTTError as exc:
        log.warning("cluster: message from Redis not readable, skipped: %s", exc)
        return None


def pack(frames: list[bytes], limit: int = ENTRY_BYTES) -> list[bytes]:
    """``frames`` as entries of at most about ``limit`` bytes, each frame after its length (4
    bytes, big-endian): one Redis entry carries many messages."""
    entries: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for frame in frames:
        if parts and size + len(frame) > limit:
            entries.append(b"".join(parts))
            parts, size = [], 0
        parts.append(len(frame).to_bytes(4, "big"))
        parts.append(frame)
        size += 4 + len(frame)
    if parts:
        entries.append(b"".join(parts))
    return entries


def came_from(seen: Any) -> Came:
    """The counters a hand-over's answer says its session got (``seen``, sequence.Came), as
    far as they are readable."""
    if not isinstance(seen, dict):
        return {}
    return {
        node: {o: c for o, c in counters.items() if isinstance(o, str) and isinstance(c, int)}
        for node, counters in seen.items()
        if isinstance(node, str) and isinstance(counters, dict)
    }


def _answer(client_id: str, data: bytes) -> dict[str, Any]:
    """A hand-over's answer (see ``ClusterNode._hand_over``): the session (handover.py's form)
    or a refusal (``refused``: its reason code, ``reason``: why); MQTTError if not readable."""
    try:
        state = json.loads(data)
        if not isinstance(state, dict):
            raise TypeError(type(state).__name__)
        if "refused" in state:
            state["refused"] = int(state["refused"])
            state["reason"] = str(state["reason"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MQTTError(f"session of {client_id} from another node not readable: {exc}") from None
    return state


def encode(message: Message, now: float) -> bytes:
    qos = message.qos
    return message.encode(MQTT_5, (qos << 1) | message.retain, 1 if qos else None, (), now)


class ClusterNode(Backplane):
    def __init__(
        self,
        config: ClusterConfig,
        broker: Broker,
        store: ClusterStore,
        data_dir: Path | None = None,
    ) -> None:
        """``data_dir``: where messages for other nodes wait while Redis is unreachable (None:
        in memory)."""
        self.config = config
        self.node_id = config.node_id
        self.url = redacted(config.redis)
        self.broker = broker
        self.router = broker.router
        self.store = store
        store.redis_pending = self._unconfirmed_forwards
        store.changed = self._session_changed
        self.outbox = Outbox(data_dir)
        # (a reply is read for longer than a hand-over waits: redis-py's default, 5 s, is not)
        self.redis = redis_client(config.redis, config.connect_timeout, 2 * HANDOVER_SECONDS)
        # The lease is renewed on a connection of its own, used for nothing else: its Redis
        # CLIENT ID is in the lease, and the other nodes take this node for gone once Redis has
        # closed it (a pub/sub connection would not do: Redis closes one that reads too slowly).
        self._live = redis_client(
            config.redis, config.connect_timeout, 2 * HANDOVER_SECONDS, single=True
        )
        self.link = Link(self.redis, self._live, PREFIX, self.node_id)
        self.lease = Lease(config.node_ttl)  # this node's own, as it knows it (ownership.py)
        self._rewriting: set[str] = set()  # sessions to write whole again (see _send)
        self._fence_next = False  # the next batch's acknowledgements are not sent (_back)
        self.routes = RouteTable(broker.options.match_cache_size)
        self.token = secrets.token_hex(16)
        self._lease_key = f"{PREFIX}node:{self.node_id}"
        self._routes_key = f"{PREFIX}routes:{self.node_id}"
        self._stream_key = self.stream_key(self.node_id)
        self._control = f"{PREFIX}ctl:{self.node_id}"
        self._claims: set[asyncio.Task[None]] = set()  # claims and adoptions under way
        self._turns: dict[str, int] = {}  # shared subscription -> messages it got from here
        self._ops: list[tuple[int, str, Any]] = []
        self._unconfirmed = 0  # forwards queued or sent, not yet confirmed by Redis
        self._counted = 0  # ... of them, those not yet taken by the writer
        self._retry: list[tuple[int, str, Any]] = []  # writes to send once Redis is back
        self._adopting = asyncio.Lock()
        self._holding: set[str] = set()  # client ids of sessions being adopted here
        self._deferred: list[bytes] = []  # hand-over requests for them, answered after
        self._missing: dict[str, float] = {}  # other node -> when it was first seen gone
        self._wake = asyncio.Event()  # the writer has something to do
        self._gone = asyncio.Event()  # Redis was lost (or the lease): resynchronise once back
        self._keeping = asyncio.Lock()  # writes go to the outbox, or it is being sent
        self._tasks: list[asyncio.Task[None]] = []
        self._pubsub: Any = None
        self._down = False  # in an episode of Redis being unreachable
        self._leased = False
        self._qos0_waiting = 0  # QoS 0 copies queued for the next write
        # Message ids (sequence.py): this run's origin and counter, the counters routed here of
        # each origin, what was routed here lately, and the counters sessions came with.
        self.origin = new_origin(self.node_id)
        self._counter = 0
        self.seen = Routed()
        self._touched = False  # a persistent session changed since the counters were taken
        self.recent = Recent()
        # for its stay here (_not_had, _had, _seen_for); and of each origin the highest of
        # those counters (a message above it is none of theirs: _not_had).
        self._came_with: dict[str, Came] = {}
        # Client id -> what its answer said it got (came_from), for the sessions on their way
        # to a node being adopted here when it was lost (_adopt), while it is.
        self._arriving: dict[str, Came] = {}
        self._came_max: dict[str, int] = {}
        # Sessions handed to other nodes lately: their plain filters (client id as the "node"),
        # and until when / to which node what this node routes for them is forwarded.
        self._leaving = RouteTable(1024)
        # Client id -> until when what is routed here for its session is forwarded, to which
        # node, the ids of the messages forwarded to it here before it left, and the counters
        # of the messages that node had let go of that it must be sent all the same (_went).
        self._left: dict[str, tuple[float, str, set[str], dict[str, tuple[int, int]]]] = {}
        self._forwards = Recent(indexed=True)  # forwarded messages routed here (ids only)
        # ... and to which sessions (also the messages of a gone node's stream, see _drain)
        self._forwarded_to: dict[tuple[str, int], set[str]] = {}
        # (before the session: when, origin, counter, the nodes it was sent to, message)
        self._early: dict[str, list[tuple[float, str, int, frozenset[str] | None, Message]]] = {}
        # Client id -> when its session came, and for each origin the counters above those it
        # came with up to the last this node had let go of then (_missed_here).
        self._gaps: dict[str, tuple[float, dict[str, tuple[int, int]]]] = {}
        self._dropping = False  # dropping QoS 0 copies (logged once until they flow again)

    def unready(self) -> str | None:
        """For /readyz: why this node does not serve as part of the cluster now."""
        if self._down:
            return f"cluster: Redis at {self.url} unreachable (local traffic only)"
        return None

    @staticmethod
    def stream_key(node_id: str) -> str:
        return f"{PREFIX}stream:{node_id}"

    def _unconfirmed_forwards(self) -> bool:
        return self._unconfirmed > 0

    def _hold(self, count: int) -> None:
        """``count`` writes for Redis that hold the acknowledgements of the input that caused
        them until Redis (or, while it is unreachable, the outbox) has them."""
        self._unconfirmed += count
        self._counted += count
        self.store.forwards += 1

    def _session_changed(self) -> None:
        # While Redis is down, the node's own store is what counts; not once this node's lease
        # may have run out: what depends on a session here waits until it is known to be
        # this node's still (another node may have adopted it).
        if not self._down or self.lease.lapsed:
            self._hold(1)
        self._touched = True
        self._wake.set()

    def lease_valid(self, now: float) -> bool:
        """Whether this node surely holds its lease (and the sessions it owns) at ``now``;
        once not, it stops serving them (``_lapse``) until Redis says."""
        if self.lease.check(now) is Act.LAPSE:
            self._on_lapse()
        return self.lease.valid(now)

    def _on_lapse(self) -> None:
        """This node's lease may have run out (no renewal for node_ttl: frozen, or cut off
        from Redis), and another node may have adopted its sessions: their clients here are
        disconnected (0x8E) now, before anything is delivered to them, and what their
        changes hold (acknowledgements) waits until the lease is renewed or the sessions
        given up (``_fence``)."""
        log.warning(
            "cluster: the lease of node %r was not renewed for node_ttl (%g s): its persistent "
            "sessions may have moved; their clients here are disconnected until it is renewed",
            self.node_id,
            self.config.node_ttl,
        )
        self._drop_clients("this node's lease ran out: the session may be on another node")
        self._gone.set()  # (renewed or resynchronised at once: see _reconnect)
        self._down = True

    @staticmethod
    def _cut(waiters: list[Callable[[], None]]) -> None:
        """The connections whose output waits for ``waiters`` closed without it: what it
        acknowledges may be lost (the sessions were another node's), their clients send it
        again."""
        from ..broker.connection import Connection

        for callback in waiters:
            conn = getattr(callback, "__self__", None)
            if isinstance(conn, Connection):
                conn.link.abort()

    def _drop_clients(self, reason: str) -> None:
        for session in list(self.broker.sessions.values()):
            conn = session.connection
            if conn is not None and session.persistent and session.sink is None:
                conn.disconnect(ReasonCode.SESSION_TAKEN_OVER, reason, publish_will=False)

    def _fence(self, waiters: list[Callable[[], None]]) -> None:
        """A write of this node was refused by its fencing token (its lease is another's, or
        gone: another node adopted it, see store.FENCED_WRITE): every persistent session here
        may be elsewhere. Their clients are disconnected (0x8E); the connections whose output
        (acknowledgements) waited for that write are cut without it; then the node
        resynchronises (_back: a new lease, the sessions other nodes own given up)."""
        log.warning(
            "cluster: node %r was fenced (its lease is not its own any more): its persistent "
            "sessions' clients are disconnected, acknowledgements that waited are not sent",
            self.node_id,
        )
        self._cut(waiters)
        self._drop_clients("this node was fenced: the session is on another node")
        if not self._down:
            self._down = True
            self._gone.set()

    # -- start and stop ---------------------------------------------------------------------

    async def connect(self) -> None:
        """Reach Redis, take this node's lease, forget the routes of this node's previous run;
        StartError names the key when that fails. Then the broker may attach the backplane and
        restore its sessions (their subscriptions become this node's routes)."""
        try:
            await self.redis.ping()
        except (RedisError, OSError) as exc:
            raise StartError(f"cluster.redis: cannot reach Redis at {self.url}: {exc}") from None
        try:
            await self.link.liveness()
            taken = await self._take_lease()
            if not taken:
                raise StartError(
                    f"cluster.node_id: node {self.node_id!r} is already running on {self.url} "
                    f"(a node that stopped without leaving holds it for up to "
                    f"{self.config.node_ttl:g} s); give each node its own node_id"
                )
            self._leased = True
            await self._prepare()
        except RedisError as exc:
            raise StartError(f"cluster.redis: Redis at {self.url} refused: {exc}") from None
        self.router.backplane = self

    async def _prepare(self) -> None:
        """This node's entries as they must be before it routes: registered, routes rewritten
        from the router's, its stream's consumer group there."""
        await self.redis.script_load(FENCED_WRITE)  # (sent by its SHA: see store.py)
        await self.redis.script_load(SEEN_SCRIPT)
        await self.redis.script_load(FENCED_XADD)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(PREFIX + "nodes", self.node_id)
        pipe.delete(self._routes_key)
        counts = self.router.route_counts
        if counts:
            pipe.hset(self._routes_key, mapping=dict(counts))
        await pipe.execute()
        try:
            await self.redis.xgroup_create(self._stream_key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def start(self) -> None:
        """Listen to the other nodes, read their routes and the retained messages, and start
        the tasks that write, read this node's stream and renew the lease."""
        try:
            self._pubsub = self.redis.pubsub()
            await self._pubsub.subscribe(
                ROUTES, RETAINED, f"{PREFIX}pub:{self.node_id}", self._control
            )
            await self._owned_sessions()
            await self._resync()
            await self.outbox.load()
            if await self._send_outbox():
                log.warning("cluster: messages kept while Redis was unreachable sent")
        except RedisError as exc:
            raise StartError(f"cluster.redis: Redis at {self.url} failed: {exc}") from None
        for work in (
            self._write_loop,
            self._listen,
            self._read_stream,
            self._renew,
            self._reconnect,
        ):
            self._tasks.append(asyncio.create_task(kept_running(work)))
        log.info(
            "cluster node %r on Redis %s: %d other nodes with routes",
            self.node_id,
            self.url,
            len(self.routes.filters),
        )

    async def _owned_sessions(self, chunk: int = 1000) -> int:
        """The sessions this node's store put back (or kept while Redis was unreachable) that
        another node took over meanwhile are not this node's any more: forgotten here (their
        wills and expiry happen there, once; a client still connected here is disconnected,
        0x8E). Those no node owns become this node's, and are written to Redis whole."""
        broker = self.broker
        sessions = list(broker.sessions.values())
        moved = 0
        for start in range(0, len(sessions), chunk):
            part = sessions[start : start + chunk]
            pipe = self.redis.pipeline(transaction=False)
            for session in part:
                pipe.set(f"{PREFIX}client:{session.client_id}", self.node_id, nx=True, get=True)
            for session, owner in zip(part, await pipe.execute(), strict=True):
                if broker.sessions.get(session.client_id) is not session:
                    # Ended or replaced meanwhile (a claim under way built the session again,
                    # from another node's answer): written whole, this one would wipe that.
                    continue
                if owner is not None and owner.decode() != self.node_id:
                    left = self._disconnect(session)
                    if left is not None:
                        forget(broker, left)
                    moved += 1
                elif session.sink is None:
                    self.store.rewrite_all(session)  # Redis may not have it (all) any more
        if moved:
            log.info("cluster: %d stored sessions were taken over by other nodes meanwhile", moved)
        return moved

    async def _resync(self) -> None:
        """The other nodes' routes, and the retained messages (those here and not in Redis
        are written there: a Redis that lost its data gets them back)."""
        nodes = [n.decode() for n in await self.redis.smembers(PREFIX + "nodes")]
        for node in nodes:
            if node != self.node_id:
                filters = await self.redis.hkeys(f"{PREFIX}routes:{node}")
                self.routes.replace(node, {f.decode() for f in filters})
        stored: dict[bytes, bytes] = await self.redis.hgetall(RETAINED)
        now = self.broker.clock()
        retained = self.router.retained
        for data in stored.values():
            self._retained_arrived(data, now)
        missing = {m.topic: encode(m, now) for m in retained if m.topic.encode() not in stored}
        if missing:
            await self.redis.hset(RETAINED, mapping=missing)

    async def stop(self, timeout: float = 2.0) -> None:
        """Send what is waiting (routes of sessions that ended at shutdown among it), then
        leave: the lease goes, the routes of persistent sessions stay (their messages wait in
        this node's stream until it is back)."""
        if self._tasks:
            writer = self._tasks[0]
            self._wake.set()
            deadline = asyncio.get_running_loop().time() + timeout
            while (
                self._ops or self.store.redis_waiters or self.store.changes
            ) and not writer.done():
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("cluster: %d writes to Redis not sent at stop", len(self._ops))
                    break
                await asyncio.sleep(0.01)
        tasks = [*self._tasks, *self._claims]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a Redis call that does not give way to cancelling holds no stop
            await asyncio.wait(tasks, timeout=timeout)
        self._tasks = []
        try:
            async with asyncio.timeout(timeout):
                await self._leave()
        except (RedisError, OSError, TimeoutError):
            pass
        self.outbox.close()

    async def _leave(self) -> None:
        """The lease given back (so that this node_id may start again at once), connections
        closed."""
        if self._leased:
            await self.link.release_lease(self._lease_key, self.token)
        await self._live.aclose()
        if self._pubsub is not None:
            await self._pubsub.aclose()
        await self.redis.aclose()

    # -- the backplane ----------------------------------------------------------------------

    def publish(
        self, message: Message, groups: list[SharedGroup], publisher: Session | None
    ) -> tuple[int, list[SharedGroup]]:
        """A message published on this node: to each other node with matching filters, and
        for each matching shared subscription to one node with members of it, in turn (this
        one among them). One without a publisher (from another node, or this node's $SYS
        counters) stays here."""
        if publisher is None:
            return 0, groups
        now = self.broker.clock()
        if now >= self.lease.valid_until:  # (one comparison per message: the fence's cost)
            self.lease_valid(now)
        if message.retain:
            self._queue(_RETAIN, message.topic, (encode(message, now), not message.payload))
        qos = message.qos
        if qos:
            self._counter += 1
            self.seen.changed = True  # (its counter is written with the session changes)
        plain, shares = self.routes.match(message.topic)
        if not plain and not shares:
            if qos and self._left:
                ident = f"{self.origin}\x1d{self._counter}".encode()
                self._forward(message.topic, ident, encode(message, now), now, [])
            return 0, groups
        chosen: dict[str, list[str]] = {}  # node -> the shared subscriptions it serves
        if shares:
            me = self.node_id
            local = {g.members[0].topic_filter: g for g in groups if g.members}
            turns = self._turns
            for share, nodes in shares.items():
                candidates = (*nodes, me) if share in local else nodes
                turn = turns.get(share, 0)
                turns[share] = turn + 1
                node = candidates[turn % len(candidates)]
                if node != me:
                    chosen.setdefault(node, []).append(share)
                    local.pop(share, None)  # its turn is elsewhere
            groups = list(local.values())
        targets = set(plain).union(chosen)
        if not qos:
            if self._qos0_waiting >= MAX_QOS0_WAITING:  # Redis (or the writer) is behind
                if not self._dropping:
                    self._dropping = True
                    log.warning(
                        "cluster: QoS 0 messages for other nodes dropped: %d wait for Redis "
                        "already (logged once until they flow again)",
                        MAX_QOS0_WAITING,
                    )
                return 0, groups
            self._qos0_waiting += len(targets)
        packet = encode(message, now)
        # (a persistent session's: given up if the session moved meanwhile, see _back)
        moves = publisher.client_id if publisher.persistent else None
        # (QoS 1/2: the message's id, 0x1E, the nodes sent it for their plain subscriptions
        # and 0x1C, before the shared subscriptions: see _forward)
        ident = head = b""
        if qos:
            listed = ",".join(plain).encode()
            # (its PUBLISH, not the message: nothing more for the garbage collector)
            self.recent.add(now, self.origin, self._counter, packet, sent_to(listed))
            ident = f"{self.origin}\x1d{self._counter}\x1e".encode()
            head = ident + listed + b"\x1c"
        for node in targets:
            header = b"1" if node in plain else b"0"
            data = header + head + "\x1f".join(chosen.get(node, ())).encode() + b"\0" + packet
            self._queue(_XADD, node, (data, moves)) if qos else self._queue(_PUB, node, data)
        if qos:
            self._hold(len(targets))  # the publisher's acknowledgement waits for Redis
            if self._left:  # (after: a node gets the message itself before a forward)
                self._forward(message.topic, ident[:-1], packet, now, plain)
        return len(targets), groups

    def route_added(self, topic_filter: str) -> None:
        """A write like a forward: the SUBACK waits until Redis has told the other nodes, so
        a message published anywhere after it reaches the new subscriber."""
        self._queue(_ROUTE, topic_filter, None)
        if not self._down:  # (while it is, the routes are written again when it is back)
            self._hold(1)

    def route_removed(self, topic_filter: str) -> None:
        self._queue(_ROUTE, topic_filter, None)
        if not self._down:
            self._hold(1)

    def claim(
        self,
        client_id: str,
        clean_start: bool,
        username: str | None,
        done: Callable[[MQTTError | None], None],
    ) -> None:
        task = asyncio.ensure_future(self._claim(client_id, clean_start, username, done))
        self._claims.add(task)
        task.add_done_callback(self._claims.discard)

    async def _claim(
        self,
        client_id: str,
        clean_start: bool,
        username: str | None,
        done: Callable[[MQTTError | None], None],
    ) -> None:
        """Own ``client_id`` for a client of ``username``. If another node owns it, that node
        hands the session over (or drops it, on Clean Start) and closes the client's connection
        there (0x8E), or, the session being another user's, refuses as one node would (see
        ``_hand_over``): the client id goes back to it and ``done`` gets the refusal. A node
        that is gone (its lease expired, or Redis saw its connection close: killed) is adopted
        first, this session among its own. A node alive that does not answer within
        HANDOVER_SECONDS (frozen, or not listening yet) keeps the session: the CONNECT is
        refused with 0x88 (Server unavailable), which the client retries; a new session never
        starts over one another node has (ownership.py)."""
        key = f"{PREFIX}client:{client_id}"
        refusal: MQTTError | None = None
        try:
            if not self.lease_valid(self.broker.clock()) and not await self._renewed():
                raise MQTTError("this node's lease ran out; resynchronising")
            previous = await self.link.claim(key)
            if previous is not None:  # another node's: taken from it (adopted if gone)
                refusal = await self._take_over(
                    client_id, key, previous.decode(), clean_start, username
                )
            if client_id in self._holding:
                # Its session is being adopted here (the client id is this node's already):
                # the client is served once it is built and has its gone node's messages.
                async with self._adopting:
                    pass
        except (RedisError, OSError) as exc:
            here = client_id in self.broker.sessions
            if serves_while_redis_down(clean_start, here, self.lease):
                log.warning(
                    "cluster: client %s: owner not checked, Redis failed (%s); served here",
                    client_id,
                    exc,
                )
            else:
                log.warning("cluster: client %s: refused, Redis failed (%s)", client_id, exc)
                refusal = MQTTError(
                    "cluster: Redis unreachable, the client's session cannot be found; retry",
                    ReasonCode.SERVER_UNAVAILABLE,
                )
        except MQTTError as exc:
            log.warning("cluster: client %s: %s; refused", client_id, exc)
            refusal = MQTTError(
                f"cluster: the session could not be taken over ({exc.message}); retry",
                ReasonCode.SERVER_UNAVAILABLE,
            )
        # The session's routes (if it came from another node) are in Redis before the CONNACK.
        self.store.after_commit(partial(done, refusal))

    async def _take_over(
        self, client_id: str, key: str, owner: str, clean: bool, username: str | None
    ) -> MQTTError | None:
        """``client_id`` is ``owner``'s: take it with its session (None), or the refusal the
        CONNECT gets; each step as ownership.claim_step says."""
        link = self.link
        deadline = link.now() + HANDOVER_SECONDS
        adopted: set[str] = set()
        while owner != self.node_id:
            gone, lease, in_cluster, listening = await link.look(owner)
            seen = Seen(gone, owner in adopted, in_cluster, listening, link.now() > deadline)
            step = claim_step(seen)
            if step is Step.ADOPT:
                adopted.add(owner)
                await self._adopt(owner, client_id, lease)
            elif step is Step.TAKE_FREE:
                await link.give_back(key, owner, self.node_id)
            elif step is Step.REFUSE:
                log.warning(
                    "cluster: client %s: node %r has its session and did not hand it over "
                    "within %g s: refused (0x88), the client retries",
                    client_id,
                    owner,
                    HANDOVER_SECONDS,
                )
                return MQTTError(
                    f"cluster: node {owner!r} has this client's session and does not answer; retry",
                    ReasonCode.SERVER_UNAVAILABLE,
                )
            elif step is Step.ASK:
                data = await self._ask(client_id, owner, clean, username, deadline)
                kind = answer_kind(data)
                if kind is Answer.REFUSED:
                    assert data is not None
                    state = _answer(client_id, data)
                    return MQTTError(state["reason"], state["refused"])
                if kind is Answer.SESSION:
                    assert data is not None
                    state = _answer(client_id, data)
                    self._restore(client_id, state)
                    self._replay(client_id, state.get("seen"))
                    log.info(
                        "cluster: client %s: session taken over from node %r", client_id, owner
                    )
                if kind is not Answer.SILENT and kind is not Answer.MOVED:
                    return None
            found = await link.claim(key)
            if found is None:
                return None
            if found.decode() == owner and step is not Step.ADOPT:
                await asyncio.sleep(0.1)
            owner = found.decode()
        return None

    async def _ask(
        self,
        client_id: str,
        owner: str,
        clean: bool,
        username: str | None,
        deadline: float,
    ) -> bytes | None:
        """Ask the live node ``owner`` to hand ``client_id``'s session over: its answer (the
        client id comes with it, see link.REPLY_SCRIPT), or None if it did not answer by
        ``deadline`` or was found gone meanwhile (the request is then abandoned: an answer
        that comes later is refused in Redis, and that node keeps the session)."""
        link = self.link
        reply = f"{PREFIX}handover:{secrets.token_hex(8)}"
        # What this node had let go of of each origin (sequence.Recent.gaps): it lets go of
        # nothing more until the session is here (_replay), so that the old node forwards what
        # it routes after the session left that this node routed before and cannot give it.
        recent = self.recent
        recent.held += 1
        request = json.dumps(
            {
                "client": client_id,
                "reply": reply,
                "clean": clean,
                "user": username,
                "node": self.node_id,
                "forgotten": recent.forgotten,
            }
        )
        try:
            if await self.redis.publish(f"{PREFIX}ctl:{owner}", request):
                while True:  # (in slices: a node found gone meanwhile is adopted at once)
                    data = await link.wait_reply(reply, min(ASK_SLICE, deadline - link.now()))
                    if data is not None:
                        return data
                    if link.now() >= deadline or (await link.look(owner))[0]:
                        break
            return await link.abandon(reply)
        finally:
            recent.held -= 1

    def _seen_for(self, client_id: str) -> Came:
        """The counters of each origin (sequence.py) up to which ``client_id``'s session,
        leaving this node now, got every message sent to each node it was at: this node's
        (its own messages among them), and those the session came here with, however long
        ago (the node it goes to may still hold messages it routed before then: its
        ``Recent`` is not trimmed while another session is on its way there, or it read its
        stream late)."""
        seen = self.seen.snapshot()
        seen[self.origin] = self._counter
        came = self._came_with.pop(client_id, None)
        path = {} if came is None else dict(came)  # (shared by the sessions that came)
        before = path.get(self.node_id)
        if before is not None:  # (it was here before too)
            for origin, counter in before.items():
                if counter > seen.get(origin, 0):
                    seen[origin] = counter
        path[self.node_id] = seen
        return path

    def _replay(self, client_id: str, seen: Any) -> None:
        """The session of ``client_id`` came from a node that had routed each origin's
        messages up to ``seen``, the nodes it was at before up to theirs (sequence.Came):
        route it what this node routed lately that it did not get there (the messages that
        reached this node before the session did, and that node after it was gone), before
        anything newer; but those forwarded to it on its way (the answer's ``got``, kept by
        _restore with those forwarded to it here: this node forwarded them when the session
        had left it before)."""
        session = self.broker.sessions.get(client_id)
        if session is None or not isinstance(seen, dict):
            return
        now = self.broker.clock()
        came = came_from(seen)
        self._came((client_id,), came)
        gaps = self._gaps
        if len(gaps) > 1000:
            for key in [k for k, (t, _) in gaps.items() if t < now - REPLAY_SECONDS]:
                del gaps[key]
        gap = self.recent.gaps(highest(came), now)
        if gap:
            gaps[client_id] = (now, gap)
        else:
            gaps.pop(client_id, None)
        count = 0
        # First what the old node forwarded before the session came: messages this node never
        # had, published before their publishers' nodes knew of its route, so before those it
        # had (of the same publisher: MQTT 4.6).
        had = self.store.forwards_got.get(client_id, ())  # (forwarded to it on its way)
        for when, origin, counter, sent, message in self._early.pop(client_id, ()):
            # (not what the session got where it was: a forward meant for a stay here before
            # that, or for this node's previous run, comes late)
            if covered(came, origin, counter, sent) or f"{origin}\x1d{counter}" in had:
                continue
            if when > now - REPLAY_SECONDS and (
                self._missed_here(client_id, origin, counter, now)
                or not self._routed(client_id, origin, counter, now, self._direct(origin, sent))
            ):
                self._got_forward(client_id, origin, counter, now)
                count += self._deliver_to(client_id, message, now)
        # (and those routed to it just now: its set, made by the first one if there was none)
        forwarded = {parse_id(g.encode()) for g in self.store.forwards_got.get(client_id, ())}
        for _, _, packet in list(self.recent.missed(client_id, came, now, forwarded)):
            count += self._deliver_to(client_id, decode(packet, now), now)
        if count:
            log.info(
                "cluster: client %s: %d messages routed here before its session came",
                client_id,
                count,
            )

    def _caught_up(self, client_id: str, came: Came, now: float) -> None:
        """Route to ``client_id``'s session, adopted on its way to the node it came to (its
        answer says it got ``came``), what this node routed lately that it did not get: since
        it left here, or, never here, all that ``came`` does not cover (_replay's second
        part). Counted as routed to it, so that the gone node's stream does not route any of
        them to it again (_arrived_one, _forwarded_gone)."""
        forwarded = {parse_id(g.encode()) for g in self.store.forwards_got.get(client_id, ())}
        for origin, counter, packet in list(self.recent.missed(client_id, came, now, forwarded)):
            had = self._forwarded_to.get((origin, counter))
            self._got_message(
                {client_id} if had is None else had | {client_id}, origin, counter, now
            )
            self._deliver_to(client_id, decode(packet, now), now)

    def _came(self, client_ids: Iterable[str], came: Came) -> None:
        """The sessions of ``client_ids`` came from nodes that had routed each origin's
        messages up to ``came`` (to them among others)."""
        for client_id in client_ids:
            self._came_with[client_id] = came
        top = self._came_max
        for origin, counter in highest(came).items():
            if counter > top.get(origin, 0):
                top[origin] = counter

    def _direct(self, origin: str, sent: frozenset[str] | None) -> bool:
        """Whether this node may have had that message itself: its own, or its origin sent it
        here (``sent``; None: not known, it may have)."""
        return sent is None or self.node_id in sent or origin.rpartition(".")[0] == self.node_id

    def _not_had(
        self, targets: list[Any], found: tuple[str, int], sent: frozenset[str] | None
    ) -> list[Any]:
        """``targets`` but the sessions that came here from nodes that had routed them this
        message already (_came, sequence.covered): this node reading its own copy after the
        session came, however long after, it would be a second one. A message above the
        counters of its origin that any session came with (nearly all, once this node has
        read as far as their nodes had) costs one look-up."""
        origin, counter = found
        if counter > self._came_max.get(origin, 0):
            return targets
        came_with = self._came_with
        got = self.store.forwards_got
        ident = f"{origin}\x1d{counter}"
        return [
            t
            for t in targets
            if not covered(came_with.get(t[0].client_id, _NOT_CAME), origin, counter, sent)
            and ident not in got.get(t[0].client_id, ())
        ]

    def _had(self, client_id: str, origin: str, counter: int, sent: frozenset[str] | None) -> bool:
        """Whether the session of ``client_id`` came here with that message routed to it
        already (sequence.covered), however long ago: a forward of it, meant for an earlier
        stay of the session here, comes late."""
        return covered(self._came_with.get(client_id, _NOT_CAME), origin, counter, sent)

    def _deliver_to(self, client_id: str, message: Message, now: float) -> int:
        """``message`` to the plain subscriptions of ``client_id``'s session here: 1 if any."""
        router = self.router
        match = router.lookup(message.topic)
        if match is None:
            return 0
        targets = [t for t in match[0] if t[0].client_id == client_id]
        if not targets:
            return 0
        router.publish(message, (targets, []), None, now)
        return 1

    def _got_forward(self, client_id: str, origin: str, counter: int, now: float) -> None:
        """A forwarded message went to ``client_id``'s session: if its own copy comes to this
        node later, it is not routed to that session again (_arrived_one)."""
        had = self._forwarded_to.get((origin, counter))
        self._got_message({client_id} if had is None else had | {client_id}, origin, counter, now)
        session = self.broker.sessions.get(client_id)
        if session is not None:
            self.store.forward_routed(session, f"{origin}\x1d{counter}")

    def _got_message(self, sessions: set[str], origin: str, counter: int, now: float) -> None:
        forwards = self._forwards
        forwards.add(now, origin, counter, None)
        got = self._forwarded_to
        got[(origin, counter)] = sessions
        if len(got) > len(forwards.ids):
            for key in [k for k in got if k not in forwards.ids]:
                del got[key]

    def _routed(self, client_id: str, origin: str, counter: int, now: float, direct: bool) -> bool:
        """Whether this node may have routed that message itself (to the session, or before it
        came: see _replay): it did lately; or, if it may have had the message itself
        (``direct``: its own, or sent here by its own node), it let go of that message already
        and cannot tell (sequence.Recent.may_have: such a forward that comes that late is
        dropped, never routed a second time); or had it forwarded to ``client_id``'s session
        (a message is forwarded once for each session that moved)."""
        recent = self.recent
        if recent.may_have(origin, counter, now) if direct else recent.has(origin, counter, now):
            return True
        got = self._forwarded_to.get((origin, counter))
        return got is not None and client_id in got and self._forwards.has(origin, counter, now)

    def _went(
        self,
        client_id: str,
        node: str,
        session: Session,
        now: float,
        got: set[str],
        gaps: dict[str, tuple[int, int]],
    ) -> None:
        """``client_id``'s session was handed to ``node``: for REPLAY_SECONDS, what this node
        routes for its plain subscriptions goes there too (_forward). A publisher's node
        learns of the new node's route a moment after the session got there; until then it
        sends only here. ``got``: the ids of the messages forwarded to it here (not forwarded
        on if they come again, see _forwarded). ``gaps``: for each origin, the counters above
        those the session got here up to the last message ``node`` had let go of when it
        asked (sequence.Recent.gaps): messages it had, routed before the session came, but
        cannot give it; they are forwarded to it all the same."""
        left = self._left
        if len(left) > 1000:
            for gone in [k for k, (until, *_) in left.items() if until < now]:
                self._stop_forwarding(gone)
        filters = {s.topic_filter for s in session.subscriptions.values()}
        self._leaving.replace(client_id, {f for f in filters if not f.startswith("$share/")})
        left[client_id] = (now + REPLAY_SECONDS, node, got, gaps)

    def _stop_forwarding(self, client_id: str) -> None:
        if self._left.pop(client_id, None) is not None:
            self._leaving.replace(client_id, set())

    def _forward(
        self, topic: str, ident: bytes, packet: bytes, now: float, sent: Collection[str] | None
    ) -> None:
        """A QoS 1/2 message routed here (``ident`` its id, ``packet`` its PUBLISH): to the
        nodes that sessions matching it went to lately, for them only (``f`` frames), but
        those ``sent`` it for their plain subscriptions already by its own node (None: the
        frame it came in did not say). The forward names those nodes: the node it goes to
        then knows whether it had the message itself, and routes it to the session unless
        it did (_forwarded)."""
        plain, _ = self._leaving.match(topic)
        head = b""
        found: tuple[str, int] | None = None
        for client_id in plain:
            left = self._left.get(client_id)
            if left is None:
                continue
            until, node, got, gaps = left
            if now > until:
                self._stop_forwarding(client_id)
                continue
            if client_id in self.broker.sessions:
                continue  # (back here)
            if got and ident.decode() in got:
                continue  # (it had that message here, forwarded to it: _forwarded)
            if sent is not None and node in sent:  # (the node has the message anyway ...)
                if not gaps:
                    continue
                if found is None:
                    found = parse_id(ident)
                    if found is None:
                        continue
                span = gaps.get(found[0])
                if span is None or not span[0] < found[1] <= span[1]:
                    continue  # (... but one it had let go of before the session came)
            if not head:
                listed = b"*" if sent is None else ",".join(sent).encode()
                head = b"f" + ident + b"\x1e" + listed + b"\x1c"
            frame = head + client_id.encode() + b"\0" + packet
            self._queue(_XADD, node, (frame, None))
            self._hold(1)  # (the acknowledgement of what it came with waits for it)

    def _forwarded(
        self,
        client_id: str,
        found: tuple[str, int],
        sent: frozenset[str] | None,
        data: bytes,
        packet: bytes,
        now: float,
    ) -> None:
        """A message forwarded by the node ``client_id``'s session came from (_forward):
        routed to that session unless this node routed it itself (before the session came,
        it was routed to it then, see _replay, or not needed; after, directly). ``sent``:
        the nodes its own node sent it to (None: not known). A message this node
        never had (neither its own nor sent here) is routed however late its forward comes;
        one it may have had is dropped once it cannot tell any more (_routed), but one it
        routed before the session came and let go of before it could route it to it then
        (_missed_here). Before the session is here, it waits for it a moment (the same
        checks then, see _replay); a session gone on is forwarded on."""
        origin, counter = found
        ident = f"{origin}\x1d{counter}"
        if ident in self.store.forwards_got.get(client_id, ()):
            return  # (routed to it here or where it was: sent twice, or from two nodes)
        direct = self._direct(origin, sent)
        here = client_id in self.broker.sessions
        left = self._left.get(client_id)
        if not here and (left is None or now > left[0]):
            message = readable(packet, now)
            if message is None:
                return
            early = self._early
            if len(early) > 1000:
                for key in [k for k, v in early.items() if v[-1][0] < now - REPLAY_SECONDS]:
                    del early[key]
            early.setdefault(client_id, []).append((now, origin, counter, sent, message))
            return
        if not self._missed_here(client_id, origin, counter, now) and self._routed(
            client_id, origin, counter, now, direct
        ):
            return
        message = readable(packet, now)
        if message is None:
            return
        if here:
            if self._had(client_id, origin, counter, sent):
                return  # (meant for an earlier stay of the session here: it came with it)
            self._got_forward(client_id, origin, counter, now)
            self._deliver_to(client_id, message, now)
        elif left is not None and ident not in left[2]:  # (not if it had that one here)
            self._queue(_XADD, left[1], (data, None))
            self._hold(1)

    def _missed_here(self, client_id: str, origin: str, counter: int, now: float) -> bool:
        """Whether that message is one this node routed before ``client_id``'s session came
        here lately and had let go of by then (so not routed to it then, see _replay), while
        the node it came from had not routed it yet (so it did not get it there)."""
        gap = self._gaps.get(client_id)
        if gap is None or gap[0] < now - REPLAY_SECONDS:
            return False
        span = gap[1].get(origin)
        return span is not None and span[0] < counter <= span[1]

    def _forwarded_gone(
        self,
        client_id: str,
        found: tuple[str, int],
        sent: frozenset[str] | None,
        packet: bytes,
        adopted: tuple[str, set[str], Routed, float],
        now: float,
    ) -> None:
        """A forward to ``gone``, a node adopted here (``adopted``: it, the sessions adopted
        from it, ``seen`` and when they came), for ``client_id``'s session, left in its stream
        (see _drain): routed to the session if it is one of those, unless this node routed
        its own copy after the session came, or ``gone``
        routed it to it (its session's hash in Redis says so: ``ClusterStore.forwards_got``),
        or routed its own copy (``seen``, what ``gone`` wrote it routed, covers a message its
        own node sent it), or it was routed to the session here from that stream already."""
        gone, sessions, seen, since = adopted
        if client_id not in sessions:
            return  # (a session that had gone on from there: see docs/cluster.md)
        origin, counter = found
        at = self.recent.when(origin, counter, now)
        if at is not None and at >= since:
            return  # (its own copy, read here after the session came, went to it)
        if f"{origin}\x1d{counter}" in self.store.forwards_got.get(client_id, ()):
            return
        came = self._arriving.get(client_id)  # (on its way there: what it got is in its answer)
        if covered({gone: seen.highest} if came is None else came, origin, counter, sent):
            return
        got = self._forwarded_to.get(found)
        if got is not None and client_id in got and self._forwards.has(origin, counter, now):
            return
        message = readable(packet, now)
        if message is None:
            return
        self._got_forward(client_id, origin, counter, now)
        self._deliver_to(client_id, message, now)

    def _restore(self, client_id: str, data: bytes | dict[str, Any], away: bool = False) -> None:
        """A session from another node or from Redis, built here and written afresh there."""
        session = restore(self.broker, client_id, data, away)
        self._stop_forwarding(client_id)
        # What was forwarded to it where it was adopted from (see _forwarded_gone), or where
        # it was, and before, if it was handed over: none of them is routed to it again.
        got = (data.get("forwarded") or data.get("got")) if isinstance(data, dict) else None
        if isinstance(got, list):
            self.store.forwards_got[client_id] = {g for g in got if isinstance(g, str)}
        if session.persistent:
            self.store.rewrite_all(session)

    async def _adopt(self, node: str, claiming: str = "", seen: str = "", chunk: int = 200) -> None:
        """``node`` is gone (its lease expired, or its connection closed: ``seen`` is its lease
        as read then): its persistent sessions become this node's, built from Redis; the
        messages left in its stream are routed here (they may come twice: at least once);
        then its routes and stream go. ``claiming``: a client id this node took already for a
        CONNECT (its session is adopted all the same)."""
        async with self._adopting:
            lease = f"{PREFIX}node:{node}"
            if not await self.redis.sismember(PREFIX + "nodes", node):
                return  # adopted already
            if not await self.link.take_lease_of(node, seen, self.token, self.config.node_ttl):
                return  # alive again, or adopted by another node now
            log.warning("cluster: node %r is gone: adopting its sessions and messages", node)
            # What its sessions in Redis hold of its stream (written with them, fenced: it
            # writes nothing more now), so that its stream is routed to them without copies.
            routed_there = Routed.from_redis(await self.redis.hgetall(f"{PREFIX}seen:{node}"))
            owned = [c.decode() for c in await self.redis.smembers(f"{PREFIX}owned:{node}")]
            # Hand-overs of these sessions wait until their messages are routed to them here
            # (_hand_over): a session handed on before would miss what is in its stream.
            self._holding.update(owned)
            arriving = self._arriving  # (empty: one adoption at a time)
            try:
                taken: set[str] = set()  # the client ids of the sessions adopted
                found_all: list[tuple[str, Any]] = []
                stream = self.stream_key(node)
                try:
                    for start in range(0, len(owned), chunk):
                        part = owned[start : start + chunk]
                        pipe = self.redis.pipeline(transaction=False)
                        for client_id in part:
                            pipe.eval(
                                TAKE_SCRIPT,
                                3,
                                f"{PREFIX}client:{client_id}",
                                f"{PREFIX}session:{client_id}",
                                f"{PREFIX}owned:{self.node_id}",
                                node,
                                self.node_id,
                                "1" if client_id == claiming else "",
                                client_id,
                            )
                        found_all.extend(zip(part, await pipe.execute(), strict=True))
                    # What this node sent that stream is in Redis before it is read; then the
                    # sessions are built and what the stream holds for them is routed to them
                    # in one step: nothing routed here meanwhile reaches them first (MQTT 4.6).
                    await self._committed()
                    entries = await self._pending(stream)
                finally:  # (the client ids taken are this node's: their sessions too, whatever)
                    for client_id, found in found_all:
                        if not found:
                            continue
                        fields = dict(zip(found[::2], found[1::2], strict=True))
                        try:
                            handed = fields.get(b"h")
                            if handed is None:
                                self._restore(client_id, from_hash(client_id, fields), away=True)
                            else:  # on its way to ``node``: the answer it got (REPLY_SCRIPT)
                                state = _answer(client_id, handed)
                                self._restore(client_id, state, away=True)
                                arriving[client_id] = came_from(state.get("seen"))
                            taken.add(client_id)
                        except MQTTError as exc:
                            log.warning("cluster: %s; not adopted", exc)
                restored = self.broker.clock()  # (what this node routes from now on, they get)
                # The sessions on their way to ``node`` when it was lost got nothing there:
                # first what this node routed since they left it (or, never here, that the
                # answer does not cover), then ``node``'s stream as for the others (but what
                # ``node`` routed says nothing of them: they are checked against their answer).
                for client_id, came in arriving.items():
                    self._caught_up(client_id, came, restored)
                ids = self._drain(entries, node, taken, routed_there, restored)
                self._own_since(taken - arriving.keys(), routed_there)
                got = routed_there.snapshot()  # (what they have: not routed to them again)
                self._came(taken - arriving.keys(), {node: got})
                for client_id, came in arriving.items():
                    self._came((client_id,), came)
                routed = len(ids)
                await self._ack(stream, ids)
                await self._committed()  # the sessions' routes announced before the next read
                filters = [f.decode() for f in await self.redis.hkeys(f"{PREFIX}routes:{node}")]
                pipe = self.redis.pipeline(transaction=False)
                for topic_filter in filters:
                    pipe.publish(ROUTES, f"-{node}\0{topic_filter}")
                pipe.delete(f"{PREFIX}routes:{node}")
                pipe.srem(PREFIX + "nodes", node)
                await pipe.execute()
                self.routes.replace(node, set())
                # A node that had not heard of the routes above yet may still have written to
                # the stream: read it once more after a moment, then it goes.
                await asyncio.sleep(RETRY_SECONDS)
                ids = self._drain(await self._pending(stream), node, taken, routed_there, restored)
                routed += len(ids)
                await self._ack(stream, ids)
                await self._committed()
                # What the sessions got there (and here from its stream), for their next move.
                got = routed_there.snapshot()
                self._came(taken - arriving.keys(), {node: got})
                pipe = self.redis.pipeline(transaction=False)
                pipe.delete(stream, f"{PREFIX}owned:{node}", f"{PREFIX}seen:{node}")
                pipe.eval(LEAVE_SCRIPT, 1, lease, self.token)
                await pipe.execute()
                log.warning(
                    "cluster: node %r adopted: %d sessions, %d stream entries routed here",
                    node,
                    len(taken),
                    routed,
                )
            finally:
                arriving.clear()
                self._holding.difference_update(owned)
                waiting, self._deferred = self._deferred, []
                for request in waiting:
                    self._hand_over(request)

    async def _sweep(self) -> None:
        """Adopt the nodes gone for ``adopt_after`` seconds (as seen from here)."""
        others = [n.decode() for n in await self.redis.smembers(PREFIX + "nodes")]
        others = [n for n in others if n != self.node_id]
        pipe = self.redis.pipeline(transaction=False)
        for node in others:
            pipe.exists(f"{PREFIX}node:{node}")
        alive = await pipe.execute() if others else []
        now = asyncio.get_running_loop().time()
        missing = {}
        for node, up in zip(others, alive, strict=True):
            if not up:
                missing[node] = self._missing.get(node, now)
        self._missing = missing
        for node, since in list(missing.items()):
            if now - since >= self.config.adopt_after:
                del missing[node]
                task = asyncio.ensure_future(self._adopt_gone(node))  # (renewal goes on)
                self._claims.add(task)
                task.add_done_callback(self._claims.discard)

    async def _adopt_gone(self, node: str) -> None:
        try:
            await self._adopt(node)
        except (RedisError, OSError) as exc:
            self._lost(exc)  # (the next sweep tries again)

    async def _pending(self, stream: str) -> list[Any]:
        """The entries of another node's stream it has not acknowledged: pending, then never
        read (claimed by this node's consumer)."""
        entries: list[Any] = []
        try:
            cursor = "0-0"
            while True:
                found = await self.redis.xautoclaim(
                    stream, GROUP, self.node_id, 0, cursor, count=READ_COUNT
                )
                cursor = found[0].decode() if isinstance(found[0], bytes) else found[0]
                entries.extend(found[1])
                if cursor == "0-0":
                    break
            while True:
                read = await self.redis.xreadgroup(
                    GROUP, self.node_id, {stream: ">"}, count=READ_COUNT
                )
                if not read or not read[0][1]:
                    break
                entries.extend(read[0][1])
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        return entries

    def _drain(
        self, entries: list[Any], node: str, sessions: set[str], seen: Routed, since: float
    ) -> list[Any]:
        """Route here ``entries`` of another node's stream (see _pending), to the ``sessions``
        adopted from it only: they were sent for that node's subscribers, and this node's own
        had each message already (from its own stream, or from its publisher here). Not those
        its sessions in Redis hold (``seen``: what it wrote it had routed), nor those this node
        routed itself ``since`` the sessions came (they had them then); one of this node's own
        copies coming later is not routed to them again. Forwards to ``node`` for those
        sessions are routed to them too (_forwarded_gone). Their ids, to acknowledge (_ack)."""
        ids = []
        for entry_id, fields in entries:
            ids.append(entry_id)
            if fields:
                self._arrived(fields[b"m"], sessions, seen, since, node)
        return ids

    def _own_since(self, sessions: set[str], seen: Routed) -> int:
        """This node's own messages published before the ``sessions`` came that their gone
        node's stream did not hold when read (their writes were on their way): routed to them
        now, after what the stream held, before anything newer; ``seen`` counts them, so that
        those entries, read later, are not routed again."""
        origin = self.origin
        above = seen.highest.get(origin, 0)
        now = self.broker.clock()
        count = 0
        forwards = self._forwards
        for _, from_, counter, packet, _ in list(self.recent.entries):
            if from_ != origin or counter <= above:
                continue
            # (not to those it was forwarded to in that stream: sent to another node only, and
            # forwarded from there to the gone node for a session that had moved to it)
            had = self._forwarded_to.get((origin, counter))
            if had is not None and forwards.has(origin, counter, now):
                targets = sessions - had
                self._got_message(sessions | had, origin, counter, now)
            else:
                targets = sessions
                self._got_message(sessions, origin, counter, now)
            message = decode(packet, now)
            for client_id in targets:
                count += self._deliver_to(client_id, message, now)
        seen.highest[origin] = max(above, self._counter)
        return count

    async def _ack(self, stream: str, ids: list[Any]) -> None:
        """The entries of another node's stream routed here, acknowledged once committed."""
        if ids:
            await self._committed()
            await self.redis.xack(stream, GROUP, *ids)

    async def _committed(self) -> None:
        """Until what was changed so far is in Redis and in the node's store."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def committed() -> None:
            if not done.done():
                done.set_result(None)

        self.store.after_commit(committed)
        self._wake.set()
        await done

    def _hand_over(self, data: bytes) -> None:
        """Another node took a client of ``user`` over: close its connection here (0x8E) and
        send its session there (nothing on Clean Start: it ends here). The session's owner is
        checked first, as one node checks it (``Broker.check_owner``): another user's session
        is not handed over, and its client and it are left alone, the refusal sent instead
        (that node refuses the CONNECT with it); where the rules let that user have the client
        id, the session is discarded, not handed over."""
        try:
            request = json.loads(data)
            client_id, reply, clean = request["client"], request["reply"], request["clean"]
            user, requester = request["user"], request["node"]
            if not isinstance(user, str | None) or not isinstance(requester, str):
                raise TypeError(user)
            forgotten = request.get("forgotten") or {}
            if not isinstance(forgotten, dict) or not all(
                isinstance(v, int) for v in forgotten.values()
            ):
                raise TypeError(forgotten)
        except (ValueError, KeyError, TypeError):
            log.warning("cluster: control request not readable, ignored")
            return
        if client_id in self._holding:
            self._deferred.append(data)  # (answered once its adoption here is done)
            return
        broker = self.broker
        if not self.lease_valid(broker.clock()):
            # Its sessions may be another node's now: no answer (the requester looks again).
            log.warning("cluster: client %s: not handed over, this node's lease ran out", client_id)
            return
        answer = b""
        session = broker.sessions.get(client_id)
        owner = None if session is None else session.username
        foreign = False
        if session is not None:
            try:
                foreign = broker.check_owner(session, user)
            except MQTTError as exc:
                log.warning(
                    "cluster: client %s: not handed over to another node for user %r: %s",
                    client_id,
                    user,
                    exc.message,
                )
                refusal = {"refused": exc.reason_code, "reason": exc.message}
                self._queue(_REPLY, reply, (client_id, json.dumps(refusal).encode(), requester))
                return
            session = self._disconnect(session)
        if session is not None:
            now = broker.clock()
            if clean or foreign:
                if foreign:
                    log.warning(
                        "cluster: session %s of user %r discarded: its client id was taken "
                        "on another node by user %r",
                        client_id,
                        owner,
                        user,
                    )
                broker.end_session(session, now)
            else:
                seen = self._seen_for(client_id)
                got = newest(self.store.forwards_got.get(client_id) or set(), GOT_MAX)
                answer = serialise(session, now, seen, got)
                self.recent.left(client_id, now)
                top = highest(seen)
                gaps = {o: (top.get(o, 0), c) for o, c in forgotten.items() if c > top.get(o, 0)}
                self._went(client_id, requester, session, now, got, gaps)
                forget(broker, session)
        self._queue(_REPLY, reply, (client_id, answer, requester))

    def _disconnect(self, session: Session) -> Session | None:
        """Close the connection of ``session``'s client here, if any (0x8E: another node has
        its session now); the session if it is still here (not if its expiry was 0)."""
        if session.connection is None:
            return session
        session.connection.disconnect(
            ReasonCode.SESSION_TAKEN_OVER, "another node took over the session"
        )
        found = self.broker.sessions.get(session.client_id)
        return found if found is session else None

    def session_ended(self, client_id: str) -> None:
        self._came_with.pop(client_id, None)  # (a new session of that client id got nothing)
        self._queue(_RELEASE, client_id, None)

    def _queue(self, kind: int, name: str, data: Any) -> None:
        if not self._ops:
            self._wake.set()
        self._ops.append((kind, name, data))

    # -- writing ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        store = self.store
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ops or store.redis_waiters or (store.changes and not self._down):
                ops, self._ops = self._ops, []
                # (a node that wakes up past its lease sends nothing before it is resynchronised:
                # its sessions may be another node's, and their messages with them, see _back)
                self.lease_valid(self.broker.clock())
                changes = store.take_changes()
                seen = self._take_seen()  # (what those changes hold of the stream)
                counted, self._counted = self._counted, 0
                self._qos0_waiting = 0
                self._dropping = False
                waiters, store.redis_waiters = store.redis_waiters, []
                kept = await self._try_send(ops, changes, seen)
                if seen is not None and not kept:
                    self.seen.changed = True  # (written with the changes put back)
                if kept is None:  # fenced: nothing of it counts; resynchronised, then on
                    self._unconfirmed -= counted
                    self._fence(waiters)
                    store.redis_done(waiters)
                    continue
                if not kept:
                    # (while Redis is unreachable, _back sends the outbox and says Redis is
                    # back as one step: nothing kept here after it can wait there unseen)
                    async with self._keeping:
                        kept = await self._try_send(ops, changes, seen)
                        if kept is False:
                            kept = await self._keep(ops, changes)
                if kept is None:
                    self._unconfirmed -= counted
                    self._fence(waiters)
                    store.redis_done(waiters)
                    continue
                if not kept:
                    # (the outbox is full: this batch waits for Redis, acknowledgements too)
                    self._ops[:0] = [op for op in ops if op[0] == _XADD]
                    self._counted += counted
                    store.redis_waiters[:0] = waiters
                    break
                self._unconfirmed -= counted
                if self._fence_next:
                    self._fence_next = False
                    self._cut(waiters)
                store.redis_done(waiters)

    def _take_seen(self) -> dict[str, int] | None:
        """This node's counters of what it routed (sequence.py), if they changed: written
        with the session changes taken at the same time. Only when a persistent session
        changed since they were last taken (a delivery stored, even if gone again since): what
        reached no such session is not routed again by a node adopting this one anyway."""
        seen = self.seen
        if not seen.changed or not self._touched:
            return None
        seen.changed = self._touched = False
        taken = seen.snapshot()
        if self._counter:
            taken[self.origin] = self._counter  # (its own messages, routed here at once)
        return taken

    async def _try_send(
        self,
        ops: list[tuple[int, str, Any]],
        changes: dict[str, SessionChanges],
        seen: dict[str, int] | None = None,
    ) -> bool | None:
        """Send a batch to Redis if it is reachable: False if it is not (or stopped being),
        None if its session writes were fenced (this node's lease is not its own)."""
        if self._down:
            return False
        try:
            if not await self._send(ops, changes, seen):
                return None
        except (RedisError, OSError) as exc:
            self._lost(exc)
            return False
        return True

    async def _send(
        self,
        ops: list[tuple[int, str, Any]],
        changes: dict[str, SessionChanges],
        seen: dict[str, int] | None = None,
    ) -> bool:
        """Send a batch: False if its session writes were fenced (see store.FENCED_WRITE).
        ``seen``: this node's counters when ``changes`` were taken, written after them."""
        if not ops and not changes and not seen:
            return True
        pipe = self.redis.pipeline(transaction=False)
        me = self.node_id
        maxlen = self.config.stream_max_length
        counts = self.router.route_counts
        routed: set[str] = set()
        streams: dict[str, list[bytes]] = {}  # node -> its QoS 1/2 frames in this batch
        channels: dict[str, list[bytes]] = {}  # node -> its QoS 0 frames
        # Hand-overs first: the client id goes with the session (link.REPLY_SCRIPT), so that
        # the end of the session here (below) leaves its hash to the node that has it now.
        replies: list[tuple[int, tuple[str, bytes, str]]] = []  # (index, the op's data)
        for kind, name, data in ops:
            if kind == _REPLY:
                client_id, answer, requester = data
                gives = "" if answer.startswith(b'{"refused"') else "1"
                replies.append((len(pipe.command_stack), data))
                pipe.eval(
                    REPLY_SCRIPT,
                    5,
                    name,
                    name + ":gone",
                    f"{PREFIX}client:{client_id}",
                    f"{PREFIX}owned:{requester}",
                    f"{PREFIX}session:{client_id}",
                    answer,
                    me,
                    requester,
                    gives,
                    client_id,
                )
        written = ClusterStore.write_changes(
            pipe, changes, me, PREFIX, self.broker.clock(), self.token
        )
        if seen:
            pairs = [x for item in seen.items() for x in item]
            pipe.evalsha(SEEN_SHA, 2, self._lease_key, f"{PREFIX}seen:{me}", self.token, *pairs)
        for kind, name, data in ops:
            if kind == _XADD:
                streams.setdefault(name, []).append(data[0])
            elif kind == _PUB:
                channels.setdefault(name, []).append(data)
            elif kind == _ROUTE:
                if name in routed:
                    continue
                routed.add(name)
                count = counts.get(name, 0)
                if count:
                    pipe.hset(self._routes_key, name, count)
                    pipe.publish(ROUTES, f"+{me}\0{name}")
                else:
                    pipe.hdel(self._routes_key, name)
                    pipe.publish(ROUTES, f"-{me}\0{name}")
            elif kind == _RETAIN:
                packet, cleared = data
                if cleared:
                    pipe.hdel(RETAINED, name)
                else:
                    pipe.hset(RETAINED, name, packet)
                pipe.publish(RETAINED, me.encode() + b"\0" + packet)
            elif kind == _XACK:
                pipe.xack(self._stream_key, GROUP, *data)
            elif kind == _REPLY:
                pass  # (above)
            elif name not in self.broker.sessions:  # _RELEASE: not if it is back already
                pipe.eval(RELEASE_SCRIPT, 1, f"{PREFIX}client:{name}", me)
        # The messages for one node go as few entries (or pub/sub messages) as their size allows.
        added = len(pipe.command_stack)  # (fenced: see link.FENCED_XADD)
        for node, frames in streams.items():
            key = self.stream_key(node)
            for entry in pack(frames):
                pipe.evalsha(FENCED_XADD_SHA, 2, self._lease_key, key, self.token, maxlen, entry)
        appends = len(pipe.command_stack) - added
        for node, frames in channels.items():
            channel = f"{PREFIX}pub:{node}"
            for entry in pack(frames):
                pipe.publish(channel, entry)
        results = await pipe.execute()
        if -1 in results[added : added + appends]:
            return False
        for index, client_id in written:
            act = self.lease.written(results[index])
            if act is Act.FENCE:
                return False
            if act is Act.REWRITE_LATER:
                self._not_written(client_id, changes[client_id].session)
        for index, (client_id, answer, _) in replies:
            if not results[index] and answer and not answer.startswith(b'{"refused"'):
                # Its requester had given up (see _ABANDON): the session stays here.
                log.warning(
                    "cluster: client %s: hand-over answered too late; the session stays here",
                    client_id,
                )
                self._restore(client_id, answer)
        return True

    def _not_written(self, client_id: str, session: Session) -> None:
        """Changes of a session refused because another node owns its client id now: it is
        being taken over (the request is on its way), or was. If it is still here in a moment
        (the taker gave up), it is written whole again."""
        if client_id in self._rewriting:
            return
        self._rewriting.add(client_id)

        def again() -> None:
            self._rewriting.discard(client_id)
            if self.broker.sessions.get(client_id) is session and session.persistent:
                self.store.rewrite_all(session)

        asyncio.get_running_loop().call_later(RETRY_SECONDS, again)

    def _lost(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            self._gone.set()  # _reconnect tries until Redis answers
            log.warning(
                "cluster: Redis at %s unreachable (%s): local traffic goes on, QoS 1/2 messages "
                "for other nodes are kept in this node's store (QoS 0 ones are dropped) until "
                "it is back",
                self.url,
                exc,
            )

    async def _keep(
        self, ops: list[tuple[int, str, Any]], changes: dict[str, SessionChanges]
    ) -> bool:
        """A batch Redis did not take: its QoS 1/2 messages go to the outbox (False if it has
        no room), the session changes and acknowledgements wait for Redis; route changes and
        retained messages are written again when it is back, QoS 0 messages dropped."""
        self.store.put_back(changes)
        if changes and self.lease.lapsed:
            return False  # (what they hold waits for Redis: see _session_changed)
        self._retry.extend(op for op in ops if op[0] in (_XACK, _RELEASE))
        for kind, _, data in ops:
            if kind == _REPLY and data[1] and not data[1].startswith(b'{"refused"'):
                # Its requester gets no answer (it gives the client id back): the session
                # handed over stays here (if Redis took it after all, _owned_sessions sees).
                self._restore(data[0], data[1])
        frames = [(name, data[0]) for kind, name, data in ops if kind == _XADD]
        if not frames:
            return True
        if not self.outbox.has_room(sum(len(data) for _, data in frames)):
            return False
        try:
            await self.outbox.add(frames)
        except (sqlite3.Error, OSError) as exc:
            log.error(
                "cluster: messages for other nodes not kept (%s): held until Redis is back", exc
            )
            return False
        return True

    def _give_up_moved(self) -> None:
        """The messages waiting to be sent that clients of sessions now on other nodes
        published here: not sent (their acknowledgements were not: the clients send them
        again there, where the session is; sent from here too, they would come twice). Nor
        routed from what this node keeps for sessions arriving (``recent``): a session that
        got the message sent again would get it a second time, under another id."""
        sessions = self.broker.sessions
        kept = []
        given_up: set[tuple[str, int]] = set()
        for op in self._ops:
            if op[0] == _XADD and op[2][1] is not None and op[2][1] not in sessions:
                found = parse_id(op[2][0][1:].partition(b"\x1e")[0])
                if found is not None:
                    given_up.add(found)
                continue
            kept.append(op)
        dropped = len(self._ops) - len(kept)
        if given_up:
            self.recent.drop(given_up)
        if dropped:
            self._ops = kept
            self._unconfirmed -= dropped
            self._counted -= dropped
            log.warning(
                "cluster: %d messages for other nodes not sent: their publishers' sessions "
                "moved to other nodes while this one's lease had run out",
                dropped,
            )

    async def _send_outbox(self) -> int:
        """Send what the outbox kept while Redis was unreachable, oldest first."""
        sent = 0
        maxlen = self.config.stream_max_length
        while True:
            rows = await self.outbox.oldest(READ_COUNT)
            if not rows:
                return sent
            streams: dict[str, list[bytes]] = {}
            for _, node, data in rows:
                streams.setdefault(node, []).append(data)
            pipe = self.redis.pipeline(transaction=False)
            for node, frames in streams.items():
                for entry in pack(frames):
                    pipe.xadd(self.stream_key(node), {"m": entry}, maxlen=maxlen, approximate=True)
            await pipe.execute()
            await self.outbox.remove(rows[-1][0])
            sent += len(rows)

    async def _reconnect(self) -> None:
        """Once Redis is lost, try every RETRY_SECONDS until it answers again. The writer does
        not wait for these tries: it keeps what it has in the outbox meanwhile."""
        while True:
            await self._gone.wait()
            while not await self._back():
                await asyncio.sleep(RETRY_SECONDS)
            # Cleared only now: if a try fails in a way not foreseen, kept_running starts this
            # loop again and it goes on trying (cleared before, the node would stay down for
            # good). Nothing can set it meanwhile: _back ends the episode without awaiting.
            self._gone.clear()

    async def _back(self) -> bool:
        """Redis answers again: put this node's entries back (a restarted Redis may have lost
        them), read the others' again, send what waited in the outbox. False if Redis does not
        answer yet."""
        try:
            kept = await self._renew_lease()
            if kept != RENEWED:
                # Lost (expired, or this node was adopted): a new lease, of a new token, so
                # that nothing sent under the old one passes a fence (see store.py).
                self.token = secrets.token_hex(16)
                if not await self._take_lease():
                    return False  # (another node adopting this one holds it: later)
            await self._prepare()
            await self._resync()
            given_up = await self._owned_sessions()
            if given_up:
                self._give_up_moved()
            async with self._keeping:  # (the writer keeps nothing more in the outbox meanwhile)
                sent = await self._send_outbox()
                if self._retry:
                    await self._send(self._retry, {})
                    self._retry = []
                self._down = False
                if self.lease.resynchronised(given_up) is Act.CUT_WAITING:
                    # Adopted elsewhere while this node's lease had run out: what waited
                    # since (acknowledgements of messages queued here in those sessions) is
                    # not sent.
                    self._fence_next = True
        except (RedisError, OSError, sqlite3.Error) as exc:
            log.debug("cluster: resync failed: %s", exc)
            return False
        self._wake.set()  # the session changes that waited in the store go now
        log.warning(
            "cluster: Redis at %s reachable again; routes resynchronised, %d messages sent from "
            "this node's store",
            self.url,
            sent,
        )
        return True

    # -- reading ----------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Route changes, QoS 0 messages for this node, retained messages."""
        pubsub = self._pubsub
        me = self.node_id
        while True:
            try:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if msg is None:
                continue
            channel = msg["channel"].decode()
            data: bytes = msg["data"]
            if channel == ROUTES:
                node, _, topic_filter = data[1:].decode().partition("\0")
                if node == me:
                    continue
                if data[:1] == b"+":
                    self.routes.add(node, topic_filter)
                else:
                    self.routes.remove(node, topic_filter)
            elif channel == self._control:
                self._hand_over(data)
            elif channel == RETAINED:
                node_bytes, _, packet = data.partition(b"\0")
                if node_bytes.decode() != me:
                    self._retained_arrived(packet, self.broker.clock())
            else:
                self._arrived(data)

    def _retained_arrived(self, data: bytes, now: float) -> None:
        try:
            message = decode(data, now)
        except MQTTError as exc:
            log.warning("cluster: retained message from Redis not readable: %s", exc)
            return
        self.router.retained.store(message)

    def _arrived(
        self,
        data: bytes,
        sessions: set[str] | None = None,
        seen: Routed | None = None,
        since: float = 0.0,
        gone: str = "",
    ) -> None:
        """Messages from another node: an entry of frames (see :func:`pack`). ``sessions``:
        only to these client ids' plain subscriptions (the stream of ``gone``, a gone node, see
        _drain), and ``seen`` what that node routed of it (default: this node's)."""
        self.lease_valid(self.broker.clock())
        if seen is None:
            seen = self.seen
        pos = 0
        end = len(data)
        while pos + 4 <= end:
            size = int.from_bytes(data[pos : pos + 4], "big")
            self._arrived_one(data[pos + 4 : pos + 4 + size], sessions, seen, since, gone)
            pos += 4 + size

    def _arrived_one(
        self,
        data: bytes,
        sessions: set[str] | None = None,
        seen: Routed | None = None,
        since: float = 0.0,
        gone: str = "",
    ) -> None:
        """A message from another node, framed as
        ``<1 or 0>[<id>\\x1e<nodes>\\x1c]<shares>\\0<PUBLISH>``: routed to this node's plain
        subscribers if the first byte is 1 (of ``sessions`` only, if given), and to those of
        its shared groups named (separated by 0x1F) whose turn it is here. A QoS 1/2
        message's id (sequence.py) that ``seen`` has already is a copy of one routed before
        (a batch sent again): skipped. ``<nodes>``: those its node sent it to for their plain
        subscriptions (comma-separated), named in what this node forwards of it (_forward);
        a forward (``f``) has ``f<id>\\x1e<nodes>\\x1c<client id>\\0<PUBLISH>``."""
        now = self.broker.clock()
        header, _, packet = data.partition(b"\0")
        ident, sep, names = header[1:].partition(b"\x1e")
        found = None
        sent: frozenset[str] | None = None
        flag = header[:1]
        if not sep:
            names = ident  # (QoS 0: no id)
        else:
            found = parse_id(ident)
            listed, mark, rest = names.partition(b"\x1c")
            if mark:  # (else a frame that does not say)
                names = rest
                sent = sent_to(listed)
            if flag == b"f":  # forwarded for a session that came here (_forward)
                if found is None:
                    return
                if sessions is None:
                    self._forwarded(names.decode(), found, sent, data, packet, now)
                elif seen is not None:
                    self._forwarded_gone(
                        names.decode(), found, sent, packet, (gone, sessions, seen, since), now
                    )
                return
            if found is not None:
                fresh = (self.seen if seen is None else seen).first(*found)
                arriving = self._arriving
                if sessions is not None and arriving:  # (see _adopt)
                    forwards_got = self.store.forwards_got
                    name = f"{found[0]}\x1d{found[1]}"
                    sessions = {
                        s
                        for s in sessions
                        if (
                            fresh
                            if s not in arriving
                            else not covered(arriving[s], *found, sent)
                            and name not in forwards_got.get(s, ())
                        )
                    }
                    if not fresh:  # (routed there to its groups' members already)
                        names = b""
                        if not sessions:
                            return
                elif not fresh:
                    return
            if found is not None and sessions is not None:  # (a gone node's stream)
                if flag != b"1":  # (for a shared group there: none of the sessions gets it)
                    sessions = set()
                at = self.recent.when(found[0], found[1], now)
                if at is not None and at >= since:
                    return  # routed here (to those sessions too) after they came
                had = self._forwarded_to.get(found)  # (forwarded to some of them: _forwarded_gone)
                if had is not None:
                    sessions = sessions - had
                self._got_message(
                    sessions if had is None else sessions | had, found[0], found[1], now
                )
        message = readable(packet, now)
        if message is None:
            return
        if found is not None and sessions is None and flag == b"1":
            self.recent.add(now, found[0], found[1], packet, sent)
            if self._left:
                self._forward(message.topic, ident, packet, now, sent)
        match = self.router.lookup(message.topic)
        if match is None:
            return
        targets, groups = match
        if found is not None and sessions is None:
            if self._forwarded_to:
                got = self._forwarded_to.get(found)
                if got is not None:  # (those sessions had it forwarded already)
                    targets = [t for t in targets if t[0].client_id not in got]
            if self._came_with:
                targets = self._not_had(targets, found, sent)
        shares = set(names.decode().split("\x1f")) if names else set()
        if header[:1] != b"1":
            targets = []
        elif sessions is not None:
            targets = [t for t in targets if t[0].client_id in sessions]
        self.router.publish(
            message,
            (
                targets,
                [g for g in groups if g.members and g.members[0].topic_filter in shares],
            ),
            None,
            now,
        )

    async def _read_stream(self) -> None:
        """QoS 1/2 messages for this node: those a previous run read and did not acknowledge
        first, then new ones. Each batch is acknowledged (XACK) once the store has committed
        what its delivery changed."""
        last = "0"
        key = self._stream_key
        while True:
            try:
                found: Any = await self.redis.xreadgroup(
                    GROUP,
                    self.node_id,
                    {key: last},
                    count=READ_COUNT,
                    block=None if last != ">" else 1000,
                )
            except (RedisError, OSError) as exc:
                # Redis may have handed entries over without the answer reaching us: read this
                # node's pending entries again first (a message may come twice, none is lost).
                last = "0"
                if not isinstance(exc, ResponseError) or "NOGROUP" in str(exc):
                    self._lost(exc)  # (NOGROUP: Redis restarted without persistence)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            entries = found[0][1] if found else []
            if not entries:
                last = ">"  # the previous run's are done
                continue
            ids = []
            for entry_id, fields in entries:
                ids.append(entry_id)
                if fields:  # None: trimmed away while pending
                    self._arrived(fields[b"m"])
            if last != ">":
                last = entries[-1][0].decode()
            self.store.after_commit(partial(self._queue, _XACK, "", ids))
            await asyncio.sleep(0)  # let the deliveries flush before the next read

    async def _take_lease(self) -> bool:
        """This node's lease, if nobody holds it."""
        sent = self.broker.clock()
        if not await self.link.take_lease(self.token, self.config.node_ttl):
            return False
        self.lease.taken(sent)
        return True

    async def _renew_lease(self) -> int:
        """ownership.RENEWED, LEASE_GONE or LEASE_TAKEN; ``self.lease`` told."""
        sent = self.broker.clock()
        kept = await self.link.renew_lease(self.token, self.config.node_ttl)
        if self.lease.renewed(kept, sent) is Act.LAPSE:
            log.warning(
                "cluster: the lease of node %r %s: resynchronising",
                self.node_id,
                "had expired" if kept == LEASE_GONE else "is held by another node (adopting it?)",
            )
            self._on_lapse()
        return kept

    async def _renewed(self) -> bool:
        """A renewal now (a CONNECT on a node whose lease may have run out): whether it held."""
        return await self._renew_lease() == RENEWED

    async def _renew(self) -> None:
        """Renew the lease every node_ttl / 3, the liveness connection held in a blocking read
        in between: if Redis closes it, the node lapses at once (the others may take it for
        gone from then on)."""
        hold = min(self.config.node_ttl / 3, HANDOVER_SECONDS)
        while True:
            try:
                await self.link.liveness()
                try:
                    await self._renew_lease()
                    if self.config.adopt_after and not self._down:
                        await self._sweep()
                except (RedisError, OSError) as exc:  # (not the liveness connection)
                    self._lost(exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                await self.link.hold_liveness(hold)
            except (RedisError, OSError) as exc:
                if self.lease.connection_lost() is Act.LAPSE:
                    log.warning("cluster: the lease's connection to Redis was lost (%s)", exc)
                    self._on_lapse()
                self._lost(exc)
                await asyncio.sleep(RETRY_SECONDS)
