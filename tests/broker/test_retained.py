"""broker/retained.py: retained messages (section 3.3.1.3): the store on its own (one message per
topic, replaced, cleared by an empty payload, wildcard matching with the '$' rule, expiry) and
through the broker."""

from __future__ import annotations

import pytest
from support.harness import Harness, Prop

from mqttbroker.broker.message import Message
from mqttbroker.broker.retained import RetainedStore


def retained(topic: str, payload: bytes = b"v", expires_at: float | None = None) -> Message:
    return Message(topic, payload, qos=1, retain=True, expires_at=expires_at)


def topics(store: RetainedStore, topic_filter: str, now: float = 0.0) -> list[str]:
    return sorted(m.topic for m in store.match(topic_filter, now))


TOPICS = ["a", "a/b", "a/b/c", "a//c", "/a", "a/", "/", "b", "$SYS/load", "$SYS", "$x/a", "x/$y"]


def test_store_and_get() -> None:
    """[MQTT-3.3.1-5] A retained message is kept for its topic."""
    store = RetainedStore()
    assert store.get("a/b") is None
    message = retained("a/b")
    store.store(message)
    assert store.get("a/b") is message
    assert store.get("a") is None
    assert store.get("a/b/c") is None
    assert len(store) == 1
    assert list(store) == [message]


def test_store_replaces() -> None:
    """[MQTT-3.3.1-5] A newer retained message replaces the one kept for the same topic."""
    store = RetainedStore()
    store.store(retained("a/b", b"1"))
    newer = retained("a/b", b"2")
    store.store(newer)
    assert store.get("a/b") is newer
    assert len(store) == 1
    assert [m.payload for m in store.match("a/b", 0.0)] == [b"2"]


def test_empty_payload_clears() -> None:
    """[MQTT-3.3.1-6] [MQTT-3.3.1-7] An empty payload removes the topic's retained message and is
    not kept itself."""
    store = RetainedStore()
    store.store(retained("a/b"))
    store.store(retained("a/b", b""))
    assert store.get("a/b") is None
    assert len(store) == 0
    assert list(store) == []
    assert topics(store, "#") == []
    # Clearing a topic that has nothing is harmless, and an empty payload is never stored.
    store.store(retained("x/y", b""))
    assert len(store) == 0
    assert store.get("x/y") is None


def test_clear_keeps_parent_and_children() -> None:
    """Clearing 'a/b' leaves 'a' and 'a/b/c' alone; clearing 'a' leaves 'a/b'."""
    store = RetainedStore()
    for topic in ("a", "a/b", "a/b/c"):
        store.store(retained(topic))
    store.store(retained("a/b", b""))
    assert topics(store, "#") == ["a", "a/b/c"]
    store.store(retained("a", b""))
    assert topics(store, "#") == ["a/b/c"]
    store.store(retained("a/b/c", b""))
    assert topics(store, "#") == []
    assert len(store) == 0
    # Storing again after everything was pruned works.
    store.store(retained("a/b"))
    assert topics(store, "a/+") == ["a/b"]


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("#", ["/", "/a", "a", "a/", "a//c", "a/b", "a/b/c", "b", "x/$y"]),
        ("+", ["a", "b"]),
        ("+/+", ["/", "/a", "a/", "a/b", "x/$y"]),
        ("a/#", ["a", "a/", "a//c", "a/b", "a/b/c"]),
        ("a/+", ["a/", "a/b"]),
        ("a/+/c", ["a//c", "a/b/c"]),
        ("+/a", ["/a"]),
        ("/+", ["/", "/a"]),
        ("/#", ["/", "/a"]),
        ("$SYS/#", ["$SYS", "$SYS/load"]),
        ("$SYS/+", ["$SYS/load"]),
        ("+/load", []),
        ("+/#", ["/", "/a", "a", "a/", "a//c", "a/b", "a/b/c", "b", "x/$y"]),
        ("$x/+", ["$x/a"]),
        ("x/+", ["x/$y"]),
        ("a/b", ["a/b"]),
        ("nothing/#", []),
    ],
)
def test_wildcard_match(topic_filter: str, expected: list[str]) -> None:
    """[MQTT-4.7.2-1] [MQTT-4.7.1-1] [MQTT-4.7.1-2] Wildcard filters find exactly the matching
    retained topics; '+' and '#' in the first level never match a '$' topic."""
    store = RetainedStore()
    for topic in TOPICS:
        store.store(retained(topic))
    assert topics(store, topic_filter) == expected


