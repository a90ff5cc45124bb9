"""Which QoS 1/2 message is which across nodes: an id given where it was published, what a node
routed of each origin, and the messages it routed lately. Sans I/O, like ownership.py.

A QoS 1/2 message that leaves its node carries an id: ``<origin>`` (the node id and a random
word new each run) and a counter, ``<origin>\\x1d<n>`` in its frame (node.py). One origin adds
its messages to one stream in the order of their counters (the writer sends batches in order;
while Redis is unreachable they wait in the outbox and go before anything newer), so the node
reading a stream sees each origin's counters rise, and:

- **A copy is known.** A message whose counter is not above the highest one routed from its
  origin (:class:`Routed`) is one routed already: a batch sent again after Redis took it but its
  answer was lost (Redis restarted, killed, or the connection cut), or an entry read again
  after a crash. Routing it again would deliver a QoS 2 message twice. A node writes its
  ``Routed`` to Redis with the session changes it covers (``seen:<node>``, fenced like them):
  a node adopting it routes from its stream only what its sessions in Redis do not hold.
- **A session that moves misses nothing.** When node A hands a session over to node B, the
  messages for it that B read before it had the session and A reads only after it gave the
  session up would reach it from neither (both have the route: each publisher's node sends a
  copy to each). A's answer carries A's ``Routed``, and those of the nodes the session was at
  before A (each node's own, :data:`Came`): every message of an origin up to a node's
  counter that was sent to that node went to the session there. Not those never sent there:
  an origin that had not heard of the session's route at A yet sent them to the node before,
  which forwards them (below); the frame of each message names the nodes it was sent to, so
  a node's counters cover only those (:func:`covered`). B keeps the messages it routed lately
  (:class:`Recent`) and routes to the session those not covered, before anything newer.
- **A forward comes late or not at all.** For those 10 s, A also forwards to B what it routes
  for the session (a publisher's node learns of B's route a moment after the session came), and
  B routes a forward to the session unless B routed that message itself. A message's frame
  names the nodes its origin sent it to, and so does a forward of it: a message B never had
  (neither its own nor sent to it) is routed however late its forward comes. One B had may
  come later than B remembers (A frozen past its lease and woken, Redis away a while, or more
  than ``REPLAY_MAX`` messages since): B routes each origin's messages in the order of their
  counters, so what it let go of an origin is all up to one counter (``Recent.forgotten``). A
  forward above it that B does not have is one B has not routed yet (routed now, its own copy
  then skipped); one at or below it B routed before, to the session or (before it came) in
  time for the replay above, and it is not routed. What B remembers of forwards it routed
  (``_forwards``) lasts 10 s, the counters a session came with its stay (a forward meant for
  an earlier stay of the session at B, however late, is not routed if they cover it); a
  forward routed to a session is also kept with the session for its stay
  (``ClusterStore.forwards_got``, written to its hash): the same forward coming again later is
  not routed again, and a node adopting a dead one routes the forwards left in its stream but
  those. Their ids go with the session when it moves on, from node to node (at most the
  newest 1,000): wherever it goes next, it is not routed again what was forwarded to it.
- **The old node is behind.** B may have let go of messages it routed before the session came
  that A had not routed when it gave the session up (A's stream behind B's by more than B
  keeps): B cannot give them to the session. B's request says what it let go of of each
  origin (``Recent.forgotten``; B lets go of nothing more until the session is there), and A
  forwards those it routes above its counters and up to B's although B had them; B routes
  them to the session (``ClusterNode._missed_here``). Still open (docs/cluster.md): A forwards
  only for 10 s.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Container, Iterator
from typing import Any

REPLAY_SECONDS = 10.0  # how long a node keeps what it routed, for a session arriving
REPLAY_MAX = 50_000  # ... at most this many messages


def new_origin(node_id: str) -> str:
    """This run's origin: the node id and a random word (a restarted node counts from 1)."""
    return f"{node_id}.{secrets.token_hex(4)}"


_ORIGINS: dict[bytes, str] = {}  # (decoded once each)


