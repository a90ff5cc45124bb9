"""A session belongs to the user that created it in a cluster as on one node: a client of
another user connecting to another node with its client id is refused there with the code one
node gives (``client_id_pattern``: 0x85; the session's owner: 0x87), and the owner's connection
and session on its node are left as they were (not disconnected, not moved, not discarded).

Two real nodes on a real redis-server, users from a password file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.clients import MQTT_5, PahoClient, unique, wait_for
from support.password_files import password_file
from support.redis_server import RedisServer

pytestmark = pytest.mark.needs_redis

PASSWORDS = {"alice": b"alice-pw", "bob": b"bob-pw", "carol": b"carol-pw"}
HOUR = 3600
NOT_AUTHORIZED = 0x87
ID_NOT_VALID = 0x85
TAKEN_OVER = 0x8E


def secure_nodes(
    tmp_path: Path, start_node: Callable[..., Any], broker_keys: str = ""
) -> tuple[Any, Any]:
    """Nodes a and b, both with the password file of PASSWORDS and ``broker_keys`` (lines of
    their [broker] table)."""
    passwords = password_file(tmp_path / "passwords", PASSWORDS)
    config = f"[security]\npassword_file = {str(passwords)!r}\n[broker]\n{broker_keys}\n"
    return start_node("a", config=config), start_node("b", config=config)


def user_client(
    node: Any, user: str, client_id: str, clean: bool = False, expiry: int = HOUR
) -> PahoClient:
    """A client of ``user`` on ``node`` (MQTT 5, Session Expiry Interval ``expiry``), not yet
    connected."""
    c = PahoClient(node.host, node.port, MQTT_5, client_id, clean=clean, expiry=expiry)
    c.client.username_pw_set(user, PASSWORDS[user])
    return c


def refused(node: Any, user: str, client_id: str, clean: bool) -> tuple[int, bool]:
    """The CONNACK (reason code, Session Present) ``user`` gets on ``node`` for ``client_id``."""
    c = user_client(node, user, client_id, clean=clean)
    try:
        code = c.connect(expect_success=False)
        assert c.connack is not None
        return code, c.connack[1]
    finally:
        c.close()


def owner_of(redis_server: RedisServer, client_id: str) -> str | None:
    with redis_server.client() as r:
        found = r.get(f"mqttbroker:client:{client_id}")
        return None if found is None else found.decode()


class Alice:
    """alice on node a: a persistent session subscribed (QoS 1) to a topic of her own, and a
    publisher (carol) on node b, the route of that topic known there."""

    def __init__(self, a: Any, b: Any, client_id: str) -> None:
        self.a, self.b = a, b
        self.client_id = client_id
        self.topic = unique("alice/inbox")
        self.sent = 0
        self.client = user_client(a, "alice", client_id)
        self.client.connect()
        assert self.client.subscribe(self.topic, 1) == [1]
        self.publisher = user_client(b, "carol", unique("carol"), clean=True, expiry=0)
        self.publisher.connect()
        wait_for(self._routed, "the route of alice's topic on node b")

    def _routed(self) -> bool:
        self.publisher.publish(self.topic, b"probe", 0)
        return any(m.payload == b"probe" for m in self.client.received())

    def publish(self, count: int) -> list[bytes]:
        """``count`` QoS 1 messages for alice, from node b (acknowledged); their payloads."""
        payloads = []
        for _ in range(count):
            payload = f"m{self.sent}".encode()
            self.sent += 1
            self.publisher.publish(self.topic, payload, 1)  # (waits for the PUBACK)
            payloads.append(payload)
        return payloads

    def got(self) -> list[bytes]:
        return [m.payload for m in self.client.received() if m.payload != b"probe"]

    def still_served(self) -> None:
        """alice was not disconnected, and her session still gets what is published for her."""
        expected = self.got() + self.publish(2)
        wait_for(lambda: self.got() == expected, "messages to alice")
        assert self.client.disconnects == [], "alice was disconnected"

    def resumes_on(self, node: Any) -> None:
        """alice, away with messages queued, comes back on ``node``: her session is there
        (Session Present), with them."""
        self.client.close()
        queued = self.publish(3)
        self.client = user_client(node, "alice", self.client_id)
        self.client.connect()
        assert self.client.connack is not None and self.client.connack[1], "session gone"
        wait_for(lambda: self.got() == queued, "alice's queued messages")

    def close(self) -> None:
        self.client.close()
        self.publisher.close()

    def __enter__(self) -> Alice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_another_user_resuming_on_another_node_is_refused_and_the_owner_stays(
    tmp_path: Path, start_node: Callable[..., Any], redis_server: RedisServer
) -> None:
    """Clean Start 0: bob is refused 0x87 on b; alice stays connected on a with her session,
    which still moves to b when she herself connects there."""
    a, b = secure_nodes(tmp_path, start_node)
    with Alice(a, b, unique("shared")) as alice:
        assert refused(b, "bob", alice.client_id, clean=False) == (NOT_AUTHORIZED, False)
        alice.still_served()
        assert owner_of(redis_server, alice.client_id) == "a"
        alice.resumes_on(b)
        assert owner_of(redis_server, alice.client_id) == "b"


def test_another_user_starting_clean_on_another_node_is_refused_and_nothing_is_discarded(
    tmp_path: Path, start_node: Callable[..., Any], redis_server: RedisServer
) -> None:
    """Clean Start 1: bob is refused 0x87 on b, alice connected or away; her session and its
    queued messages stay on a."""
    a, b = secure_nodes(tmp_path, start_node)
    with Alice(a, b, unique("shared")) as alice:
        assert refused(b, "bob", alice.client_id, clean=True) == (NOT_AUTHORIZED, False)
        alice.still_served()
        # Away, with messages queued: refused all the same (session_owner_mismatch "refuse").
        alice.client.close()
        queued = alice.publish(3)
        assert refused(b, "bob", alice.client_id, clean=True) == (NOT_AUTHORIZED, False)
        assert owner_of(redis_server, alice.client_id) == "a"
        alice.client = user_client(a, "alice", alice.client_id)
        alice.client.connect()
        assert alice.client.connack is not None and alice.client.connack[1], "session gone"
        wait_for(lambda: alice.got() == queued, "alice's queued messages")
        alice.still_served()


def test_a_client_id_against_the_pattern_is_refused_before_any_hand_over(
    tmp_path: Path, start_node: Callable[..., Any], redis_server: RedisServer
) -> None:
    """client_id_pattern "%u-*": bob with alice's id is refused 0x85 on b, Clean Start 0 or 1;
    alice stays connected on a."""
    a, b = secure_nodes(tmp_path, start_node, 'client_id_pattern = "%u-*"')
    with Alice(a, b, unique("alice")) as alice:
        for clean in (False, True):
            assert refused(b, "bob", alice.client_id, clean=clean) == (ID_NOT_VALID, False)
        alice.still_served()
        assert owner_of(redis_server, alice.client_id) == "a"
        alice.resumes_on(b)


def test_with_session_owner_mismatch_new_another_user_gets_a_fresh_session(
    tmp_path: Path, start_node: Callable[..., Any]
) -> None:
    """``session_owner_mismatch = "new"``: alice connected, bob on b is refused all the same
    and she stays; alice away, bob on b gets a fresh session (Session Present 0) and hers is
    discarded, as on one node."""
    a, b = secure_nodes(tmp_path, start_node, 'session_owner_mismatch = "new"')
    with Alice(a, b, unique("shared")) as alice:
        assert refused(b, "bob", alice.client_id, clean=False) == (NOT_AUTHORIZED, False)
        alice.still_served()
        alice.client.close()
        alice.publish(2)
        bob = user_client(b, "bob", alice.client_id)
        try:
            bob.connect()
            assert bob.connack is not None and not bob.connack[1]
        finally:
            bob.close()
        # Hers is gone: back on a, she finds none (and discards bob's in her turn).
        alice.client = user_client(a, "alice", alice.client_id)
        alice.client.connect()
        assert alice.client.connack is not None and not alice.client.connack[1]


def test_allow_takeover_by_other_user_lets_another_node_kick_the_owner(
    tmp_path: Path, start_node: Callable[..., Any]
) -> None:
    """``allow_takeover_by_other_user = true``: bob on b closes alice's connection on a (0x8E)
    and gets a fresh session, hers discarded, as on one node."""
    a, b = secure_nodes(tmp_path, start_node, "allow_takeover_by_other_user = true")
    with Alice(a, b, unique("shared")) as alice:
        bob = user_client(b, "bob", alice.client_id)
        try:
            bob.connect()
            assert bob.connack is not None and not bob.connack[1]
            assert alice.client.wait_disconnected().reason_code == TAKEN_OVER
        finally:
            bob.close()
