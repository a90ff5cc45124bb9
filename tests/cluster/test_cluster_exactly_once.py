"""Exactly once across nodes: a QoS 2 message reaches each subscriber once, also when a node
is killed and adopted or a session moves, and nothing acknowledged is dropped on the way.

Real node processes on a real redis-server, with the default ``node_ttl`` (10 s)."""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest
from support.clients import unique
from test_cluster_kill import client, device, payloads, until_routed, wait_for

pytestmark = pytest.mark.needs_redis


def test_adopting_a_killed_node_routes_its_stream_to_its_sessions_only(start_node: Any) -> None:
    """A QoS 2 message published on a goes to a's own subscriber and to b's stream (for b's
    device, away). b is SIGKILLed; the device comes back on a, which adopts b and routes b's
    stream: to the device's session only. a's own subscriber had each message already and
    must not get it a second time (MQTT 4.3.3: exactly once)."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("adopted")
    topic = unique("once")
    away = device(b, client_id, clean=True)
    away.connect()
    away.subscribe(topic, qos=2)
    local = client(a)
    local.subscribe(topic, qos=2)
    pub = client(a)
    until_routed(pub, away, topic)
    away.close()  # its messages wait in b's stream
    b.send_signal(signal.SIGKILL)
    b.wait_exit()
    sent = [f"m{i}".encode() for i in range(20)]
    for p in sent:
        assert pub.wait_published(pub.publish(topic, p, qos=2, wait=False), timeout=30) == 0
    wait_for(lambda: set(payloads(local)) >= set(sent), "a's subscriber's messages")
    again = device(a, client_id, clean=False)
    again.connect()
    assert again.session_present, a.log_text()
    wait_for(lambda: set(payloads(again)) >= set(sent), "the messages in b's stream")
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    pub.publish(topic, b"last", qos=2)  # after the adoption: once everything before it came
    wait_for(lambda: b"last" in payloads(local) and b"last" in payloads(again), "the last one")
    for c in (local, again):
        counts = Counter(payloads(c))
        assert all(counts[p] == 1 for p in [*sent, b"last"]), counts
    for c in (local, again, pub):
        c.close()
