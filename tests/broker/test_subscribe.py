"""broker/subscribe.py: SUBSCRIBE and UNSUBSCRIBE (SUBACK/UNSUBACK codes and Reason Strings,
subscription options, quotas, rights including ACL rules that deny part of a filter), and the
retained messages a new subscription gets (Retain Handling, a share per pass, a client that does
not read)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.harness import MQTT_3_1_1, MQTT_5, AllowAll, FakeLink, Harness, LinkClient, Prop, pk

from mqttbroker.broker.session import filter_size
from mqttbroker.broker.subscribe import REPLAY_WRITE, RETAINED_PER_PASS
from mqttbroker.protocol import grammar
from mqttbroker.security import AclAuthorizer, AclRules

# Everyone may read and write everything; the subscribers "sub" and "member" may not read (nor
# write) secret/x.
RULES = "topic readwrite #\nclient sub\ntopic deny secret/x\nclient member\ntopic deny secret/x\n"


def acl(h: Harness, text: str = RULES, mode: str = "filter") -> None:
    h.broker.authorizer = AclAuthorizer(AclRules.parse(text.encode(), "acl.txt"), mode)


@pytest.fixture
def guarded(h: Harness) -> Harness:
    """The test's broker with RULES in filter mode."""
    acl(h)
    return h


def topics(client: object) -> list[str]:
    return [p.topic for p in client.publishes()]  # type: ignore[attr-defined]


def _suback(client: Any, *filters: str) -> pk.Suback:
    requests = [pk.SubscriptionRequest(f, 0, False, False, 0) for f in filters]
    client.send(pk.Subscribe(client.next_id(), requests, {}))
    received = client.receive()
    assert isinstance(received[0], pk.Suback), received
    return received[0]


HIGH = 256 * 1024  # the transport's high-water mark in these tests


SIZE = 100_000  # payload bytes of each retained message


COUNT = 40  # retained messages: 4 MB, far more than HIGH


PASSES = 20  # event-loop passes per step: more than a step needs to settle


class MarkedLink(FakeLink):
    """A transport with a high-water mark, as the broker's: pause_writing from the write that
    takes it past ``high``; the client reads only when a test says so (then resume_writing)."""

    def __init__(self, high: int) -> None:
        super().__init__()
        self.high = high
        self.paused = False
        self.peak = 0  # the most it held unread
        self.client: LinkClient | None = None

    def write(self, data: bytes) -> None:
        super().write(data)
        self.unread += len(data)
        self.peak = max(self.peak, self.unread)
        if not self.paused and self.unread > self.high:
            self.paused = True
            assert self.client is not None
            self.client.conn.pause_writing()

    def read_all(self) -> None:
        self.unread = 0
        if self.paused:
            self.paused = False
            assert self.client is not None
            self.client.conn.resume_writing()


def marked_client(h: Harness, client_id: str, **connect: Any) -> tuple[LinkClient, MarkedLink]:
    link = MarkedLink(HIGH)
    client = LinkClient(h.broker, MQTT_5, link, f"peer-{client_id}")
    link.client = client
    client.send(pk.Connect(client_id=client_id, protocol_level=MQTT_5, **connect))
    h.broker.scheduler.flush()
    (connack,) = client.unread()
    assert isinstance(connack, pk.Connack) and connack.reason_code == 0
    link.read_all()
    return client, link


def passes(h: Harness) -> None:
    for _ in range(PASSES):
        h.broker.scheduler.flush()


def held(client: LinkClient, link: MarkedLink) -> int:
    """Bytes the broker holds for the client: written and unread, and not yet written."""
    return link.unread + sum(len(chunk) for chunk in client.conn.output.chunks or ())


