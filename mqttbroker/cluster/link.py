"""The ownership protocol's Redis I/O: leases, claims, looks at another node, hand-over
bookkeeping. The decisions are ownership.py's (sans I/O); ``ClusterNode`` calls both.

Every check-and-set is one Lua script, so that no other node's command comes between the check
and the set. The scripts compare a lease by its token, the part before its first ``/``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from redis.exceptions import ResponseError

log = logging.getLogger("mqttbroker.cluster")

RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A session of the node ARGV[1] (gone) taken by ARGV[2]: its hash, or nothing if another node
# owns the client id now (ARGV[3] "1": the client id ARGV[2] is claiming for a CONNECT). KEYS:
# client:<id>, session:<id>, owned:<ARGV[2]>; ARGV[4] the client id. The session counts among
# the taker's at once: a taker lost before it wrote the session is adopted with it.
TAKE_SCRIPT = """
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] and (ARGV[3] ~= '1' or owner ~= ARGV[2]) then return false end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[4])
return redis.call('HGETALL', KEYS[2])
"""

# The client id KEYS[1] claimed by the node ARGV[1] in one round trip when no node or this
# one owns it (a CONNECT's usual case); else its owner, left as it is (see ClusterNode._claim).
_CLAIM_SCRIPT = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return owner end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""

# The client id KEYS[1], taken by the node ARGV[1] for a CONNECT the node ARGV[2] refused to hand
# the session over to (another user's), given back to ARGV[2] unless another node took it since.
_GIVE_BACK_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2]) end
return false
"""

