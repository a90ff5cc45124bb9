"""MQTT over WebSocket with paho-mqtt (ws:// and wss://, both protocol versions, a configured
path), and the HTTP side of the handshake: the "mqtt" subprotocol selected and returned
(MQTT-6.0.0-4), refused without it, other paths and plain HTTP refused."""

from __future__ import annotations

import socket
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.launcher import BrokerProcess
from support.transports import CUSTOM_PATH, Listeners, RawWebSocket, echoes, toml_listener

from conformance.websocket import HandshakeRefused

VERSIONS = [pytest.param(mqtt.MQTTv5, id="v5"), pytest.param(mqtt.MQTTv311, id="v311")]


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
@pytest.mark.parametrize("version", VERSIONS)
def test_paho_over_websocket(
    listeners: Listeners, certs: Certificates, version: int, secure: bool
) -> None:
    address = listeners.wss if secure else listeners.ws
    topic = f"ws/{unique()}"
    tls = client_context(certs) if secure else None
    client = PahoClient(address.host, address.port, version, transport="websockets", tls=tls)
    echoes(client, topic, b"over websocket")


def test_large_messages_both_ways_and_across_transports(listeners: Listeners) -> None:
    """A 600 kB payload (more than one frame's worth of output) from WebSocket to TCP and back."""
    topic = f"ws/{unique()}"
    big = bytes(range(256)) * 2400
    web = PahoClient(listeners.ws.host, listeners.ws.port, transport="websockets")
    tcp = PahoClient(listeners.tcp.host, listeners.tcp.port)
    try:
        web.connect()
        tcp.connect()
        assert web.subscribe(f"{topic}/to-ws", 1) == [1]
        assert tcp.subscribe(f"{topic}/to-tcp", 1) == [1]
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
    client = PahoClient(address.host, address.port, transport="websockets", path=CUSTOM_PATH)
    try:
        client.connect()
    finally:
        client.close()
    with pytest.raises(HandshakeRefused) as refused:
        RawWebSocket(address.host, address.port, path="/mqtt")
    assert refused.value.status == 404


def test_subprotocol_mqtt_is_selected_and_returned(listeners: Listeners) -> None:
    ws = RawWebSocket(listeners.ws.host, listeners.ws.port, protocols=("mqtt",))
    try:
        assert ws.headers["sec-websocket-protocol"] == "mqtt"
        ws.send_binary(connect_packet(unique("sub-proto"), MQTT_311))
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


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the broker closes ``sock`` within ``seconds`` (whatever it sent before)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def test_connections_that_do_not_upgrade_in_time_are_closed(tmp_path: Path) -> None:
    """A socket accepted on a WebSocket listener is closed when it has not become a WebSocket
    within connect_timeout: silent, a request never finished, or only refused requests on a
    kept-alive connection. One that upgrades in time stays, and its CONNECT is then bounded
    by connect_timeout as on TCP."""
    config = tmp_path / "ws.toml"
    config.write_text(
        toml_listener(host="127.0.0.1", port=0, protocol="ws")
        + '\n[broker]\nconnect_timeout = 1.0\n[storage]\nbackend = "memory"\n'
    )
    broker = BrokerProcess(tmp_path, config=config).start()
    try:
        host, port = broker.addresses[0].host, broker.addresses[0].port
        silent = socket.create_connection((host, port), timeout=TIMEOUT)
        partial = socket.create_connection((host, port), timeout=TIMEOUT)
        partial.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        refused = socket.create_connection((host, port), timeout=TIMEOUT)
        refused.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive, 400
        ws = RawWebSocket(host, port, protocols=("mqtt",))
        ws.send_binary(connect_packet(unique("in-time"), MQTT_311))
        assert ws.read_packet() == CONNACK_OK
        for sock in (silent, partial, refused):
            with sock:
                assert _closed_within(sock, 5.0)
        assert broker.wait_for_log(r"no WebSocket upgrade within 1s; closing")
        ws.send_binary(b"\xc0\x00")  # PINGREQ, well past the deadline
        assert ws.read_packet() == b"\xd0\x00"
        ws.close()
        late = RawWebSocket(host, port, protocols=("mqtt",))  # upgraded, never sends CONNECT
        try:
            assert _closed_within(late.sock, 5.0)
        finally:
            late.close()
    finally:
        broker.stop()