def retained_set(make_harness: Callable[..., Harness], qos: int = 0) -> tuple[Harness, list[str]]:
    h = make_harness()
    pub = h.connect("pub")
    for i in range(COUNT):
        pub.publish(f"r/{i:02d}", bytes([i]) * SIZE, qos, retain=True)
        if qos:
            pub.receive()  # the PUBACK
    # The order of a client that reads all along.
    reader = h.connect("reader")
    received = reader.subscribe("#")[1:]
    for _ in range(PASSES):
        received += reader.receive()
    order = [p.topic for p in received]
    assert sorted(order) == [f"r/{i:02d}" for i in range(COUNT)]
    return h, order


def replaying_to_a_slow_reader(
    make_harness: Callable[..., Harness],
) -> tuple[Harness, list[str], LinkClient, MarkedLink]:
    """The retained set (``retained_set``) and a client that reads slowly subscribed to all of
    it, the passes run: the harness, the topics in order, the client and its link."""
    h, order = retained_set(make_harness)
    client, link = marked_client(h, "slow")
    client.send_subscribe("#", 0)
    passes(h)
    return h, order, client, link


class DenyAll(AllowAll):
    """Refuses every subscription."""

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


def test_suback_codes_in_order(h: Harness) -> None:
    """[MQTT-3.8.4-1] [MQTT-3.8.4-2] [MQTT-3.8.4-5] [MQTT-3.8.4-6] [MQTT-3.8.4-7] [MQTT-3.9.3-1]
    One SUBACK with the SUBSCRIBE's id and one code per filter, in order: the granted QoS or
    0x8F for an invalid filter."""
    client = h.connect("c1")
    requests = [
        pk.SubscriptionRequest("a", 2),
        pk.SubscriptionRequest("a/#/b", 1),
        pk.SubscriptionRequest("b/+", 1),
        pk.SubscriptionRequest("$share//x", 1),
        pk.SubscriptionRequest("c", 0),
    ]
    client.send(pk.Subscribe(321, requests))
    suback = client.one(pk.Suback)
    assert suback.packet_id == 321
    assert suback.reason_codes == [2, 0x8F, 1, 0x8F, 0]
    assert sorted(client.session.subscriptions) == ["a", "b/+", "c"]


def test_suback_v311_failure_code(h: Harness) -> None:
    """A 3.1.1 client gets return code 0x80 for a filter that cannot be subscribed."""
    client = h.connect("c1", version=MQTT_3_1_1)
    assert client.subscribe("a+")[0].reason_codes == [0x80]


def test_subscribe_replaces_existing(h: Harness) -> None:
    """[MQTT-3.8.4-3] Subscribing to the same filter again replaces the subscription: one copy per
    message, with the new QoS."""
    client = h.connect("c1")
    client.subscribe("t", 0)
    client.subscribe("t", 2)
    publisher = h.connect("pub")
    publisher.publish("t", b"m", 2)
    (message,) = client.publishes()
    assert message.qos == 2
    assert len(client.session.subscriptions) == 1


def test_unsubscribe(h: Harness) -> None:
    """[MQTT-3.10.4-1] [MQTT-3.10.4-2] [MQTT-3.10.4-4] [MQTT-3.10.4-5] [MQTT-3.10.4-6]
    [MQTT-3.11.3-1] UNSUBACK with the same id and one code per filter: 0x00 removed, 0x11 none
    existed (filters compared literally); no more messages for the removed filter."""
    client = h.connect("c1")
    client.subscribe("a/+")
    client.subscribe("b")
    packet_id = client._next_id
    (unsuback,) = client.unsubscribe("a/b", "b", "a/+", "b")
    assert isinstance(unsuback, pk.Unsuback)
    assert unsuback.packet_id == packet_id
    assert unsuback.reason_codes == [0x11, 0x00, 0x00, 0x11]
    publisher = h.connect("pub")
    publisher.publish("a/b", b"m")
    publisher.publish("b", b"m")
    assert client.receive() == []


