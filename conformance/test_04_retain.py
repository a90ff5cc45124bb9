"""Retained messages (section 3.3.1.3) and Retain Handling (section 3.8.3.1)."""

from __future__ import annotations

from .mqtt import sub_options


def test_retained_message_stored_and_replaced(clients, topic, retained):
    """RETAIN 1 stores the message as the topic's retained message, replacing the previous one;
    a new subscription (Retain Handling 0) receives it with RETAIN 1.
    [MQTT-3.3.1-5] [MQTT-3.3.1-9]"""
    retained(topic)
    pub = clients.connected()
    pub.publish_acked(topic, b"first", qos=1, retain=True)
    pub.publish_acked(topic, b"second", qos=1, retain=True)
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    pkt = sub.expect_publish(topic, b"second")
    assert pkt.retain and pkt.qos == 1, pkt
    sub.acknowledge(pkt)
    assert sub.drain() == []


def test_retained_messages_for_wildcard_subscription(clients, topic, retained):
    """A wildcard subscription receives every matching retained message, each with RETAIN 1,
    at the lower of its QoS and the granted QoS. [MQTT-3.3.1-9] [MQTT-3.8.4-8]"""
    names = [f"{topic}/a", f"{topic}/b/c", f"{topic}/d"]
    for name in names:
        retained(name)
    pub = clients.connected()
    for qos, name in enumerate(names):
        pub.publish_acked(name, name.encode(), qos=qos, retain=True)
    sub = clients.connected()
    sub.subscribe(f"{topic}/#", qos=1)
    got = {}
    for pkt in sub.drain():
        got[pkt.topic] = pkt
        assert pkt.retain and pkt.payload == pkt.topic.encode(), pkt
        sub.acknowledge(pkt)
    assert sorted(got) == sorted(names), got
    assert [got[n].qos for n in names] == [0, 1, 1], got


def test_empty_retained_message_deletes(clients, topic, retained):
    """A retained PUBLISH with an empty payload is forwarded to current subscribers as a normal
    message and removes the retained message; it is not itself retained.
    [MQTT-3.3.1-6] [MQTT-3.3.1-7]"""
    retained(topic)
    pub = clients.connected()
    pub.publish_acked(topic, b"old", qos=1, retain=True)
    live = clients.connected()
    live.subscribe(topic, qos=1)
    live.acknowledge(live.expect_publish(topic, b"old"))
    pub.publish_acked(topic, b"", qos=1, retain=True)
    pkt = live.expect_publish(topic, b"")
    live.acknowledge(pkt)
    late = clients.connected()
    late.subscribe(topic, qos=1)
    assert late.drain() == [], "retained message not removed"


def test_empty_retained_message_never_stored(clients, topic):
    """An empty retained message to a topic without a retained message stores nothing.
    [MQTT-3.3.1-7]"""
    clients.connected().publish_acked(topic, b"", qos=1, retain=True)
    late = clients.connected()
    late.subscribe(topic, qos=1)
    assert late.drain() == []


def test_non_retained_publish_leaves_retained_alone(clients, topic, retained):
    """RETAIN 0 neither stores the message as retained nor replaces or removes the existing
    retained message. [MQTT-3.3.1-8]"""
    retained(topic)
    pub = clients.connected()
    pub.publish_acked(topic, b"kept", qos=1, retain=True)
    pub.publish_acked(topic, b"transient", qos=1)
    pub.publish_acked(topic, b"", qos=1)  # empty but not retained: no deletion either
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    pkt = sub.expect_publish(topic, b"kept")
    sub.acknowledge(pkt)
    assert sub.drain() == []


def test_retain_handling_1_only_new_subscriptions(clients, topic, retained):
    """Retain Handling 1 sends retained messages when the subscription is new, not when it
    replaces an existing one. [MQTT-3.3.1-10]"""
    retained(topic)
    clients.connected().publish_acked(topic, b"kept", qos=1, retain=True)
    sub = clients.connected()
    sub.subscribe((topic, sub_options(qos=1, rh=1)))
    sub.acknowledge(sub.expect_publish(topic, b"kept"))
    sub.subscribe((topic, sub_options(qos=1, rh=1)))
    assert sub.drain() == [], "retained message resent for an existing subscription"


def test_retain_handling_2_never(clients, topic, retained):
    """Retain Handling 2 sends no retained messages when the subscription is made, new or not.
    [MQTT-3.3.1-11]"""
    retained(topic)
    clients.connected().publish_acked(topic, b"kept", qos=1, retain=True)
    sub = clients.connected()
    sub.subscribe((topic, sub_options(qos=1, rh=2)))
    assert sub.drain() == []
    sub.subscribe((topic, sub_options(qos=1, rh=2)))
    assert sub.drain() == []


def test_retained_message_keeps_properties(clients, topic, retained):
    """A retained message is delivered later with its properties unchanged.
    [MQTT-3.3.2-4] [MQTT-3.3.2-17] [MQTT-3.3.2-18] [MQTT-3.3.2-20]"""
    retained(topic)
    props = [
        (0x01, 1),
        (0x03, "text/plain"),
        (0x26, ("b", "2")),
        (0x26, ("a", "1")),
        (0x26, ("b", "2")),
    ]
    clients.connected().publish_acked(topic, b"text", qos=1, retain=True, props=props)
    sub = clients.connected()
    sub.subscribe(topic, qos=1)
    pkt = sub.expect_publish(topic, b"text")
    assert pkt.prop(0x01) == 1 and pkt.prop(0x03) == "text/plain", pkt
    assert pkt.prop_all(0x26) == [("b", "2"), ("a", "1"), ("b", "2")], pkt
    sub.acknowledge(pkt)
