"""Outbound topic aliases, shared-subscription strategies, and the hand-over of a shared
subscription's messages when a member's session ends."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import Client, Harness, Prop, pk, split_packets


def raw_publishes(client: Client) -> list[pk.Publish]:
    """What the client was sent, decoded without the harness's no-alias check."""
    client.h.broker.flush()
    packets = split_packets(client.link.data[client._read :], client.version)
    client._read = len(client.link.data)
    return [p for p in packets if isinstance(p, pk.Publish)]


def resolve(publishes: list[pk.Publish], maximum: int) -> list[str]:
    """Play the client's side of the alias map: the topic each PUBLISH stands for."""
    table: dict[int, str] = {}
    topics = []
    for p in publishes:
        alias = p.properties.get(Prop.TOPIC_ALIAS)
        if alias is None:
            topics.append(p.topic)
            continue
        assert 0 < alias <= maximum  # [MQTT-3.1.2-26] [MQTT-3.3.2-8]
        if p.topic:
            table[alias] = p.topic
        topics.append(table[alias])  # KeyError: an alias used before it was set
    return topics


def test_outbound_aliases_are_set_then_reused(h: Harness) -> None:
    """The broker assigns aliases to a client that allows them; a repeated topic goes out with
    an empty topic name and its alias."""
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#")
    pub = h.connect("pub")
    for topic in ["t/a", "t/a", "t/b", "t/a", "t/b"]:
        pub.publish(topic, topic.encode())
    got = raw_publishes(sub)
    assert resolve(got, 2) == ["t/a", "t/a", "t/b", "t/a", "t/b"]
    assert [p.topic for p in got] == ["t/a", "", "t/b", "", ""]
    assert [p.payload for p in got] == [b"t/a", b"t/a", b"t/b", b"t/a", b"t/b"]


def test_least_recently_used_alias_is_reassigned(h: Harness) -> None:
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#", 1)
    pub = h.connect("pub")
    order = ["t/a", "t/b", "t/a", "t/c", "t/b", "t/a"]
    for topic in order:
        pub.publish(topic, b"x", 1)
    got = raw_publishes(sub)
    assert resolve(got, 2) == order
    assert all(p.properties[Prop.TOPIC_ALIAS] in (1, 2) for p in got)
    # t/c displaced t/b (least recently used), so t/b and then t/a came with their names again
    assert [bool(p.topic) for p in got] == [True, True, False, True, True, True]


def test_no_alias_without_a_topic_alias_maximum(h: Harness) -> None:
    """[MQTT-3.1.2-27] A client that announced no Topic Alias Maximum gets no aliases."""
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    for _ in range(3):
        pub.publish("t")
    got = raw_publishes(sub)
    assert len(got) == 3
    assert all(Prop.TOPIC_ALIAS not in p.properties and p.topic == "t" for p in got)


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


def test_round_robin_spreads_evenly(make_harness: Any) -> None:
    """[MQTT-4.8.2-3] Each message goes to exactly one member, at the QoS granted to it."""
    h, subs = shared_setup(make_harness, "round_robin")
    pub = h.connect("pub")
    for i in range(9):
        pub.publish(f"work/{i}", b"x", 1)
    assert counts(subs) == [3, 3, 3]


def test_hash_keeps_a_topic_on_one_member(make_harness: Any) -> None:
    h, subs = shared_setup(make_harness, "hash")
    pub = h.connect("pub")
    for _ in range(6):
        pub.publish("work/one", b"x", 1)
    assert sorted(counts(subs)) == [0, 0, 6]


def test_sticky_keeps_a_publisher_on_one_member(make_harness: Any) -> None:
    h, subs = shared_setup(make_harness, "sticky")
    first = h.connect("pub1")
    for i in range(4):
        first.publish(f"work/{i}", b"x", 1)
    assert sorted(counts(subs)) == [0, 0, 4]


def test_random_delivers_each_message_once(make_harness: Any) -> None:
    h, subs = shared_setup(make_harness, "random")
    pub = h.connect("pub")
    for i in range(30):
        pub.publish(f"work/{i}", b"x", 1)
    assert sum(counts(subs)) == 30


def test_offline_persistent_member_keeps_its_share(make_harness: Any) -> None:
    """A member whose client is away but whose session persists keeps receiving its share,
    queued, and gets it on reconnect."""
    h = make_harness()
    away = h.connect("away", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 600})
    away.subscribe("$share/g/job", 1)
    here = h.connect("here")
    here.subscribe("$share/g/job", 1)
    away.disconnect()
    pub = h.connect("pub")
    for _ in range(4):
        pub.publish("job", b"x", 1)
    assert len(here.publishes()) == 2
    back = h.connect(
        "away",
        clean_start=False,
        properties={Prop.SESSION_EXPIRY_INTERVAL: 600},
        expect_present=True,
    )
    assert len(back.publishes()) == 2


def test_qos1_in_flight_goes_to_another_member_when_the_session_ends(make_harness: Any) -> None:
    """Section 4.8.2: when a member's session ends, its unacknowledged QoS 1 messages go to
    another member; a QoS 2 message in flight does not (MQTT-4.8.2-5)."""
    h = make_harness()
    leaving = h.connect("leaving")
    leaving.subscribe("$share/g/job", 2)
    staying = h.connect("staying")
    staying.subscribe("$share/g/job", 2)
    pub = h.connect("pub")
    pub.publish("job", b"q1-a", 1)  # -> leaving (round robin)
    pub.publish("job", b"q1-b", 1)  # -> staying
    pub.publish("job", b"q2-c", 2)  # -> leaving
    pub.receive()
    assert [p.payload for p in leaving.publishes()] == [b"q1-a", b"q2-c"]
    assert [p.payload for p in staying.publishes()] == [b"q1-b"]
    leaving.lose()  # clean session: it ends now, nothing acknowledged
    handed = staying.publishes()
    assert [p.payload for p in handed] == [b"q1-a"]
    assert handed[0].qos == 1


def test_hand_over_goes_to_the_group_as_it_is_when_the_session_ends(make_harness: Any) -> None:
    """The group a message came through may have emptied and filled again before the session
    holding it ends: the message goes to whoever is subscribed to that shared subscription then,
    with that member's subscription options."""
    h = make_harness()
    first = h.connect("first")
    first.subscribe("$share/g/job", 1, sub_id=3, retain_as_published=True)
    pub = h.connect("pub")
    pub.publish("job", b"m1", 1, retain=True)
    got = first.publishes()  # in flight, not acknowledged
    assert [(p.payload, p.retain) for p in got] == [(b"m1", True)]
    assert got[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [3]
    first.unsubscribe("$share/g/job")  # the group is left without members
    later = h.connect("later")
    later.subscribe("$share/g/job", 1, sub_id=7)
    first.lose()
    # As the receiving member's subscription sends it: its identifier (MQTT-3.3.4-3), and
    # RETAIN cleared since it did not ask for Retain As Published (MQTT-3.3.1-12).
    handed = later.publishes()
    assert [(p.payload, p.retain) for p in handed] == [(b"m1", False)]
    assert handed[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [7]


@pytest.mark.parametrize("strategy", ["bogus", ""])
def test_unknown_strategy_is_refused(strategy: str) -> None:
    from mqttbroker.broker.options import BrokerOptions

    with pytest.raises(ValueError, match="shared_subscription_strategy"):
        BrokerOptions(shared_subscription_strategy=strategy).check()
