"""Details the other tests let slip (found by mutation testing, see conformance/README.md):
packet identifiers at the wrap, the offline queue's byte limit, broker-sent aliases on QoS 1
messages with their properties, and each shared-subscription strategy's own rule."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk
from test_aliases_and_sharing import counts, raw_publishes, resolve, shared_setup


def test_packet_ids_wrap_from_65535_to_1(h: Harness) -> None:
    """Never 0, never past 65535 (MQTT-2.2.1-3)."""
    sub = h.connect("sub")
    sub.subscribe("t", 1)
    sub.session.next_packet_id = 65535
    pub = h.connect("pub")
    for i in range(3):
        pub.publish("t", b"%d" % i, 1)
    assert [p.packet_id for p in sub.publishes()] == [65535, 1, 2]


def test_queued_bytes_limit_exact(make_harness: Any) -> None:
    """max_queued_bytes counts payload and topic bytes (as on the wire, with their length): a
    message that fills the limit exactly is queued, the next one dropped; a delivered message
    gives its bytes back."""
    size = 2 + len(b"q") + len(b"0123456789")
    h: Harness = make_harness(max_queued_bytes=3 * size)
    props = {Prop.SESSION_EXPIRY_INTERVAL: 600}
    h.connect("sub", clean_start=False, properties=props).subscribe("q", 1)
    h.connect("sub", clean_start=False, properties=props, expect_present=True).lose()
    pub = h.connect("pub")
    for _ in range(4):
        pub.publish("q", b"0123456789", 1)
    session = h.broker.sessions["sub"]
    assert len(session.queue) == 3 and session.queued_bytes == 3 * size
    assert session.dropped == 1
    back = h.connect("sub", clean_start=False, properties=props, expect_present=True)
    got = back.publishes()
    assert len(got) == 3
    assert session.queued_bytes == 0
    for p in got:
        back.puback(p.packet_id)


def test_aliased_qos1_publish_keeps_its_fields(h: Harness) -> None:
    """A QoS 1 message sent with an alias in place of its topic still carries its QoS, packet
    identifier, subscription identifier and the message expiry it has left."""
    sub = h.connect("sub", properties={Prop.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("t/#", 1, sub_id=9)
    pub = h.connect("pub")
    expiry = {Prop.MESSAGE_EXPIRY_INTERVAL: 100}
    pub.publish("t/a", b"1", 1, properties=expiry)
    h.tick(10.0)
    pub.publish("t/a", b"2", 1, properties=expiry)
    got = raw_publishes(sub)
    assert resolve(got, 2) == ["t/a", "t/a"]
    second = got[1]
    assert second.topic == ""  # the alias alone
    assert second.qos == 1 and not second.dup and second.packet_id == got[0].packet_id + 1
    assert second.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [9]
    assert second.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 100


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


def test_retained_messages_carry_the_subscription_identifier(h: Harness) -> None:
    pub = h.connect("pub")
    for name in ("r/1", "r/2"):
        pub.publish(name, b"kept", 1, retain=True)
    sub = h.connect("sub")
    received = sub.subscribe("r/+", 1, sub_id=42)[1:]
    assert sorted(p.topic for p in received) == ["r/1", "r/2"]
    assert all(p.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [42] for p in received)