def parse_id(ident: bytes) -> tuple[str, int] | None:
    """``<origin>\\x1d<counter>`` as (origin, counter); None if it is not one."""
    origin, sep, counter = ident.rpartition(b"\x1d")
    if not sep:
        return None
    try:
        number = int(counter)
    except ValueError:
        return None
    name = _ORIGINS.get(origin)
    if name is None:
        if len(_ORIGINS) > 10_000:
            _ORIGINS.clear()
        name = _ORIGINS[origin] = origin.decode()
    return name, number


_SENT: dict[bytes, frozenset[str] | None] = {}  # (parsed once each)


def sent_to(listed: bytes | None) -> frozenset[str] | None:
    """The nodes a frame says its origin sent the message to for their plain subscriptions
    (``<nodes>``, comma-separated); None where it does not say (``*``, or no list)."""
    if listed is None or listed == b"*":
        return None
    names = _SENT.get(listed)
    if names is None:
        if len(_SENT) > 10_000:
            _SENT.clear()
        names = _SENT[listed] = frozenset(listed.decode().split(",")) if listed else frozenset()
    return names


# What a session that moved got where it was lately: for each node, the counter of each
# origin that node had routed up to when the session left it (the node's ``Routed``).
Came = dict[str, dict[str, int]]


def covered(came: Came, origin: str, counter: int, sent: frozenset[str] | None) -> bool:
    """Whether a session that came with ``came`` got that message where it was: one of those
    nodes routed it, since the message's origin sent it there (``sent``; None: not known,
    any of them) or is that node's own, and that node's counter of the origin is not below
    the message's. A node's counters say nothing of the messages never sent to it: sent to
    the node the session was at before (and forwarded from there, see ClusterNode._forward)."""
    home = origin.rpartition(".")[0]
    for node, counters in came.items():
        if counter <= counters.get(origin, 0) and (sent is None or node in sent or node == home):
            return True
    return False


def highest(came: Came) -> dict[str, int]:
    """The highest counter of each origin among ``came``'s nodes."""
    top: dict[str, int] = {}
    for counters in came.values():
        for origin, counter in counters.items():
            if counter > top.get(origin, 0):
                top[origin] = counter
    return top


def newest(ids: set[str], limit: int) -> set[str]:
    """``ids`` (``<origin>\x1d<counter>``), or the ``limit`` of them with the highest counters."""
    if len(ids) <= limit:
        return ids
    return set(sorted(ids, key=lambda i: int(i.rpartition("\x1d")[2] or 0))[-limit:])


class Routed:
    """The highest counter routed from each origin (in the order they come from a stream)."""

    __slots__ = ("highest", "changed")

    def __init__(self, highest: dict[str, int] | None = None) -> None:
        self.highest: dict[str, int] = dict(highest or {})
        self.changed = False  # since last written (taken by ``written``)

    def first(self, origin: str, counter: int) -> bool:
        """Whether this message is new (and it counts as routed now), not a copy of one."""
        if counter <= self.highest.get(origin, 0):
            return False
        self.highest[origin] = counter
        self.changed = True
        return True

    def covers(self, origin: str, counter: int) -> bool:
        return counter <= self.highest.get(origin, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self.highest)

    @staticmethod
    def from_redis(found: dict[Any, Any]) -> Routed:
        highest = {}
        for origin, counter in found.items():
            key = origin.decode() if isinstance(origin, bytes) else str(origin)
            try:
                highest[key] = int(counter)
            except (TypeError, ValueError):
                continue
        return Routed(highest)


