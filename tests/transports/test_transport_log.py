"""The "connected" log line names the transport and the user: MQTT over TCP, TLS, WebSocket and
WebSocket+TLS, and the user a client certificate names (mutual TLS)."""

from __future__ import annotations

import re

import pytest
from support.certs import Certificates, client_context
from support.clients import PahoClient, unique
from support.listeners import Listeners


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
    client = PahoClient(
        address.host, address.port, client_id=client_id, transport=transport, tls=tls
    )
    try:
        client.connect()
    finally:
        client.close()
    pattern = (
        rf"client {re.escape(client_id)} connected from \S+ \(MQTT 5\.0 over {kind}, user {user},"
    )
    assert listeners.broker.wait_for_log(pattern, since=mark), listeners.broker.log_text()[-2000:]
