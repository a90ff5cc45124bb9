"""Mutual TLS: a listener that requires a client certificate signed by its CA accepts such a
client (paho-mqtt, mosquitto_pub, WebSocket+TLS) and refuses a client without a certificate or
with one from another CA."""

from __future__ import annotations

import socket
import ssl

import paho.mqtt.client as mqtt
import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.launcher import mosquitto_client
from support.transports import Listeners, RawWebSocket, echoes


@pytest.mark.parametrize("version", [mqtt.MQTTv5, mqtt.MQTTv311], ids=["v5", "v311"])
def test_paho_with_a_client_certificate_is_accepted(
    listeners: Listeners, certs: Certificates, version: int
) -> None:
    topic = f"mtls/{unique()}"
    client = PahoClient(
        listeners.mtls.host, listeners.mtls.port, version, tls=client_context(certs, with_cert=True)
    )
    echoes(client, topic, b"with a certificate")


def _mqtt_connect_answer(port: int, context: ssl.SSLContext) -> bytes | Exception:
    """What a raw TLS client gets for its CONNECT: the first bytes of the answer, or the
    exception that ended the attempt (a refused handshake shows up in the handshake with TLS
    1.2, and at the first read with TLS 1.3, where the server checks the certificate after the
    client considers the handshake done)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        tls = context.wrap_socket(sock, server_hostname="localhost")
        tls.sendall(connect_packet(unique("mtls"), MQTT_311))
        data = tls.recv(4)
        return data
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        return exc
    finally:
        sock.close()


@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_2, None], ids=["tls1.2", "tls1.3"])
def test_client_certificate_accepted_and_refused(
    listeners: Listeners, certs: Certificates, maximum: ssl.TLSVersion | None
) -> None:
    port = listeners.mtls.port
    accepted = _mqtt_connect_answer(port, client_context(certs, True, maximum=maximum))
    assert accepted == CONNACK_OK
    without = _mqtt_connect_answer(port, client_context(certs, maximum=maximum))
    assert isinstance(without, Exception) or without == b"", without
    rogue = _mqtt_connect_answer(port, client_context(certs, rogue=True, maximum=maximum))
    assert isinstance(rogue, Exception) or rogue == b"", rogue


@pytest.mark.needs_mosquitto
def test_mosquitto_pub_with_and_without_a_client_certificate(
    listeners: Listeners, certs: Certificates
) -> None:
    topic = f"mtls/{unique()}"
    subscriber = PahoClient(listeners.tcp.host, listeners.tcp.port)
    try:
        subscriber.connect()
        assert subscriber.subscribe(topic, 1) == [1]
        common = ("localhost", listeners.mtls.port, "--cafile", str(certs.ca))
        message = ("-t", topic, "-q", "1", "-m")
        refused = mosquitto_client(
            "mosquitto_pub", *common, *message, "no certificate", timeout=TIMEOUT, check=False
        )
        assert refused.returncode != 0
        certificate = ("--cert", str(certs.client_cert), "--key", str(certs.client_key))
        mosquitto_client(
            "mosquitto_pub", *common, *certificate, *message, "certificate", timeout=TIMEOUT
        )
        [message] = subscriber.wait_messages(1)
        assert message.payload == b"certificate"
    finally:
        subscriber.close()


def test_websocket_tls_with_and_without_a_client_certificate(
    listeners: Listeners, certs: Certificates
) -> None:
    address = listeners.wss_mtls
    ws = RawWebSocket(address.host, address.port, tls=client_context(certs, with_cert=True))
    try:
        ws.send_binary(connect_packet(unique("wss-mtls"), MQTT_311))
        assert ws.read_packet() == CONNACK_OK
    finally:
        ws.close()
    with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
        # TLS 1.3: the refusal arrives as an alert when the client reads the HTTP answer
        RawWebSocket(address.host, address.port, tls=client_context(certs))
