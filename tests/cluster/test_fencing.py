"""The fencing token on a real redis-server: a session's changes are written by one script
(``store.FENCED_WRITE``) that checks first that the writing node still holds its lease with
the token it wrote under, and owns the client id. A node whose lease was adopted (or ran out)
writes nothing; nor does one whose client id another node has taken."""

from __future__ import annotations

import pytest
import redis
from support.redis_server import RedisServer

from mqttbroker.cluster.link import FENCED_XADD, REPLY_SCRIPT, TAKE_SCRIPT
from mqttbroker.cluster.store import END, FENCED_WRITE, KEEP, REWRITE

pytestmark = pytest.mark.needs_redis

LEASE = "mqttbroker:node:n1"
CLIENT = "mqttbroker:client:dev"
SESSION = "mqttbroker:session:dev"
OWNED = "mqttbroker:owned:n1"


def write(
    r: redis.Redis, token: str, wipe: int, removed: list[str], fields: dict[str, bytes]
) -> int:
    args: list[str | int | bytes] = [
        token,
        "n1",
        "dev",
        wipe,
        b'["u", 3600]',
        len(removed),
        *removed,
    ]
    for name, value in fields.items():
        args += [name, value]
    return int(r.eval(FENCED_WRITE, 4, LEASE, CLIENT, SESSION, OWNED, *args))


def test_a_write_passes_only_under_the_writers_lease_and_ownership(
    redis_server: RedisServer,
) -> None:
    with redis_server.client() as r:
        r.set(LEASE, "t1/7/run")  # n1's lease: token t1 (its connection 7, that Redis's run)
        r.set(CLIENT, "n1")
        assert write(r, "t1", REWRITE, [], {"d:1": b"m1", "d:2": b"m2"}) == 1
        assert r.hgetall(SESSION) == {b"s": b'["u", 3600]', b"d:1": b"m1", b"d:2": b"m2"}
        assert r.smembers(OWNED) == {b"dev"}
        assert write(r, "t1", KEEP, ["d:1"], {"d:3": b"m3"}) == 1
        assert set(r.hkeys(SESSION)) == {b"s", b"d:2", b"d:3"}
        # n1 frozen past its lease; n2 adopted it (its lease, then the client id).
        r.set(LEASE, "t-of-n2")
        assert write(r, "t1", KEEP, ["d:2", "d:3"], {"d:4": b"stale"}) == -1
        assert write(r, "t1", END, [], {}) == -1
        r.set(CLIENT, "n2")
        r.delete(LEASE)  # (adopted: released)
        assert write(r, "t1", REWRITE, [], {}) == -1
        assert set(r.hkeys(SESSION)) == {b"s", b"d:2", b"d:3"}  # untouched
        # n1 back with a new lease: still not its client id.
        r.set(LEASE, "t2/9/run")
        assert write(r, "t2", REWRITE, [], {"d:9": b"x"}) == 0
        assert write(r, "t2", END, [], {}) == 1  # (its own set only: the hash is n2's)
        assert set(r.hkeys(SESSION)) == {b"s", b"d:2", b"d:3"}
        assert r.smembers(OWNED) == set()


def test_a_hand_over_answer_kept_in_the_hash_goes_with_the_owners_first_write(
    redis_server: RedisServer,
) -> None:
    """The answer a hand-over left in the session's hash (``h``, link.REPLY_SCRIPT) is what a
    node adopting the requester builds the session from while the requester has not written
    it. Any write of the owner removes it, a REWRITE as the whole hash goes and a KEEP too:
    the owner may have started a new session (the answer never built into one), and a later
    adoption must not bring back the answered one."""
    with redis_server.client() as r:
        r.set(LEASE, "t1/7/run")
        r.set(CLIENT, "n1")
        r.hset(SESSION, mapping={"s": '["u", 3600]', "h": '{"username": "u"}'})
        assert write(r, "t1", KEEP, [], {"f:a": b"{}"}) == 1
        assert set(r.hkeys(SESSION)) == {b"s", b"f:a"}
        r.hset(SESSION, "h", '{"username": "u"}')
        assert write(r, "t1", REWRITE, [], {"d:1": b"m1"}) == 1
        assert set(r.hkeys(SESSION)) == {b"s", b"d:1"}
        r.hset(SESSION, "h", '{"username": "u"}')
        r.set(CLIENT, "n2")  # (another node's now: its answer stays)
        assert write(r, "t1", KEEP, [], {"d:2": b"m2"}) == 0
        assert set(r.hkeys(SESSION)) == {b"s", b"d:1", b"h"}


