"""Restored deliveries keep what a live one has (Subscription Identifiers, the shared
subscription they came through, their packet id as the store sees it); a stored message too
large for the returning client leaves the store; an integration subscribes at the QoS it asks
and publishes with the message's properties."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk
from test_store_mirror import PERSISTENT, MirrorStore

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.sink import Outbox, Sink
from mqttbroker.broker.store import DeliveryRecord, Restored, SessionRecord, SubscriptionRecord


class Quiet(Sink):
    def wake(self) -> None:
        pass


def mirrored(make_harness: Any) -> tuple[Harness, MirrorStore]:
    h: Harness = make_harness()
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    return h, store


def test_restored_in_flight_delivery_keeps_ids_and_packet_id(make_harness: Any) -> None:
    h, store = mirrored(make_harness)
    record = SessionRecord(
        "s",
        100,
        None,
        None,
        1,  # the store's handle: its deliveries are numbered from it
        [SubscriptionRecord("t", 2, False, False, 0, 7)],
        [DeliveryRecord(1, Message("t", b"m", 2), 2, False, (7,), 4, False, None)],
    )
    h.broker.restore(Restored([record], []))
    h.broker.restored()
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    (resent,) = client.publishes()
    assert (resent.packet_id, resent.dup) == (4, True)
    assert resent.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [7]
    client.pubrec(4)
    client.receive()
    assert store.payloads("s") == [(b"m", 4, True)]  # the PUBREC recorded under its id


def test_restored_queued_share_is_handed_over(make_harness: Any) -> None:
    """A message queued for a member when the broker stopped still belongs to its shared
    subscription: when that session ends, another member gets it."""
    h, _ = mirrored(make_harness)
    record = SessionRecord(
        "away",
        5,
        None,
        None,
        1,  # the store's handle: its deliveries are numbered from it
        [SubscriptionRecord("$share/g/job", 1, False, False, 0, None)],
        [DeliveryRecord(1, Message("job", b"kept", 1), 1, False, (), None, False, "$share/g/job")],
    )
    h.broker.restore(Restored([record], []))
    h.broker.restored()
    other = h.connect("other")
    other.subscribe("$share/g/job", 1)
    h.tick(5)  # the restored session expires
    assert [p.payload for p in other.publishes()] == [b"kept"]


def test_stored_message_too_large_for_the_returning_client(make_harness: Any) -> None:
    """[MQTT-3.1.2-25] Queued while the client was away, too large for the Maximum Packet Size
    it comes back with: dropped as delivered, and gone from the store."""
    h, store = mirrored(make_harness)
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("t", 1)
    sub.lose()
    h.connect("pub").publish("t", b"x" * 500, 1)
    assert len(store.payloads("s")) == 1
    small = {**PERSISTENT, Prop.MAXIMUM_PACKET_SIZE: 100}
    sub = h.connect("s", clean_start=False, properties=small, expect_present=True)
    assert sub.receive() == []
    assert store.payloads("s") == []


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


def test_hand_over_of_a_multi_level_shared_filter(h: Harness) -> None:
    leaving = h.connect("leaving")
    staying = h.connect("staying")
    for client in (leaving, staying):
        client.subscribe("$share/g/a/b/+", 1)
    pub = h.connect("pub")
    pub.publish("a/b/1", b"first", 1)  # round robin: to leaving
    assert [p.payload for p in leaving.publishes()] == [b"first"]
    leaving.lose()
    assert [p.payload for p in staying.publishes()] == [b"first"]


def test_pubrec_of_restored_qos2_alone(make_harness: Any) -> None:
    h, _ = mirrored(make_harness)
    record = SessionRecord(
        "s",
        100,
        None,
        None,
        1,  # the store's handle: its deliveries are numbered from it
        [],
        [DeliveryRecord(1, Message("t", b"m", 2), 2, False, (), 9, False, None)],
    )
    h.broker.restore(Restored([record], []))
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    client.receive()
    client.pubrec(9)
    assert client.one(pk.Pubrel).packet_id == 9
