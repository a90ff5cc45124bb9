"""broker/core.py: the Broker: connections and their limits, the session registry (Clean Start,
session present, takeover, owners and per-user caps), wills and their delay, session expiry, shared
messages handed over when a session ends, rules rechecked, tick() and the early write of a read,
the log of connections."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import (
    PERSISTENT,
    AllowAll,
    Client,
    DenySecret,
    FakeClock,
    FakeLink,
    Harness,
    Prop,
    WakeCounter,
    pk,
)

from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.policy import ListenerPolicy
from mqttbroker.broker.session import NEVER
from mqttbroker.broker.sink import Outbox
from mqttbroker.protocol import grammar

MQTT_3_1_1 = 4


def member(
    h: Harness, client_id: str, qos: int = 1, group: str = "$share/g/job", **connect: Any
) -> Client:
    """A client (``connect``: the keywords of ``Harness.connect``) subscribed at ``qos`` to the
    shared subscription ``group``."""
    client = h.connect(client_id, **connect)
    client.subscribe(group, qos)
    return client


def watcher(h: Harness, topic_filter: str = "will/#") -> Client:
    client = h.connect("watcher")
    client.subscribe(topic_filter, 2)
    return client


def will(delay: int | None = None, **kwargs: object) -> pk.Will:
    props = {} if delay is None else {Prop.WILL_DELAY_INTERVAL: delay}
    props.update(kwargs.pop("properties", {}))  # type: ignore[call-overload]
    return pk.Will("will/c", b"gone", properties=props, **kwargs)  # type: ignore[arg-type]


def expiry(seconds: int) -> dict[int, int]:
    return {Prop.SESSION_EXPIRY_INTERVAL: seconds}


def _connect_as(h: Harness, client_id: str, user: str | None, expiry: int, clean: bool) -> Any:
    """CONNECT as ``user``; the CONNACK."""
    client = h.client(peer=f"peer-{client_id}")
    client.send(
        pk.Connect(
            client_id=client_id,
            clean_start=clean,
            username=user,
            properties={Prop.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {},
        )
    )
    (connack,) = client.receive(limit=1)
    assert isinstance(connack, pk.Connack)
    return client, connack


class DenyAll(AllowAll):
    """Refuses every subscription."""

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


class ReadableFilters(AllowAll):
    """An authorizer that lets a client subscribe to the filters in ``readable`` only."""

    def __init__(self) -> None:
        self.generation = 0
        self.readable = {"a/#", "b/#"}

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return topic_filter in self.readable


def read(h: Harness, client: Client, payload: bytes) -> None:
    """One transport read from ``client``: a QoS 0 PUBLISH to "t"."""
    h.broker.scheduler.handle_read(
        client.conn, grammar.encode(pk.Publish(topic="t", payload=payload), 5)
    )


def connect_as(h: Harness, client_id: str, username: str | None) -> pk.Connack:
    client = h.client()
    client.send(pk.Connect(client_id=client_id, username=username, properties=PERSISTENT))
    connack: pk.Connack = client.receive()[0]
    client.lose()
    return connack


def _connect(h: Harness, client_id: str, certificate: str | None, claimed: str | None) -> Any:
    client = h.client(peer=f"peer-{certificate}", certificate_user=certificate)
    client.send(
        pk.Connect(
            client_id=client_id,
            clean_start=False,
            username=claimed,
            properties={Prop.SESSION_EXPIRY_INTERVAL: 60},
        )
    )
    (connack,) = client.receive(limit=1)
    assert isinstance(connack, pk.Connack)
    return client, connack


def test_will_published_on_connection_lost(h: Harness) -> None:
    """[MQTT-3.1.2-8] [MQTT-3.1.2-7] [MQTT-3.1.2-14] The network failing publishes the will, not
    retained (Will Retain 0), at the will QoS."""
    w = watcher(h)
    client = h.connect("c", will=will(qos=1))
    assert w.receive() == []
    client.lose()
    (message,) = w.publishes()
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "will/c",
        b"gone",
        1,
        False,
    )
    assert len(h.broker.router.retained) == 0


def test_will_published_once(h: Harness) -> None:
    """[MQTT-3.1.2-10] Once published the will is deleted: nothing more on later ticks."""
    w = watcher(h)
    h.connect("c", will=will()).lose()
    assert len(w.publishes()) == 1
    h.tick(1000)
    assert w.receive() == []


def test_will_not_published_on_normal_disconnect(h: Harness) -> None:
    """[MQTT-3.14.4-3] [MQTT-3.1.2-10] DISCONNECT 0x00 deletes the will unpublished."""
    w = watcher(h)
    client = h.connect("c", will=will(), properties=expiry(100))
    client.disconnect(0x00)
    h.tick(1000)
    assert w.receive() == []


def test_will_published_on_disconnect_with_will(h: Harness) -> None:
    """[MQTT-3.1.2-8] DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    w = watcher(h)
    client = h.connect("c", will=will())
    client.disconnect(0x04)
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_will_published_on_protocol_error(h: Harness) -> None:
    """[MQTT-3.1.2-8] A connection the server closes for a protocol error publishes the will."""
    w = watcher(h)
    client = h.connect("c", will=will())
    client.publish("bad/#", b"x")
    assert client.closed
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_will_published_on_keep_alive_timeout(h: Harness) -> None:
    """[MQTT-3.1.2-22] [MQTT-3.1.2-8] Closing on keep alive is as if the network failed: the will
    is published."""
    w = watcher(h)
    h.connect("c", keep_alive=2, will=will())
    h.tick(3.5)
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_a_311_will_goes_on_connection_loss_not_after_disconnect(h: Harness) -> None:
    """[MQTT-3.1.2-8] A 3.1.1 will: published on connection loss, not after DISCONNECT."""
    w = watcher(h)
    h.connect("c1", version=MQTT_3_1_1, will=pk.Will("will/1", b"x")).lose()
    assert [p.topic for p in w.publishes()] == ["will/1"]
    client = h.connect("c2", version=MQTT_3_1_1, will=pk.Will("will/2", b"x"))
    client.send_raw(b"\xe0\x00")
    assert client.closed
    assert w.receive() == []


