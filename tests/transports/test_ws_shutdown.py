"""Stopping the broker with WebSocket clients connected: MQTT 5 clients get DISCONNECT 0x8B
(server shutting down) in a binary frame, then the WebSocket close frame; 3.1.1 clients just
the close; the process exits 0 without waiting for anyone."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.certs import Certificates, client_context
from support.clients import connect_packet, packet_type, unique
from support.launcher import BrokerProcess
from support.transports import RawWebSocket, toml_listener

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
