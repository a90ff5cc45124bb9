"""broker/router.py: fan-out (one copy per session, overlapping subscriptions, No Local, Retain As
Published), shared subscriptions and their strategies, and the match cache (bounded, kept in step
with subscriptions, each topic validated once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.harness import Client, Harness, Prop, disconnected_with, pk


def shared_setup(
    make_harness: Any, strategy: str, members: int = 3
) -> tuple[Harness, list[Client]]:
    h = make_harness(shared_subscription_strategy=strategy)
    subs = []
    for index in range(members):
        client = h.connect(f"m{index}")
        client.subscribe("$share/g/work/+", 1)
        subs.append(client)
    return h, subs


def counts(subs: list[Client]) -> list[int]:
    return [len(s.publishes()) for s in subs]


def test_round_robin_goes_in_member_order(make_harness: Any) -> None:
    h, subs = shared_setup(make_harness, "round_robin")
    pub = h.connect("pub")
    order = []
    for i in range(6):
        pub.publish(f"work/{i}", b"x", 1)
        order.append(next(n for n, c in enumerate(counts(subs)) if c))
    assert order == [0, 1, 2, 0, 1, 2]


def test_random_uses_every_member(make_harness: Any) -> None:
    """Random, not sticky: one publisher's 60 messages reach every member of three."""
    h, subs = shared_setup(make_harness, "random")
    pub = h.connect("pub")
    for i in range(60):
        pub.publish(f"work/{i}", b"x", 1)
    assert all(counts(subs))


def test_hash_spreads_topics(make_harness: Any) -> None:
    """By topic, not by publisher: one publisher's topics are spread over the members."""
    h, subs = shared_setup(make_harness, "hash")
    pub = h.connect("pub")
    for i in range(30):
        pub.publish(f"work/{i}", b"x", 1)
    assert sum(1 for c in counts(subs) if c) > 1


def test_sticky_moves_on_when_its_member_leaves(make_harness: Any) -> None:
    h, subs = shared_setup(make_harness, "sticky")
    pub = h.connect("pub")
    pub.publish("work/1", b"x", 1)
    first = [n for n, c in enumerate(counts(subs)) if c]
    assert len(first) == 1
    subs[first[0]].unsubscribe("$share/g/work/+")
    pub.publish("work/2", b"x", 1)
    pub.publish("work/3", b"x", 1)
    now = counts(subs)
    assert now[first[0]] == 0 and sorted(now) == [0, 0, 2]


def test_overlapping_subscriptions_no_local_and_retain_as_published(h: Harness) -> None:
    """One client, two matching subscriptions: a No Local one does not stop the other from
    delivering the client's own message, whichever the router meets first; the copy keeps
    RETAIN if either subscription asked for Retain As Published (MQTT-3.3.1-12, -3.8.3-3)."""
    for no_local_filter, plain_filter in (("t/a", "t/#"), ("t/#", "t/a")):
        c = h.connect("both")
        c.subscribe(no_local_filter, 1, no_local=True)
        c.subscribe(plain_filter, 1, retain_as_published=True)
        c.publish("t/a", b"own", 1, retain=True)
        got = [p for p in c.receive() if isinstance(p, pk.Publish)]
        assert [(p.payload, p.retain) for p in got] == [(b"own", True)], (no_local_filter, got)
        for p in got:
            c.puback(p.packet_id)
        c.disconnect()
    other = h.connect("other")
    other.subscribe("t/a", 1)
    other.subscribe("t/#", 1)
    h.connect("pub").publish("t/a", b"x", 1, retain=True)
    assert [p.retain for p in other.publishes()] == [False]  # neither asked for it


