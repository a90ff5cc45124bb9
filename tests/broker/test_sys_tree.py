"""The $SYS/broker/... counters: published on the interval, retained, reachable by $SYS/# and
not by # (MQTT-4.7.2-1), and never written to the durable store."""

from __future__ import annotations

from typing import Any

from broker_harness import Harness

from mqttbroker.ops.sys_tree import SysTree


def test_counters_published_on_interval(make_harness: Any) -> None:
    h: Harness = make_harness(sys_interval=5.0)
    tree = SysTree(h.broker, 5.0)
    watcher = h.connect("watcher")
    watcher.subscribe("$SYS/broker/#")
    everything = h.connect("everything")
    everything.subscribe("#")
    pub = h.connect("pub")
    pub.publish("a/b", b"x")
    everything.receive()
    tree.tick()
    got = {p.topic: p.payload for p in watcher.publishes()}
    assert got["$SYS/broker/messages/received"] == b"1"
    assert got["$SYS/broker/clients/connected"] == b"3"
    assert got["$SYS/broker/subscriptions/count"] == b"2"
    assert not everything.publishes()  # '#' does not match $SYS topics
    tree.tick()  # before the interval: nothing new
    assert not watcher.publishes()
    h.clock.advance(5.0)
    pub.publish("a/b", b"y")
    tree.tick()
    again = {p.topic: p.payload for p in watcher.publishes()}
    assert again["$SYS/broker/messages/received"] == b"2"
    late = h.connect("late")  # retained: a new subscriber gets the latest values at once
    received = late.subscribe("$SYS/broker/messages/received")[1:]
    assert [p.payload for p in received] == [b"2"] and received[0].retain


def test_zero_interval_publishes_nothing(h: Harness) -> None:
    tree = SysTree(h.broker, 0)
    watcher = h.connect("watcher")
    watcher.subscribe("$SYS/#")
    tree.tick()
    assert not watcher.publishes()
