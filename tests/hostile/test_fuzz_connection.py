"""Fuzzing the codec and the connection state machine (bounded in time by hypothesis settings):
random and mutated bytes never make anything but the codec's own errors escape, and a
connection fed garbage either keeps going or is closed with the spec's answer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.codec import decode_packet

from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from mqttbroker.protocol.properties import PropertyId as Prop


class Link:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.writes_after_close = 0

    def write(self, data: bytes) -> None:
        if self.closed:
            self.writes_after_close += 1
        self.data += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def buffered(self) -> int:
        return 0

    def abort(self) -> None:
        self.close()


VALID = [
    grammar.encode(pk.Connect(client_id="fz", properties={Prop.TOPIC_ALIAS_MAXIMUM: 4}), 5),
    grammar.encode(pk.Subscribe(1, [pk.SubscriptionRequest("a/#", 2)]), 5),
    grammar.encode(pk.Publish("a/b", b"payload", 0), 5),
    grammar.encode(pk.Publish("a/b", b"p1", 1, packet_id=7), 5),
    grammar.encode(pk.Publish("a/c", b"p2", 2, packet_id=8, properties={Prop.TOPIC_ALIAS: 1}), 5),
    grammar.encode(pk.Pubrel(8), 5),
    grammar.encode(pk.Puback(1), 5),
    grammar.encode(pk.Unsubscribe(3, ["a/#"]), 5),
    grammar.encode(pk.Pingreq(), 5),
    grammar.encode(pk.Disconnect(4), 5),
]


@st.composite
def mutated_stream(draw: st.DrawFn) -> list[bytes]:
    """A CONNECT then a mix of valid packets, mutated packets and random bytes, cut into chunks
    at random places."""
    parts = [VALID[0]]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["valid", "flip", "truncate", "random"]))
        packet = bytearray(draw(st.sampled_from(VALID)))
        if kind == "flip" and packet:
            for _ in range(draw(st.integers(1, 3))):
                index = draw(st.integers(0, len(packet) - 1))
                packet[index] = draw(st.integers(0, 255))
        elif kind == "truncate":
            packet = packet[: draw(st.integers(0, len(packet)))]
        elif kind == "random":
            packet = bytearray(draw(st.binary(max_size=40)))
        parts.append(bytes(packet))
    stream = b"".join(parts)
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks, start = [], 0
    for cut in cuts + [len(stream)]:
        chunks.append(stream[start:cut])
        start = cut
    return chunks


def split(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        header = fastpath.read_fixed_header(data, pos, len(data))
        assert header is not None, "the broker wrote a truncated packet"
        length, body = header
        out.append((data[pos], data[body : body + length]))
        pos = body + length
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_stream())
def test_connection_survives_any_input(chunks: list[bytes]) -> None:
    """Whatever arrives, data_received returns normally; everything the broker wrote decodes;
    a DISCONNECT, if any, is the last packet and the connection is then closed
    ([MQTT-4.13.1-1], [MQTT-3.14.4-1]); an observer connection is unharmed."""
    clock = [1000.0]
    broker = Broker(BrokerOptions(max_packet_size=4096), clock=lambda: clock[0])
    observer_link = Link()
    observer = broker.connect(observer_link, "observer")
    observer.data_received(grammar.encode(pk.Connect(client_id="observer"), 5))
    observer.data_received(grammar.encode(pk.Subscribe(1, [pk.SubscriptionRequest("#")]), 5))
    link = Link()
    conn = broker.connect(link, "fuzz")
    for chunk in chunks:
        conn.data_received(chunk)  # must not raise
    broker.scheduler.flush()
    broker.tick()
    written = split(bytes(link.data))
    for index, (first, body) in enumerate(written):
        packet = decode_packet(first, body, 5)
        if isinstance(packet, pk.Disconnect):
            assert index == len(written) - 1
            assert link.closed
    assert link.writes_after_close == 0
    # the observer still works
    before = len(observer_link.data)
    other = broker.connect(Link(), "other")
    other.data_received(grammar.encode(pk.Connect(client_id="other"), 5))
    other.data_received(grammar.encode(pk.Publish("obs/x", b"still here", 0), 5))
    broker.scheduler.flush()
    assert b"still here" in bytes(observer_link.data[before:])


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=64), st.sampled_from([4, 5]))
def test_codec_raises_only_its_own_errors(first: int, body: bytes, version: int) -> None:
    """Random bodies for any packet type: decoding succeeds or raises an MQTTError."""
    try:
        decode_packet(first, body, version)
    except MQTTError as exc:
        assert exc.reason_code >= 0x80