def test_a_large_rewrite_goes_in_slices(redis_server: RedisServer) -> None:
    """Lua's unpack has a limit: thousands of fields are written in slices."""
    with redis_server.client() as r:
        r.set(LEASE, "t1/7/run")
        r.set(CLIENT, "n1")
        fields = {f"d:{i}": b"m" for i in range(5000)}
        assert write(r, "t1", REWRITE, [], fields) == 1
        assert r.hlen(SESSION) == 5001
        assert write(r, "t1", KEEP, list(fields), {}) == 1
        assert r.hlen(SESSION) == 1


def test_a_session_taken_counts_among_the_takers_at_once(redis_server: RedisServer) -> None:
    """n2 adopting n1 takes the session (``link.TAKE_SCRIPT``): it is among n2's from then on,
    so that a node adopting n2, lost before it wrote the session, takes it along. A session
    whose client id another node has is neither taken nor counted."""
    with redis_server.client() as r:
        r.set(CLIENT, "n1")
        r.hset(SESSION, "s", b'["u", 3600]')
        keys = (CLIENT, SESSION, "mqttbroker:owned:n2")
        assert r.eval(TAKE_SCRIPT, 3, *keys, "n1", "n2", "", "dev") == [b"s", b'["u", 3600]']
        assert r.get(CLIENT) == b"n2"
        assert r.smembers("mqttbroker:owned:n2") == {b"dev"}
        keys = (CLIENT, SESSION, "mqttbroker:owned:n3")
        assert r.eval(TAKE_SCRIPT, 3, *keys, "n1", "n3", "", "dev") is None
        assert not r.exists("mqttbroker:owned:n3")


def test_a_session_handed_over_counts_among_the_requesters_at_once(
    redis_server: RedisServer,
) -> None:
    """n1 answers n2's hand-over request with the session (``link.REPLY_SCRIPT``): the client id
    goes to n2 and the session is among n2's from then on, so that a node adopting n2, lost
    before it wrote the session (frozen at that moment, say), takes it along: the answer
    itself, in the session's hash beside what n1 last wrote of it (that stays: n1's end of it
    keeps the hash of a client id another node owns; the messages routed to it since are in
    the answer only). Not when n1 had no session to give (a Clean Start, or none), nor when
    n2 had given up waiting."""

    def reply(r: redis.Redis, answer: bytes, requester: str, reply: str = "reply") -> int:
        keys = (reply, reply + ":gone", CLIENT, f"mqttbroker:owned:{requester}", SESSION)
        return int(r.eval(REPLY_SCRIPT, 5, *keys, answer, "n1", requester, "1", "dev"))

    with redis_server.client() as r:
        r.set(CLIENT, "n1")
        r.hset(SESSION, "s", '["u", 3600]')
        assert reply(r, b'{"username": "u"}', "n2") == 1
        assert r.get(CLIENT) == b"n2"
        assert r.smembers("mqttbroker:owned:n2") == {b"dev"}
        assert r.hgetall(SESSION) == {b"s": b'["u", 3600]', b"h": b'{"username": "u"}'}
        r.delete(SESSION)
        r.set(CLIENT, "n1")
        assert reply(r, b"", "n3") == 1  # (a Clean Start: the session ends)
        assert r.get(CLIENT) == b"n3" and not r.exists("mqttbroker:owned:n3")
        assert not r.exists(SESSION)
        r.set(CLIENT, "n1")
        r.set("late:gone", "1")
        assert reply(r, b'{"username": "u"}', "n4", "late") == 0
        assert r.get(CLIENT) == b"n1" and not r.exists("mqttbroker:owned:n4")
        assert not r.exists(SESSION)


def test_messages_for_other_nodes_pass_only_under_the_writers_lease(
    redis_server: RedisServer,
) -> None:
    """A batch's QoS 1/2 messages for another node's stream are fenced like its session writes
    (``link.FENCED_XADD``): a node frozen with a batch on its way, adopted meanwhile, adds
    nothing when it wakes (its publishers were not acknowledged: they send again where their
    sessions are now, and a copy from here came twice)."""
    stream = "mqttbroker:stream:n2"
    with redis_server.client() as r:
        r.set(LEASE, "t1/7/run")
        args = (2, LEASE, stream, "t1", 1000, b"frames")
        assert r.eval(FENCED_XADD, *args) != -1
        assert r.xlen(stream) == 1
        r.set(LEASE, "t-of-n3")  # adopted meanwhile
        assert r.eval(FENCED_XADD, *args) == -1
        r.delete(LEASE)
        assert r.eval(FENCED_XADD, *args) == -1
        assert r.xlen(stream) == 1
