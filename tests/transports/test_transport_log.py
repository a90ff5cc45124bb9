"""The "connected" log line names the transport and the user: MQTT over TCP, TLS, WebSocket and
WebSocket+TLS, and the user a client certificate names (mutual TLS)."""

from __future__ import annotations

import re

import paho.mqtt.client as mqtt
import pytest
from transport_support import Certificates, Listeners, Paho, client_context, unique


@pytest.mark.parametrize(
    ("name", "transport", "kind", "user"),
    [
        ("tcp", "tcp", "TCP", "None"),
        ("tls", "tcp", "TLS", "None"),
        ("ws", "websockets", "WebSocket", "None"),
        ("wss", "websockets", "WebSocket\\+TLS", "None"),
        ("mtls", "tcp", "TLS", "'alice'"),
    ],
)
def test_connected_line_names_transport_and_user(
    listeners: Listeners, certs: Certificates, name: str, transport: str, kind: str, user: str
) -> None:
    address = getattr(listeners, name)
    tls = None
    if name != "tcp" and name != "ws":
        tls = client_context(certs, with_cert=name == "mtls")
    client_id = unique(f"log-{name}")
    mark = listeners.broker.log_mark()
    client = Paho(mqtt.MQTTv5, transport, tls=tls, client_id=client_id)
    try:
        assert client.connect(address.host, address.port) == 0
    finally:
        client.close()
    pattern = (
        rf"client {re.escape(client_id)} connected from \S+ \(MQTT 5\.0 over {kind}, user {user},"
    )
    assert listeners.broker.wait_for_log(pattern, mark), listeners.broker.log_text()[-2000:]