@pytest.mark.parametrize(
    ("strategy", "topics", "spread"),
    [
        pytest.param("round_robin", [f"work/{i}" for i in range(9)], [3, 3, 3], id="evenly"),
        pytest.param("hash", ["work/one"] * 6, [0, 0, 6], id="hash-a-topic-on-one-member"),
        pytest.param("sticky", [f"work/{i}" for i in range(4)], [0, 0, 4], id="sticky-publisher"),
        pytest.param("random", [f"work/{i}" for i in range(30)], None, id="random"),
    ],
)
def test_each_strategy_gives_each_message_to_one_member_spread_as_it_says(
    make_harness: Any, strategy: str, topics: list[str], spread: list[int] | None
) -> None:
    """[MQTT-4.8.2-3] Each message goes to exactly one member; round robin spreads evenly, hash
    keeps a topic on one member, sticky a publisher."""
    h, subs = shared_setup(make_harness, strategy)
    pub = h.connect("pub")
    for topic in topics:
        pub.publish(topic, b"x", 1)
    got = counts(subs)
    assert sum(got) == len(topics)
    if spread is not None:
        assert sorted(got) == spread


def test_invalid_topic_rejected_every_time(h: Harness) -> None:
    """[MQTT-3.3.2-2] An invalid topic is refused on every connection that sends it (an invalid
    name is never remembered as valid)."""
    for index in range(3):
        client = h.connect(f"c{index}")
        client.publish("a/+/b", b"x", index % 2)
        disconnected_with(client, 0x90)


