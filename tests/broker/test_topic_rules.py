"""Topic names, topic filters, shared-subscription names and matching (sections 4.7, 4.8.2).

One table of (topic name, filter, matches?) is checked three ways: against the reference
``topics.matches``, against the subscription trie, and against the retained store's wildcard walk.
"""

from __future__ import annotations

import pytest

from mqttbroker.broker.message import Message
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.retained import RetainedStore
from mqttbroker.broker.session import Session
from mqttbroker.broker.topics import (
    Subscription,
    SubscriptionTrie,
    matches,
    parse_shared,
    valid_topic_filter,
    valid_topic_name,
)


def session_of(client_id: str) -> Session:
    return Session(client_id, BrokerOptions())


# (topic name, topic filter, expected)
MATCH_TABLE = [
    # plain levels
    ("a", "a", True),
    ("a", "b", False),
    ("a/b", "a/b", True),
    ("a/b", "a", False),
    ("a", "a/b", False),
    ("A", "a", False),  # exact comparison, MQTT-4.7.3-4
    ("a/b/", "a/b", False),
    ("a/b", "a/b/", False),
    # '+'
    ("a", "+", True),
    ("a/b", "+", False),
    ("a/b", "a/+", True),
    ("a/b", "+/b", True),
    ("a/b", "+/+", True),
    ("a/b/c", "a/+", False),
    ("a/b/c", "a/+/c", True),
    ("a/b/c", "+/+/+", True),
    ("a", "a/+", False),
    ("a/b/c", "+/b/#", True),
    # '#'
    ("a", "#", True),
    ("a/b/c", "#", True),
    ("a/b/c", "a/#", True),
    ("a", "a/#", True),  # the parent level, 4.7.1.2
    ("ab", "a/#", False),
    ("b/a", "a/#", False),
    ("a/b", "a/b/#", True),
    ("a/b/c/d", "a/+/#", True),
    ("a", "a/+/#", False),
    # empty levels
    ("a//b", "a//b", True),
    ("a//b", "a/+/b", True),
    ("a//b", "a/b", False),
    ("a//b", "a/#", True),
    ("a//b", "+/+/+", True),
    ("/a", "/a", True),
    ("/a", "+/a", True),  # '+' matches the empty first level
    ("/a", "/+", True),
    ("/a", "#", True),
    ("/a", "a", False),
    ("/a", "+", False),
    ("a/", "a/", True),
    ("a/", "a/+", True),  # '+' matches the empty last level
    ("a/", "a/#", True),
    ("a/", "a", False),
    ("a/", "+", False),
    ("/", "/", True),
    ("/", "+/+", True),
    ("/", "#", True),
    ("/", "/#", True),
    ("/", "+", False),
    ("/", "+/+/+", False),
    ("//", "+/+/+", True),
    # '$' topics, MQTT-4.7.2-1
    ("$SYS/broker/load", "#", False),
    ("$SYS/broker/load", "+/broker/load", False),
    ("$SYS/broker/load", "+/#", False),
    ("$SYS", "#", False),
    ("$SYS", "+", False),
    ("$SYS/broker/load", "$SYS/#", True),
    ("$SYS", "$SYS/#", True),
    ("$SYS/broker/load", "$SYS/+/load", True),
    ("$SYS/broker/load", "$SYS/broker/load", True),
    ("$", "#", False),
    ("$", "$", True),
    ("$a/b", "$a/+", True),
    ("a/$SYS", "a/+", True),  # '$' only matters in the first level
    ("a/$SYS", "a/#", True),
    ("a/$SYS", "#", True),
    ("a$", "#", True),
    ("a$", "+", True),
]

IDS = [f"{name!r}~{flt!r}" for name, flt, _ in MATCH_TABLE]


@pytest.mark.parametrize(("topic", "topic_filter", "expected"), MATCH_TABLE, ids=IDS)
def test_matches_reference(topic: str, topic_filter: str, expected: bool) -> None:
    """[MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.2-1] [MQTT-4.7.3-4] The reference matcher."""
    assert valid_topic_name(topic)
    assert valid_topic_filter(topic_filter)
    assert matches(topic_filter, topic) is expected


@pytest.mark.parametrize(("topic", "topic_filter", "expected"), MATCH_TABLE, ids=IDS)
def test_trie_matches_table(topic: str, topic_filter: str, expected: bool) -> None:
    """[MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.2-1] The trie agrees with the table, for a plain
    subscription and for the same filter in a shared group."""
    trie = SubscriptionTrie()
    session = session_of("c1")
    trie.add(Subscription(session, topic_filter))
    trie.add(Subscription(session_of("c2"), f"$share/g/{topic_filter}"))
    targets, groups = trie.match(topic)
    assert bool(targets) is expected
    assert bool(groups) is expected
    if expected:
        assert [(s.client_id, [sub.topic_filter for sub in subs]) for s, subs in targets] == [
            ("c1", [topic_filter])
        ]
        assert [g.name for g in groups] == ["g"]


