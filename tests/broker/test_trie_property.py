"""The subscription trie against a brute-force matcher (topics.matches), under hypothesis.

Random filters (some shared) for random client ids, random topic names from a small alphabet that
has '/', '$' and empty levels; the (client id, filter) pairs the trie matches must be exactly the
ones the brute force finds, before and after random removals.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.session import Session
from mqttbroker.broker.topics import Subscription, SubscriptionTrie, matches

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