def test_unsubscribe_literal_compare_keeps_wildcard(h: Harness) -> None:
    """[MQTT-3.10.4-1] Unsubscribing 'a/b' does not remove 'a/+'."""
    client = h.connect("c1")
    client.subscribe("a/+")
    (unsuback,) = client.unsubscribe("a/b")
    assert unsuback.reason_codes == [0x11]
    h.connect("pub").publish("a/b", b"still")
    assert [p.payload for p in client.publishes()] == [b"still"]


def test_a_311_unsubscribe_gets_the_4_byte_unsuback(h: Harness) -> None:
    """[MQTT-3.10.4-4] A 3.1.1 client gets the 4-byte UNSUBACK."""
    client = h.connect("c1", version=MQTT_3_1_1)
    client.subscribe("a")
    client.unsubscribe("a")
    assert client.link.writes[-1] == b"\xb0\x02\x00\x02"


def test_unsubscribe_finishes_messages_in_flight(h: Harness) -> None:
    """[MQTT-3.10.4-3] A QoS 1 delivery started before UNSUBSCRIBE is still completed."""
    client = h.connect("c1")
    client.subscribe("t", 1)
    h.connect("pub").publish("t", b"m", 1)
    (message,) = client.publishes()
    client.unsubscribe("t")
    client.puback(message.packet_id)
    assert client.session.inflight == {}
    assert not client.closed


def test_no_local(h: Harness) -> None:
    """[MQTT-3.8.3-3] No Local: a client's own messages do not come back on that subscription;
    other subscribers still get them."""
    me = h.connect("me")
    me.subscribe("t", 1, no_local=True)
    other = h.connect("other")
    other.subscribe("t", 1)
    me.publish("t", b"mine", 1)
    assert [type(p) for p in me.receive()] == [pk.Puback]
    assert [p.payload for p in other.publishes()] == [b"mine"]
    other.publish("t", b"theirs", 0)
    assert [p.payload for p in me.publishes()] == [b"theirs"]


def test_no_local_with_overlapping_subscription(h: Harness) -> None:
    """[MQTT-3.8.3-3] [MQTT-3.3.4-3] With an overlapping subscription without No Local the
    client gets its message once, with only that subscription's identifier."""
    me = h.connect("me")
    me.subscribe("t", 1, no_local=True, sub_id=1)
    me.subscribe("#", 0, sub_id=2)
    me.publish("t", b"mine", 1)
    received = me.receive()
    publishes = [p for p in received if isinstance(p, pk.Publish)]
    assert len(publishes) == 1
    assert publishes[0].qos == 0
    assert publishes[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [2]


def test_no_local_on_shared_subscription_is_protocol_error(h: Harness) -> None:
    """[MQTT-3.8.3-4] No Local on a shared subscription: DISCONNECT 0x82."""
    client = h.connect("c1")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest("$share/g/t", 1, no_local=True)]))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x82)]
    assert client.closed


def test_subscription_options_reserved_bits_malformed(h: Harness) -> None:
    """[MQTT-3.8.3-5] Non-zero reserved bits in Subscription Options: Malformed Packet."""
    client = h.connect("c1")
    data = bytearray(grammar.encode(pk.Subscribe(1, [pk.SubscriptionRequest("t", 1)]), 5))
    data[-1] |= 0x40
    client.send_raw(bytes(data))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x81)]
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_retain_as_published(h: Harness) -> None:
    """[MQTT-3.3.1-12] [MQTT-3.3.1-13] Live messages: RETAIN is kept with Retain As Published,
    cleared without it."""
    keep = h.connect("keep")
    keep.subscribe("t", 1, retain_as_published=True)
    clear = h.connect("clear")
    clear.subscribe("t", 1)
    publisher = h.connect("pub")
    publisher.publish("t", b"r", 1, retain=True)
    publisher.publish("t", b"n", 1, retain=False)
    assert [(p.payload, p.retain) for p in keep.publishes()] == [(b"r", True), (b"n", False)]
    assert [(p.payload, p.retain) for p in clear.publishes()] == [(b"r", False), (b"n", False)]