def test_will_retained(h: Harness) -> None:
    """[MQTT-3.1.2-15] Will Retain 1: the will is published as a retained message."""
    w = watcher(h)
    h.connect("c", will=will(retain=True)).lose()
    assert [p.payload for p in w.publishes()] == [b"gone"]
    late = h.connect("late")
    (message,) = late.subscribe("will/c")[1:]
    assert (message.payload, message.retain) == (b"gone", True)


def test_will_properties_forwarded(h: Harness) -> None:
    """[MQTT-3.1.3-10] [MQTT-3.3.2-17] [MQTT-3.3.2-18] The will's User Properties arrive unchanged
    and in order, with its Content Type; the Will Delay Interval is not forwarded."""
    w = watcher(h)
    users = [("b", "1"), ("a", "2"), ("b", "0")]
    props = {Prop.USER_PROPERTY: users, Prop.CONTENT_TYPE: "text/x"}
    h.connect("c", will=will(delay=0, properties=props)).lose()
    (message,) = w.publishes()
    assert message.properties[Prop.USER_PROPERTY] == users
    assert message.properties[Prop.CONTENT_TYPE] == "text/x"
    assert Prop.WILL_DELAY_INTERVAL not in message.properties


def test_will_delay_honoured(h: Harness) -> None:
    """[MQTT-3.1.2-8] With a Will Delay Interval the will waits out the delay after the
    connection is lost, then is published on the next tick."""
    w = watcher(h)
    h.connect("c", will=will(delay=5), properties=expiry(100)).lose()
    assert w.receive() == []
    h.tick(4.9)
    assert w.receive() == []
    h.tick(0.1)
    assert [p.payload for p in w.publishes()] == [b"gone"]
    h.tick(100)
    assert w.receive() == []


def test_will_delay_cancelled_by_reconnect(h: Harness) -> None:
    """[MQTT-3.1.3-9] [MQTT-3.1.2-8] Reconnecting to the session before the delay runs out
    cancels the will."""
    w = watcher(h)
    h.connect("c", will=will(delay=10), properties=expiry(100)).lose()
    h.tick(5)
    client = h.connect("c", clean_start=False, properties=expiry(100), expect_present=True)
    h.tick(10)
    h.tick(200)
    assert w.receive() == []
    assert not client.closed


def test_will_delay_ends_with_session(h: Harness) -> None:
    """[MQTT-3.1.2-8] [MQTT-4.1.0-2] A session that expires before the will delay does publishes
    the will when it ends."""
    w = watcher(h)
    h.connect("c", will=will(delay=60), properties=expiry(3)).lose()
    h.tick(2.9)
    assert w.receive() == []
    h.tick(0.1)
    assert [p.payload for p in w.publishes()] == [b"gone"]
    assert "c" not in h.broker.sessions


def test_will_delay_with_no_session_expiry(h: Harness) -> None:
    """[MQTT-3.1.2-8] Session Expiry 0: the session ends with the connection, so a delayed will
    is published at once."""
    w = watcher(h)
    h.connect("c", will=will(delay=60)).lose()
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_new_will_replaces_old_after_reconnect(h: Harness) -> None:
    """[MQTT-3.1.3-9] The will of the new connection is the one that counts; the old delayed one
    stays cancelled."""
    w = watcher(h)
    h.connect("c", will=will(delay=10), properties=expiry(100)).lose()
    h.tick(1)
    second = h.connect(
        "c",
        clean_start=False,
        properties=expiry(100),
        will=pk.Will("will/second", b"2"),
        expect_present=True,
    )
    second.lose()
    h.tick(50)
    assert [p.topic for p in w.publishes()] == ["will/second"]


