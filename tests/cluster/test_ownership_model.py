"""The ownership protocol's decisions (mqttbroker/cluster/ownership.py) checked with Hypothesis:
a cluster of three nodes over a model of Redis (leases, client id keys, session hashes, the
nodes' streams), driven through any interleaving of CONNECTs on any node, node deaths (one
right after another node handed it a session, before it wrote it), freezes and wake-ups, Redis
lost and back for a node, renewals, resynchronisations, adoptions and time passing (leases
running out). The nodes decide with the very ``Lease``, ``claim_step`` and
``answer_kind`` that ``ClusterNode`` uses; the model stands for the I/O, each Redis script one
atomic step as in Redis.

Invariants: at most one node serves a client id at a time (a node serves it while the client
is connected there and its lease is surely its own by its clock); an acknowledged QoS 1
message for a persistent session is never dropped while the session lives (it is delivered, in
the session's hash, in the memory of the node that owns it, or in the stream of a node still
in the cluster); Session Present is 1 exactly when a session of that client id lived.

What the model assumes: a node that wakes up (SIGCONT) notices first that Redis closed its
liveness connection meanwhile, if it did (in the node, that end-of-file competes with client
input in the first loop pass after a freeze; the Redis fence still refuses its writes); a
session handed over comes with the messages for it waiting in its old node's stream (the node
reads its stream before it answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqttbroker.cluster.ownership import (
    FENCED,
    LEASE_GONE,
    LEASE_TAKEN,
    NOT_OWNER,
    RENEWED,
    WRITTEN,
    Act,
    Answer,
    Lease,
    Seen,
    Step,
    answer_kind,
    claim_step,
)

NODES = ("n1", "n2", "n3")
CLIENTS = ("c1", "c2")
TTL = 10.0
HANDOVER = 5.0


@dataclass
class RedisLease:
    token: int
    conn_open: bool
    expires: float


@dataclass
class Node:
    name: str
    lease: Lease = field(default_factory=lambda: Lease(TTL))
    token: int = 0
    alive: bool = True
    frozen: bool = False
    redis_ok: bool = True
    conn_lost_unseen: bool = False  # Redis closed its liveness connection while it was frozen
    sessions: dict[str, set[int]] = field(default_factory=dict)  # persistent: queued messages
    connected: set[str] = field(default_factory=set)

    @property
    def acts(self) -> bool:
        return self.alive and not self.frozen

    @property
    def reaches(self) -> bool:
        return self.acts and self.redis_ok


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.tokens = 0
        self.leases: dict[str, RedisLease] = {}
        self.client_key: dict[str, str] = {}
        self.hashes: dict[str, set[int]] = {}
        self.in_cluster = set(NODES)
        self.owned: dict[str, set[str]] = {n: set() for n in NODES}
        self.streams: dict[str, list[tuple[str, int]]] = {n: [] for n in NODES}
        self.nodes = {n: Node(n) for n in NODES}
        self.lives: dict[str, bool] = {c: False for c in CLIENTS}  # a session of c lives
        self.acked: dict[str, set[int]] = {c: set() for c in CLIENTS}
        self.delivered: dict[str, set[int]] = {c: set() for c in CLIENTS}
        self.messages = 0
        for node in self.nodes.values():
            self._take_lease(node)

    # -- the model of Redis ---------------------------------------------------------------

    def _lease_live(self, name: str) -> RedisLease | None:
        lease = self.leases.get(name)
        return lease if lease is not None and lease.expires > self.now else None

    def _gone(self, name: str) -> bool:
        lease = self._lease_live(name)
        return lease is None or not lease.conn_open

    def _take_lease(self, node: Node) -> bool:
        if self._lease_live(node.name) is not None:
            return False
        self.tokens += 1
        node.token = self.tokens
        self.leases[node.name] = RedisLease(node.token, True, self.now + TTL)
        node.lease.taken(self.now)
        return True

    def _fenced_write(self, node: Node, client_id: str) -> int:
        """store.FENCED_WRITE: the session's queue as ``node`` has it."""
        lease = self._lease_live(node.name)
        if lease is None or lease.token != node.token:
            return FENCED
        if self.client_key.get(client_id) != node.name:
            return NOT_OWNER
        self.hashes[client_id] = set(node.sessions[client_id])
        return WRITTEN

    # -- what a node does -------------------------------------------------------------------

    def _lapse(self, node: Node) -> None:
        """ClusterNode._on_lapse / _fence: the persistent sessions' clients disconnected."""
        node.connected.clear()

    def _check(self, node: Node) -> bool:
        """Before delivering or answering for its sessions (ClusterNode.lease_valid)."""
        if node.lease.check(self.now) is Act.LAPSE:
            self._lapse(node)
        return node.lease.valid(self.now)

    def _written(self, node: Node, client_id: str) -> bool:
        act = node.lease.written(self._fenced_write(node, client_id))
        if act is Act.FENCE:
            self._lapse(node)
        return act is Act.NOTHING

    def _adopt(self, node: Node, gone: str, claiming: str) -> None:
        """ClusterNode._adopt, one step: the gone node's sessions built from their hashes, the
        messages left in its stream routed to them, its lease, stream and membership gone."""
        if gone not in self.in_cluster:
            return
        for client_id in sorted(self.owned[gone]):
            owner = self.client_key.get(client_id)
            if owner == gone or (client_id == claiming and owner == node.name):
                self.client_key[client_id] = node.name
                node.sessions[client_id] = set(self.hashes.get(client_id, set()))
                self.owned[node.name].add(client_id)
        for client_id, message in self.streams[gone]:
            if client_id in node.sessions and self.client_key.get(client_id) == node.name:
                node.sessions[client_id].add(message)
                self._written(node, client_id)
        self.streams[gone] = []
        self.owned[gone] = set()
        self.in_cluster.discard(gone)
        self.leases.pop(gone, None)

    def _hand_over(self, old: Node, new: Node, client_id: str, clean: bool) -> bytes | None:
        """ClusterNode._hand_over on ``old``, as its requester reads the answer."""
        if not old.reaches or not self._check(old):
            return None  # silent: frozen, cut off, or its lease not surely its own
        kept = []
        for entry in self.streams[old.name]:  # (read before it answers: see the docstring)
            if entry[0] == client_id and client_id in old.sessions:
                old.sessions[client_id].add(entry[1])
            else:
                kept.append(entry)
        self.streams[old.name] = kept
        old.connected.discard(client_id)
        session = old.sessions.pop(client_id, None)
        self.owned[old.name].discard(client_id)
        self.client_key[client_id] = new.name
        if session is None or clean:
            return b""
        new.sessions[client_id] = session
        self.owned[new.name].add(client_id)  # (in the same step: link.REPLY_SCRIPT ...)
        self.hashes[client_id] = set(session)  # (... with the answer in the session's hash)
        return b'{"session": 1}'

    def _wait(self, node: Node, until: float) -> None:
        """``node`` waits for an answer until ``until``: its lease is renewed meanwhile, as
        ClusterNode renews it every third of ``node_ttl`` whatever else it waits for."""
        self.renew(node.name)
        self.now = until
        self.renew(node.name)

    # -- rules ------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(NODES),
        client_id=st.sampled_from(CLIENTS),
        clean=st.booleans(),
        dies=st.sampled_from((False, False, False, True)),
    )
    def connect(self, name: str, client_id: str, clean: bool, dies: bool) -> None:
        """A CONNECT on ``name``; ``dies``: the node dies (SIGKILL) as soon as another node has
        answered it with the session, before it wrote the session it got."""
        node = self.nodes[name]
        if not node.reaches:
            return
        if not self._check(node):
            self.renew(name)
            if not node.lease.valid(self.now):
                return  # refused (0x88): resynchronising
        lived = self.lives[client_id]
        refused = False
        deadline = self.now + HANDOVER
        adopted: set[str] = set()
        owner = self.client_key.get(client_id)
        while owner is not None and owner != name:
            other = self.nodes[owner]
            listening = other.alive and other.redis_ok
            seen = Seen(
                self._gone(owner),
                owner in adopted,
                owner in self.in_cluster,
                listening,
                self.now >= deadline,
            )
            step = claim_step(seen)
            if step is Step.ADOPT:
                adopted.add(owner)
                self._adopt(node, owner, client_id)
            elif step is Step.TAKE_FREE:
                self.client_key[client_id] = name
            elif step is Step.REFUSE:
                refused = True
                break
            elif step is Step.ASK:
                answer = answer_kind(self._hand_over(other, node, client_id, clean))
                if answer is Answer.SILENT:
                    self._wait(node, deadline)  # (that long, then abandoned)
                elif answer is Answer.SESSION and dies and self._others_alive(node):
                    self._die(node)
                    return
                else:
                    break
            else:
                self._wait(node, deadline)
            owner = self.client_key.get(client_id)
        if refused:
            assert lived == self.lives[client_id]  # the session stays where it is
            return
        self.client_key[client_id] = name
        self.owned[name].add(client_id)
        present = not clean and client_id in node.sessions
        if clean or client_id not in node.sessions:
            node.sessions[client_id] = set()
            self.acked[client_id] = set()  # a new session: the old one's messages went with it
            self.delivered[client_id] = set()
            self.hashes[client_id] = set()
        assert present == (lived and not clean), (client_id, present, lived, clean)
        self.lives[client_id] = True
        self._written(node, client_id)
        for other in self.nodes.values():  # (the hand-over disconnected it there)
            if other is not node and other.acts and client_id in other.connected:
                assert not other.lease.valid(self.now) or not self._check(other)
        node.connected.add(client_id)

    @rule(client_id=st.sampled_from(CLIENTS))
    def publish(self, client_id: str) -> None:
        """A QoS 1 message for the client, acknowledged once in its owner's stream."""
        owner = self.client_key.get(client_id)
        if owner is None or owner not in self.in_cluster or not self.lives[client_id]:
            return
        self.messages += 1
        self.streams[owner].append((client_id, self.messages))
        self.acked[client_id].add(self.messages)

    @rule(name=st.sampled_from(NODES), stall=st.sampled_from((0.0, 0.0, 11.0)))
    def read_stream(self, name: str, stall: float) -> None:
        """The node queues the messages of its stream in their sessions, each acknowledged
        (XACK) once written; ``stall``: seconds the node stops between its check and the
        write (a GC pause, a freeze), which the fence in Redis catches."""
        node = self.nodes[name]
        if not node.reaches:
            return
        while self.streams[name]:
            if not self._check(node):
                return
            client_id, message = self.streams[name][0]
            if client_id not in node.sessions:
                return  # (not here: left for whoever takes the node over)
            node.sessions[client_id].add(message)
            self.now += stall
            stall = 0.0
            if not self._written(node, client_id):
                node.sessions[client_id].discard(message)
                return  # not acknowledged (XACK): it stays in the stream
            self.streams[name].pop(0)

    @rule(name=st.sampled_from(NODES), client_id=st.sampled_from(CLIENTS))
    def deliver(self, name: str, client_id: str) -> None:
        """The node sends the client its queued messages; the client acknowledges them."""
        node = self.nodes[name]
        if not node.acts or client_id not in node.connected or not self._check(node):
            return
        self.delivered[client_id] |= node.sessions[client_id]
        node.sessions[client_id].clear()
        if node.redis_ok:
            self._written(node, client_id)

    @rule(name=st.sampled_from(NODES))
    def renew(self, name: str) -> None:
        node = self.nodes[name]
        if not node.reaches:
            return
        lease = self._lease_live(name)
        if lease is None:
            result = LEASE_GONE
        elif lease.token != node.token:
            result = LEASE_TAKEN
        else:
            result = RENEWED
            lease.expires = self.now + TTL
            lease.conn_open = True
        if node.lease.renewed(result, self.now) is Act.LAPSE:
            self._lapse(node)

    @rule(name=st.sampled_from(NODES))
    def resynchronise(self, name: str) -> None:
        """ClusterNode._back after a lapse: its lease (a new one if lost), the sessions other
        nodes own given up, the others written again."""
        node = self.nodes[name]
        if not node.reaches or not node.lease.lapsed:
            return
        lease = self._lease_live(name)
        if lease is not None and lease.token == node.token:
            lease.expires = self.now + TTL
            lease.conn_open = True
            node.lease.renewed(RENEWED, self.now)
        elif not self._take_lease(node):
            return
        if name not in self.in_cluster:
            self.in_cluster.add(name)
        given_up = [c for c in node.sessions if self.client_key.get(c) != name]
        for client_id in given_up:
            del node.sessions[client_id]
            node.connected.discard(client_id)
        node.lease.resynchronised(len(given_up))
        for client_id in node.sessions:
            self.owned[name].add(client_id)
            self._written(node, client_id)

    @rule(name=st.sampled_from(NODES), gone=st.sampled_from(NODES))
    def sweep(self, name: str, gone: str) -> None:
        """adopt_after: a node adopts another found gone."""
        node = self.nodes[name]
        if name != gone and node.reaches and self._check(node) and self._gone(gone):
            self._adopt(node, gone, "")

    def _others_alive(self, node: Node) -> bool:
        return any(n.alive for n in self.nodes.values() if n is not node)

    @precondition(lambda self: sum(n.alive for n in self.nodes.values()) > 1)
    @rule(name=st.sampled_from(NODES))
    def kill(self, name: str) -> None:
        self._die(self.nodes[name])

    def _die(self, node: Node) -> None:
        name = node.name
        node.alive = False
        node.connected.clear()
        node.sessions.clear()
        lease = self.leases.get(name)
        if lease is not None and lease.token == node.token:
            lease.conn_open = False  # Redis sees the process's connection close

    @rule(name=st.sampled_from(NODES))
    def freeze(self, name: str) -> None:
        self.nodes[name].frozen = True

    def _connection_lost(self, node: Node) -> None:
        """The node hears that its connection to Redis is gone."""
        if node.lease.connection_lost() is Act.LAPSE:
            self._lapse(node)

    @rule(name=st.sampled_from(NODES))
    def wake(self, name: str) -> None:
        node = self.nodes[name]
        node.frozen = False
        if node.conn_lost_unseen:
            node.conn_lost_unseen = False
            self._connection_lost(node)

    @rule(name=st.sampled_from(NODES))
    def lose_redis(self, name: str) -> None:
        node = self.nodes[name]
        node.redis_ok = False
        lease = self.leases.get(name)
        if lease is not None and lease.token == node.token:
            lease.conn_open = False
        if node.frozen:
            node.conn_lost_unseen = True
        else:
            self._connection_lost(node)

    @rule(name=st.sampled_from(NODES))
    def redis_back(self, name: str) -> None:
        self.nodes[name].redis_ok = True

    @rule(seconds=st.sampled_from((0.5, 2.0, 4.0, 11.0)))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def at_most_one_node_serves_a_client_id(self) -> None:
        for client_id in CLIENTS:
            serving = [
                n.name
                for n in self.nodes.values()
                if n.acts and client_id in n.connected and n.lease.valid(self.now)
            ]
            assert len(serving) <= 1, (client_id, serving, self.now)

    @invariant()
    def no_acknowledged_message_is_lost_while_its_session_lives(self) -> None:
        for client_id in CLIENTS:
            if not self.lives[client_id]:
                continue
            kept = self.delivered[client_id] | self.hashes.get(client_id, set())
            owner = self.client_key.get(client_id)
            if owner is not None and self.nodes[owner].alive:
                kept |= self.nodes[owner].sessions.get(client_id, set())
            for name in self.in_cluster:
                kept |= {m for c, m in self.streams[name] if c == client_id}
            lost = self.acked[client_id] - kept
            assert not lost, (client_id, sorted(lost))


TestOwnership = Cluster.TestCase
TestOwnership.settings = settings(max_examples=1500, stateful_step_count=40, deadline=None)