def test_retained_sent_on_subscribe_with_retain_flag(h: Harness) -> None:
    """[MQTT-3.3.1-5] [MQTT-3.3.1-9] A new subscription gets the matching retained messages after
    the SUBACK, with RETAIN 1 whatever Retain As Published says, at most at the granted QoS."""
    publisher = h.connect("pub")
    publisher.publish("r/a", b"1", 2, retain=True)
    publisher.publish("r/b", b"2", 0, retain=True)
    publisher.publish("r/a", b"3", 1, retain=True)  # replaces "1"
    publisher.publish("other", b"x", 1, retain=True)
    client = h.connect("c1")
    received = client.subscribe("r/+", 1)
    assert isinstance(received[0], pk.Suback)
    got = sorted((p.topic, p.payload, p.retain, p.qos) for p in received[1:])
    assert got == [("r/a", b"3", True, 1), ("r/b", b"2", True, 0)]


def test_retained_not_sent_to_wildcard_for_dollar_topics(h: Harness) -> None:
    """[MQTT-4.7.2-1] '#' does not bring retained '$' topics; '$SYS/#' does."""
    publisher = h.connect("pub")
    publisher.publish("$SYS/x", b"sys", 0, retain=True)
    publisher.publish("plain", b"p", 0, retain=True)
    client = h.connect("c1")
    assert [p.topic for p in client.subscribe("#")[1:]] == ["plain"]
    assert [p.topic for p in client.subscribe("+/x")[1:]] == []
    assert [p.topic for p in client.subscribe("$SYS/#")[1:]] == ["$SYS/x"]


@pytest.mark.parametrize(
    ("retain_handling", "on_new", "on_existing"),
    [(0, True, True), (1, True, False), (2, False, False)],
)
def test_retain_handling(h: Harness, retain_handling: int, on_new: bool, on_existing: bool) -> None:
    """[MQTT-3.3.1-9] [MQTT-3.3.1-10] [MQTT-3.3.1-11] [MQTT-3.8.4-4] Retain Handling 0 sends the
    retained messages at every SUBSCRIBE, 1 only when the subscription is new, 2 never."""
    h.connect("pub").publish("r", b"v", 0, retain=True)
    client = h.connect("c1")
    first = client.subscribe("r", 0, retain_handling=retain_handling)[1:]
    assert [p.payload for p in first] == ([b"v"] if on_new else [])
    second = client.subscribe("r", 0, retain_handling=retain_handling)[1:]
    assert [p.payload for p in second] == ([b"v"] if on_existing else [])


def test_retain_handling_1_new_after_unsubscribe(h: Harness) -> None:
    """[MQTT-3.3.1-10] After UNSUBSCRIBE the same filter is a new subscription again."""
    h.connect("pub").publish("r", b"v", 0, retain=True)
    client = h.connect("c1")
    assert len(client.subscribe("r", retain_handling=1)) == 2
    client.unsubscribe("r")
    assert len(client.subscribe("r", retain_handling=1)) == 2


def test_broad_subscriptions_granted_and_denied_topic_withheld(guarded: Harness) -> None:
    sub = guarded.connect("sub")
    for topic_filter in ("#", "+/+"):
        assert sub.subscribe(topic_filter, 1)[0].reason_codes == [1]
    pub = guarded.connect("pub")
    pub.publish("secret/x", b"hidden")
    pub.publish("secret/y", b"seen")
    pub.publish("other/x", b"seen")
    assert topics(sub) == ["secret/y", "other/x"]


def test_a_filter_denied_whole_is_refused(guarded: Harness) -> None:
    sub = guarded.connect("sub")
    assert sub.subscribe("secret/x")[0].reason_codes == [0x87]


