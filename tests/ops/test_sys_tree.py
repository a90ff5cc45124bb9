"""The $SYS/broker/... counters: published on the interval, retained, reachable by $SYS/# and
not by # (MQTT-4.7.2-1), and never written to the durable store."""

from __future__ import annotations

import math
from typing import Any

from support.harness import Client, Harness

from mqttbroker.ops.sys_tree import SysTree
from mqttbroker.protocol.properties import PropertyId as Prop


def watched(
    make_harness: Any, interval: float, topic_filter: str, **options: Any
) -> tuple[Harness, SysTree, Client]:
    """A broker publishing its $SYS tree every ``interval`` seconds, the tree, and a client
    subscribed to ``topic_filter`` of it."""
    h: Harness = make_harness(sys_interval=interval, **options)
    tree = SysTree(h.broker, interval)
    watcher = h.connect("watcher")
    watcher.subscribe(topic_filter)
    return h, tree, watcher


def test_counters_published_on_interval(make_harness: Any) -> None:
    h, tree, watcher = watched(make_harness, 5.0, "$SYS/broker/#")
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


def test_own_topics_are_not_retained_messages(make_harness: Any) -> None:
    """The $SYS topics are retained for new subscribers, but they are not counted as retained
    messages, nor against max_retained."""
    h, tree, watcher = watched(
        make_harness, 5.0, "$SYS/broker/retained messages/count", max_retained=1
    )
    tree.tick()
    assert [p.payload for p in watcher.publishes()] == [b"0"]
    pub = h.connect("pub")
    pub.publish("kept/one", b"1", 1, retain=True)
    [ack] = pub.receive()
    assert ack.reason_code < 0x80  # accepted: $SYS topics do not take up max_retained = 1
    h.clock.advance(5.0)
    tree.tick()
    assert [p.payload for p in watcher.publishes()] == [b"1"]


def test_delivered_counts_publish_packets_sent(make_harness: Any) -> None:
    """messages/delivered counts PUBLISH packets sent to subscribers: a message queued for an
    offline session counts when it is sent, a dropped one never."""
    h, tree, watcher = watched(make_harness, 1.0, "$SYS/broker/messages/delivered")
    online = h.connect("online")
    online.subscribe("t", 1)
    away = h.connect("away", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 600})
    away.subscribe("t", 1)
    away.disconnect()
    slow = h.connect("slow")
    slow.subscribe("t", 0)
    slow.conn.pause_writing()  # its QoS 0 messages are dropped
    pub = h.connect("pub")
    for i in range(3):
        pub.publish("t", b"%d" % i, 1)
    assert len(online.publishes()) == 3

    def delivered() -> bytes:
        h.clock.advance(1.0)
        tree.tick()
        return watcher.publishes()[-1].payload

    assert delivered() == b"3"  # not the 3 queued for "away", nor the 3 "slow" dropped
    back = h.connect("away", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 600})
    assert len(back.publishes()) == 3
    # 3 more, and the watcher's own previous $SYS message
    assert delivered() == b"7"
    back.disconnect()  # packets sent on closed connections still count
    online.disconnect()
    assert delivered() == b"8"


def test_uptime_and_loads(make_harness: Any) -> None:
    """uptime in seconds; load/.../1min, 5min, 15min: the rate per minute, averaged
    exponentially over that period, as Mosquitto's are."""
    h, tree, watcher = watched(make_harness, 10.0, "$SYS/broker/uptime")
    watcher.subscribe("$SYS/broker/load/messages/received/+")
    watcher.subscribe("$SYS/broker/load/connections/+")
    pub = h.connect("pub")
    got: dict[str, bytes] = {}
    for _ in range(30):  # 10 messages every 10 s (60 a minute) for 5 minutes
        for i in range(10):
            pub.publish("load/t", b"%d" % i)
        h.clock.advance(10.0)
        tree.tick()
        got.update((p.topic, p.payload) for p in watcher.publishes())
    assert got["$SYS/broker/uptime"] == b"300 seconds"
    loads = {
        period: float(got[f"$SYS/broker/load/messages/received/{period}"])
        for period in ("1min", "5min", "15min")
    }
    # 60 per minute for 300 s: 60 (1 - e^(-300/T)) for the span T of each average
    assert abs(loads["1min"] - 60 * (1 - math.exp(-5))) < 0.5
    assert abs(loads["5min"] - 60 * (1 - math.exp(-1))) < 0.5
    assert abs(loads["15min"] - 60 * (1 - math.exp(-1 / 3))) < 0.5
    # two CONNECTs in the first 10 s, none since: the 1-minute average has all but forgotten
    # them, the 15-minute one not yet
    connections = {
        period: float(got[f"$SYS/broker/load/connections/{period}"]) for period in ("1min", "15min")
    }
    assert 0 < connections["1min"] < 0.05 < connections["15min"]


def test_names_mosquitto_dashboards_read(make_harness: Any) -> None:
    """The topics a dashboard made for Mosquitto subscribes to are there, with its meaning."""
    h, tree, watcher = watched(make_harness, 5.0, "$SYS/broker/#")
    sub = h.connect("sub")
    sub.subscribe("a/#")
    h.connect("pub").publish("a/b", b"x")
    sub.receive()
    tree.tick()
    got = {p.topic.removeprefix("$SYS/broker/"): p.payload for p in watcher.publishes()}
    expected = {
        "clients/connected": b"3",
        "clients/total": b"3",
        "clients/disconnected": b"0",
        "messages/received": b"1",
        "messages/sent": b"1",
        "publish/messages/received": b"1",
        "publish/messages/sent": b"1",
        "publish/messages/dropped": b"0",
        "store/messages/count": b"0",
        "subscriptions/count": b"2",
    }
    assert {name: got.get(name) for name in expected} == expected
    for name in (
        "uptime",
        "version",
        "bytes/received",
        "bytes/sent",
        "load/messages/received/1min",
        "load/messages/sent/15min",
        "load/publish/received/1min",
        "load/publish/sent/5min",
        "load/bytes/received/1min",
        "load/connections/1min",
    ):
        assert name in got, name
