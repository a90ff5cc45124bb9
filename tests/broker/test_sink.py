"""Integrations as sinks (broker/sink.py): a session under a reserved client id that queues what
its subscriptions match, QoS 0 too, wakes its sink, and lets go of a delivery only when told;
and no network client may take such a client id."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import MQTT_5, AllowAll, Harness, pk

from mqttbroker.broker.sink import Outbox, Sink, retire
from mqttbroker.protocol import grammar
from mqttbroker.protocol.reasons import ReasonCode


class Recorder(Sink):
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


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
    sink = Recorder()
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
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 100, 1 << 20)
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
    outbox = Outbox(h.broker, "$webhook/w", Recorder(), 10, 1 << 20)
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


class NothingReadable(AllowAll):
    generation = 1

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


def test_rules_reload_leaves_integration_subscriptions(h: Harness) -> None:
    """SIGHUP rechecks what clients subscribed; an integration's rules are the operator's."""
    outbox = Outbox(h.broker, "$bridge/b", Recorder(), 10, 1 << 20)
    outbox.subscribe({"a/#": 1})
    h.broker.authorizer = NothingReadable()
    assert h.broker.recheck_subscriptions() == 0
    assert list(outbox.session.subscriptions) == ["a/#"]