def test_only_overlapping_subscriptions_check_each_message(guarded: Harness) -> None:
    """The per-message check is decided once, at subscribe time."""
    sub = guarded.connect("sub")
    sub.subscribe("#")
    sub.subscribe("public/+")
    subs = sub.session.subscriptions
    assert subs["#"].read_check is not None
    assert subs["public/+"].read_check is None


def test_strict_mode_refuses_the_broad_subscription(h: Harness) -> None:
    acl(h, mode="refuse")
    sub = h.connect("sub")
    assert sub.subscribe("#")[0].reason_codes == [0x87]
    assert sub.subscribe("public/+")[0].reason_codes == [0]


def test_shared_subscription_withholds_the_denied_topic(guarded: Harness) -> None:
    member = guarded.connect("member")
    assert member.subscribe("$share/g/#")[0].reason_codes == [0]
    pub = guarded.connect("pub")
    pub.publish("secret/x")
    pub.publish("open/x")
    assert topics(member) == ["open/x"]


def test_retained_denied_topic_not_sent_on_subscribe(guarded: Harness) -> None:
    pub = guarded.connect("pub")
    pub.publish("secret/x", b"r", retain=True)
    pub.publish("open/x", b"r", retain=True)
    sub = guarded.connect("sub")
    received = sub.subscribe("#")
    assert [p.topic for p in received if isinstance(p, pk.Publish)] == ["open/x"]


def test_will_on_a_denied_topic_not_delivered_through_a_broad_filter(guarded: Harness) -> None:
    watcher = guarded.connect("sub")
    assert watcher.subscribe("#")[0].reason_codes == [0]
    reader = guarded.connect("reader")
    reader.subscribe("secret/#")
    dying = guarded.connect("dying", will=pk.Will("secret/x", b"gone"))
    dying.lose()
    assert topics(watcher) == []
    assert topics(reader) == ["secret/x"]  # others may still read it


def test_rules_reloaded_mark_existing_subscriptions(h: Harness) -> None:
    acl(h, "topic readwrite #\n")
    sub = h.connect("sub")
    sub.subscribe("#")
    assert sub.session.subscriptions["#"].read_check is None
    acl(h)
    h.broker.authorizer.generation += 1  # type: ignore[union-attr]
    assert h.broker.recheck_subscriptions() == 0
    h.connect("pub").publish("secret/x")
    assert topics(sub) == []


def test_refused_filters_named_in_the_reason_string(make_harness: Any) -> None:
    # A SUBSCRIBE with more filters than a client may hold is refused whole: the quota is
    # reached here through four earlier subscriptions.
    h = make_harness(wildcard_subscriptions=False, max_subscriptions_per_client=6)
    rules = "topic readwrite #\ntopic deny secret/x\n"
    h.broker.authorizer = AclAuthorizer(AclRules.parse(rules.encode(), "acl.txt"))
    sub = h.connect("sub")
    assert _suback(sub, "p1", "p2", "p3", "p4").reason_codes == [0, 0, 0, 0]
    suback = _suback(sub, "ok", "secret/x", "a/#/b", "w/+", "ok2", "ok3")
    assert suback.reason_codes == [0, 0x87, 0x8F, 0xA2, 0, 0x97]
    reason = suback.properties[Prop.REASON_STRING]
    for expected in (
        "'secret/x': not authorized",
        "'a/#/b': invalid",
        "'w/+': wildcard",
        "'ok3': subscription quota",
    ):
        assert expected in reason, reason
    assert "'ok'" not in reason and "'ok2'" not in reason


def test_no_reason_string_without_a_refusal(h: Harness) -> None:
    sub = h.connect("sub")
    assert not _suback(sub, "ok").properties


def test_no_reason_string_when_problem_information_is_not_requested(h: Harness) -> None:
    """[MQTT-3.1.2-29]"""
    sub = h.connect("sub", properties={Prop.REQUEST_PROBLEM_INFORMATION: 0})
    suback = _suback(sub, "a/#/b")
    assert suback.reason_codes == [0x8F] and not suback.properties


