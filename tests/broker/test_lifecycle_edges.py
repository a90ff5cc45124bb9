"""Edges of a connection's and a session's life: wills (published at once without a delay,
never for a refused CONNECT or after DISCONNECT 0x00, checked by the authorizer), per-user
session caps, the observers' events, shared messages handed over round robin, held resends
with their expiry, and the rules rechecked on messages in flight."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import AllowAll, Harness, Prop, pk

PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}


def watcher(h: Harness) -> Any:
    client = h.connect("w")
    client.subscribe("will/#", 1)
    return client


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
