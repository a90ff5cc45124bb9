"""Who serves a client id in the cluster: the ownership protocol's decisions, sans I/O.

Like ``protocol/`` (and h11), nothing here talks to Redis or reads a clock: the inputs are
what a node has learned (a lease renewed or not, what a look at another node found, what a
fenced write answered, the time it was told), the outputs are what it must do. ``ClusterNode``
(node.py) does the I/O, through link.py, and acts on them; tests/cluster/test_ownership_model.py
drives these same objects with Hypothesis over interleavings of connects, node deaths, freezes
and wake-ups, Redis lost and back, and leases running out, and checks that at most one node
serves a client id at a time, that no acknowledged QoS 1/2 message of a persistent session is
lost while it lives, and that Session Present is right.

The protocol:

- **Lease.** A node holds ``node:<id>`` = ``<token>/<CLIENT ID>/<run_id>``, renewed every
  ``node_ttl / 3`` on a Redis connection of its own (its liveness connection, which it keeps
  blocked in a read so that it learns at once when that connection goes). Redis counts the
  lease from when it got the renewal, the node from when it sent it: the node's lease is
  surely its own until ``sent + node_ttl`` (:class:`Lease`). The token is new each time the
  node takes its lease again: it is the node's **fencing token**.
- **Gone.** Another node is gone when its lease is missing (expired, or released by a node
  that adopted it) or the connection it names is closed (Redis closes it when the process
  dies). A frozen node keeps its connection: its lease has to run out.
- **Claim** (a CONNECT for a client id the key ``client:<id>`` gives to another node,
  :func:`claim_step`): a gone owner is adopted (all its persistent sessions, from Redis, and
  the messages left in its stream); a live owner that listens is asked to hand the session
  over; one that does not answer by the deadline keeps it, and the CONNECT is refused (0x88,
  the client retries): a new session never starts over one another node has. The client id
  moves with the session, in the script that writes the answer (link.REPLY_SCRIPT): until
  then it names the node that has the session, so a second claim asks that one.
- **Fence.** A node whose lease is not surely its own (past ``valid_until``, its liveness
  connection lost, a renewal that found the lease gone or another's) **lapses**: it
  disconnects the clients of its persistent sessions before delivering anything more, answers
  no hand-over, and holds the acknowledgements that depend on its sessions until Redis says
  whether they are still its own. Every session write in Redis checks the token
  (store.FENCED_WRITE): -1 fences the node (:meth:`Lease.written`); when it resynchronises, the
  sessions another node owns are given up, and if any was, what waited is not acknowledged.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Act(Enum):
    """What a node must do after an input."""

    NOTHING = 0
    LAPSE = 1  # disconnect the persistent sessions' clients (0x8E), hold, resynchronise
    FENCE = 2  # LAPSE, and cut the connections whose acknowledgements waited on the write
    REWRITE_LATER = 3  # the session's client id is another node's now: write it whole later
    CUT_WAITING = 4  # the acknowledgements that waited through a lapse are not sent


# What a renewal script answers (link._RENEW) and a fenced write (store.FENCED_WRITE).
RENEWED, LEASE_TAKEN, LEASE_GONE = 1, 0, 2
WRITTEN, NOT_OWNER, FENCED = 1, 0, -1


class Lease:
    """A node's own lease, as the node knows it."""

    __slots__ = ("ttl", "valid_until", "lapsed", "generation")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.valid_until = 0.0  # on the node's clock: surely its own until then
        self.lapsed = False  # not surely its own: serving nothing persistent until resync
        self.generation = 0  # times taken (the token is new each time)

    def taken(self, sent_at: float) -> None:
        """The node took its lease (SET NX), asked at ``sent_at``."""
        self.generation += 1
        self.valid_until = sent_at + self.ttl

    def renewed(self, result: int, sent_at: float) -> Act:
        """A renewal sent at ``sent_at`` answered ``result``."""
        if result == RENEWED:
            self.valid_until = max(self.valid_until, sent_at + self.ttl)
            return Act.NOTHING
        return self.lapse()

    def valid(self, now: float) -> bool:
        """Whether the node may serve its persistent sessions at ``now``."""
        return not self.lapsed and now < self.valid_until

    def check(self, now: float) -> Act:
        """Before the node delivers, acknowledges or answers anything for its sessions."""
        if self.lapsed or now < self.valid_until:
            return Act.NOTHING
        return self.lapse()

    def lapse(self) -> Act:
        if self.lapsed:
            return Act.NOTHING
        self.lapsed = True
        self.valid_until = 0.0
        return Act.LAPSE

    def connection_lost(self) -> Act:
        """The liveness connection closed: the other nodes may take this one for gone now."""
        return self.lapse()

    def written(self, result: int) -> Act:
        """A session write's answer (store.FENCED_WRITE)."""
        if result == FENCED:
            self.lapse()
            return Act.FENCE
        if result == NOT_OWNER:
            return Act.REWRITE_LATER
        return Act.NOTHING

    def resynchronised(self, given_up: int) -> Act:
        """The node is back with a lease of its own and has given up ``given_up`` sessions
        that other nodes own now."""
        was = self.lapsed
        self.lapsed = False
        return Act.CUT_WAITING if was and given_up else Act.NOTHING


class Seen(NamedTuple):
    """What a claiming node found about the node ``client:<id>`` names."""

    gone: bool  # its lease missing, or its liveness connection closed
    adopted_here: bool  # this claim adopted it already (or tried: another node was at it)
    in_cluster: bool  # still in the ``nodes`` set: its adoption not finished
    listening: bool  # subscribed to its control channel (can answer a hand-over)
    past_deadline: bool  # the claim's HANDOVER_SECONDS are over


class Step(Enum):
    ADOPT = 0  # adopt the gone node (this session among its own), then look again
    TAKE_FREE = 1  # adopted, and the client id was not among its sessions: take it
    ASK = 2  # ask it to hand the session over (waiting until the deadline at most)
    WAIT = 3  # look again in a moment
    REFUSE = 4  # CONNACK 0x88: the client retries; the session stays where it is


def claim_step(seen: Seen) -> Step:
    """The next step of a claim of a client id another node has."""
    if seen.gone:
        if not seen.adopted_here:
            return Step.ADOPT
        return Step.WAIT if seen.in_cluster else Step.TAKE_FREE
    if seen.past_deadline:
        return Step.REFUSE
    return Step.ASK if seen.listening else Step.WAIT


class Answer(Enum):
    SESSION = 0  # the session came: built here, Session Present 1
    NONE = 1  # the node had none (or Clean Start): a new one here
    REFUSED = 2  # another user's: the CONNECT is refused with the node's code
    SILENT = 3  # no answer by the deadline: the request is abandoned, look again
    MOVED = 4  # handed over to another node just before: look again


def answer_kind(data: bytes | None) -> Answer:
    """A hand-over's reply as read (None: no answer)."""
    if data is None:
        return Answer.SILENT
    if not data:
        return Answer.NONE
    if data == b"moved":
        return Answer.MOVED
    return Answer.REFUSED if data.startswith(b'{"refused"') else Answer.SESSION


def serves_while_redis_down(clean_start: bool, session_here: bool, lease: Lease) -> bool:
    """A CONNECT while Redis is unreachable: served if the client starts clean, or its
    session is here and the lease surely this node's; otherwise refused (0x88), since its
    session may be on another node."""
    return clean_start or (session_here and not lease.lapsed)
