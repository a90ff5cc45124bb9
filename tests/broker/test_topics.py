"""broker/topics.py: topic names, topic filters, shared-subscription names and matching (sections
4.7, 4.8.2), their limits, and the subscription trie (a table checked three ways, and hypothesis
against a brute-force matcher)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.harness import Harness, pk
from support.traced import bytes_per

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


LEVELS = ["a", "b", "", "$", "$a", "a$"]


CLIENTS = ["c1", "c2", "c3"]


GROUPS = [None, None, "g", "h"]


SESSIONS = {cid: Session(cid, BrokerOptions()) for cid in CLIENTS}


# Every topic name of 1 to 4 levels, and every filter of 0 to 3 levels with an optional '#'
# after them: sampling from precomputed lists keeps generation cheap.
ALL_NAMES = sorted(
    {"/".join(p) for n in range(1, 5) for p in itertools.product(LEVELS, repeat=n)} - {""}
)


ALL_FILTERS = sorted(
    {
        "/".join((*p, "#") if hash_ else p)
        for n in range(0, 4)
        for p in itertools.product([*LEVELS, "+"], repeat=n)
        for hash_ in (False, True)
    }
    - {""}
)


topic_names = st.sampled_from(ALL_NAMES)


topic_filters = st.sampled_from(ALL_FILTERS)


@st.composite
def subscriptions(draw: st.DrawFn) -> dict[tuple[str, str], Subscription]:
    """Distinct (client id, filter as subscribed) -> Subscription."""
    entries = draw(
        st.lists(
            st.tuples(st.sampled_from(CLIENTS), topic_filters, st.sampled_from(GROUPS)),
            max_size=25,
        )
    )
    subs: dict[tuple[str, str], Subscription] = {}
    for client_id, topic_filter, group in entries:
        full = topic_filter if group is None else f"$share/{group}/{topic_filter}"
        subs[(client_id, full)] = Subscription(SESSIONS[client_id], full)
    return subs


@st.composite
def topics_for(draw: st.DrawFn, subs: dict[tuple[str, str], Subscription]) -> list[str]:
    """Topic names: some from the whole alphabet, some made to match (or nearly match) one of
    the drawn filters by filling in its wildcards."""
    topics = draw(st.lists(topic_names, min_size=1, max_size=4))
    filters = sorted({sub.filter for sub in subs.values()})
    if filters:
        for topic_filter in draw(st.lists(st.sampled_from(filters), max_size=6)):
            levels: list[str] = []
            for level in topic_filter.split("/"):
                if level == "+":
                    levels.append(draw(st.sampled_from(LEVELS)))
                elif level == "#":
                    levels.extend(draw(st.lists(st.sampled_from(LEVELS), max_size=2)))
                else:
                    levels.append(level)
            topic = "/".join(levels)
            if topic:
                topics.append(topic)
    return topics


def trie_matches(trie: SubscriptionTrie, topic: str) -> set[tuple[str, str]]:
    targets, groups = trie.match(topic)
    found: set[tuple[str, str]] = set()
    seen_sessions = []
    for session, subs in targets:
        seen_sessions.append(session.client_id)
        for sub in subs:
            assert sub.session is session, "a subscription listed under another session"
            assert sub.share_group is None
            key = (session.client_id, sub.topic_filter)
            assert key not in found, f"{key} matched twice"
            found.add(key)
    assert len(seen_sessions) == len(set(seen_sessions)), "a session listed twice"
    group_keys = [id(g) for g in groups]
    assert len(group_keys) == len(set(group_keys)), "a shared group listed twice"
    for group in groups:
        for member in group.members:
            assert member.share_group == group.name
            key = (member.session.client_id, member.topic_filter)
            assert key not in found, f"{key} matched twice"
            found.add(key)
    return found


def brute_force(subs: dict[tuple[str, str], Subscription], topic: str) -> set[tuple[str, str]]:
    return {key for key, sub in subs.items() if matches(sub.filter, topic)}


# What the trie keeps for one subscription to a topic of its own, two levels below a shared one.
TRIE_BYTES_PER_TOPIC = 750


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


@settings(max_examples=120, deadline=None)
@given(data=st.data(), subs=subscriptions())
def test_trie_equals_brute_force(
    data: st.DataObject, subs: dict[tuple[str, str], Subscription]
) -> None:
    """[MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.2-1] [MQTT-4.5.0-1] Every matching subscription,
    and only those, is found."""
    topics = data.draw(topics_for(subs))
    trie = SubscriptionTrie()
    for sub in subs.values():
        assert trie.add(sub) is False
    assert trie.count == len(subs)
    for topic in topics:
        assert trie_matches(trie, topic) == brute_force(subs, topic), topic


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    subs=subscriptions(),
    removal=st.lists(st.booleans(), min_size=25, max_size=25),
)
def test_trie_after_removals(
    data: st.DataObject, subs: dict[tuple[str, str], Subscription], removal: list[bool]
) -> None:
    """Removing (and pruning) some subscriptions leaves the others matching exactly as before."""
    topics = data.draw(topics_for(subs))
    trie = SubscriptionTrie()
    for sub in subs.values():
        trie.add(sub)
    for topic in topics:  # matched once first: what the trie keeps of a match must follow
        assert trie_matches(trie, topic) == brute_force(subs, topic), topic
    remaining = dict(subs)
    for (key, sub), remove in zip(list(subs.items()), removal, strict=False):
        if remove:
            assert trie.remove(sub) is True
            assert trie.remove(sub) is False  # already gone
            del remaining[key]
    assert trie.count == len(remaining)
    for topic in topics:
        assert trie_matches(trie, topic) == brute_force(remaining, topic), topic
    # Re-adding after pruning works too.
    for key, sub in subs.items():
        if key not in remaining:
            assert trie.add(sub) is False
    for topic in topics:
        assert trie_matches(trie, topic) == brute_force(subs, topic), topic


@settings(max_examples=40, deadline=None)
@given(subs=subscriptions())
def test_trie_prunes_to_empty(subs: dict[tuple[str, str], Subscription]) -> None:
    """Removing every subscription leaves no node behind (the trie does not grow with churn)."""
    trie = SubscriptionTrie()
    for sub in subs.values():
        trie.add(sub)
    for sub in subs.values():
        assert trie.remove(sub) is True
    assert trie.count == 0
    assert list(trie) == []
    assert not trie._root.children


@settings(max_examples=40, deadline=None)
@given(subs=subscriptions())
def test_trie_add_replaces(subs: dict[tuple[str, str], Subscription]) -> None:
    """[MQTT-3.8.4-3] Adding the same (client, filter) again replaces the subscription: the count
    does not change and the newer options are the ones matched."""
    trie = SubscriptionTrie()
    for sub in subs.values():
        trie.add(sub)
    for (client_id, full), _sub in subs.items():
        newer = Subscription(SESSIONS[client_id], full, qos=2)
        assert trie.add(newer) is True
    assert trie.count == len(subs)
    assert sorted((s.session.client_id, s.topic_filter) for s in trie) == sorted(subs)
    assert all(s.qos == 2 for s in trie)


def test_remove_unknown_filter() -> None:
    """Removing a subscription that was never added is a no-op returning False."""
    trie = SubscriptionTrie()
    keep = Subscription(SESSIONS["c1"], "a/b")
    trie.add(keep)
    assert trie.remove(Subscription(SESSIONS["c2"], "a/b")) is False
    assert trie.remove(Subscription(SESSIONS["c1"], "a/b/c")) is False
    assert trie.remove(Subscription(SESSIONS["c1"], "$share/g/a/b")) is False
    assert trie.count == 1
    assert trie_matches(trie, "a/b") == {("c1", "a/b")}


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


def test_the_trie_keeps_little_per_subscription(make_harness: Callable[..., Harness]) -> None:
    """A node creates its tables (children, subscriptions, shared groups) on first use: a
    device's own topic costs its two levels' nodes and what they hold, not three tables each."""
    h = make_harness()
    session = h.connect("owner").session
    subs = [Subscription(session, f"dev/{i:04d}/state") for i in range(500)]
    trie = SubscriptionTrie()
    trie.add(Subscription(session, "dev/warm/state"))
    per_subscription = bytes_per(subs, trie.add)
    assert per_subscription < TRIE_BYTES_PER_TOPIC, per_subscription
    assert [s.topic_filter for s in trie.match("dev/0007/state")[0][0][1]] == ["dev/0007/state"]
    for sub in subs:
        assert trie.remove(sub)
    assert trie.count == 1 and [s.topic_filter for s in trie] == ["dev/warm/state"]


def clients_of(match: Any) -> list[str]:
    return sorted(session.client_id for session, _subs in match[0])


def test_the_topics_one_filter_alone_matches_share_one_match_until_it_changes() -> None:
    """A fleet's topics under one wildcard filter share that filter's match (a cached match per
    topic then costs its topic, not a copy each); a change to the filter's subscriptions gives
    them a new one and leaves the old one as it was; a topic two filters match gets its own."""
    trie = SubscriptionTrie()
    trie.add(Subscription(SESSIONS["c1"], "fleet/+/state"))
    first = trie.match("fleet/1/state")
    # The lists: a compiled trie may box the pair that holds them anew on each return.
    assert trie.match("fleet/2/state")[0] is first[0]
    assert clients_of(first) == ["c1"]
    trie.add(Subscription(SESSIONS["c2"], "fleet/+/state"))
    second = trie.match("fleet/2/state")
    assert second[0] is not first[0]
    assert clients_of(second) == ["c1", "c2"] and clients_of(first) == ["c1"]
    trie.add(Subscription(SESSIONS["c3"], "fleet/7/state"))
    assert clients_of(trie.match("fleet/7/state")) == ["c1", "c2", "c3"]
    assert trie.match("fleet/1/state")[0] is second[0]  # another node's change keeps it
    trie.add(Subscription(SESSIONS["c3"], "$share/g/fleet/+/state"))
    shared = trie.match("fleet/1/state")
    assert [group.name for group in shared[1]] == ["g"] and not second[1]
    assert trie.remove(Subscription(SESSIONS["c1"], "fleet/+/state"))
    assert clients_of(trie.match("fleet/1/state")) == ["c2"] and clients_of(shared) == ["c1", "c2"]
    assert trie.match("other/1/state") == ([], [])


# What a cached match costs per topic of a fleet publishing under one wildcard filter: the
# topic's wire form and its dict slot, about 145 bytes compiled and 89 in pure Python. 267 and
# 211 while the entry kept the decoded name too (and a tuple of both); 515 (pure Python) when
# each topic held its own match.
CACHE_BYTES_PER_FLEET_TOPIC = 170


def test_the_match_cache_keeps_little_per_topic_of_a_fleet(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    h.connect("watcher").subscribe("fleet/+/state")
    router = h.broker.router
    topics = [f"fleet/{i:05d}/state" for i in range(2000)]
    router.lookup("fleet/warm/state")
    per_topic = bytes_per(topics, router.lookup)
    assert len(router.cache) == len(topics) + 1
    assert per_topic < CACHE_BYTES_PER_FLEET_TOPIC, per_topic
    match = router.lookup("fleet/00042/state")
    assert match is not None and clients_of(match) == ["watcher"]
