"""MQTT over WebSocket with paho-mqtt (ws:// and wss://, both protocol versions, a configured
path), and the HTTP side of the handshake: the "mqtt" subprotocol selected and returned
(MQTT-6.0.0-4), refused without it, other paths and plain HTTP refused."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest
from transport_support import (
    CONNACK_OK,
    CUSTOM_PATH,
    TIMEOUT,
    Certificates,
    HandshakeRefused,
    Listeners,
    Paho,
    RawWebSocket,
    client_context,
    connect_packet,
    unique,
)

VERSIONS = [pytest.param(mqtt.MQTTv5, id="v5"), pytest.param(mqtt.MQTTv311, id="v311")]


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
@pytest.mark.parametrize("version", VERSIONS)
def test_paho_over_websocket(
    listeners: Listeners, certs: Certificates, version: int, secure: bool
) -> None:
    address = listeners.wss if secure else listeners.ws
    topic = f"ws/{unique()}"
    client = Paho(version, "websockets", tls=client_context(certs) if secure else None)
    try:
        assert client.connect(address.host, address.port) == 0
        assert client.subscribe(topic, 1) == 1
        client.publish(topic, b"over websocket", 1)
        [message] = client.wait_messages(1)
        assert (message.topic, message.payload, message.qos) == (topic, b"over websocket", 1)
    finally:
        client.close()


def test_large_messages_both_ways_and_across_transports(listeners: Listeners) -> None:
    """A 600 kB payload (more than one frame's worth of output) from WebSocket to TCP and back."""
    topic = f"ws/{unique()}"
    big = bytes(range(256)) * 2400
    web = Paho(transport="websockets")
    tcp = Paho()
    try:
        assert web.connect(listeners.ws.host, listeners.ws.port) == 0
        assert tcp.connect(listeners.tcp.host, listeners.tcp.port) == 0
        assert web.subscribe(f"{topic}/to-ws", 1) == 1
        assert tcp.subscribe(f"{topic}/to-tcp", 1) == 1
        web.publish(f"{topic}/to-tcp", big, 1)
        tcp.publish(f"{topic}/to-ws", big[::-1], 1)
        [to_tcp] = tcp.wait_messages(1)
        [to_ws] = web.wait_messages(1)
        assert to_tcp.payload == big
        assert to_ws.payload == big[::-1]
    finally:
        web.close()
        tcp.close()


def test_configured_path(listeners: Listeners) -> None:
    address = listeners.ws_custom
    client = Paho(transport="websockets", path=CUSTOM_PATH)
    try:
        assert client.connect(address.host, address.port) == 0
    finally:
        client.close()
    with pytest.raises(HandshakeRefused) as refused:
        RawWebSocket(address.host, address.port, path="/mqtt")
    assert refused.value.status == 404


def test_subprotocol_mqtt_is_selected_and_returned(listeners: Listeners) -> None:
    ws = RawWebSocket(listeners.ws.host, listeners.ws.port, protocols=("mqtt",))
    try:
        assert ws.headers["sec-websocket-protocol"] == "mqtt"
        ws.send_binary(connect_packet(unique("sub-proto")))
        assert ws.read_packet() == CONNACK_OK
    finally:
        ws.close()
    ws = RawWebSocket(listeners.ws.host, listeners.ws.port, protocols=("chat", "mqtt"))
    try:
        assert ws.headers["sec-websocket-protocol"] == "mqtt"
    finally:
        ws.close()


@pytest.mark.parametrize("protocols", [(), ("chat",)], ids=["none", "other"])
def test_handshake_without_the_mqtt_subprotocol_is_refused(
    listeners: Listeners, protocols: tuple[str, ...]
) -> None:
    with pytest.raises(HandshakeRefused) as refused:
        RawWebSocket(listeners.ws.host, listeners.ws.port, protocols=protocols)
    assert refused.value.status == 400


def test_plain_http_request_is_refused(listeners: Listeners) -> None:
    with socket.create_connection((listeners.ws.host, listeners.ws.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
