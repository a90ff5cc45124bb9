"""When the TCP link writes what a read produced: at once while the loop is not under load (the
pass's first read with output), at the end of the pass otherwise, one write per connection per
pass. The loop is played by hand: ``broker.scheduler.flush()`` is the end of a pass, as the event
loop runs it once per pass that ``broker.scheduler.wake`` asked for."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from support.harness import FakeClock, split_packets

from mqttbroker import compiled
from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_5
from mqttbroker.server.tcp import ListenerContext, MQTTProtocol


class _Transport:
    """What MQTTProtocol uses of an asyncio transport; records every write."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writes: list[bytes] = []

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.port) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Loop:
    """A broker on MQTTProtocols, and the passes of an event loop played by hand."""

    def __init__(self) -> None:
        self.broker = Broker(BrokerOptions(), clock=FakeClock())
        self.wakes = 0
        self.broker.scheduler.wake = self._wake
        self.clients: dict[str, tuple[MQTTProtocol, _Transport]] = {}

    def _wake(self) -> None:
        self.wakes += 1

    def end_pass(self) -> None:
        self.broker.scheduler.flush()

    def connect(self, client_id: str) -> _Transport:
        protocol = MQTTProtocol(ListenerContext(self.broker))
        transport = _Transport(40000 + len(self.clients))
        protocol.connection_made(transport)  # type: ignore[arg-type]
        self.clients[client_id] = (protocol, transport)
        self.read(client_id, pk.Connect(client_id=client_id, protocol_level=MQTT_5))
        self.end_pass()
        return transport

    def subscribed(self, *publishers: str) -> _Transport:
        """A subscriber of "t" and ``publishers``, connected, after the pass that set them up:
        the subscriber's transport."""
        sub = self.connect("sub")
        for client_id in publishers:
            self.connect(client_id)
        self.read("sub", pk.Subscribe(1, [pk.SubscriptionRequest("t", 0, False, False, 0)], {}))
        self.end_pass()
        return sub

    def read(self, client_id: str, packet: Any) -> None:
        self.clients[client_id][0].data_received(grammar.encode(packet, MQTT_5))

    def publish(self, client_id: str, payload: bytes) -> None:
        self.read(client_id, pk.Publish("t", payload, 0, False, False, None, {}))


def _payloads(data: bytes) -> list[bytes]:
    return [p.payload for p in split_packets(data, MQTT_5)]


def test_first_output_of_an_idle_pass_is_written_before_the_pass_ends() -> None:
    loop = _Loop()
    sub = loop.subscribed("a", "b")
    assert [type(p) for p in split_packets(b"".join(sub.writes), MQTT_5)] == [
        pk.Connack,
        pk.Suback,
    ]
    seen = len(sub.writes)

    def new_writes() -> list[list[bytes]]:
        nonlocal seen
        fresh = [_payloads(w) for w in sub.writes[seen:]]
        seen = len(sub.writes)
        return fresh

    # An idle loop: the forwarded message is written by the read itself.
    wakes = loop.wakes
    loop.publish("a", b"1")
    assert new_writes() == [[b"1"]]
    assert loop.wakes == wakes + 1  # the end-of-pass flush is still asked for, once
    loop.end_pass()
    assert new_writes() == []

    # Load arrives: the pass's first read writes at once, the second waits for the flush.
    loop.publish("a", b"2")
    loop.publish("b", b"3")
    assert new_writes() == [[b"2"]]
    loop.end_pass()
    assert new_writes() == [[b"3"]]

    # Under load (the last pass had two reads): one write per pass, at its end.
    loop.publish("a", b"4")
    loop.publish("b", b"5")
    loop.publish("a", b"6")
    assert new_writes() == []
    loop.end_pass()
    assert new_writes() == [[b"4", b"5", b"6"]]

    # The first pass with one read after the load still coalesces; the next one is idle again.
    loop.publish("a", b"7")
    assert new_writes() == []
    loop.end_pass()
    assert new_writes() == [[b"7"]]
    loop.publish("b", b"8")
    assert new_writes() == [[b"8"]]
    loop.end_pass()
    assert new_writes() == []


