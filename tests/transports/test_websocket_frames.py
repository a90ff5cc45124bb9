"""WebSocket framing with a raw client (MQTT 5.0 section 6): packets and frames are independent
(MQTT-6.0.0-2), the broker sends binary frames only, and a text frame closes the connection
(MQTT-6.0.0-1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clients import (
    CONNACK_OK,
    MQTT_311,
    PINGREQ,
    PINGRESP,
    PahoClient,
    connect_packet,
    packet_type,
    publish_packet,
    subscribe_packet,
    unique,
)
from support.transports import OP_BINARY, OP_CONTINUATION, OP_TEXT, Listeners, RawWebSocket, echoes

SUBACK, PUBLISH = 9, 3


@pytest.fixture
def ws(listeners: Listeners) -> Iterator[RawWebSocket]:
    socket = RawWebSocket(listeners.ws.host, listeners.ws.port)
    yield socket
    socket.close()


def test_connect_split_over_three_messages(ws: RawWebSocket) -> None:
    packet = connect_packet(unique("split"), MQTT_311)
    ws.send_binary(packet[:1])
    ws.send_binary(packet[1:7])
    ws.send_binary(packet[7:])
    assert ws.read_packet() == CONNACK_OK


def test_connect_split_over_the_fragments_of_one_message(ws: RawWebSocket) -> None:
    packet = connect_packet(unique("fragments"), MQTT_311)
    ws.send_frame(OP_BINARY, packet[:3], fin=False)
    ws.send_frame(OP_CONTINUATION, packet[3:9], fin=False)
    ws.send_frame(OP_CONTINUATION, packet[9:], fin=True)
    assert ws.read_packet() == CONNACK_OK


def test_several_packets_in_one_frame(ws: RawWebSocket) -> None:
    """SUBSCRIBE, a PUBLISH to the same topic and PINGREQ in one frame: SUBACK, the PUBLISH and
    PINGRESP come back, in that order."""
    topic = f"frames/{unique()}"
    ws.send_binary(connect_packet(unique("several"), MQTT_311))
    assert ws.read_packet() == CONNACK_OK
    ws.send_binary(
        subscribe_packet(1, [(topic, 0)], MQTT_311)
        + publish_packet(topic, b"one frame", version=MQTT_311)
        + PINGREQ
    )
    suback, publish, pingresp = ws.read_packet(), ws.read_packet(), ws.read_packet()
    assert packet_type(suback) == SUBACK and suback[-1] == 0
    assert packet_type(publish) == PUBLISH and publish.endswith(b"one frame")
    assert pingresp == PINGRESP


def test_frames_that_cut_packets_anywhere(ws: RawWebSocket) -> None:
    """A frame that ends inside CONNECT and carries the start of SUBSCRIBE, then the rest."""
    topic = f"frames/{unique()}"
    stream = (
        connect_packet(unique("cut"), MQTT_311)
        + subscribe_packet(7, [(topic, 0)], MQTT_311)
        + PINGREQ
    )
    cuts = [0, 5, 20, len(stream) - 3, len(stream)]
    for start, end in zip(cuts, cuts[1:], strict=False):
        ws.send_binary(stream[start:end])
    assert ws.read_packet() == CONNACK_OK
    suback = ws.read_packet()
    assert packet_type(suback) == SUBACK and suback[2:4] == b"\x00\x07"
    assert ws.read_packet() == PINGRESP


def test_text_frame_closes_the_connection(listeners: Listeners, ws: RawWebSocket) -> None:
    """After a text frame the broker closes (close code 1003, unsupported data) without a
    DISCONNECT from the client: its will is published."""
    broker = listeners.broker
    will_topic = f"frames/{unique()}/will"
    watcher = PahoClient(listeners.tcp.host, listeners.tcp.port)
    try:
        watcher.connect()
        assert watcher.subscribe(will_topic, 0) == [0]
        mark = broker.log_mark()
        ws.send_binary(connect_packet(unique("text"), MQTT_311, will=(will_topic, b"gone")))
        assert ws.read_packet() == CONNACK_OK
        ws.send_frame(OP_TEXT, b"\x10\x00")
        assert ws.wait_closed() == 1003
        assert broker.wait_for_log(r"WebSocket text frame.*closing", since=mark)
        [will] = watcher.wait_messages(1)
        assert (will.topic, will.payload) == (will_topic, b"gone")
    finally:
        watcher.close()


def test_text_frame_before_connect_closes_too(ws: RawWebSocket) -> None:
    ws.send_frame(
        OP_TEXT, connect_packet(unique("text-first"), MQTT_311).decode("latin-1").encode()
    )
    assert ws.wait_closed() == 1003


def test_broker_still_serves_after_frame_errors(listeners: Listeners) -> None:
    for _ in range(3):
        bad = RawWebSocket(listeners.ws.host, listeners.ws.port)
        bad.send_frame(OP_TEXT, b"hello")
        assert bad.wait_closed() == 1003
        bad.close()
    topic = f"frames/{unique()}"
    client = PahoClient(listeners.ws.host, listeners.ws.port, transport="websockets")
    echoes(client, topic, b"still here", qos=0)
    listeners.broker.assert_clean_log()
