"""Refusals as they are logged (rate-limited, so a client retrying in a loop cannot flood the
log) and counted; an integration publishing into the broker through the same checks as a
client; and the rules rechecked on queued messages."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.harness import AllowAll, Harness, Prop

from mqttbroker.broker.sink import Outbox, Sink, retire
from mqttbroker.protocol.reasons import ReasonCode

POWERS_OF_TWO = [1, 2, 4, 8]


class Recorder(Sink):
    def wake(self) -> None:
        pass


class Rules(AllowAll):
    """An authorizer: ``users`` may publish and read everything but ``secret/#``."""

    generation = 0

    def __init__(self) -> None:
        self.denied = "secret/"
        self.calls: list[tuple[str, str | None, str]] = []

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        self.calls.append((client_id, username, topic))
        return not topic.startswith(self.denied)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return not topic_filter.startswith(self.denied)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        self.calls.append((client_id, username, topic))
        return not topic.startswith(self.denied)


def counts_logged(caplog: pytest.LogCaptureFixture, marker: str) -> list[int]:
    """The "(N refused so far)" counts of the log lines containing ``marker``."""
    return [
        int(r.getMessage().rsplit("(", 1)[1].split()[0])
        for r in caplog.records
        if marker in r.getMessage()
    ]


def test_refused_connections_logged_at_powers_of_two(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")
    h = make_harness(max_connections=1)
    h.connect("a")
    for _ in range(9):
        assert h.client().closed
    assert h.broker.refused == 9
    assert counts_logged(caplog, "max_connections (1) reached") == POWERS_OF_TWO


def test_integration_publish_is_authorized_as_its_session(h: Harness) -> None:
    rules = Rules()
    h.broker.authorizer = rules
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
    outbox.session.username = "bridge-user"
    denied = h.broker.denied
    assert outbox.publish("secret/in", b"x", 1, False, None) == ReasonCode.NOT_AUTHORIZED
    assert h.broker.denied == denied + 1
    assert rules.calls == [("$bridge/b", "bridge-user", "secret/in")]
    assert outbox.publish("open/in", b"x", 1, False, None) == ReasonCode.NO_MATCHING_SUBSCRIBERS


def test_integration_retain_follows_retain_available(make_harness: Callable[..., Harness]) -> None:
    """Retain Available 0: an integration's retained message is forwarded, not kept."""
    h = make_harness(retain_available=False)
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
    assert outbox.publish("r", b"x", 1, True, None) == ReasonCode.NO_MATCHING_SUBSCRIBERS
    assert len(h.broker.router.retained) == 0
    h = make_harness()
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
    outbox.publish("r", b"x", 1, True, None)
    assert len(h.broker.router.retained) == 1


def test_integration_retained_limit(make_harness: Callable[..., Harness]) -> None:
    """max_retained: the integration may replace or clear a retained topic at the limit, not
    add one (0x97)."""
    h = make_harness(max_retained=2)
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
    assert outbox.publish("r/1", b"x", 0, True, None) < 0x80
    assert outbox.publish("r/2", b"x", 0, True, None) < 0x80
    assert outbox.publish("r/3", b"x", 0, True, None) == ReasonCode.QUOTA_EXCEEDED
    assert outbox.publish("r/1", b"new", 0, True, None) < 0x80
    assert outbox.publish("r/2", b"", 0, True, None) < 0x80  # cleared
    assert outbox.publish("r/3", b"x", 0, True, None) < 0x80
    assert sorted(m.topic for m in h.broker.router.retained.match("r/#", h.clock())) == [
        "r/1",
        "r/3",
    ]


def test_outbox_done_refills_nothing_but_frees_its_id(h: Harness) -> None:
    outbox = Outbox(h.broker, "$webhook/w", Recorder(), 10, 1 << 20)
    outbox.subscribe({"a": 1})
    h.connect("pub").publish("a", b"1", 1)
    taken = outbox.take()
    assert taken is not None
    assert outbox.done(taken[0]) and not outbox.done(taken[0])
    assert outbox.pending == 0


def test_outbox_take_drops_expired(h: Harness) -> None:
    """[MQTT-3.3.2-5] A queued message whose expiry passed is not handed to the integration."""
    outbox = Outbox(h.broker, "$webhook/w", Recorder(), 10, 1 << 20)
    outbox.subscribe({"a": 1})
    pub = h.connect("pub")
    pub.publish("a", b"old", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("a", b"new", 1)
    h.clock.advance(6)
    taken = outbox.take()
    assert taken is not None and taken[1].message.payload == b"new"
    assert outbox.take() is None and outbox.session.queued_bytes == 0


def test_retire_logs_what_it_removes(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.sink")
    Outbox(h.broker, "$bridge/old", Recorder(), 10, 1 << 20)
    Outbox(h.broker, "$bridge/kept", Recorder(), 10, 1 << 20)
    retire(h.broker, {"$bridge/kept"})
    assert "$bridge/old" not in h.broker.sessions and "$bridge/kept" in h.broker.sessions
    assert [r.getMessage() for r in caplog.records] == [
        "$bridge/old is no longer configured: its session and queue are removed"
    ]


def test_recheck_drops_queued_messages_no_longer_readable(h: Harness) -> None:
    """A session with only queued messages (none in flight): those it may no longer read go,
    the others stay; an integration's session before it does not stop the recheck."""
    rules = Rules()
    rules.denied = "nothing/"
    h.broker.authorizer = rules
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
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
