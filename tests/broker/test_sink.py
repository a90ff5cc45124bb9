"""broker/sink.py: integrations as sinks: a session under a reserved client id that queues what its
subscriptions match, wakes its sink and lets go of a delivery only when told, publishes through the
same checks as a client, and retires."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.harness import (
    MQTT_5,
    AllowAll,
    DenySecret,
    Harness,
    Prop,
    WakeCounter,
    pk,
)

from mqttbroker.broker.sink import Outbox, Sink, retire
from mqttbroker.protocol import grammar
from mqttbroker.protocol.reasons import ReasonCode


class NothingReadable(AllowAll):
    generation = 1

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


class Quiet(Sink):
    def wake(self) -> None:
        pass


def test_integration_publish_is_authorized_as_its_session(h: Harness) -> None:
    rules = DenySecret()
    h.broker.authorizer = rules
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
    outbox.session.username = "bridge-user"
    denied = h.broker.stats.denied
    assert outbox.publish("secret/in", b"x", 1, False, None) == ReasonCode.NOT_AUTHORIZED
    assert h.broker.stats.denied == denied + 1
    assert rules.calls == [("$bridge/b", "bridge-user", "secret/in")]
    assert outbox.publish("open/in", b"x", 1, False, None) == ReasonCode.NO_MATCHING_SUBSCRIBERS


def test_integration_retain_follows_retain_available(make_harness: Callable[..., Harness]) -> None:
    """Retain Available 0: an integration's retained message is forwarded, not kept."""
    h = make_harness(retain_available=False)
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
    assert outbox.publish("r", b"x", 1, True, None) == ReasonCode.NO_MATCHING_SUBSCRIBERS
    assert len(h.broker.router.retained) == 0
    h = make_harness()
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
    outbox.publish("r", b"x", 1, True, None)
    assert len(h.broker.router.retained) == 1


def test_integration_retained_limit(make_harness: Callable[..., Harness]) -> None:
    """max_retained: the integration may replace or clear a retained topic at the limit, not
    add one (0x97)."""
    h = make_harness(max_retained=2)
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
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
    outbox = Outbox(h.broker, "$webhook/w", WakeCounter(), 10, 1 << 20)
    outbox.subscribe({"a": 1})
    h.connect("pub").publish("a", b"1", 1)
    taken = outbox.take()
    assert taken is not None
    assert outbox.done(taken[0]) and not outbox.done(taken[0])
    assert outbox.pending == 0


def test_outbox_take_drops_expired(h: Harness) -> None:
    """[MQTT-3.3.2-5] A queued message whose expiry passed is not handed to the integration."""
    outbox = Outbox(h.broker, "$webhook/w", WakeCounter(), 10, 1 << 20)
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
    Outbox(h.broker, "$bridge/old", WakeCounter(), 10, 1 << 20)
    Outbox(h.broker, "$bridge/kept", WakeCounter(), 10, 1 << 20)
    retire(h.broker, {"$bridge/kept"})
    assert "$bridge/old" not in h.broker.sessions and "$bridge/kept" in h.broker.sessions
    assert [r.getMessage() for r in caplog.records] == [
        "$bridge/old is no longer configured: its session and queue are removed"
    ]


@pytest.mark.parametrize("client_id", ["$bridge/x", "$webhook/hook"])
@pytest.mark.parametrize("version", [MQTT_5, 4])
def test_reserved_client_ids_are_refused(
    make_harness: Callable[..., Harness], client_id: str, version: int
) -> None:
    h = make_harness()
    client = h.client(version)
    client.send(pk.Connect(client_id=client_id, protocol_level=version))
    connack = client.one(pk.Connack)
    # 0x85 Client Identifier not valid (3.1.1: return code 2, identifier rejected)
    assert connack.reason_code == (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID if version == 5 else 2)
    assert client.closed
    assert client_id not in h.broker.sessions