def test_matching_follows_subscription_changes(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-4.5.0-1] [MQTT-3.10.4-2] [MQTT-3.1.2-4] Repeated topics are matched against the
    current subscriptions: after SUBSCRIBE, UNSUBSCRIBE, and a session replaced by Clean Start."""
    for cache_size in (65536, 1):
        h = make_harness(match_cache_size=cache_size)
        publisher = h.connect("pub")
        subscriber = h.connect("sub", properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
        publisher.publish("t", b"1")
        publisher.publish("u", b"1")
        subscriber.subscribe("t")
        publisher.publish("t", b"2")
        publisher.publish("u", b"2")
        assert [p.payload for p in subscriber.publishes()] == [b"2"]
        subscriber.unsubscribe("t")
        publisher.publish("t", b"3")
        assert subscriber.receive() == []
        subscriber.subscribe("t", 1)
        publisher.publish("t", b"4", 1)
        assert [p.payload for p in subscriber.publishes()] == [b"4"]
        subscriber.lose()
        fresh = h.connect("sub", clean_start=True, expect_present=False)
        publisher.publish("t", b"5", 1)
        assert publisher.receive()[-1].reason_code == 0x10
        fresh.subscribe("t", 1)
        publisher.publish("t", b"6", 1)
        assert [p.payload for p in fresh.publishes()] == [b"6"]
        assert len(h.broker.sessions["sub"].queue) == 0


def test_a_subscription_without_wildcards_keeps_the_other_cached_matches(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    watcher = h.connect("watcher")
    watcher.subscribe("busy/#")
    pub = h.connect("pub")
    pub.publish("busy/a", b"1")
    cache = h.broker.router.cache
    cached = set(cache)
    assert cached
    for i in range(3):  # a storm of own-topic subscribers
        h.connect(f"own-{i}").subscribe(f"own/{i}")
    assert set(cache) >= cached
    pub.publish("busy/a", b"2")
    assert [p.payload for p in watcher.publishes()] == [b"1", b"2"]


@pytest.mark.parametrize("topic_filter", ["t/x", "$share/g/t/x", "t/+", "#"])
def test_a_new_subscription_changes_the_cached_match_of_its_topic(
    make_harness: Callable[..., Harness], topic_filter: str
) -> None:
    h = make_harness()
    pub = h.connect("pub")
    other = h.connect("other")
    other.subscribe("t/x")
    pub.publish("t/x", b"before")  # cached: one subscriber
    late = h.connect("late")
    late.subscribe(topic_filter)
    pub.publish("t/x", b"after")
    assert [p.payload for p in late.publishes()] == [b"after"]
    assert [p.payload for p in other.publishes()] == [b"before", b"after"]
    late.unsubscribe(topic_filter)
    pub.publish("t/x", b"gone")
    assert late.receive() == []


def test_live_dollar_topic_not_matched_by_wildcard(h: Harness) -> None:
    """[MQTT-4.7.2-1] A live message on '$SYS/x' reaches '$SYS/#' but not '#' or '+/x'."""
    everything = h.connect("all")
    everything.subscribe("#")
    everything.subscribe("+/x")
    sys_sub = h.connect("sys")
    sys_sub.subscribe("$SYS/#")
    h.connect("pub").publish("$SYS/x", b"m")
    assert everything.receive() == []
    assert [p.topic for p in sys_sub.publishes()] == ["$SYS/x"]


def test_shared_subscription_one_member_per_message(h: Harness) -> None:
    """[MQTT-4.8.2-3] Each message goes to one member of the group, at that member's granted QoS;
    no retained messages on subscribing."""
    h.connect("pub").publish("t", b"retained", 1, retain=True)
    first = h.connect("m1")
    assert first.subscribe("$share/g/t", 1)[1:] == []
    second = h.connect("m2")
    assert second.subscribe("$share/g/t", 0)[1:] == []
    publisher = h.connect("pub2")
    for index in range(4):
        publisher.publish("t", b"%d" % index, 2)
    got1 = first.publishes()
    got2 = second.publishes()
    assert len(got1) + len(got2) == 4
    assert got1 and got2
    assert all(p.qos == 1 for p in got1)
    assert all(p.qos == 0 for p in got2)
    assert sorted(p.payload for p in got1 + got2) == [b"0", b"1", b"2", b"3"]


def test_match_cache_is_bounded_by_bytes(make_harness: Any) -> None:
    h: Harness = make_harness(match_cache_bytes=100_000, max_topic_length=65535)
    client = h.connect("c")
    for index in range(50):
        client.publish(f"{index}/" + "x" * 10_000)
    router = h.broker.router
    assert 0 < router._cache_bytes <= 100_000
    assert len(router.cache) < 50


def test_sticky_publishers_stay_when_another_member_leaves(make_harness: Any) -> None:
    h: Harness = make_harness(shared_subscription_strategy="sticky")
    members = [h.connect(f"m{i}") for i in range(3)]
    for member in members:
        member.subscribe("$share/g/t", 1)
    publishers = [h.connect(f"p{i}") for i in range(3)]
    for publisher in publishers:
        publisher.publish("t", publisher.conn.client_id.encode(), 1)
    first = [[p.payload for p in m.publishes()] for m in members]
    assert sorted(len(f) for f in first) == [1, 1, 1]
    members[2].unsubscribe("$share/g/t")
    publishers[0].publish("t", b"again", 1)
    holder = next(i for i, f in enumerate(first) if f == [b"p0"])
    assert [p.payload for p in members[holder].publishes()] == [b"again"]


def test_overlapping_subscriptions_forward_the_expiry(h: Harness) -> None:
    """[MQTT-3.3.4-2] [MQTT-3.3.2-6] One copy for two matching subscriptions, with the Message
    Expiry Interval less the time it waited: sent at once to a connected client, and queued for
    one that is away."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 60}
    here = h.connect("here")
    away = h.connect("away", properties=props)
    for client in (here, away):
        client.subscribe("t/+", 1)
        client.subscribe("t/#", 1)
    away.lose()
    h.connect("pub").publish("t/x", b"m", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 30})
    (now,) = here.publishes()
    assert now.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 30
    h.clock.advance(10)
    away = h.connect("away", clean_start=False, properties=props, expect_present=True)
    (later,) = away.publishes()
    assert later.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 20


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_no_local_at_every_qos(h: Harness, qos: int) -> None:
    """[MQTT-3.8.3-3] No Local: the client's own messages do not come back, whatever their QoS."""
    client = h.connect("c")
    client.subscribe("t", 2, no_local=True)
    other = h.connect("o")
    other.subscribe("t", 2)
    client.publish("t", b"mine", qos)
    received = client.receive()
    assert all(not isinstance(p, pk.Publish) for p in received), received
    assert [p.payload for p in other.publishes()] == [b"mine"]