@pytest.mark.parametrize(("topic", "topic_filter", "expected"), MATCH_TABLE, ids=IDS)
def test_retained_store_matches_table(topic: str, topic_filter: str, expected: bool) -> None:
    """[MQTT-4.7.2-1] [MQTT-3.3.1-9] The retained store's wildcard walk agrees with the table."""
    store = RetainedStore()
    store.store(Message(topic, b"payload", retain=True))
    store.store(Message("zzz/other", b"payload", retain=True))
    found = [m.topic for m in store.match(topic_filter, now=0.0)]
    assert (topic in found) is expected
    assert found.count(topic) <= 1


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("a", True),
        ("a/b", True),
        ("/", True),
        ("//", True),
        ("/a", True),
        ("a/", True),
        (" ", True),
        ("$SYS/x", True),
        ("$", True),
        ("a$b", True),
        ("", False),  # MQTT-4.7.3-1
        ("+", False),
        ("#", False),
        ("a/+", False),
        ("a/#", False),
        ("a+", False),
        ("a#b", False),
        ("a/b+/c", False),
        ("$SYS/#", False),
    ],
)
def test_valid_topic_name(name: str, valid: bool) -> None:
    """[MQTT-4.7.0-1] [MQTT-4.7.3-1] [MQTT-3.3.2-2] Topic Names: non-empty, no wildcards."""
    assert valid_topic_name(name) is valid


@pytest.mark.parametrize(
    ("topic_filter", "valid"),
    [
        ("a", True),
        ("a/b", True),
        ("#", True),
        ("+", True),
        ("a/#", True),
        ("a/+", True),
        ("+/a", True),
        ("+/+", True),
        ("a/+/b", True),
        ("+/#", True),
        ("/#", True),
        ("/+", True),
        ("//", True),
        ("a//#", True),
        ("$SYS/#", True),
        ("/", True),
        ("", False),  # MQTT-4.7.3-1
        ("a#", False),  # MQTT-4.7.1-1
        ("#a", False),
        ("a/#/b", False),
        ("#/a", False),
        ("##", False),
        ("a/b#", False),
        ("a/#/", False),
        ("a+", False),  # MQTT-4.7.1-2
        ("+a", False),
        ("a/+b", False),
        ("a/b+/c", False),
        ("++", False),
        ("a/+#", False),
        ("+#", False),
    ],
)
def test_valid_topic_filter(topic_filter: str, valid: bool) -> None:
    """[MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.3-1] Topic Filters: '#' alone and last, '+'
    alone in its level."""
    assert valid_topic_filter(topic_filter) is valid


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/a", ("g", "a")),
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/g/+", ("g", "+")),
        ("$share/g/+/a/#", ("g", "+/a/#")),
        ("$share/group-1/a", ("group-1", "a")),
        ("$share/g//a", ("g", "/a")),
        ("$share/g/$SYS/#", ("g", "$SYS/#")),
        # not shared filters at all
        ("a/b", None),
        ("#", None),
        ("$share", None),
        ("$SHARE/g/a", None),
        ("$shared/g/a", None),
        ("a/$share/g/a", None),
    ],
)
def test_parse_shared_valid(topic_filter: str, expected: tuple[str, str] | None) -> None:
    """[MQTT-4.8.2-1] [MQTT-4.8.2-2] '$share/' + ShareName + '/' + Topic Filter."""
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize(
    "topic_filter",
    [
        "$share//a",  # empty ShareName, MQTT-4.8.2-1
        "$share/g",  # no '/' and Topic Filter after the ShareName, MQTT-4.8.2-2
        "$share/",
        "$share/g/",  # empty Topic Filter
        "$share/g+/a",  # '+' in the ShareName, MQTT-4.8.2-2
        "$share/+/a",
        "$share/g#/a",
        "$share/#/a",
        "$share/#",
        "$share/g/a#",  # the Topic Filter itself is invalid
        "$share/g/#/a",
        "$share/g/a+",
    ],
)
def test_parse_shared_invalid(topic_filter: str) -> None:
    """[MQTT-4.8.2-1] [MQTT-4.8.2-2] Malformed shared subscription names are rejected."""
    with pytest.raises(ValueError):
        parse_shared(topic_filter)
