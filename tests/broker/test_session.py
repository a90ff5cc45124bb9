"""broker/session.py: one client's state: the in-flight window and the client's Receive Maximum,
packet identifiers, the offline queue and its limits, resending in order on a resumed session,
expiry of messages held back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.harness import PERSISTENT, Client, Harness, Prop, pair, pk, queued_while_away, window

from mqttbroker.broker.connect import SHARED_LIMITS
from mqttbroker.broker.session import DROP_LOG_INTERVAL

EXPIRY = {Prop.SESSION_EXPIRY_INTERVAL: 300}  # a session that outlives its connection


def come_back(h: Harness, receive_maximum: int):  # type: ignore[no-untyped-def]
    """The subscriber of ``pair`` back on its session, with a new Receive Maximum."""
    properties = {**EXPIRY, Prop.RECEIVE_MAXIMUM: receive_maximum}
    return h.connect("sub", clean_start=False, properties=properties, expect_present=True)


def resume(h: Harness, props: dict[int, int] | None = None) -> Client:
    client = h.client(peer="s")
    properties: dict[int, Any] = {Prop.SESSION_EXPIRY_INTERVAL: 100, **(props or {})}
    client.send(pk.Connect(client_id="s", clean_start=False, properties=properties))
    return client


def three_in_flight(h: Harness, first: bytes = b"m1") -> Client:
    sub = resume(h)
    sub.receive()
    sub.subscribe("t", 1)
    pub = h.connect("p")
    for payload in (first, b"m2", b"m3"):
        pub.publish("t", payload, 1)
    sub.receive()
    sub.lose()
    return pub


def summary(packets: list[Any]) -> list[tuple[str, Any, Any]]:
    return [
        (type(p).__name__, getattr(p, "packet_id", None), getattr(p, "dup", None)) for p in packets
    ]


def expiry(seconds: int) -> dict[int, int]:
    return {Prop.SESSION_EXPIRY_INTERVAL: seconds}


def test_packet_ids_nonzero_and_unique_in_flight(h: Harness) -> None:
    """[MQTT-2.2.1-4] [MQTT-4.3.2-1] [MQTT-4.3.3-1] Outgoing ids are non-zero and never reuse an
    id still in flight, also across the wrap from 65535 to 1."""
    subscriber, publisher = pair(h, sub_qos=1)
    for index in range(40):
        publisher.publish("t", str(index).encode(), 1 + index % 2)
    received = subscriber.publishes()
    ids = [p.packet_id for p in received]
    assert len(ids) == 40 and all(ids) and len(set(ids)) == 40
    for p in received[::2]:  # acknowledge half of them
        subscriber.puback(p.packet_id)
    subscriber.session.next_packet_id = 65534  # jump to the wrap (ids 2, 4, ... still in flight)
    for index in range(10):
        publisher.publish("t", b"w%d" % index, 1)
    later = [p.packet_id for p in subscriber.publishes()]
    in_flight = [p.packet_id for p in received[1::2]]
    assert later[:2] == [65534, 65535]
    assert all(later) and len(set(later)) == 10
    assert not set(later) & set(in_flight)
    assert set(subscriber.session.inflight) == set(in_flight) | set(later)


def test_receive_maximum_respected(h: Harness) -> None:
    """[MQTT-3.3.4-9] [MQTT-4.9.0-1] [MQTT-4.9.0-2] [MQTT-3.3.4-10] [MQTT-4.9.0-3] At most Receive
    Maximum unacknowledged QoS 1/2 PUBLISHes; the others wait and flow, in order, as PUBACKs
    come in; other packets are not held back meanwhile."""
    subscriber, publisher = pair(h, sub_qos=1, properties={Prop.RECEIVE_MAXIMUM: 2})
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    first = subscriber.publishes()
    assert [p.payload for p in first] == [b"0", b"1"]
    subscriber.pingreq()
    assert [type(p) for p in subscriber.receive()] == [pk.Pingresp]
    assert subscriber.subscribe("other", 1)[1:] == []
    subscriber.puback(first[0].packet_id)
    (third,) = subscriber.publishes()
    assert third.payload == b"2"
    subscriber.puback(first[1].packet_id)
    subscriber.puback(third.packet_id)
    rest = subscriber.publishes()
    assert [p.payload for p in rest] == [b"3", b"4"]
    subscriber.puback(rest[0].packet_id)
    assert [p.payload for p in subscriber.publishes()] == [b"5"]


def test_clients_that_ask_the_same_share_what_they_asked(h: Harness) -> None:
    """What a CONNECT asked of what its client is sent (Receive Maximum, Maximum Packet Size,
    Topic Alias Maximum, Request Problem Information) is one object, shared by the clients that
    asked the same; each client is still held to its own. The broker keeps at most
    SHARED_LIMITS distinct ones: past them, a client's are its own."""
    plain = [h.connect(f"plain-{i}") for i in range(3)]
    assert plain[0].conn.limits is plain[1].conn.limits is plain[2].conn.limits
    asked = {Prop.RECEIVE_MAXIMUM: 2, Prop.MAXIMUM_PACKET_SIZE: 4096}
    small = [h.connect(f"small-{i}", properties=dict(asked)) for i in range(2)]
    assert small[0].conn.limits is small[1].conn.limits is not plain[0].conn.limits
    limits = small[0].conn.limits
    assert (limits.send_quota, limits.max_send_size) == (2, 4096)
    defaults = plain[0].conn.limits
    assert (defaults.send_quota, defaults.max_send_size, defaults.alias_maximum) == (
        min(65535, h.broker.options.max_inflight),
        268_435_460,
        0,
    )
    for i in range(SHARED_LIMITS + 10):
        h.connect(f"many-{i}", properties={Prop.RECEIVE_MAXIMUM: 100 + i})
    assert len(h.broker.client_limits) == SHARED_LIMITS
    late = [h.connect(f"late-{i}", properties={Prop.RECEIVE_MAXIMUM: 7}) for i in range(2)]
    assert late[0].conn.limits is not late[1].conn.limits
    assert late[0].conn.limits.send_quota == late[1].conn.limits.send_quota == 7