def test_the_flush_is_asked_for_after_the_early_write_and_not_for_a_read_without_output() -> None:
    """The forwarded message does not wait for the loop's callback: the end-of-pass flush is
    scheduled once the first read's output is written. A read with no output (a message
    nobody subscribed to) asks for no flush, and the pass stays idle: its next read is
    still written at once."""
    loop = _Loop()
    sub = loop.subscribed("a")
    order: list[tuple[str, int]] = []
    loop.broker.scheduler.wake = lambda: order.append(("wake", len(sub.writes)))
    written = len(sub.writes)

    loop.publish("a", b"1")
    assert order == [("wake", written + 1)]  # written first, then the flush asked for
    loop.end_pass()

    order.clear()
    loop.read("a", pk.Publish("nobody", b"2", 0, False, False, None, {}))
    assert order == []
    loop.publish("a", b"3")
    assert [_payloads(w) for w in sub.writes[written + 1 :]] == [[b"3"]]
    assert order == [("wake", written + 2)]


def test_a_write_that_raises_still_leaves_the_flush_asked_for() -> None:
    """A transport whose write raises in the early write (the error reaches the transport's
    handler) must not leave the pass's flush unasked for: the broker would otherwise believe
    a flush is due for ever, and no later output would be written."""
    loop = _Loop()
    sub = loop.subscribed("a")

    def refuse(data: bytes) -> None:
        raise RuntimeError("the transport refuses")

    sub.write = refuse  # type: ignore[method-assign]
    wakes = loop.wakes
    with pytest.raises(RuntimeError, match="refuses"):
        loop.publish("a", b"1")
    assert loop.wakes == wakes + 1


def test_a_hooked_pass_asks_for_no_callback_and_is_flushed_at_its_end() -> None:
    """The own transport frames each pass with pass_begin and pass_end: the reads in between
    ask the loop for no flush (wake), whatever they write, and pass_end writes what they left,
    one write per connection. Output outside such a pass (a read on another transport, a
    commit, a timer) still asks the loop for one."""
    loop = _Loop()
    sub = loop.subscribed("a", "b")
    seen = len(sub.writes)
    wakes = loop.wakes

    loop.broker.scheduler.pass_begin()
    loop.publish("a", b"1")  # the pass's first read: still written at once
    loop.publish("b", b"2")
    loop.publish("a", b"3")
    assert [_payloads(w) for w in sub.writes[seen:]] == [[b"1"]]
    loop.broker.scheduler.pass_end()
    assert [_payloads(w) for w in sub.writes[seen:]] == [[b"1"], [b"2", b"3"]]
    assert loop.wakes == wakes  # no loop callback asked for
    loop.broker.scheduler.pass_end()  # nothing due: nothing written
    assert len(sub.writes) == seen + 2

    loop.publish("a", b"4")  # outside a pass: the flush is asked of the loop, as before
    assert loop.wakes == wakes + 1


def test_the_protocols_of_one_listener_share_what_it_gives_them() -> None:
    """A connection's protocol refers to its listener's broker, configuration and rules through
    one object, the same for all its connections: compiled, a protocol is 80 bytes (it was 104
    with a reference to each, 88 with a field for a PROXY header's client). A connection a PROXY
    header named has a context of its own, with that client."""
    shared = ListenerContext(Broker(BrokerOptions()))
    first, second = MQTTProtocol(shared), MQTTProtocol(shared)
    assert first.context is second.context is shared and shared.origin is None
    proxied = MQTTProtocol(shared.for_origin(("10.0.0.7:4242", "10.0.0.7")))
    assert proxied.context is not shared
    assert proxied.context.origin == ("10.0.0.7:4242", "10.0.0.7")
    assert proxied.context.broker is shared.broker and proxied.context.policy is shared.policy
    assert proxied.context.listener is shared.listener and shared.origin is None
    if compiled.mode == "compiled":
        assert sys.getsizeof(first) <= 80, sys.getsizeof(first)
    else:
        assert not hasattr(first, "__dict__")