def test_session_expiry_after_disconnect(h: Harness) -> None:
    """[MQTT-3.1.2-23] [MQTT-4.1.0-2] A session is kept for its Session Expiry Interval after the
    connection closes (queuing its messages), and deleted, on the tick, once it has run out."""
    client = h.connect("s", properties=expiry(10))
    client.subscribe("t", 1)
    client.lose()
    publisher = h.connect("pub")
    h.tick(9.9)
    assert "s" in h.broker.sessions
    publisher.publish("t", b"kept", 1)
    assert publisher.one(pk.Puback).reason_code == 0  # matched the offline session
    client = h.connect("s", clean_start=False, properties=expiry(10), expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"kept"]
    client.lose()
    h.tick(10)
    assert "s" not in h.broker.sessions
    publisher.publish("t", b"lost", 1)
    assert publisher.one(pk.Puback).reason_code == 0x10  # no matching subscribers any more
    client = h.connect("s", clean_start=False, properties=expiry(10), expect_present=False)
    assert client.receive() == []
    assert client.session.subscriptions == {}


def test_session_expiry_zero_ends_with_connection(h: Harness) -> None:
    """[MQTT-4.1.0-2] Session Expiry 0 (the default): the session ends when the connection does."""
    client = h.connect("s", clean_start=False)
    client.subscribe("t", 1)
    client.lose()
    assert "s" not in h.broker.sessions
    h.connect("s", clean_start=False, expect_present=False)


def test_session_never_expires(h: Harness) -> None:
    """[MQTT-3.1.2-23] Session Expiry 0xFFFFFFFF: the session does not expire."""
    client = h.connect("s", properties=expiry(0xFFFFFFFF))
    client.subscribe("t", 1)
    client.lose()
    h.tick(10**9)
    h.connect("s", clean_start=False, expect_present=True)


def test_session_kept_while_connected(h: Harness) -> None:
    """[MQTT-4.1.0-1] Session state is not dropped while the connection is open, however long."""
    client = h.connect("s", properties=expiry(1))
    client.subscribe("t", 1)
    h.tick(1000)
    assert h.broker.sessions["s"].connection is client.conn
    h.connect("pub").publish("t", b"m", 1)
    assert [p.payload for p in client.publishes()] == [b"m"]


def test_disconnect_can_change_session_expiry(h: Harness) -> None:
    """[MQTT-3.1.2-23] A DISCONNECT may change a non-zero Session Expiry Interval: 0 ends the
    session at once, a longer one keeps it longer."""
    client = h.connect("a", properties=expiry(10))
    client.disconnect(0, expiry(0))
    assert "a" not in h.broker.sessions
    client = h.connect("b", properties=expiry(10))
    client.disconnect(0, expiry(100))
    h.tick(50)
    h.connect("b", clean_start=False, expect_present=True)


def test_session_expiry_capped_by_server(make_harness) -> None:  # type: ignore[no-untyped-def]
    """[MQTT-3.1.2-23] A server maximum below the request is announced in CONNACK and used."""
    h = make_harness(max_session_expiry=60)
    client = h.connect("s", properties=expiry(3600))
    assert client.connack.properties[Prop.SESSION_EXPIRY_INTERVAL] == 60
    client.lose()
    h.tick(60)
    assert "s" not in h.broker.sessions


def test_persistent_session_will_without_delay_is_published_at_once(h: Harness) -> None:
    """[MQTT-3.1.2-8] No Will Delay Interval: published when the connection closes, not on a
    later tick, also for a session that outlives the connection."""
    w = watcher(h)
    h.connect("c", will=pk.Will("will/c", b"gone"), properties=PERSISTENT).lose()
    assert [p.payload for p in w.publishes()] == [b"gone"]
    assert h.broker.sessions["c"].will is None


def test_no_will_for_a_refused_connect(make_harness: Any) -> None:
    """[MQTT-3.2.2-7] A CONNECT refused (here its client id against client_id_pattern) does not
    publish its will."""
    h: Harness = make_harness(client_id_pattern="dev-*")
    listener = h.client()
    listener.send(pk.Connect(client_id="dev-w", username="u"))
    assert listener.one(pk.Connack).reason_code == 0
    listener.subscribe("will/#", 1)
    client = h.client()
    client.send(pk.Connect(client_id="bad", username="u", will=pk.Will("will/bad", b"no")))
    assert client.one(pk.Connack).reason_code == 0x85
    assert listener.receive() == []


