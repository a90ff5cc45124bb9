"""Persistent sessions and their limits, end to end.

Caps on persistent sessions, in all and per user (CONNACK 0x97, 3.1.1: 0x03), and on the
bytes of one session's topic filters (SUBACK 0x97). Sessions of expiry 0 do not count.

A message dropped from a subscriber's full offline queue: the publisher was acknowledged
(success: the drop is the subscriber's queue policy, as in Mosquitto), and the operator sees it:
a WARNING naming the session and the count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.clients import MQTT_5, MQTT_311, unique
from support.secure_broker import HOUR, SecureBroker, assert_logged, connack, paho_client

QUOTA = {MQTT_5: 0x97, MQTT_311: 0x03}


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_persistent_sessions_per_user(secure: SecureBroker, version: int) -> None:
    server = secure.start("max_sessions_per_user = 2\nmax_sessions = 4")
    first, second = unique("a"), unique("a")
    assert connack(server, first, version, "alice") == (False, 0)
    assert connack(server, second, version, "alice") == (False, 0)
    mark = server.log_mark()
    assert connack(server, unique("a"), version, "alice") == (False, QUOTA[version])
    assert_logged(server, "max_sessions_per_user (2) reached for user 'alice'", mark)
    # Her sessions are still there to resume; a clean (non-persistent) one is not counted.
    assert connack(server, first, version, "alice") == (True, 0)
    assert connack(server, unique("a"), version, "alice", clean=True, expiry=0) == (False, 0)
    # Another user has a quota of its own, up to the global cap, where anonymous counts too.
    assert connack(server, unique("b"), version, "bob") == (False, 0)
    assert connack(server, unique("n"), version, None) == (False, 0)
    assert connack(server, unique("n"), version, None) == (False, QUOTA[version])
    assert connack(server, unique("b"), version, "bob") == (False, QUOTA[version])
    # A session that ends frees its place: Clean Start with expiry 0 ends alice's first one.
    assert connack(server, first, version, "alice", clean=True, expiry=0) == (False, 0)
    assert connack(server, unique("b"), version, "bob") == (False, 0)


def test_caps_count_the_sessions_restored_after_a_restart(secure: SecureBroker) -> None:
    server = secure.start("max_sessions_per_user = 1", memory=False)
    kept = unique("a")
    assert connack(server, kept, MQTT_5, "alice") == (False, 0)
    server.stop()
    server = secure.start("max_sessions_per_user = 1", memory=False)
    assert connack(server, unique("a"), MQTT_5, "alice") == (False, 0x97)
    assert connack(server, kept, MQTT_5, "alice") == (True, 0)


def test_subscription_bytes_per_session(secure: SecureBroker) -> None:
    server = secure.start("max_subscription_bytes = 24")
    alice = paho_client(server, "alice", unique("a"))
    try:
        alice.connect()
        assert alice.subscribe("alice/0123456789", 1) == [1]  # 16 bytes
        assert alice.subscribe("alice/01", 1) == [1]  # 8: 24 in all
        mark = server.log_mark()
        assert alice.subscribe("alice/x", 1) == [0x97]
        assert_logged(server, "max_subscription_bytes (24) reached", mark)
        assert alice.subscribe("alice/01", 0) == [0]  # the same filter again costs nothing
        assert alice.unsubscribe("alice/01") == [0]
        assert alice.subscribe("alice/x", 1) == [1]  # room again
    finally:
        alice.close()


QUEUE_LIMIT = 1000  # max_queued_messages by default


def test_drop_from_a_full_queue_is_logged(start_broker: Callable[..., Any]) -> None:
    server = start_broker(extra_args=("--memory",))
    client_id = unique("sub")
    sub = paho_client(server, None, client_id, expiry=HOUR)
    try:
        sub.connect()
        assert sub.subscribe("drops/#", 1) == [1]
    finally:
        sub.close()
    pub = paho_client(server, None, unique("pub"), clean=True, expiry=0)
    mark = server.log_mark()
    try:
        pub.connect()
        infos = [pub.publish("drops/t", b"%d" % i, 1, wait=False) for i in range(QUEUE_LIMIT + 2)]
        assert {pub.wait_published(info) for info in infos} == {0}
    finally:
        pub.close()
    line = server.wait_for_log(rf"session {client_id}: 1 messages dropped", since=mark)
    assert line is not None, server.log_since(mark)
    assert "WARNING" in line.string and "(queue full); 1 dropped in all" in line.string