def test_receive_maximum_qos2_slot_freed_by_pubcomp(h: Harness) -> None:
    """[MQTT-3.3.4-9] A QoS 2 message holds its slot until PUBCOMP, not PUBREC."""
    subscriber, publisher = pair(h, sub_qos=2, properties={Prop.RECEIVE_MAXIMUM: 1})
    publisher.publish("t", b"a", 2)
    publisher.publish("t", b"b", 2)
    (first,) = subscriber.publishes()
    subscriber.pubrec(first.packet_id)
    assert [type(p) for p in subscriber.receive()] == [pk.Pubrel]
    subscriber.pubcomp(first.packet_id)
    (second,) = subscriber.publishes()
    assert second.payload == b"b"


def test_qos0_not_held_by_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] Receive Maximum limits QoS 1/2 only: QoS 0 flows while the quota is used."""
    subscriber, publisher = pair(h, sub_qos=1, properties={Prop.RECEIVE_MAXIMUM: 1})
    publisher.publish("t", b"q1-a", 1)
    publisher.publish("t", b"q1-b", 1)
    publisher.publish("t", b"q0", 0)
    assert [p.payload for p in subscriber.publishes()] == [b"q1-a", b"q0"]


def test_resend_with_dup_after_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1] [MQTT-4.6.0-1] [MQTT-3.1.2-23] Unacknowledged PUBLISHes are
    sent again with DUP 1, the same ids, in order, when the session is resumed; messages queued
    meanwhile follow with DUP 0."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=2, properties=expiry)
    publisher.publish("t", b"a", 1)
    publisher.publish("t", b"b", 2)
    first = subscriber.publishes()
    assert [(p.payload, p.dup) for p in first] == [(b"a", False), (b"b", False)]
    subscriber.lose()
    publisher.publish("t", b"c", 1)
    h.tick(10)
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    resent = again.publishes()
    assert [(p.payload, p.dup, p.packet_id, p.qos) for p in resent] == [
        (b"a", True, first[0].packet_id, 1),
        (b"b", True, first[1].packet_id, 2),
        (b"c", False, resent[2].packet_id, 1),
    ]
    assert resent[2].packet_id not in (first[0].packet_id, first[1].packet_id)


def test_pubrel_resent_not_publish_after_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-4.3.3-6] A QoS 2 message whose PUBREC arrived is continued with
    PUBREL after a reconnect; the PUBLISH is never sent again."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=2, properties=expiry)
    publisher.publish("t", b"x", 2)
    (message,) = subscriber.publishes()
    subscriber.pubrec(message.packet_id)
    assert [type(p) for p in subscriber.receive()] == [pk.Pubrel]
    subscriber.lose()
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    received = again.receive()
    assert [(type(p), p.packet_id) for p in received] == [(pk.Pubrel, message.packet_id)]
    again.pubcomp(message.packet_id)
    assert again.receive() == []
    assert again.session.inflight == {}


def test_no_resend_on_clean_start(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-3.1.2-4] Reconnecting with Clean Start 1 resends nothing."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    publisher.publish("t", b"a", 1)
    assert len(subscriber.publishes()) == 1
    subscriber.lose()
    again = h.connect("sub", clean_start=True, expect_present=False)
    assert again.receive() == []


def test_resend_after_reconnect_respects_new_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] [MQTT-4.4.0-1] [MQTT-4.9.0-2] Receive Maximum is set afresh by each CONNECT
    (section 4.9): resuming a session with more unacknowledged messages than the new Receive
    Maximum resends only that many; the others follow, with DUP 1 and their original ids, as
    PUBACKs free the window."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    for index in range(5):
        publisher.publish("t", b"%d" % index, 1)
    first = subscriber.publishes()
    ids = [p.packet_id for p in first]
    assert len(ids) == 5
    subscriber.lose()
    again = come_back(h, receive_maximum=2)
    resent = again.publishes()
    assert [(p.packet_id, p.dup) for p in resent] == [(ids[0], True), (ids[1], True)]
    seen = [p.payload for p in resent]
    for _ in range(10):
        if not resent:
            break
        again.puback(resent[0].packet_id)
        more = again.publishes()
        assert len(more) <= 1
        if more:
            assert more[0].dup is True
            assert more[0].packet_id == ids[len(seen)]
        seen += [p.payload for p in more]
        resent = resent[1:] + more
    assert seen == [b"0", b"1", b"2", b"3", b"4"]


def test_queue_sent_on_resume_respects_receive_maximum(h: Harness) -> None:
    """[MQTT-3.3.4-9] Messages queued while the client was away, for a session that had nothing
    in flight, go out on its return at most Receive Maximum at a time, then one per PUBACK."""
    subscriber, publisher = pair(h, sub_qos=1, properties=EXPIRY)
    subscriber.send(pk.Disconnect())
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    back = come_back(h, receive_maximum=2)
    first = back.publishes()
    assert [p.payload for p in first] == [b"0", b"1"]
    assert len(back.session.inflight) == 2
    back.puback(first[0].packet_id)
    assert [p.payload for p in back.publishes()] == [b"2"]


def test_offline_queue_bounded(make_harness: Callable[..., Harness]) -> None:
    """The offline queue holds at most max_queued_messages; later messages are dropped, the
    earliest are kept and delivered in order."""
    h = make_harness(max_queued_messages=3)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=1, properties=expiry)
    subscriber.lose()
    for index in range(6):
        publisher.publish("t", b"%d" % index, 1)
    again = h.connect("sub", clean_start=False, properties=expiry, expect_present=True)
    assert [p.payload for p in again.publishes()] == [b"0", b"1", b"2"]
    assert again.session.dropped == 3


def test_queue_drops_logged_per_session_rate_limited(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """A message dropped from a full offline queue: the publisher's PUBACK says success (the
    drop is the subscriber's queue policy), and the log names the session and the count: at
    the first drop, then at most once per interval, the end of a burst included."""
    h = make_harness(max_queued_messages=1)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    subscriber, publisher = pair(h, sub_qos=1, properties=expiry)
    subscriber.lose()
    caplog.set_level(logging.WARNING, logger="mqttbroker.session")

    def drop_lines() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        caplog.clear()
        return lines

    for index in range(4):
        publisher.publish("t", b"%d" % index, 1)
    assert [(a.packet_id, a.reason_code) for a in publisher.receive()] == [
        (i, 0) for i in range(1, 5)
    ]
    assert drop_lines() == ["session sub: 1 messages dropped (queue full); 1 dropped in all"]
    h.tick(1.0)
    assert drop_lines() == []  # within the interval: the line waits
    h.tick(DROP_LOG_INTERVAL)
    assert drop_lines() == ["session sub: 2 messages dropped (queue full); 3 dropped in all"]
    h.tick(DROP_LOG_INTERVAL)
    assert drop_lines() == []  # nothing new to report
    publisher.publish("t", b"later", 1)  # the interval is over: logged at once
    assert drop_lines() == ["session sub: 1 messages dropped (queue full); 4 dropped in all"]
    assert subscriber.session.dropped == 4


def test_a_message_too_large_now_does_not_let_the_queue_jump_ahead(h: Harness) -> None:
    """[MQTT-4.4.0-1] In-flight messages are resent in their order before queued ones, also
    when one of them is dropped for the client's new Maximum Packet Size."""
    sub = resume(h, {Prop.RECEIVE_MAXIMUM: 2})
    sub.receive()
    sub.subscribe("t", 1)
    pub = h.connect("p")
    for payload in (b"A" * 500, b"m2", b"m3"):
        pub.publish("t", payload, 1)
    sub.receive()  # 1 and 2 in flight, m3 queued
    sub.lose()
    again = resume(h, {Prop.MAXIMUM_PACKET_SIZE: 200})
    got = again.receive()
    assert [getattr(p, "payload", None) for p in got[1:]] == [b"m2", b"m3"]
    assert got[1].dup and got[1].packet_id == 2