def test_normal_disconnect_discards_the_will_cleanly(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """[MQTT-3.14.4-3] DISCONNECT 0x00: no will, and nothing goes wrong on the way."""
    caplog.set_level(logging.WARNING)
    w = watcher(h)
    h.connect("c", will=pk.Will("will/c", b"gone")).disconnect(0x00)
    assert w.receive() == []
    assert [r.getMessage() for r in caplog.records] == []


def test_will_checked_by_the_authorizer(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """A will goes through the authorizer as its client's PUBLISH would, user included."""
    caplog.set_level(logging.INFO, logger="mqttbroker.broker")
    asked: list[tuple[str, str | None, str]] = []

    class Rules(AllowAll):
        def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
            asked.append((client_id, username, topic))
            return topic != "will/denied"

    h.broker.authorizer = Rules()
    w = watcher(h)
    for client_id, topic in (("a", "will/denied"), ("b", "will/ok")):
        client = h.client()
        client.send(pk.Connect(client_id=client_id, username="u", will=pk.Will(topic, b"x")))
        client.receive()
        client.lose()
    assert [p.topic for p in w.publishes()] == ["will/ok"]
    assert ("a", "u", "will/denied") in asked
    messages = [r.getMessage() for r in caplog.records]
    assert "will of a not published: not authorized for 'will/denied'" in messages
    assert "publishing the will of b on 'will/ok'" in messages


def test_session_cap_per_user(make_harness: Any) -> None:
    """max_sessions_per_user: a user at the cap may still replace (clean start) or resume a
    session of their own; a new one is refused (0x97) saying why."""
    h: Harness = make_harness(max_sessions_per_user=1)

    def connect(client_id: str, clean: bool) -> pk.Connack:
        client = h.client()
        packet = pk.Connect(
            client_id=client_id, username="alice", clean_start=clean, properties=PERSISTENT
        )
        client.send(packet)
        connack: pk.Connack = client.receive()[0]
        client.lose()
        return connack

    assert connect("a1", True).reason_code == 0
    assert connect("a1", True).reason_code == 0  # replaced: the same count
    assert connect("a1", False).reason_code == 0  # resumed
    refused = connect("a2", True)
    assert refused.reason_code == 0x97
    assert refused.properties[Prop.REASON_STRING] == (
        "max_sessions_per_user (1) reached for user 'alice'"
    )


def test_observers_hear_the_life_of_a_session(h: Harness) -> None:
    events: list[tuple[str, str]] = []
    h.broker.observers.append(lambda event, session: events.append((event, session.client_id)))
    h.connect("s", properties={Prop.SESSION_EXPIRY_INTERVAL: 5}).lose()
    h.tick(5)
    assert events == [
        ("client.connected", "s"),
        ("client.disconnected", "s"),
        ("session.expired", "s"),
    ]


def test_shared_messages_handed_over_round_robin(h: Harness) -> None:
    """Section 4.8.2: a leaving member's unacknowledged QoS 1 messages are spread over the
    members left, as the strategy (round robin) picks."""
    members = [h.connect(name) for name in ("a", "b", "c")]
    for member in members:
        member.subscribe("$share/g/job", 1)
    pub = h.connect("pub")
    for i in range(6):
        pub.publish("job", f"m{i}".encode(), 1)
    a, b, c = members
    assert len(a.publishes()) == 2
    got_b, got_c = len(b.publishes()), len(c.publishes())
    a.lose()  # clean session: ends now, its two messages go to b and c
    assert (len(b.publishes()), len(c.publishes())) == (1, 1)
    assert (got_b, got_c) == (2, 2)


def test_recheck_does_not_send_what_it_is_about_to_drop(h: Harness) -> None:
    """The rules rechecked with a message in flight and others queued behind it, all now
    unreadable but one: dropping the one in flight must not send a queued unreadable one on
    its way out; the readable one goes."""

    class Rules(AllowAll):
        denied = "nothing/"

        def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
            return not topic.startswith(self.denied)

    rules = Rules()
    h.broker.authorizer = rules
    sub = h.connect("s", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("#", 1)
    pub = h.connect("pub")
    pub.publish("secret/1", b"1", 1)
    pub.publish("secret/2", b"2", 1)
    pub.publish("open/3", b"3", 1)
    assert [p.payload for p in sub.publishes()] == [b"1"]
    rules.denied = "secret/"
    rules.generation += 1
    h.broker.recheck_subscriptions()
    assert [p.payload for p in sub.publishes()] == [b"3"]
    assert sub.session.dropped == 2  # one in flight, one queued


def test_session_present_flag(h: Harness) -> None:
    """[MQTT-3.2.2-2] [MQTT-3.2.2-3] [MQTT-3.1.2-4] [MQTT-3.1.2-5] [MQTT-3.1.2-6] Session Present
    reflects whether a session was resumed; Clean Start 1 discards the old one."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    client = h.connect("s", clean_start=False, properties=expiry, expect_present=False)
    client.subscribe("t", 1)
    client.lose()
    client = h.connect("s", clean_start=False, properties=expiry, expect_present=True)
    assert list(client.session.subscriptions) == ["t"]
    client.lose()
    client = h.connect("s", clean_start=True, properties=expiry, expect_present=False)
    assert client.session.subscriptions == {}
    publisher = h.connect("p")
    publisher.publish("t", b"x", 1)
    assert publisher.one(pk.Puback).reason_code == 0x10  # no matching subscribers
    assert client.receive() == []


def test_v311_persistent_session(h: Harness) -> None:
    """[MQTT-3.1.2-5] [MQTT-3.1.2-23] A 3.1.1 Clean Session 0 session survives the connection
    and is resumed with Session Present 1 and its subscriptions."""
    client = h.connect("old", version=MQTT_3_1_1, clean_start=False, expect_present=False)
    client.subscribe("t", 1)
    client.lose()
    h.tick(1e6)
    publisher = h.connect("p")
    publisher.publish("t", b"while away", 1)
    client = h.connect("old", version=MQTT_3_1_1, clean_start=False, expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"while away"]


def test_a_second_connection_takes_the_session_over_with_0x8e(h: Harness) -> None:
    """[MQTT-3.1.4-3] A second connection with the same client id takes the session over: the old
    one gets DISCONNECT 0x8E and is closed, the new one gets the messages."""
    old = h.connect("same", properties={Prop.SESSION_EXPIRY_INTERVAL: 60})
    old.subscribe("t", 1)
    new = h.connect("same", clean_start=False, expect_present=True)
    received = old.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code == 0x8E
    assert old.closed
    assert not new.closed
    assert h.broker.sessions["same"].connection is new.conn
    publisher = h.connect("p")
    publisher.publish("t", b"m", 1)
    assert [p.payload for p in new.publishes()] == [b"m"]
    assert old.receive() == []


def test_session_takeover_v311_closes_without_disconnect(h: Harness) -> None:
    """[MQTT-3.1.4-3] A 3.1.1 connection taken over is closed; 3.1.1 has no server DISCONNECT."""
    old = h.connect("same", version=MQTT_3_1_1)
    h.connect("same", version=MQTT_3_1_1)
    assert old.receive() == []
    assert old.closed


def test_takeover_publishes_will_of_old_connection(h: Harness) -> None:
    """[MQTT-3.1.4-3] [MQTT-3.1.2-8] The taken-over connection was closed without DISCONNECT 0x00,
    so its Will (no delay) is published."""
    watcher = h.connect("watcher")
    watcher.subscribe("will/#")
    h.connect("same", will=pk.Will("will/same", b"gone"))
    h.connect("same")
    assert [p.payload for p in watcher.publishes()] == [b"gone"]


def test_max_connections_closes_the_extra_connection(make_harness: Any) -> None:
    h = make_harness(max_connections=2)
    first = h.connect("a")
    h.connect("b")
    extra = h.client()
    assert extra.closed  # closed on accept, before any byte
    assert h.broker.stats.refused == 1
    first.subscribe("t")  # the others are unharmed


def test_max_connections_per_address(make_harness: Any) -> None:
    h: Harness = make_harness(max_connections_per_address=1)
    one = h.client(peer="10.0.0.1:1000")
    two = h.client(peer="10.0.0.1:1001")
    other = h.client(peer="10.0.0.2:1000")
    assert not one.closed and two.closed and not other.closed
    one.lose()  # the slot is given back
    again = h.client(peer="10.0.0.1:1002")
    assert not again.closed


def test_persistent_session_count_follows_every_way_a_session_ends(make_harness: Any) -> None:
    """The counts behind max_sessions / max_sessions_per_user: a session of non-zero expiry
    counts once (resumed or taken over), and stops counting when it ends: DISCONNECT with
    expiry 0, Clean Start with expiry 0, expiry running out."""
    h = make_harness(max_sessions=3, max_sessions_per_user=2)
    broker = h.broker

    def counts() -> tuple[int, dict[str, int]]:
        return broker.persistent_sessions, dict(broker._user_sessions)

    a1, ack = _connect_as(h, "a1", "alice", 60, False)
    assert ack.reason_code == 0 and counts() == (1, {"alice": 1})
    a1b, ack = _connect_as(h, "a1", "alice", 60, False)  # takes over its own session
    assert (ack.reason_code, ack.session_present) == (0, True) and counts() == (1, {"alice": 1})
    a2, _ = _connect_as(h, "a2", "alice", 60, False)
    _, ack = _connect_as(h, "a3", "alice", 60, False)
    assert ack.reason_code == 0x97 and counts() == (2, {"alice": 2})
    _, ack = _connect_as(h, "n1", None, 60, False)  # anonymous: counted in all only
    assert ack.reason_code == 0 and counts() == (3, {"alice": 2})
    _, ack = _connect_as(h, "b1", "bob", 60, False)
    assert ack.reason_code == 0x97  # max_sessions
    a2.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 0})  # ends with the connection
    assert counts() == (2, {"alice": 1})
    _connect_as(h, "a1", "alice", 0, True)  # Clean Start, expiry 0: a1 is over
    assert counts() == (1, {})
    _, ack = _connect_as(h, "b1", "bob", 5, False)
    assert ack.reason_code == 0 and counts() == (2, {"bob": 1})
    h.tick(10)  # the connection stays: its session does not expire
    assert counts() == (2, {"bob": 1})
    h.clients[-1].lose()
    h.tick(6)  # bob's session expired
    assert counts() == (1, {})
    assert a1b.closed  # taken over by the Clean Start above


def test_connections_per_address_by_default(make_harness: Any) -> None:
    """Unless configured: 64 per address on listeners other machines reach, no limit on
    local-only ones."""
    h: Harness = make_harness()
    links = [FakeLink() for _ in range(65)]
    for link in links:
        h.broker.connect(link, "10.0.0.1:1")
    assert [link.closed for link in links] == [False] * 64 + [True]
    local = [FakeLink() for _ in range(65)]
    for link in local:
        h.broker.connect(link, "127.0.0.1:1", policy=ListenerPolicy(local=True))
    assert not any(link.closed for link in local)


def test_offline_persistent_member_keeps_its_share(make_harness: Any) -> None:
    """A member whose client is away but whose session persists keeps receiving its share,
    queued, and gets it on reconnect."""
    h = make_harness()
    away = member(h, "away", clean_start=False, properties={Prop.SESSION_EXPIRY_INTERVAL: 600})
    here = member(h, "here")
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
    leaving = member(h, "leaving", qos=2)
    staying = member(h, "staying", qos=2)
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


def test_connections_from_one_address_share_its_string() -> None:
    broker = Broker(BrokerOptions(max_connections_per_address=0), clock=FakeClock())
    host = ".".join(str(part) for part in (192, 0, 2, 7))  # built at run time, not a constant
    first = broker.connect(FakeLink(keep=False), f"{host}:40001")
    second = broker.connect(FakeLink(keep=False), f"{host}:40002")
    assert first.address == second.address == "192.0.2.7"
    assert first.address is second.address


def test_per_address_slot_given_back_once(make_harness: Any) -> None:
    h: Harness = make_harness(max_connections_per_address=2)
    first = h.client(peer="10.0.0.1:1")
    h.client(peer="10.0.0.1:2")
    first.lose()
    assert not h.client(peer="10.0.0.1:3").closed
    assert h.client(peer="10.0.0.1:4").closed  # two open again: the limit


def test_take_over_says_why(h: Harness) -> None:
    """[MQTT-3.1.4-3] The old connection gets DISCONNECT 0x8E with the reason."""
    old = h.connect("c")
    h.connect("c")
    disconnect = old.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x8E,
        "another connection took over the session",
    )


def test_removed_subscription_is_logged(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")

    class Rules(AllowAll):
        allowed = True

        def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
            return self.allowed

    rules = Rules()
    h.broker.authorizer = rules
    h.connect("s").subscribe("a/#")
    rules.allowed = False
    rules.generation += 1
    assert h.broker.recheck_subscriptions() == 1
    assert "session s: subscription 'a/#' removed: no longer authorized" in [
        r.getMessage() for r in caplog.records
    ]


def test_clean_session_end_hands_over_with_expiry(h: Harness) -> None:
    leaving = member(h, "leaving")
    staying = member(h, "staying")
    pub = h.connect("pub")
    pub.publish("job", b"m", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 60})
    assert [p.payload for p in leaving.publishes()] == [b"m"]
    h.clock.advance(10)
    leaving.lose()
    (handed,) = staying.publishes()
    assert handed.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 50


def test_never_expiring_session_resumed_and_left(h: Harness) -> None:
    props = {Prop.SESSION_EXPIRY_INTERVAL: NEVER}
    h.connect("s", properties=props).lose()
    h.connect("s", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(10.0**6)
    assert "s" in h.broker.sessions
    h.connect("s", clean_start=False, properties=props, expect_present=True)


def test_authorizer_given_at_construction(h: Harness) -> None:
    h.broker = Broker(h.options, clock=h.clock, authorizer=DenyAll())
    client = h.connect("c")
    assert client.subscribe("t")[0].reason_codes == [0x87]


def test_revoked_subscription_stops_the_flow(h: Harness) -> None:
    rules = ReadableFilters()
    h.broker.authorizer = rules
    sub = h.connect("sub")
    assert sub.subscribe("a/#")[0].reason_codes == [0]
    assert sub.subscribe("b/#")[0].reason_codes == [0]
    assert sub.subscribe("c/#")[0].reason_codes == [0x87]
    pub = h.connect("pub")
    pub.publish("a/1")
    pub.publish("b/1")
    assert len(sub.publishes()) == 2
    rules.readable = {"b/#"}
    rules.generation += 1
    assert h.broker.recheck_subscriptions() == 1
    pub.publish("a/2")
    pub.publish("b/2")
    assert [p.topic for p in sub.publishes()] == ["b/2"]
    assert list(sub.session.subscriptions) == ["b/#"]


def test_no_authorizer_removes_nothing(h: Harness) -> None:
    sub = h.connect("sub")
    sub.subscribe("a/#")
    assert h.broker.recheck_subscriptions() == 0
    assert list(sub.session.subscriptions) == ["a/#"]


def test_first_read_of_an_idle_pass_is_written_at_once_later_ones_at_the_flush(
    h: Harness,
) -> None:
    sub = h.connect("sub")
    sub.subscribe("t")
    a, b = h.connect("a"), h.connect("b")
    h.broker.scheduler.flush()

    def written() -> list[bytes]:
        return [p.payload for p in sub.unread()]

    read(h, a, b"1")  # the first read of an idle pass: out before the flush
    assert written() == [b"1"]
    read(h, b, b"2")  # a second read in the same pass: waits for the pass's flush
    assert written() == []
    h.broker.scheduler.flush()
    assert written() == [b"2"]
    read(h, a, b"3")  # that pass was crowded: even the next pass's first read waits
    assert written() == []
    h.broker.scheduler.flush()
    assert written() == [b"3"]
    read(h, a, b"4")  # a pass of one read is not crowded: the next one is idle again
    assert written() == [b"4"]


def test_the_broker_counts_each_byte_read_and_written_once(h: Harness) -> None:
    """The broker's byte totals are the sums of its connections' counts, which are what the
    links carried (the transports do not count again)."""
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    read(h, pub, b"x" * 100)
    h.broker.scheduler.flush()
    clients = [sub, pub]
    assert h.broker.stats.bytes_sent == sum(len(c.link.data) for c in clients)
    assert h.broker.stats.bytes_sent == sum(c.conn.output.sent for c in clients) > 100
    assert h.broker.stats.bytes_received == sum(c.conn.input.received for c in clients) > 100


def test_session_expiry_bracketed(h: Harness) -> None:
    """Session Expiry Interval 30: the session is there just before 30 s, gone just after; a
    DISCONNECT raising it to 100 keeps it past 30 s (MQTT-3.1.2-23)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 30}
    h.connect("a", properties=props).lose()
    h.tick(29.9)
    h.connect("a", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(30.1)
    h.connect("a", clean_start=False, properties=props, expect_present=False).disconnect()
    b = h.connect("b", properties=props)
    b.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
    h.tick(99.0)
    h.connect("b", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(100.5)
    h.connect("b", clean_start=False, properties=props, expect_present=False)


def test_session_expiry_never(h: Harness) -> None:
    """0xFFFFFFFF: the session does not expire (a year later it is still there)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}
    h.connect("forever", properties=props).lose()
    h.tick(366 * 86400.0)
    h.connect("forever", clean_start=False, properties=props, expect_present=True)


def test_delayed_will_carries_its_expiry(h: Harness) -> None:
    """[MQTT-3.1.3-9] [MQTT-3.3.2-6] A will published after its delay carries its Message Expiry
    Interval, counted from its publication."""
    watcher = h.connect("w")
    watcher.subscribe("will/#", 1)
    will = pk.Will(
        "will/c",
        b"gone",
        1,
        properties={Prop.WILL_DELAY_INTERVAL: 5, Prop.MESSAGE_EXPIRY_INTERVAL: 60},
    )
    h.connect("c", will=will, properties=PERSISTENT).lose()
    h.tick(5)
    (message,) = watcher.publishes()
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 60


def test_session_expiry_is_logged(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.broker")
    h.connect("s", properties={Prop.SESSION_EXPIRY_INTERVAL: 5}).lose()
    h.tick(5)
    assert "session s expired" in [r.getMessage() for r in caplog.records]


def test_taking_over_another_users_client_id_counts_for_the_cap(make_harness: Any) -> None:
    """session_owner_mismatch "new": bob taking alice's client id gets a new session, which
    counts against bob's max_sessions_per_user (the one it replaces was alice's)."""
    h: Harness = make_harness(max_sessions_per_user=1, session_owner_mismatch="new")
    assert connect_as(h, "x", "alice").reason_code == 0
    assert connect_as(h, "b1", "bob").reason_code == 0
    assert connect_as(h, "x", "bob").reason_code == 0x97
    assert h.broker.sessions["x"].username == "alice"


def test_fresh_broker_counters(h: Harness) -> None:
    snap = h.broker.stats.snapshot(h.broker.connections, 0)
    assert (snap.bytes_sent, snap.bytes_received, snap.received, snap.denied) == (0, 0, 0, 0)


def test_queued_share_of_an_expired_session_goes_to_another_member(h: Harness) -> None:
    away = member(h, "away", properties={Prop.SESSION_EXPIRY_INTERVAL: 10})
    here = member(h, "here")
    away.lose()
    pub = h.connect("pub")
    for i in range(4):
        pub.publish("job", f"m{i}".encode(), 1)
    mine = [p.payload for p in here.publishes()]
    assert len(mine) == 2 and len(h.broker.sessions["away"].queue) == 2
    h.tick(10)  # the away session expires with its queue
    handed = [p.payload for p in here.publishes()]
    assert sorted(mine + handed) == [b"m0", b"m1", b"m2", b"m3"]


def test_share_queued_behind_a_full_window_is_handed_over(h: Harness) -> None:
    """The same for a member still connected whose receive window is full: what waits in its
    queue goes to another member when its session ends."""
    busy = member(h, "busy", properties={Prop.RECEIVE_MAXIMUM: 1})
    idle = member(h, "idle")
    pub = h.connect("pub")
    for i in range(6):
        pub.publish("job", f"m{i}".encode(), 1)
    mine = [p.payload for p in idle.publishes()]
    assert len(busy.publishes()) == 1 and len(busy.session.queue) == 2
    busy.lose()  # clean session: ends now
    handed = [p.payload for p in idle.publishes()]
    assert sorted(mine + handed) == [f"m{i}".encode() for i in range(6)]


def test_certificate_name_owns_the_session(h: Harness) -> None:
    alice, ack = _connect(h, "meter-1", "alice", None)
    assert ack.reason_code == 0 and alice.session.username == "alice"
    alice.lose()
    _, ack = _connect(h, "meter-1", "bob", "alice")  # bob's certificate, alice's name claimed
    assert (ack.reason_code, ack.session_present) == (0x87, False)
    _, ack = _connect(h, "meter-1", "alice", None)
    assert (ack.reason_code, ack.session_present) == (0, True)


def test_session_of_another_user_discarded_and_logged(
    make_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")
    h: Harness = make_harness(session_owner_mismatch="new")
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    first = h.client()
    first.send(pk.Connect(client_id="x", username="alice", properties=expiry))
    first.receive()
    first.lose()
    second = h.client()
    second.send(pk.Connect(client_id="x", username="bob", clean_start=False, properties=expiry))
    assert second.one(pk.Connack).session_present is False
    assert "session x of user 'alice' discarded: its client id was taken by user 'bob'" in [
        r.getMessage() for r in caplog.records
    ]


def test_recheck_drops_queued_messages_no_longer_readable(h: Harness) -> None:
    """A session with only queued messages (none in flight): those it may no longer read go,
    the others stay; an integration's session before it does not stop the recheck."""
    rules = DenySecret()
    rules.denied = "nothing/"
    h.broker.authorizer = rules
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
    outbox.subscribe({"#": 1})
    sub = h.connect("sub", properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
    sub.subscribe("#", 1)
    sub.lose()
    pub = h.connect("pub")
    pub.publish("secret/a", b"1", 1)
    pub.publish("open/b", b"2", 1)
    session = h.broker.sessions["sub"]
    assert len(session.queue) == 2 and not session.inflight
    rules.denied = "secret/"
    rules.generation += 1
    rules.calls.clear()
    h.broker.recheck_subscriptions()
    assert [d.message.payload for d in session.queue] == [b"2"]
    assert ("sub", None, "secret/a") in rules.calls
    assert outbox.pending == 2  # the integration's queue is the operator's: untouched


def test_hand_over_of_a_multi_level_shared_filter(h: Harness) -> None:
    leaving = member(h, "leaving", group="$share/g/a/b/+")
    staying = member(h, "staying", group="$share/g/a/b/+")
    pub = h.connect("pub")
    pub.publish("a/b/1", b"first", 1)  # round robin: to leaving
    assert [p.payload for p in leaving.publishes()] == [b"first"]
    leaving.lose()
    assert [p.payload for p in staying.publishes()] == [b"first"]
