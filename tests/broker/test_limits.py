"""Configurable limits: each one answered with the right reason code, harming nobody else."""

from __future__ import annotations

from typing import Any

from broker_harness import Harness, pk


def test_max_connections_closes_the_extra_connection(make_harness: Any) -> None:
    h = make_harness(max_connections=2)
    first = h.connect("a")
    h.connect("b")
    extra = h.client()
    assert extra.closed  # closed on accept, before any byte
    assert h.broker.refused == 1
    first.subscribe("t")  # the others are unharmed


def test_max_connections_per_address(make_harness: Any) -> None:
    h: Harness = make_harness(max_connections_per_address=1)
    one = h.client(peer="10.0.0.1:1000")
    two = h.client(peer="10.0.0.1:1001")
    other = h.client(peer="10.0.0.2:1000")
    assert not one.closed and two.closed and not other.closed
    one.lose()  # the slot is given back
    again = h.client(peer="10.0.0.1:1002")
    assert not again.closed


def test_topic_levels_limit(make_harness: Any) -> None:
    h = make_harness(max_topic_levels=3)
    client = h.connect("c")
    suback = client.subscribe("a/b/c/d")[0]
    assert suback.reason_codes == [0x8F]
    assert client.subscribe("a/b/c")[0].reason_codes == [0]
    client.publish("a/b/c/d", b"x", 1)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x90


def test_topic_length_limit(make_harness: Any) -> None:
    h = make_harness(max_topic_length=10)
    client = h.connect("c")
    assert client.subscribe("x" * 11)[0].reason_codes == [0x8F]
    assert client.subscribe("x" * 10)[0].reason_codes == [0]


def test_subscriptions_per_client(make_harness: Any) -> None:
    h = make_harness(max_subscriptions_per_client=2)
    client = h.connect("c")
    assert client.subscribe("a")[0].reason_codes == [0]
    assert client.subscribe("b")[0].reason_codes == [0]
    assert client.subscribe("c")[0].reason_codes == [0x97]
    assert client.subscribe("a", 1)[0].reason_codes == [1]  # replacing one is no new one
    client.unsubscribe("b")
    assert client.subscribe("c")[0].reason_codes == [0]


def test_publish_rate(make_harness: Any) -> None:
    """A client publishing faster than max_publish_rate is disconnected with 0x96; others keep
    publishing."""
    h = make_harness(max_publish_rate=10.0, max_publish_burst=3)
    fast = h.connect("fast")
    calm = h.connect("calm")
    sub = h.connect("sub")
    sub.subscribe("t")
    for _ in range(3):
        fast.publish("t")
    assert len(sub.publishes()) == 3
    fast.publish("t")
    assert fast.one(pk.Disconnect).reason_code == 0x96
    h.clock.advance(0.2)  # two tokens back for everyone
    calm.publish("t")
    calm.publish("t")
    assert len(sub.publishes()) == 2


def test_max_retained(make_harness: Any) -> None:
    h = make_harness(max_retained=1)
    client = h.connect("c")
    client.publish("r/1", b"one", 1, retain=True)
    assert client.one(pk.Puback).reason_code in (0, 0x10)
    client.publish("r/2", b"two", 1, retain=True)
    assert client.one(pk.Puback).reason_code == 0x97
    client.publish("r/1", b"uno", 1, retain=True)  # replacing the one there is fine
    assert client.one(pk.Puback).reason_code in (0, 0x10)
    assert len(h.broker.router.retained) == 1
    assert h.broker.router.retained.get("r/1").payload == b"uno"
