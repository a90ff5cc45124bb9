"""Connection and subscription storms: what an idle connection keeps, the log under thousands
of connections, and what a new subscription forgets of the match cache."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from collections.abc import Callable

import pytest
from support.harness import FakeClock, Harness, pk

from mqttbroker import compiled
from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.protocol import grammar
from mqttbroker.protocol.packets import MQTT_5

# What one idle connection (clean session, no subscription) may keep in the sans-I/O broker:
# its Connection and Session with what they hold, its entries in the broker's tables. An empty
# deque alone takes 760 bytes, a set 216, a dict 64, a list 56: what most connections and
# sessions never use is created on first use (about 800 bytes in all compiled, 880 pure, where
# every field is a full pointer).
IDLE_CONNECTION_BYTES = 900 if compiled.mode == "compiled" else 1000


class _Link:
    """A transport that keeps nothing of what is written to it."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def buffered(self) -> int:
        return 0

    def abort(self) -> None:
        pass


def test_an_idle_connection_keeps_little_memory() -> None:
    broker = Broker(BrokerOptions(max_connections_per_address=0), clock=FakeClock())
    count = 500
    link = _Link()
    connects = [
        grammar.encode(pk.Connect(client_id=f"idle-{i:04d}", protocol_level=MQTT_5), MQTT_5)
        for i in range(count)
    ]
    peers = [f"127.0.0.1:{40000 + i}" for i in range(count)]
    for data in connects[:20]:  # the broker's own tables get going first
        broker.connect(link, "127.0.0.1:1").data_received(data)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for peer, data in zip(peers[20:], connects[20:], strict=True):
            broker.connect(link, peer).data_received(data)
        broker.flush()
        gc.collect()
        per_connection = (tracemalloc.get_traced_memory()[0] - before) / (count - 20)
    finally:
        tracemalloc.stop()
    assert len(broker.connections) == count
    assert per_connection < IDLE_CONNECTION_BYTES, per_connection


def test_an_idle_connection_keeps_no_output_list(make_harness: Callable[..., Harness]) -> None:
    """The list of packets waiting to be written exists while some do: once its CONNACK is
    written, an idle connection has none; the next packet starts one, and its write ends it."""
    h = make_harness()
    client = h.connect("idle")
    assert client.conn.out is None
    client.send(pk.Pingreq())
    assert client.conn.out is not None  # waits for the flush at the end of the pass
    h.broker.flush()
    assert client.conn.out is None
    assert isinstance(client.receive()[-1], pk.Pingresp)


def test_connections_from_one_address_share_its_string() -> None:
    broker = Broker(BrokerOptions(max_connections_per_address=0), clock=FakeClock())
    host = ".".join(str(part) for part in (192, 0, 2, 7))  # built at run time, not a constant
    first = broker.connect(_Link(), f"{host}:40001")
    second = broker.connect(_Link(), f"{host}:40002")
    assert first.address == second.address == "192.0.2.7"
    assert first.address is second.address


def test_connection_log_interval_counts_instead_of_a_line_each(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker")
    h = make_harness(connection_log_interval=10.0)
    h.tick()
    clients = [h.connect(f"storm-{i}") for i in range(5)]
    clients[0].send(pk.Disconnect())
    clients[1].conn.connection_lost()
    assert not [r for r in caplog.records if "storm-" in r.getMessage()]
    h.tick(5)
    assert not [r for r in caplog.records if "clients connected" in r.getMessage()]
    h.tick(5)
    lines = [r.getMessage() for r in caplog.records if "clients connected" in r.getMessage()]
    assert lines == ["in the last 10s: 5 clients connected, 1 disconnected, 1 connections lost"]
    h.tick(10)  # nothing happened since: no line
    assert len([r for r in caplog.records if "clients connected" in r.getMessage()]) == 1


def test_without_connection_log_interval_each_connection_is_logged(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker")
    h = make_harness()
    h.connect("one").send(pk.Disconnect())
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("client one connected from") for m in messages)
    assert "client one disconnected (reason 0x00)" in messages


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
