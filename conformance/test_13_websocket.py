"""MQTT over WebSocket (chapter 6), against the broker's WebSocket listener (the suite starts
this broker with one; ``--ws-broker`` names another's). The client is the suite's raw client
with its bytes in hand-made WebSocket frames (``websocket.py``), which also checks that every
frame the broker sends MQTT in is binary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .mqtt import CONNACK, MQTT_5, PINGRESP, PUBLISH, SUBACK, connect, publish, subscribe
from .websocket import TEXT, WsClient

PINGREQ = b"\xc0\x00"


@pytest.fixture
def ws(ws_broker: tuple[str, int, str]) -> Iterator[list[WsClient]]:
    """The WebSocket clients a test opens (``open_ws``), closed after it."""
    made: list[WsClient] = []
    yield made
    for client in made:
        client.sock.close()


def open_ws(made: list[WsClient], ws_broker: tuple[str, int, str], name: str) -> WsClient:
    host, port, path = ws_broker
    client = WsClient((host, port), path, MQTT_5, name)
    made.append(client)
    return client


def test_the_handshake_selects_mqtt(ws, ws_broker, uid):
    """Offered the subprotocol ``mqtt`` (among others), the broker selects it and says so in
    the handshake's Sec-WebSocket-Protocol header. [MQTT-6.0.0-4]"""
    host, port, path = ws_broker
    client = WsClient((host, port), path, MQTT_5, f"{uid}-hs", protocols=("chat", "mqtt"))
    ws.append(client)
    assert client.headers.get("sec-websocket-protocol") == "mqtt", client.head
    client.connect(client.name)
    assert client.ping() == []


def test_packets_and_frames_are_independent(ws, ws_broker, uid, topic):
    """A packet split over several binary frames and several packets in one frame are read as
    the packets they are: a CONNECT in three frames; then SUBSCRIBE, a PUBLISH to the
    subscribed topic and PINGREQ in one frame, answered in order; then a PUBLISH split with
    its first byte alone in a frame. Every MQTT byte the broker sends comes in binary frames.
    [MQTT-6.0.0-2] [MQTT-6.0.0-1]"""
    c = open_ws(ws, ws_broker, f"{uid}-frames")
    hello = connect(c.name)
    c.send_frames([hello[:1], hello[1:5], hello[5:]])
    ack = c.expect(CONNACK)
    assert ack.reason_code == 0, ack
    c.send_frames(
        [subscribe(1, [(topic, 0)]) + publish(topic, b"one frame, three packets") + PINGREQ]
    )
    assert c.expect(SUBACK, stash_publish=True).reason_codes == [0]  # PUBLISH may come first
    assert c.expect_publish(topic, b"one frame, three packets").qos == 0
    assert c.expect(PINGRESP).type == PINGRESP
    split = publish(topic, b"one packet, three frames")
    c.send_frames([split[:1], split[1:-3], split[-3:]])
    pkt = c.expect(PUBLISH)
    assert pkt.payload == b"one packet, three frames", pkt


def test_a_text_frame_closes_the_connection(ws, ws_broker, uid, topic):
    """MQTT travels in binary frames only: a text data frame makes the broker close the
    network connection (after a DISCONNECT 0x81 or 0x82, if it sends one, section 4.13).
    [MQTT-6.0.0-1]"""
    c = open_ws(ws, ws_broker, f"{uid}-text")
    c.connect(c.name)
    c.send_frame(TEXT, publish(topic, b"sent in a text frame"))
    c.expect_disconnect({0x81, 0x82})