class Recent:
    """The messages a node routed for its plain subscriptions lately (from its stream, or from
    its own publishers, for other nodes too): ``(when, origin, counter, message, sent)`` (the
    message as its PUBLISH, and the nodes its origin sent it to: :func:`sent_to`), oldest
    first; and the sessions
    it handed to other nodes lately (what it routed before that went to them here). Looking
    one up by its id (``has``, ``when``) keeps an index of them for ``seconds`` from then
    (``indexed``: always): a node that hands nothing over pays only the append."""

    __slots__ = (
        "entries",
        "ids",
        "away",
        "forgotten",
        "seconds",
        "limit",
        "index_until",
        "indexed",
        "held",
    )

    def __init__(
        self, seconds: float = REPLAY_SECONDS, limit: int = REPLAY_MAX, indexed: bool = False
    ) -> None:
        self.entries: deque[tuple[float, str, int, Any, frozenset[str] | None]] = deque()
        self.ids: dict[tuple[str, int], float] = {}  # (origin, counter) -> when, see above
        self.away: dict[str, float] = {}  # client id -> when it left this node
        self.forgotten: dict[str, int] = {}  # origin -> the counter of its last one let go
        self.seconds = seconds
        self.limit = limit
        self.indexed = indexed
        self.index_until = float("inf") if indexed else float("-inf")
        self.held = 0  # while above 0, nothing is let go of (a session on its way here)

    def add(
        self,
        now: float,
        origin: str,
        counter: int,
        message: Any,
        sent: frozenset[str] | None = None,
    ) -> None:
        entries = self.entries
        entries.append((now, origin, counter, message, sent))
        if now < self.index_until:
            self.ids[(origin, counter)] = now
        if len(entries) > self.limit or entries[0][0] < now - self.seconds:
            self._trim(now)

    def _index(self, now: float) -> dict[tuple[str, int], float]:
        if now >= self.index_until:  # (not kept meanwhile: built again)
            self.ids = {(origin, counter): at for at, origin, counter, _, _ in self.entries}
        if not self.indexed:
            self.index_until = now + self.seconds
        return self.ids

    def has(self, origin: str, counter: int, now: float) -> bool:
        """Whether this node routed that message lately."""
        return (origin, counter) in self._index(now)

    def may_have(self, origin: str, counter: int, now: float) -> bool:
        """Whether this node may have routed that message: it did lately, or it is not newer
        than one of its origin let go already, so it cannot tell. Sure only where each
        origin's messages were added in the order of their counters (as ``recent`` is: see
        ClusterNode._forwarded): the ones let go of an origin are then all those up to
        ``forgotten``, and a message above it that is not here never was."""
        return counter <= self.forgotten.get(origin, 0) or self.has(origin, counter, now)

    def when(self, origin: str, counter: int, now: float) -> float | None:
        """When this node routed that message, if lately."""
        return self._index(now).get((origin, counter))

    def _trim(self, now: float) -> None:
        if self.held:
            return
        entries = self.entries
        ids = self.ids
        forgotten = self.forgotten
        oldest = now - self.seconds
        while entries and (len(entries) > self.limit or entries[0][0] < oldest):
            _, origin, counter, _, _ = entries.popleft()
            forgotten[origin] = counter
            if ids:
                ids.pop((origin, counter), None)

    def drop(self, ids: set[tuple[str, int]]) -> None:
        """Forget these messages (``(origin, counter)``): not sent on after all."""
        self.entries = deque(e for e in self.entries if (e[1], e[2]) not in ids)
        for found in ids:
            self.ids.pop(found, None)

    def gaps(self, seen: dict[str, int], now: float) -> dict[str, tuple[int, int]]:
        """For each origin, the counters above ``seen`` (those a session coming now got
        where it was) up to the last of its messages let go of: routed here before, and not
        here to be routed to that session (``missed``)."""
        self._trim(now)
        return {
            origin: (seen.get(origin, 0), last)
            for origin, last in self.forgotten.items()
            if last > seen.get(origin, 0)
        }

    def left(self, client_id: str, now: float) -> None:
        """``client_id``'s session went to another node at ``now``."""
        away = self.away
        away[client_id] = now
        if len(away) > 1000:
            oldest = now - self.seconds
            for key in [k for k, t in away.items() if t < oldest]:
                del away[key]

    def missed(
        self,
        client_id: str,
        came: Came,
        now: float,
        got: Container[tuple[str, int] | None] = (),
    ) -> Iterator[tuple[str, int, Any]]:
        """The messages routed here lately that the session of ``client_id``, coming with
        ``came``, did not get where it was (:func:`covered`), nor had forwarded to it there
        (``got``, see ClusterNode._forward), routed here after the session was last here:
        ``(origin, counter, message)``, oldest first."""
        self._trim(now)
        since = self.away.pop(client_id, float("-inf"))
        top = highest(came)
        for when, origin, counter, message, sent in self.entries:
            if when > since and (
                counter > top.get(origin, 0) or not covered(came, origin, counter, sent)
            ):
                if (origin, counter) not in got:
                    yield origin, counter, message
