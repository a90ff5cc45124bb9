"""server/tls.py: MQTT over TLS.

MQTT over TLS: paho-mqtt and mosquitto_pub/mosquitto_sub with the test CA, the minimum TLS
version and the cipher list of a listener, and messages crossing from TLS to plain TCP.

Mutual TLS: a listener that requires a client certificate signed by its CA accepts such a
client (paho-mqtt, mosquitto_pub, WebSocket+TLS) and refuses a client without a certificate or
with one from another CA.

The lingering close over TLS: a client still sending when the broker closes its connection
reads the DISCONNECT, and the TLS close_notify after it, instead of a reset.
"""

from __future__ import annotations

import os
import socket
import ssl

import paho.mqtt.client as mqtt
import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.launcher import mosquitto_client
from support.listeners import TLS12_CIPHER, Listeners, RawWebSocket, echoes

from conformance.mqtt import CONNACK, PUBREC, PUBREL, Client, P, ack, connect, publish

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