def test_expired_message_removed_not_returned() -> None:
    """[MQTT-3.3.2-5] An expired retained message is not returned and is dropped from the store;
    one that has not expired is returned."""
    store = RetainedStore()
    store.store(retained("a/old", expires_at=10.0))
    store.store(retained("a/new", expires_at=20.0))
    store.store(retained("a/forever"))
    assert topics(store, "a/#", now=9.9) == ["a/forever", "a/new", "a/old"]
    assert len(store) == 3
    assert topics(store, "a/#", now=10.0) == ["a/forever", "a/new"]
    assert store.get("a/old") is None
    assert len(store) == 2
    assert topics(store, "a/new", now=25.0) == []
    assert store.get("a/new") is None
    assert len(store) == 1
    assert topics(store, "#", now=1e9) == ["a/forever"]


def test_expired_message_replaced_while_matching_stays_replaced() -> None:
    """A match is consumed over several loop passes: an expired message replaced meanwhile is
    not removed with the replacement."""
    store = RetainedStore()
    store.store(retained("a/live"))
    store.store(retained("a/old", expires_at=10.0))  # walked first
    found = store.match("a/#", 15.0)
    assert next(found).topic == "a/live"  # the walk is done, the cleanup not yet
    newer = retained("a/old", b"new")
    store.store(newer)
    assert list(found) == []
    assert store.get("a/old") is newer


def test_retained_cleared_by_empty_payload(h: Harness) -> None:
    """[MQTT-3.3.1-6] [MQTT-3.3.1-7] An empty retained PUBLISH is delivered to current
    subscribers as usual and removes the retained message; later subscribers get nothing."""
    watcher = h.connect("watcher")
    watcher.subscribe("r", 1)
    publisher = h.connect("pub")
    publisher.publish("r", b"value", 1, retain=True)
    publisher.publish("r", b"", 1, retain=True)
    assert [p.payload for p in watcher.publishes()] == [b"value", b""]
    assert len(h.broker.router.retained) == 0
    late = h.connect("late")
    assert late.subscribe("r", 1)[1:] == []


def test_non_retained_publish_leaves_retained_alone(h: Harness) -> None:
    """[MQTT-3.3.1-8] RETAIN 0 neither stores nor replaces nor clears the retained message."""
    publisher = h.connect("pub")
    publisher.publish("r", b"kept", 1, retain=True)
    publisher.publish("r", b"live", 1)
    publisher.publish("r", b"", 1)
    publisher.publish("fresh", b"live", 1)
    client = h.connect("c1")
    assert [p.payload for p in client.subscribe("#", 1)[1:]] == [b"kept"]


def test_retained_message_expiry(h: Harness) -> None:
    """[MQTT-3.3.2-5] [MQTT-3.3.2-6] A retained message with a Message Expiry Interval is sent
    with the remaining interval, and not at all once expired."""
    publisher = h.connect("pub")
    publisher.publish("r", b"v", 1, retain=True, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    h.tick(4)
    early = h.connect("early")
    (message,) = early.subscribe("r", 1)[1:]
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6
    h.tick(6)
    late = h.connect("late")
    assert late.subscribe("r", 1)[1:] == []


def test_cleared_retained_topic_leaves_no_empty_levels(h: Harness) -> None:
    """Clearing a retained message removes the levels of its topic that hold nothing else,
    so that retained topics come and go without the tree growing."""
    client = h.connect("c")
    client.publish("a/b/c", b"x", retain=True)
    client.publish("a/d", b"y", retain=True)
    retained = h.broker.router.retained
    client.publish("a/b/c", b"", retain=True)
    assert list(retained._root.children) == ["a"]
    assert list(retained._root.children["a"].children) == ["d"]
    client.publish("a/d", b"", retain=True)
    assert retained._root.children == {} and len(retained) == 0