def test_reason_string_left_out_beyond_the_maximum_packet_size(h: Harness) -> None:
    """[MQTT-3.9.2-1]"""
    sub = h.connect("sub", properties={Prop.MAXIMUM_PACKET_SIZE: 40})
    suback = _suback(sub, "a/#/b")
    assert suback.reason_codes == [0x8F] and not suback.properties
    roomy = h.connect("roomy", properties={Prop.MAXIMUM_PACKET_SIZE: 400})
    assert _suback(roomy, "a/#/b").properties


def test_unsuback_names_the_filters_without_a_subscription(h: Harness) -> None:
    """[MQTT-3.11.2-1]"""
    sub = h.connect("sub")
    sub.subscribe("a")
    (unsuback,) = sub.unsubscribe("a", "b")
    assert unsuback.reason_codes == [0, 0x11]
    assert unsuback.properties[Prop.REASON_STRING] == "'b': no such subscription"
    quiet = h.connect("quiet", properties={Prop.REQUEST_PROBLEM_INFORMATION: 0})
    (unsuback,) = quiet.unsubscribe("b")
    assert unsuback.reason_codes == [0x11] and not unsuback.properties


def test_a_client_that_does_not_read_is_held_the_mark_and_about_a_message(
    make_harness: Callable[..., Harness],
) -> None:
    h, order, client, link = replaying_to_a_slow_reader(make_harness)
    bound = HIGH + REPLAY_WRITE + SIZE + 64  # and a SUBACK, a PUBLISH header
    assert link.paused and client.conn.retained  # it stopped: the rest waits
    assert held(client, link) <= bound, (held(client, link), bound)
    # Unbounded, a pass sent RETAINED_PER_PASS past the mark (1.1 MB here).
    assert bound < RETAINED_PER_PASS
    # It reads a little at a time: every retained message once, in order, and the broker never
    # holds more than the bound meanwhile.
    got: list[pk.Publish] = []
    steps = 0
    while len(got) < COUNT:
        steps += 1
        assert steps <= COUNT, "the replay stalled"
        packets = client.unread()
        got += [p for p in packets if isinstance(p, pk.Publish)]
        link.read_all()
        passes(h)
        assert link.peak <= bound, (link.peak, bound)
    assert [p.topic for p in got] == order
    assert all(p.retain and p.qos == 0 for p in got)
    assert [p.payload for p in got] == [bytes([int(t[2:])]) * SIZE for t in order]
    assert steps > 2  # it did wait for the client: more than the mark in all
    assert client.conn.retained is None


def test_the_replay_after_the_suback_is_a_small_share(
    make_harness: Callable[..., Harness],
) -> None:
    """The share sent with the SUBACK is written at the pass's end (the SUBACK may wait for a
    commit): REPLAY_WRITE and one message, not a whole pass's share past the mark."""
    h, order = retained_set(make_harness)
    client, link = marked_client(h, "slow")
    link.unread = HIGH - 1  # just under the mark: live traffic it has not read yet
    client.send_subscribe("#", 0)
    h.broker.scheduler.flush()
    assert link.unread - (HIGH - 1) <= REPLAY_WRITE + SIZE + 64, link.unread
    passes(h)
    assert link.peak <= HIGH + REPLAY_WRITE + SIZE + 64


