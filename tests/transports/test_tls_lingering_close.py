"""The lingering close over TLS: a client still sending when the broker closes its connection
reads the DISCONNECT, and the TLS close_notify after it, instead of a reset."""

from __future__ import annotations

import os
import socket

import pytest
from support.certs import Certificates, client_context
from support.clients import unique
from support.transports import Listeners

from conformance.mqtt import CONNACK, PUBREC, PUBREL, Client, P, ack, connect, publish


def test_receive_maximum_exceeded_over_tls_heard_while_still_sending(
    listeners: Listeners, certs: Certificates
) -> None:
    """A client sends Receive Maximum + 1 QoS 2 PUBLISHes over TLS and answers each PUBREC with
    PUBREL as it reads it, one at a time: its PUBRELs reach a connection the broker is closing.
    It must read the DISCONNECT 0x93 and then the end of the stream: closing at once answers
    its next segments with a reset, and its next write fails or the reset discards what it has
    not read. The broker then closes the socket soon (it lingers about 2 s), not when the
    client closes or the loop's SSL shutdown timeout (30 s) ends. [MQTT-3.3.4-7]"""
    client = Client((listeners.tls.host, listeners.tls.port))
    client.sock = client_context(certs).wrap_socket(client.sock, server_hostname="localhost")
    try:
        client.send(connect(unique("linger")))
        connack = client.expect(CONNACK)
        assert connack.reason_code == 0
        maximum = connack.prop(P.RECEIVE_MAXIMUM, 65535)
        assert maximum <= 5000, f"Receive Maximum {maximum} too large to exceed quickly"
        topic = f"linger/{unique()}"
        burst = b"".join(publish(topic, b"x", qos=2, packet_id=i + 1) for i in range(maximum + 1))
        client.recv_size = 4  # one PUBREC per read, as a client reading packet by packet does
        client.send(burst)
        for _ in range(maximum):
            rec = client.expect(PUBREC)
            assert rec.reason_code < 0x80
            # A client library stops at a failed write and never reads what came before it.
            try:
                client.send(ack(PUBREL, rec.packet_id))
            except OSError as exc:
                raise AssertionError(f"{exc!r} before the DISCONNECT 0x93 was read") from None
        client.expect_disconnect({0x93}, required=True)  # and the close_notify after it
        # The client neither closes nor sends its close_notify: the TCP connection under the
        # TLS session must still end, with a FIN or a reset.
        with socket.socket(fileno=os.dup(client.sock.fileno())) as raw:
            raw.settimeout(10)
            try:
                rest = raw.recv(1)
            except TimeoutError:
                pytest.fail("the broker still holds the connection 10 s after its DISCONNECT")
            except ConnectionResetError:
                rest = b""
            assert rest == b""
    finally:
        client.sock.close()
