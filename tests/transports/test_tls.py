"""MQTT over TLS: paho-mqtt and mosquitto_pub/mosquitto_sub with the test CA, the minimum TLS
version and the cipher list of a listener, and messages crossing from TLS to plain TCP."""

from __future__ import annotations

import socket
import ssl

import paho.mqtt.client as mqtt
import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.launcher import mosquitto_client
from support.transports import TLS12_CIPHER, Listeners, echoes

VERSIONS = [pytest.param(mqtt.MQTTv5, id="v5"), pytest.param(mqtt.MQTTv311, id="v311")]


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_over_tls(listeners: Listeners, certs: Certificates, version: int) -> None:
    topic = f"tls/{unique()}"
    client = PahoClient(listeners.tls.host, listeners.tls.port, version, tls=client_context(certs))
    echoes(client, topic, b"over tls")


def test_tls_and_plain_tcp_share_one_broker(listeners: Listeners, certs: Certificates) -> None:
    topic = f"tls/{unique()}"
    plain = PahoClient(listeners.tcp.host, listeners.tcp.port)
    secure = PahoClient(listeners.tls13.host, listeners.tls13.port, tls=client_context(certs))
    try:
        plain.connect()
        assert plain.subscribe(topic, 1) == [1]
        secure.connect()
        secure.publish(topic, b"from tls 1.3", 1)
        [message] = plain.wait_messages(1)
        assert message.payload == b"from tls 1.3"
    finally:
        plain.close()
        secure.close()


@pytest.mark.needs_mosquitto
def test_mosquitto_clients_with_cafile(listeners: Listeners, certs: Certificates) -> None:
    """mosquitto_pub --cafile leaves a retained message; mosquitto_sub --cafile receives it (so the
    subscriber needs no synchronisation with the publisher), both over TLS."""
    topic = f"tls/{unique()}"
    port = listeners.tls.port
    ca = ("--cafile", str(certs.ca))
    pub = ("-V", "mqttv5", "-t", topic, "-m", "via mosquitto", "-q", "1", "-r")
    mosquitto_client("mosquitto_pub", "localhost", port, *ca, *pub, timeout=TIMEOUT)
    sub = ("-V", "mqttv311", "-t", topic, "-C", "1", "-W", "10", "-F", "%r %t %p")
    got = mosquitto_client("mosquitto_sub", "localhost", port, *ca, *sub, timeout=TIMEOUT + 5)
    assert got.stdout.strip() == f"1 {topic} via mosquitto"
    clear = ("-t", topic, "-n", "-r")
    mosquitto_client("mosquitto_pub", "localhost", port, *ca, *clear, timeout=TIMEOUT)


@pytest.mark.needs_mosquitto
def test_mosquitto_sub_refuses_a_server_it_does_not_trust(
    listeners: Listeners, certs: Certificates
) -> None:
    """The same client with the server certificate as its CA file fails: the test above really
    verified the chain."""
    rogue = ("--cafile", str(certs.rogue_cert))
    sub = mosquitto_client(
        "mosquitto_sub",
        "localhost",
        listeners.tls.port,
        *rogue,
        *("-t", "x", "-C", "1", "-W", "5"),
        timeout=TIMEOUT + 5,
        check=False,
    )
    assert sub.returncode != 0


def _handshake(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        return context.wrap_socket(sock, server_hostname="localhost")
    except BaseException:
        sock.close()
        raise


def test_tls_1_2_client_gets_the_configured_cipher(
    listeners: Listeners, certs: Certificates
) -> None:
    context = client_context(certs, maximum=ssl.TLSVersion.TLSv1_2)
    with _handshake(listeners.tls.port, context) as tls:
        assert tls.version() == "TLSv1.2"
        cipher = tls.cipher()
        assert cipher is not None and cipher[0] == TLS12_CIPHER
        tls.sendall(connect_packet(unique("raw"), MQTT_311))
        assert tls.recv(4) == CONNACK_OK


def test_tls_1_2_client_without_the_configured_cipher_is_refused(
    listeners: Listeners, certs: Certificates
) -> None:
    context = client_context(
        certs, maximum=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES256-GCM-SHA384"
    )
    with pytest.raises(ssl.SSLError):
        _handshake(listeners.tls.port, context).close()


def test_minimum_version_1_3_refuses_a_tls_1_2_client(
    listeners: Listeners, certs: Certificates
) -> None:
    with pytest.raises(ssl.SSLError):
        _handshake(
            listeners.tls13.port, client_context(certs, maximum=ssl.TLSVersion.TLSv1_2)
        ).close()
    with _handshake(listeners.tls13.port, client_context(certs)) as tls:
        assert tls.version() == "TLSv1.3"


def test_plain_mqtt_to_a_tls_listener_gets_no_connack(listeners: Listeners) -> None:
    """A client speaking MQTT in the clear to a TLS port is not served."""
    with socket.create_connection(("127.0.0.1", listeners.tls.port), timeout=TIMEOUT) as sock:
        sock.sendall(connect_packet(unique("clear"), MQTT_311))
        try:
            data = sock.recv(64)
        except ConnectionError:
            data = b""
        assert not data.startswith(b"\x20")