def test_each_held_message_is_resent_once(h: Harness) -> None:
    three_in_flight(h, b"A" * 500)
    narrow = resume(h, {Prop.RECEIVE_MAXIMUM: 1})
    assert summary(narrow.receive()) == [("Connack", None, None), ("Publish", 1, True)]
    narrow.lose()
    small = resume(h, {Prop.MAXIMUM_PACKET_SIZE: 200})
    assert summary(small.receive()) == [
        ("Connack", None, None),
        ("Publish", 2, True),
        ("Publish", 3, True),
    ]


def test_acknowledging_a_held_message_does_not_open_the_window(h: Harness) -> None:
    """[MQTT-3.3.4-9] A PUBACK for a message whose resend was still held frees no slot of the
    new connection's window: nothing more is sent while message 1 is unacknowledged."""
    three_in_flight(h)
    narrow = resume(h, {Prop.RECEIVE_MAXIMUM: 1})
    assert summary(narrow.receive()) == [("Connack", None, None), ("Publish", 1, True)]
    narrow.puback(2)  # the client had it from the old connection
    assert narrow.receive() == []
    narrow.puback(1)
    assert summary(narrow.receive()) == [("Publish", 3, True)]


def test_message_held_back_keeps_its_expiry_running(h: Harness) -> None:
    """[MQTT-3.3.2-6] A message waiting behind the receive window (MQTT-3.3.4-9) is sent when a
    PUBACK makes room, with its Message Expiry Interval reduced by the time it waited; one
    whose interval ran out meanwhile is not sent at all."""
    sub = window(h)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"waits", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    pub.publish("t", b"expires", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    (first,) = sub.publishes()
    h.clock.advance(4)
    sub.puback(first.packet_id)
    (waited,) = sub.publishes()
    assert waited.payload == b"waits"
    assert waited.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6
    h.clock.advance(2)
    sub.puback(waited.packet_id)
    assert sub.receive() == []  # "expires" ran out while it waited
    assert not sub.session.queue and not sub.session.inflight


def test_qos2_released_state_survives_reconnect(h: Harness) -> None:
    """[MQTT-4.4.0-1] A persistent session that got the PUBREC of a QoS 2 message resends the
    PUBREL, not the PUBLISH, when the client comes back."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    sub = h.connect("sub", properties=props)
    sub.subscribe("t", 2)
    h.connect("pub").publish("t", b"m", 2)
    (message,) = sub.publishes()
    sub.pubrec(message.packet_id)
    assert sub.one(pk.Pubrel).packet_id == message.packet_id
    sub.lose()
    again = h.connect("sub", clean_start=False, properties=props, expect_present=True)
    assert again.one(pk.Pubrel).packet_id == message.packet_id
    again.pubcomp(message.packet_id)
    assert not again.session.inflight


def test_message_held_back_by_receive_maximum_expires(h: Harness) -> None:
    """A message waiting for room in the client's Receive Maximum expires there: once room
    comes after its Message Expiry Interval, it is not sent (MQTT-3.3.2-5)."""
    sub = h.connect("sub", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", 1)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"short-lived", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("t", b"lasting", 1)
    (first,) = sub.publishes()
    assert first.payload == b"first"
    h.tick(6.0)
    sub.puback(first.packet_id)
    assert [p.payload for p in sub.publishes()] == [b"lasting"]


def test_message_held_back_sent_with_the_remaining_expiry(h: Harness) -> None:
    """Sent before it expires, it carries the time it has left (MQTT-3.3.2-6)."""
    sub = h.connect("sub", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", 1)
    pub = h.connect("pub")
    pub.publish("t", b"first", 1)
    pub.publish("t", b"x", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 10})
    (first,) = sub.publishes()
    h.tick(4.0)
    sub.puback(first.packet_id)
    (held,) = sub.publishes()
    assert held.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6


def test_idle_sessions_share_their_empty_tables(make_harness: Callable[..., Harness]) -> None:
    """Until a session subscribes, queues or holds a QoS 2 id, it has no table of its own for
    them; the first one it fills is its own, and the others stay empty."""
    h = make_harness()
    one, two = h.connect("one").session, h.connect("two").session
    assert one.subscriptions is two.subscriptions
    assert one.queue is two.queue
    assert one.awaiting_release is two.awaiting_release
    assert one.inflight is two.inflight
    h.clients[0].subscribe("mine")
    assert list(one.subscriptions) == ["mine"] and not two.subscriptions
    h.clients[0].unsubscribe("mine")
    assert not one.subscriptions


def test_sessions_queue_and_hold_ids_after_starting_without(
    make_harness: Callable[..., Harness],
) -> None:
    """The queue and the QoS 2 ids a session creates on first use work as before: two idle
    sessions share nothing that one of them fills."""
    h = make_harness()
    sub = h.connect("sub", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 60})
    sub.subscribe("q/t", qos=1)
    other = h.connect("other")
    sub.send(pk.Disconnect())
    pub = h.connect("pub")
    pub.publish("q/t", b"1", qos=1)
    pub.publish("q/t", b"2", qos=2)
    pub.receive()
    assert len(h.broker.sessions["sub"].queue) == 2
    assert len(other.session.queue) == 0 and len(pub.session.queue) == 0
    assert set(pub.session.awaiting_release) == {2}
    assert not other.session.awaiting_release
    pub.send(pk.Pubrel(2))
    assert pub.one(pk.Pubcomp).packet_id == 2
    sub = h.connect("sub", clean_start=False, expect_present=True)
    assert [p.payload for p in sub.publishes()] == [b"1", b"2"]
    assert len(sub.session.inflight) == 2  # its own: the shared empty one stays empty
    assert not other.session.inflight and not pub.session.inflight
    assert not h.connect("later").session.inflight


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


def test_held_resend_keeps_its_expiry_running(h: Harness) -> None:
    """[MQTT-4.4.0-1] [MQTT-3.3.2-6] A resend held back by a smaller Receive Maximum goes out
    when room is made, with the expiry it has left then."""
    props = {**PERSISTENT, Prop.RECEIVE_MAXIMUM: 2}
    sub = h.connect("s", properties=props)
    sub.subscribe("t", 1)
    pub = h.connect("pub")
    pub.publish("t", b"one", 1)
    pub.publish("t", b"two", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 100})
    assert len(sub.publishes()) == 2
    sub.lose()
    narrow = h.connect(
        "s",
        clean_start=False,
        properties={**PERSISTENT, Prop.RECEIVE_MAXIMUM: 1},
        expect_present=True,
    )
    (first,) = narrow.publishes()
    assert (first.payload, first.dup) == (b"one", True)
    h.clock.advance(30)
    narrow.puback(first.packet_id)
    (second,) = narrow.publishes()
    assert (second.payload, second.dup) == (b"two", True)
    assert second.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 70


def test_persistent_queue_expires_while_offline(h: Harness) -> None:
    """[MQTT-3.3.2-5] A message queued for an offline persistent session whose expiry passes
    is not delivered when the client returns; the one after it is."""
    queued_while_away(h)
    h.tick(6)
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"fresh"]


@pytest.mark.parametrize("clean_start", [False, True])
def test_offline_qos0_not_queued_by_default(h: Harness, clean_start: bool) -> None:
    """QoS 0 messages for an offline session are dropped by default (queue_qos0 off); QoS 1 ones
    are queued."""
    client = h.connect("s", clean_start=clean_start, properties=expiry(100))
    client.subscribe("t", 2)
    client.lose()
    publisher = h.connect("pub")
    publisher.publish("t", b"q0", 0)
    publisher.publish("t", b"q1", 1)
    client = h.connect("s", clean_start=False, properties=expiry(100), expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"q1"]


def test_a_queue_emptied_on_resuming_is_given_up_and_made_again(
    make_harness: Callable[..., Harness],
) -> None:
    """A session back for the messages queued while it was away, all of which its Receive
    Maximum lets out at once, keeps no empty queue (shared again, as an idle session's); one
    that gets only some keeps its own with the rest; and messages queued later make one again.
    The resumed connection holds the session's own client id, not the CONNECT's copy."""
    h = make_harness()
    idle = h.connect("idle").session
    sub = h.connect("sub", clean_start=False, properties=EXPIRY)
    sub.subscribe("t", qos=1)
    sub.send(pk.Disconnect())
    pub = h.connect("pub")
    for payload in (b"1", b"2", b"3"):
        pub.publish("t", payload, qos=1)
    session = h.broker.sessions["sub"]
    assert len(session.queue) == 3 and session.queue is not idle.queue
    back = come_back(h, receive_maximum=10)
    assert [p.payload for p in back.publishes()] == [b"1", b"2", b"3"]
    assert session.queue is idle.queue and len(session.inflight) == 3
    assert back.conn.client_id is session.client_id
    back.send(pk.Disconnect())
    for payload in (b"4", b"5", b"6"):
        pub.publish("t", payload, qos=1)
    assert len(session.queue) == 3 and session.queue is not idle.queue and not idle.queue
    again = come_back(h, receive_maximum=2)  # 3 in flight still (resent first), the queue kept
    assert [p.payload for p in again.publishes()] == [b"1", b"2"]
    assert len(session.queue) == 3 and session.queue is not idle.queue