# A lease (KEYS[1]) given back by the token ARGV[1] that holds it.
LEAVE_SCRIPT = """
local lease = redis.call('GET', KEYS[1])
if lease and string.match(lease, '^[^/]*') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A node's lease (KEYS[1]) is "<token>/<Redis CLIENT ID of its liveness connection>/<Redis
# run_id>". Renewed by the node holding ARGV[1] (with its connection's id ARGV[2]): 1; 2 if it
# is gone (expired, or adopted and released: the node takes a new one once resynchronised, see
# _back); 0 if another token holds it (another process, or a node adopting this one).
_RENEW = """
local lease = redis.call('GET', KEYS[1])
if not lease then return 2 end
if string.match(lease, '^[^/]*') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '/' .. ARGV[2], 'PX', ARGV[3])
return 1
"""

# The lease KEYS[1] of a node found gone (ARGV[1]: its value as seen then; "" if there was
# none) taken by the adopting node (its token ARGV[2]) unless it changed meanwhile.
_TAKE_LEASE = """
local lease = redis.call('GET', KEYS[1])
if (lease or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# A hand-over's requester gives up waiting: the reply list KEYS[1] is marked abandoned (KEYS[2]:
# a late answer is then refused, and its node keeps the session), and a reply that came
# meanwhile is returned (to be used all the same). The client id never moved meanwhile.
_ABANDON = """
redis.call('SET', KEYS[2], '1', 'EX', 120)
return redis.call('LPOP', KEYS[1])
"""

# A hand-over's answer ARGV[1] from the node ARGV[2] to the node ARGV[3], to the reply list
# KEYS[1] unless the requester gave up (KEYS[2]). With ARGV[4] "1" (a session, or none: not a
# refusal) the client id KEYS[3] (ARGV[5]) goes to the requester in the same step, the session
# with it: counted among the requester's (KEYS[4], owned:<requester>) at once, as TAKE_SCRIPT
# does, so that a node adopting the requester, lost before it wrote the session, takes it along
# with the answer itself in its hash (KEYS[5], field "h"): the hash as the answering node last
# wrote it lacks what the session got since (the messages routed to it in the moment before it
# was answered), and stays while another node owns the client id (store.FENCED_WRITE); the
# requester's first write of the session replaces the hash whole. If the client id is not the
# answering node's any more (handed over to another requester just before), the answer is
# "moved" (the requester looks again). 0: not answered (abandoned, or a session whose client id
# is not this node's): the session stays with the answering node.
REPLY_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local answer = ARGV[1]
if ARGV[4] == '1' then
  if redis.call('GET', KEYS[3]) == ARGV[2] then
    redis.call('SET', KEYS[3], ARGV[3])
    if answer ~= '' then
      redis.call('SADD', KEYS[4], ARGV[5])
      redis.call('HSET', KEYS[5], 'h', answer)
    end
  elseif answer == '' then
    answer = 'moved'
  else
    return 0
  end
end
redis.call('RPUSH', KEYS[1], answer)
redis.call('EXPIRE', KEYS[1], 60)
return 1
"""


# This node's counters of the messages it routed (sequence.Seen), written with the session
# changes they are in, fenced like them: KEYS the node's lease, seen:<node>; ARGV its token,
# then origin, counter pairs. -1: fenced, nothing written.
SEEN_SCRIPT = """
local lease = redis.call('GET', KEYS[1])
if not lease or string.match(lease, '^[^/]*') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
return 1
"""
SEEN_SHA = hashlib.sha1(SEEN_SCRIPT.encode()).hexdigest()

# An entry of QoS 1/2 messages (ARGV[3]) added to another node's stream (KEYS[2]), fenced like
# the session writes of its batch (KEYS[1] the writing node's lease, ARGV[1] its token, ARGV[2]
# the stream's approximate length): -1, nothing added, if the lease is not that token's. A node
# frozen with a batch on its way, and adopted meanwhile, sends it when it wakes: its session
# writes were refused, and so are its messages now (their publishers were not acknowledged and
# send them again where their sessions are; sent from here too, they came twice).
FENCED_XADD = """
local lease = redis.call('GET', KEYS[1])
if not lease or string.match(lease, '^[^/]*') ~= ARGV[1] then return -1 end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'm', ARGV[3])
"""
FENCED_XADD_SHA = hashlib.sha1(FENCED_XADD.encode()).hexdigest()


class Link:
    """The Redis commands of one node's ownership protocol. ``redis``: the node's client;
    ``live``: a client of its own for the liveness connection (one connection, used for the
    lease alone: its CLIENT ID is in the lease, and the other nodes take the node for gone
    once Redis has closed it; a pub/sub connection would not do, Redis closes one that reads
    too slowly)."""

    def __init__(self, redis: Any, live: Any, prefix: str, node_id: str) -> None:
        self.redis = redis
        self.live = live
        self.prefix = prefix
        self.node_id = node_id
        self.lease_key = f"{prefix}node:{node_id}"
        self._no_client_list = False  # CLIENT LIST refused (logged once)
        self.alive = ""  # "<CLIENT ID>/<run_id>" of the liveness connection, as last read

    async def liveness(self) -> str:
        """Read (and keep in ``alive``) ``<id>/<run_id>``: the Redis CLIENT ID of the liveness
        connection (connected again first if it was lost), and the run_id of that Redis (ids
        start again when it restarts)."""
        # (not a pipeline: it would take a connection of the pool, not this one)
        conn_id = await self.live.client_id()
        info = await self.live.info("server")
        self.alive = f"{conn_id}/{info.get('run_id')}"
        return self.alive

    async def take_lease(self, token: str, ttl: float) -> bool:
        """The node's lease under ``token``, if nobody holds it."""
        value = f"{token}/{self.alive}"
        return bool(await self.redis.set(self.lease_key, value, nx=True, px=int(ttl * 1000)))

    async def renew_lease(self, token: str, ttl: float) -> int:
        """ownership.RENEWED, LEASE_GONE or LEASE_TAKEN (see _RENEW); on the pool's
        connections (the liveness one is held in its read), naming the liveness connection as
        last read: stale after a reconnection until the renewal loop reads it again, which
        makes the other nodes wait for the lease (a run_id or id that does not match), never
        take the node for gone early."""
        result: int = await self.redis.eval(
            _RENEW, 1, self.lease_key, token, self.alive, int(ttl * 1000)
        )
        return result

    async def hold_liveness(self, seconds: float) -> None:
        """Keep the liveness connection in a blocking read for ``seconds``: if Redis closes
        it meanwhile, this raises at once (the node lapses, as the others may take it for
        gone now)."""
        await self.live.blpop([f"{self.prefix}live:{self.node_id}"], timeout=seconds)

    async def release_lease(self, key: str, token: str) -> None:
        await self.redis.eval(LEAVE_SCRIPT, 1, key, token)

    async def take_lease_of(self, node: str, seen: str, token: str, ttl: float) -> bool:
        """The lease of ``node``, found gone (its value ``seen`` then), taken to adopt it."""
        key = f"{self.prefix}node:{node}"
        return bool(await self.redis.eval(_TAKE_LEASE, 1, key, seen, token, int(ttl * 1000)))

    async def look(self, node: str) -> tuple[bool, str, bool, bool]:
        """What a claim needs to know about ``node``: whether it is gone (its lease missing,
        or the liveness connection it names closed, as Redis sees at once when a node is
        killed; a frozen one keeps its connection), its lease as read ("" if none), whether it
        is still in the cluster (not adopted yet), whether it listens to its control
        channel."""
        prefix = self.prefix
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(f"{prefix}node:{node}")
        pipe.info("server")
        pipe.sismember(prefix + "nodes", node)
        pipe.pubsub_numsub(f"{prefix}ctl:{node}")
        value, info, member, numsub = await pipe.execute()
        in_cluster = bool(member)
        listening = bool(numsub[0][1])
        if value is None:
            return True, "", in_cluster, listening
        lease = value.decode()
        _, _, rest = lease.partition("/")
        conn_id, _, run_id = rest.partition("/")
        if not conn_id or run_id != str(info.get("run_id")):
            return False, lease, in_cluster, listening  # (a Redis restarted gives ids anew)
        try:
            listed = await self.redis.client_list(client_id=[conn_id])
        except ResponseError as exc:  # (a Redis user without CLIENT LIST: the lease only)
            if not self._no_client_list:
                self._no_client_list = True
                log.warning(
                    "cluster: CLIENT LIST refused (%s): a node killed is found gone only once "
                    "its lease (node_ttl) runs out",
                    exc,
                )
            return False, lease, in_cluster, listening
        return not listed, lease, in_cluster, listening

    async def claim(self, key: str) -> bytes | None:
        """The client id ``key`` claimed if free or this node's (None), else its owner."""
        found: bytes | None = await self.redis.eval(_CLAIM_SCRIPT, 1, key, self.node_id)
        return found

    async def give_back(self, key: str, holder: str, to: str) -> None:
        """``key`` to ``to`` if ``holder`` has it."""
        await self.redis.eval(_GIVE_BACK_SCRIPT, 1, key, holder, to)

    async def abandon(self, reply: str) -> bytes | None:
        """A hand-over request given up (see _ABANDON): a reply that came meanwhile, or
        None."""
        found: bytes | None = await self.redis.eval(_ABANDON, 2, reply, reply + ":gone")
        return found

    async def wait_reply(self, reply: str, seconds: float) -> bytes | None:
        found = await self.redis.blpop([reply], timeout=max(0.01, seconds))
        return None if found is None else bytes(found[1])

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()
