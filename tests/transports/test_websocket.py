"""server/websocket.py: MQTT over WebSocket.

MQTT over WebSocket with paho-mqtt (ws:// and wss://, both protocol versions, a configured
path), and the HTTP side of the handshake: the "mqtt" subprotocol selected and returned
(MQTT-6.0.0-4), refused without it, other paths and plain HTTP refused.

WebSocket framing with a raw client (MQTT 5.0 section 6): packets and frames are independent
(MQTT-6.0.0-2), the broker sends binary frames only, and a text frame closes the connection
(MQTT-6.0.0-1).

``ws_trusted_proxies``: behind a reverse proxy, the client a WebSocket connection is counted and
logged as is the one the proxy names in X-Forwarded-For, and only a trusted proxy is believed.

``forwarded_client`` on its own (chains, several headers, ports, IPv6, malformed entries), then a
real Server whose WebSocket listeners sit behind "a proxy" on 127.0.0.1: with
``max_connections_per_address = 1`` two clients forwarded from different addresses are both
accepted and a second from the same address is refused, naming it; on a listener that trusts
nobody the header changes nothing.

Stopping the broker with WebSocket clients connected: MQTT 5 clients get DISCONNECT 0x8B
(server shutting down) in a binary frame, then the WebSocket close frame; 3.1.1 clients just
the close; the process exits 0 without waiting for anyone.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
import pytest
from aiohttp import WSMsgType
from support.certs import Certificates, client_context
from support.clients import (
    CONNACK_OK,
    MQTT_311,
    PINGREQ,
    PINGRESP,
    TIMEOUT,
    PahoClient,
    connect_packet,
    packet_type,
    publish_packet,
    subscribe_packet,
    unique,
)
from support.launcher import BrokerProcess
from support.listeners import (
    CUSTOM_PATH,
    OP_BINARY,
    OP_CONTINUATION,
    OP_TEXT,
    Listeners,
    RawWebSocket,
    echoes,
    memory_config,
    serving,
    toml_listener,
)

from conformance.websocket import HandshakeRefused
from mqttbroker.config import ListenerConfig, trusted_networks
from mqttbroker.server.websocket import forwarded_client

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


def test_websocket_on_the_configured_path(listeners: Listeners) -> None:
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


GUARD = 10.0  # seconds: a failure guard, never a measured time
TRUSTED = trusted_networks("127.0.0.1, 10.0.0.0/8, 2001:db8::/32")


@pytest.mark.parametrize(
    ("proxy", "headers", "client"),
    [
        ("127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
        ("::ffff:127.0.0.1", ["203.0.113.7"], "203.0.113.7"),  # a dual-stack socket's form
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7"], "203.0.113.7"),  # the client wrote the first
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7, 10.1.2.3"], "203.0.113.7"),  # two proxies
        ("127.0.0.1", ["198.51.100.1", "203.0.113.7, 10.1.2.3"], "203.0.113.7"),  # two headers
        ("127.0.0.1", ["10.9.9.9, 10.1.2.3"], "10.9.9.9"),  # every hop trusted: the first
        ("127.0.0.1", ["203.0.113.7:4711"], "203.0.113.7"),
        ("127.0.0.1", ["[2001:db9::1]:4711"], "2001:db9::1"),
        ("2001:db8::5", ["2001:db9::1"], "2001:db9::1"),
        ("127.0.0.1", ["203.0.113.7,"], "203.0.113.7"),  # empty entries are skipped
        ("127.0.0.1", ["", "203.0.113.7"], "203.0.113.7"),
        ("127.0.0.1", [""], None),
        ("127.0.0.1", ["::ffff:203.0.113.7"], "203.0.113.7"),  # one client, one address
        ("127.0.0.1", ["203.0.113.7, unknown"], None),  # malformed: not believed at all
        ("127.0.0.1", ["[203.0.113.7]junk"], None),
        ("127.0.0.1", ["[2001:db9::1"], None),
        ("127.0.0.1", ["203.0.113.7:http"], None),
        ("127.0.0.1", ["not-an-address"], None),
        ("127.0.0.1", [], None),  # no header
        ("192.0.2.50", ["203.0.113.7"], None),  # not a trusted proxy: its header counts for nothing
    ],
)
def test_forwarded_client(proxy: str, headers: list[str], client: str | None) -> None:
    assert forwarded_client(proxy, headers, TRUSTED) == client


def test_forwarded_client_without_trusted_proxies() -> None:
    assert forwarded_client("127.0.0.1", ["203.0.113.7"], ()) is None


async def _mqtt_over_ws(
    session: aiohttp.ClientSession, port: int, forwarded: str
) -> tuple[aiohttp.ClientWebSocketResponse, bytes | None]:
    """Connect through WebSocket with this X-Forwarded-For; the CONNACK, or None if closed."""
    ws = await session.ws_connect(
        f"ws://127.0.0.1:{port}/mqtt",
        protocols=("mqtt",),
        headers={"X-Forwarded-For": forwarded},
    )
    await ws.send_bytes(connect_packet(unique("proxied"), MQTT_311))
    answer = await asyncio.wait_for(ws.receive(), GUARD)
    if answer.type is WSMsgType.BINARY:
        return ws, answer.data
    assert answer.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED), answer
    return ws, None


def test_limits_and_logs_count_the_forwarded_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = memory_config(
        tmp_path,
        ListenerConfig(port=0, protocol="ws", ws_trusted_proxies="127.0.0.1", allow_anonymous=True),
        ListenerConfig(port=0, protocol="ws"),  # trusts nobody
        # Behind a proxy, a loopback listener serves whoever the proxy serves: anonymous
        # clients are refused unless allowed (3.1.1 CONNACK 5, not authorized).
        ListenerConfig(port=0, protocol="ws", ws_trusted_proxies="127.0.0.1"),
    )
    config.broker.max_connections_per_address = 1

    async def scenario() -> dict[str, Any]:
        server, (behind, plain, guarded) = await serving(config)
        seen: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            sockets = []
            try:
                for name, port, forwarded in [
                    ("first", behind, "203.0.113.7"),
                    ("other", behind, "198.51.100.9, 203.0.113.8"),
                    ("again", behind, "203.0.113.7"),
                    ("plain-first", plain, "192.0.2.1"),
                    ("plain-second", plain, "192.0.2.2"),
                    ("anonymous", guarded, "192.0.2.3"),
                ]:
                    ws, connack = await _mqtt_over_ws(session, port, forwarded)
                    sockets.append(ws)
                    seen[name] = connack
                seen["peers"] = sorted(conn.peer for conn in server.broker.connections)
            finally:
                for ws in sockets:
                    await ws.close()
                await server.stop()
        return seen

    with caplog.at_level(logging.INFO, logger="mqttbroker"):
        seen = asyncio.run(scenario())
    assert seen["first"] == CONNACK_OK and seen["other"] == CONNACK_OK
    assert seen["again"] is None  # the same client address behind the proxy: over the limit
    # Without trusted proxies both come from 127.0.0.1 whatever the header says.
    assert seen["plain-first"] == CONNACK_OK and seen["plain-second"] is None
    assert seen["anonymous"] == b"\x20\x02\x00\x05"
    forwarded = [p for p in seen["peers"] if "(via 127.0.0.1:" in p]
    assert sorted(p.partition(" ")[0] for p in forwarded) == ["203.0.113.7", "203.0.113.8"]
    assert "max_connections_per_address (1) reached for 203.0.113.7" in caplog.text
    assert "max_connections_per_address (1) reached for 127.0.0.1" in caplog.text


CONNACK, DISCONNECT = 2, 14


def test_sigterm_with_websocket_clients(tmp_path: Path, certs: Certificates) -> None:
    config = tmp_path / "shutdown.toml"
    config.write_text(
        toml_listener(port=0)
        + toml_listener(port=0, protocol="ws")
        + toml_listener(
            port=0,
            protocol="ws",
            tls_cert_file=str(certs.server_cert),
            tls_key_file=str(certs.server_key),
        )
    )
    broker = BrokerProcess(tmp_path / "data", config=config, listeners=3, extra_args=("--memory",))
    broker.start()
    _tcp, ws_address, wss_address = broker.addresses
    clients: list[RawWebSocket] = []
    try:
        v5 = RawWebSocket(ws_address.host, ws_address.port)
        v5_tls = RawWebSocket(wss_address.host, wss_address.port, tls=client_context(certs))
        v311 = RawWebSocket(ws_address.host, ws_address.port)
        clients += [v5, v5_tls, v311]
        for client, version in ((v5, 5), (v5_tls, 5), (v311, 4)):
            client.send_binary(connect_packet(unique("bye"), version=version))
            assert packet_type(client.read_packet()) == CONNACK
        assert broker.proc is not None
        broker.proc.terminate()
        for client in (v5, v5_tls):
            disconnect = client.read_packet()
            assert packet_type(disconnect) == DISCONNECT and disconnect[2] == 0x8B, disconnect
            assert client.wait_closed() == 1000
        with pytest.raises(EOFError):
            v311.read_packet()
        assert v311.close_code == 1000
        assert broker.stop() == 0
    finally:
        for client in clients:
            client.close()
        broker.stop()
    assert broker.wait_for_log(r"\bstopped\b"), broker.log_text()
    broker.assert_clean_log()