def test_qos1_replay_keeps_the_window_and_order(make_harness: Callable[..., Harness]) -> None:
    """QoS 1: the client's Receive Maximum bounds what is in flight, the rest follows its
    PUBACKs, every message once and in order, while the transport pauses and resumes."""
    h, order = retained_set(make_harness, qos=1)
    client, link = marked_client(h, "slow", properties={Prop.RECEIVE_MAXIMUM: 3})
    client.send_subscribe("#", 1)
    got: list[pk.Publish] = []
    steps = 0
    while len(got) < COUNT:
        steps += 1
        assert steps <= 4 * COUNT, "the replay stalled"
        passes(h)
        assert link.peak <= HIGH + REPLAY_WRITE + SIZE + 64
        new = [p for p in client.unread() if isinstance(p, pk.Publish)]
        session = client.conn.session
        assert session is not None and len(session.inflight) <= 3
        got += new
        link.read_all()
        for publish in new:
            assert publish.qos == 1 and publish.retain and not publish.dup
            assert publish.packet_id is not None
            client.send(pk.Puback(publish.packet_id))
    assert [p.topic for p in got] == order
    passes(h)
    assert not client.unread()  # nothing twice


def test_a_client_that_goes_mid_replay_leaves_nothing_behind(
    make_harness: Callable[..., Harness],
) -> None:
    h, _, client, link = replaying_to_a_slow_reader(make_harness)
    assert link.paused and client.conn.retained
    client.conn.connection_lost()
    passes(h)
    assert client.conn not in h.broker.connections
    assert "slow" not in h.broker.sessions  # its backlog goes with it
    written = len(link.data)
    link.read_all()  # resume_writing after the close: nothing more is written
    passes(h)
    assert len(link.data) == written


def test_subscriptions_per_client(make_harness: Any) -> None:
    h = make_harness(max_subscriptions_per_client=2)
    client = h.connect("c")
    assert client.subscribe("a")[0].reason_codes == [0]
    assert client.subscribe("b")[0].reason_codes == [0]
    assert client.subscribe("c")[0].reason_codes == [0x97]
    assert client.subscribe("a", 1)[0].reason_codes == [1]  # replacing one is no new one
    client.unsubscribe("b")
    assert client.subscribe("c")[0].reason_codes == [0]


def test_retained_messages_go_out_a_share_per_pass(make_harness: Any) -> None:
    """More retained messages than one pass sends: the rest follows in later passes, and the
    client's later input waits for them (its PINGRESP comes after the last one)."""
    h: Harness = make_harness()
    publisher = h.connect("pub")
    for index in range(5):
        publisher.publish(f"r/{index}", bytes([index]) * 400_000, retain=True)
    client = h.connect("c")
    client.send(
        pk.Subscribe(1, [pk.SubscriptionRequest("r/#", 0)]),
        pk.Pingreq(),
    )
    got = client.receive()
    assert 1 < len(got) < 6  # SUBACK and a share, not the whole retained set at once
    for _ in range(10):
        got += client.receive()
    assert isinstance(got[0], pk.Suback)
    assert sorted(p.payload for p in got[1:6]) == [bytes([i]) * 400_000 for i in range(5)]
    assert got[6:] == [pk.Pingresp()]


def test_a_subscribe_past_the_subscription_limit_is_refused_whole(make_harness: Any) -> None:
    h: Harness = make_harness(max_subscriptions_per_client=3)
    client = h.connect("c")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest(f"t/{i}") for i in range(4)]))
    assert client.one(pk.Disconnect).reason_code == 0x97
    assert client.closed