def test_outbox_queues_wakes_and_keeps_until_done(h: Harness) -> None:
    sink = WakeCounter()
    outbox = Outbox(h.broker, "$webhook/w", sink, max_messages=3, max_bytes=1 << 20)
    outbox.subscribe({"a/#": 2})
    publisher = h.connect("pub")
    publisher.publish("a/1", b"zero", qos=0)
    publisher.publish("a/2", b"one", qos=1)
    publisher.receive()
    assert sink.wakes == 2
    assert outbox.pending == 2
    assert outbox.session in h.broker.backlog
    first = outbox.take()
    assert first is not None
    packet_id, delivery = first
    assert delivery.message.payload == b"zero" and delivery.qos == 0
    assert delivery.message.origin_id is None  # not recorded: nobody asked
    second = outbox.take()
    assert second is not None and second[1].message.payload == b"one"
    assert outbox.take() is None
    assert outbox.session not in h.broker.backlog  # its queue is empty
    assert outbox.pending == 2  # in flight until done
    assert outbox.done(packet_id)
    assert not outbox.done(packet_id)
    assert outbox.pending == 1
    # bounded by its own limit, drops counted
    for n in range(5):
        publisher.publish("a/x", b"%d" % n, qos=1)
    publisher.receive()
    assert len(outbox.session.queue) == 3
    assert outbox.session.dropped == 2


def test_outbox_publish_is_no_local_and_retire_ends_unconfigured(h: Harness) -> None:
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 100, 1 << 20)
    outbox.subscribe({"t/#": 1})
    other = h.connect("sub")
    other.subscribe("t/#", qos=1)
    other.receive()
    assert outbox.publish("t/in", b"x", 1, False, None) == ReasonCode.SUCCESS
    assert [p.payload for p in other.publishes()] == [b"x"]
    assert outbox.pending == 0  # its own message does not come back to it
    assert outbox.publish("t/+", b"x", 1, False, None) == ReasonCode.TOPIC_NAME_INVALID
    retire(h.broker, set())
    assert "$bridge/b" not in h.broker.sessions
    raw = grammar.encode(pk.Publish("t/again", b"y", 1, packet_id=9), MQTT_5)
    other.send_raw(raw)
    other.receive()
    assert outbox.pending == 0


def test_publisher_recorded_only_when_asked(h: Harness) -> None:
    outbox = Outbox(h.broker, "$webhook/w", WakeCounter(), 10, 1 << 20)
    outbox.subscribe({"a/#": 1})
    publisher = h.connect("pub")
    publisher.publish("a/1", b"anonymous", qos=1)
    h.broker.router.track_origin = True  # a webhook names publishers
    publisher.publish("a/2", b"named", qos=1)
    publisher.receive()
    assert [(d.message.origin_id, d.message.origin_user) for d in outbox.session.queue] == [
        (None, None),
        ("pub", None),
    ]


def test_rules_reload_leaves_integration_subscriptions(h: Harness) -> None:
    """SIGHUP rechecks what clients subscribed; an integration's rules are the operator's."""
    outbox = Outbox(h.broker, "$bridge/b", WakeCounter(), 10, 1 << 20)
    outbox.subscribe({"a/#": 1})
    h.broker.authorizer = NothingReadable()
    assert h.broker.recheck_subscriptions() == 0
    assert list(outbox.session.subscriptions) == ["a/#"]


def test_integration_subscribes_at_its_qos_and_publishes_properties(h: Harness) -> None:
    outbox = Outbox(h.broker, "$bridge/b", Quiet(), 10, 1 << 20)
    outbox.subscribe({"in/#": 1})
    h.connect("pub").publish("in/1", b"x", 2)
    taken = outbox.take()
    assert taken is not None and taken[1].qos == 1
    watcher = h.connect("w")
    watcher.subscribe("out/#", 1)
    props = {Prop.USER_PROPERTY: [("origin", "remote")], Prop.CONTENT_TYPE: "text/plain"}
    assert outbox.publish("out/1", b"y", 1, False, props) == 0
    (message,) = watcher.publishes()
    assert message.properties[Prop.USER_PROPERTY] == [("origin", "remote")]
    assert message.properties[Prop.CONTENT_TYPE] == "text/plain"


def test_integration_message_with_expiry(h: Harness) -> None:
    class Quiet(Sink):
        def wake(self) -> None:
            pass

    watcher = h.connect("w")
    watcher.subscribe("out", 1)
    outbox = Outbox(h.broker, "$bridge/b", Quiet(), 10, 1 << 20)
    outbox.publish("out", b"x", 1, False, {Prop.MESSAGE_EXPIRY_INTERVAL: 30})
    (message,) = watcher.publishes()
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 30
