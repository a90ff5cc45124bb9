"""The bridge's message flow without sockets: an inbound message is acknowledged to the remote
only after the local store committed it; an outbound one stays stored until the remote's PUBACK
(or PUBCOMP), under the session's packet id."""

from __future__ import annotations

from support.codec import decode_hot, encode_hot
from support.harness import GatedStore

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.store import Store
from mqttbroker.config import BridgeConfig, TopicRule
from mqttbroker.integrations.bridge import Bridge
from mqttbroker.protocol import fastpath
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import PacketType


class DeferredStore(GatedStore):
    """Records the deliveries it holds; commits only when told."""

    def __init__(self) -> None:
        super().__init__()
        self.deliveries: set[tuple[str, int]] = set()

    def save_delivery(self, session, delivery) -> None:  # type: ignore[no-untyped-def]
        super().save_delivery(session, delivery)
        self.deliveries.add((session.client_id, delivery.stored))

    def delete_delivery(self, session, delivery) -> None:  # type: ignore[no-untyped-def]
        self.deliveries.discard((session.client_id, delivery.stored))
        delivery.stored = 0


class FakeWriter:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def is_closing(self) -> bool:
        return False


def make_bridge(store: Store) -> tuple[Broker, Bridge, FakeWriter]:
    broker = Broker(store=store)
    config = BridgeConfig(
        "b",
        "127.0.0.1",
        1,
        topics=[
            TopicRule("in/#", "in", 1, local_prefix="remote/"),
            TopicRule("out/#", "out", 2, remote_prefix="site/"),
        ],
    )
    bridge = Bridge(broker, config, "me")
    writer = FakeWriter()
    bridge._writer = writer  # type: ignore[assignment]
    return broker, bridge, writer


def feed(bridge: Bridge, writer: FakeWriter, data: bytes) -> None:
    length, body = fastpath.read_fixed_header(data, 0, len(data))  # type: ignore[misc]
    bridge._handle(writer, data[0], data[body : body + length])  # type: ignore[arg-type]


def test_inbound_acknowledged_only_after_the_local_commit() -> None:
    store = DeferredStore()
    broker, bridge, writer = make_bridge(store)
    feed(bridge, writer, encode_hot(pk.Publish("in/x", b"v", 1, packet_id=7), 5))
    assert broker.stats.received_q1 == 1 and bridge.forwarded_in == 1
    assert writer.data == []  # not before the commit
    store.commit()
    assert writer.data == [fastpath.encode_ack(PacketType.PUBACK, 7, 0x10, None, 5)]


def test_outbound_kept_until_the_remote_acknowledges() -> None:
    store = DeferredStore()
    broker, bridge, writer = make_bridge(store)
    match = broker.router.lookup("out/t")
    assert match is not None
    broker.router.publish(Message("out/t", b"payload", 2), match, None, 0.0)
    assert bridge.outbox.pending == 1 and len(store.deliveries) == 1
    item = bridge.outbox.take()
    assert item is not None
    packet_id, delivery = item
    data = bridge._encode(packet_id, delivery, False)
    assert data is not None
    writer.write(data)
    sent = decode_hot(
        PacketType.PUBLISH, writer.data[0][0] & 0x0F, writer.data[0], 2, len(writer.data[0]), 5
    )
    assert isinstance(sent, pk.Publish)
    assert (sent.topic, sent.qos, sent.packet_id) == ("site/out/t", 2, packet_id)
    assert ("mqttbroker-via", "me") in sent.properties[0x26]
    feed(bridge, writer, fastpath.encode_ack(PacketType.PUBREC, packet_id, 0, None, 5))
    assert writer.data[-1] == fastpath.encode_ack(PacketType.PUBREL, packet_id, 0, None, 5)
    assert len(store.deliveries) == 1  # released, not yet complete
    feed(bridge, writer, fastpath.encode_ack(PacketType.PUBCOMP, packet_id, 0, None, 5))
    assert bridge.outbox.pending == 0 and not store.deliveries
