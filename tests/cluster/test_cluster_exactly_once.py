"""Exactly once across nodes: a QoS 2 message reaches each subscriber once, also when a node
is killed and adopted or a session moves, and nothing acknowledged is dropped on the way.

Real node processes on a real redis-server, with the default ``node_ttl`` (10 s)."""

from __future__ import annotations

from typing import Any

import pytest
from support.clients import wait_for
from support.cluster_clients import (
    acknowledged,
    close_all,
    counted,
    kill,
    payloads,
    resumed,
    routed,
    subscriber,
)

pytestmark = pytest.mark.needs_redis


def test_adopting_a_killed_node_routes_its_stream_to_its_sessions_only(start_node: Any) -> None:
    """A QoS 2 message published on a goes to a's own subscriber and to b's stream (for b's
    device, away). b is SIGKILLed; the device comes back on a, which adopts b and routes b's
    stream: to the device's session only. a's own subscriber had each message already and
    must not get it a second time (MQTT 4.3.3: exactly once)."""
    a = start_node("a")
    b = start_node("b")
    client_id, topic, away, pub = routed(b, a, 2, "adopted")
    local = subscriber(a, topic, 2)
    away.close()  # its messages wait in b's stream
    kill(b)
    sent = [f"m{i}".encode() for i in range(20)]
    acknowledged(pub, topic, sent, 2)
    wait_for(lambda: set(payloads(local)) >= set(sent), "a's subscriber's messages")
    again = resumed(a, client_id)
    wait_for(lambda: set(payloads(again)) >= set(sent), "the messages in b's stream", 30)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    pub.publish(topic, b"last", qos=2)  # after the adoption: once everything before it came
    wait_for(lambda: b"last" in payloads(local) and b"last" in payloads(again), "the last one")
    for c in (local, again):
        counts = counted(c)
        assert all(counts[p] == 1 for p in [*sent, b"last"]), counts
    close_all(local, again, pub)