@pytest.mark.parametrize(("version", "refused"), [(5, 0x97), (MQTT_3_1_1, 0x80)])
def test_subscription_count_quota(
    make_harness: Any, caplog: pytest.LogCaptureFixture, version: int, refused: int
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    h: Harness = make_harness(max_subscriptions_per_client=2)
    client = h.connect("c", version=version)
    client.subscribe("a")
    client.send(pk.Subscribe(7, [pk.SubscriptionRequest(f) for f in ("a", "b")]))
    assert client.one(pk.Suback).reason_codes == [0, 0]  # "a" replaced, "b" the second
    client.send(pk.Subscribe(8, [pk.SubscriptionRequest(f) for f in ("c", "b")]))
    assert client.one(pk.Suback).reason_codes == [refused, 0]
    assert "client c: max_subscriptions_per_client (2) reached: 1 filter(s) refused" in [
        r.getMessage() for r in caplog.records
    ]


def test_subscription_bytes_quota_counts_every_filter(
    make_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """max_subscription_bytes bounds the sum over the client's filters, not each one."""
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    limit = filter_size("x" * 40) * 2 + filter_size("y") - 1
    h: Harness = make_harness(max_subscription_bytes=limit)
    client = h.connect("c")
    assert client.subscribe("x" * 40)[0].reason_codes == [0]
    assert client.subscribe("z" * 40)[0].reason_codes == [0]
    assert client.subscribe("x" * 40, 1)[0].reason_codes == [1]  # replaced: no growth
    assert client.subscribe("y")[0].reason_codes == [0x97]
    assert f"client c: max_subscription_bytes ({limit}) reached" in [
        r.getMessage() for r in caplog.records
    ]
    client.unsubscribe("z" * 40)
    assert client.subscribe("y")[0].reason_codes == [0]


def test_denied_subscription_logged_once_per_packet(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")

    class Rules(AllowAll):
        def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
            return not topic_filter.startswith("secret")

    h.broker.authorizer = Rules()
    client = h.connect("c")
    client.send(
        pk.Subscribe(3, [pk.SubscriptionRequest(f) for f in ("secret/1", "ok", "secret/2")])
    )
    assert client.one(pk.Suback).reason_codes == [0x87, 0, 0x87]
    lines = [r.getMessage() for r in caplog.records if "not authorized" in r.getMessage()]
    assert lines == [
        "client c from peer-c (user None): not authorized to subscribe to 'secret/1' "
        "(1 refused so far)"
    ]


@pytest.mark.parametrize("strategy", ["bogus", ""])
def test_unknown_strategy_is_refused(strategy: str) -> None:
    from mqttbroker.broker.options import BrokerOptions

    with pytest.raises(ValueError, match="shared_subscription_strategy"):
        BrokerOptions(shared_subscription_strategy=strategy).check()


def test_subscribe_above_maximum_qos_is_granted_lower(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-10] With Maximum QoS 1 the server still accepts a QoS 2 SUBSCRIBE (granting 1)."""
    h = make_harness(maximum_qos=1)
    client = h.connect("c1")
    assert client.subscribe("t", 2)[0].reason_codes == [1]


def test_a_subscription_keeps_no_retained_backlog_once_sent(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    pub = h.connect("pub")
    pub.publish("kept/a", b"r1", retain=True)
    pub.publish("kept/b", b"r2", retain=True)
    sub = h.connect("sub")
    assert sub.subscribe("nothing/here")[1:] == []
    assert sub.conn.retained is None
    received = sub.subscribe("kept/a")[1:]
    assert [(p.topic, p.payload, p.retain) for p in received] == [("kept/a", b"r1", True)]
    received = sub.subscribe("kept/+")[1:]
    assert sorted(p.payload for p in received) == [b"r1", b"r2"]
    assert sub.conn.retained is None


def test_retained_messages_carry_the_subscription_identifier(h: Harness) -> None:
    pub = h.connect("pub")
    for name in ("r/1", "r/2"):
        pub.publish(name, b"kept", 1, retain=True)
    sub = h.connect("sub")
    received = sub.subscribe("r/+", 1, sub_id=42)[1:]
    assert sorted(p.topic for p in received) == ["r/1", "r/2"]
    assert all(p.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [42] for p in received)


def test_too_many_filters_says_how_many(make_harness: Any) -> None:
    client = make_harness(max_subscriptions_per_client=2).connect("c")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest(f) for f in ("a", "b", "c")]))
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x97,
        "SUBSCRIBE with more than 2 topic filters",
    )


def test_v311_refused_subscription_is_0x80(h: Harness) -> None:
    h.broker.authorizer = DenyAll()
    client = h.connect("c", version=MQTT_3_1_1)
    assert client.subscribe("t")[0].reason_codes == [0x80]
