"""``proxy_protocol`` behind a real HAProxy (Debian's ``haproxy``, installed by .ci/run): one
frontend sends the version 2 header (``send-proxy-v2``), another version 1 (``send-proxy``).
paho-mqtt subscribes through the first from 127.0.0.3, mosquitto_pub publishes through the
second; the message arrives, and the broker logs each client by the address HAProxy names, the
balancer's own beside it. A client that skips HAProxy is closed: it sends no header. A third
frontend passes TLS through to a mutual-TLS listener (header in clear, then the client's own
handshake): mosquitto_pub with a client certificate publishes through it."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.certs import Certificates
from support.clients import MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.external_tools import program
from support.launcher import BrokerProcess, free_port, stop_process, wait_port
from support.listeners import toml_listener

pytestmark = [pytest.mark.needs_haproxy, pytest.mark.needs_mosquitto]

HAPROXY_CONFIG = """\
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s

frontend v2
    bind 127.0.0.1:{v2}
    default_backend broker_v2

backend broker_v2
    server broker 127.0.0.1:{broker} send-proxy-v2

frontend v1
    bind 127.0.0.1:{v1}
    default_backend broker_v1

backend broker_v1
    server broker 127.0.0.1:{broker} send-proxy

frontend tls
    bind 127.0.0.1:{tls}
    default_backend broker_tls

backend broker_tls
    server broker 127.0.0.1:{broker_tls} send-proxy-v2
"""


@pytest.fixture
def broker(tmp_path: Path, certs: Certificates) -> Iterator[BrokerProcess]:
    config = tmp_path / "proxied.toml"
    plain = toml_listener(
        host="127.0.0.1", port=0, proxy_protocol="127.0.0.1", allow_anonymous=True
    )
    mtls = toml_listener(
        host="127.0.0.1",
        port=0,
        proxy_protocol="127.0.0.1",
        allow_anonymous=True,
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_ca_file=certs.ca,
        tls_require_certificate=True,
        tls_certificate_username="cn",
    )
    config.write_text(plain + "\n" + mtls + '\n[storage]\nbackend = "memory"\n')
    run = BrokerProcess(tmp_path, config=config, listeners=2).start()
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture
def haproxy(tmp_path: Path, broker: BrokerProcess) -> Iterator[tuple[int, int, int]]:
    binary = program("haproxy")
    v2, v1, tls = free_port(), free_port(), free_port()
    config = tmp_path / "haproxy.cfg"
    plain, mtls = broker.addresses
    config.write_text(
        HAPROXY_CONFIG.format(v2=v2, v1=v1, tls=tls, broker=plain.port, broker_tls=mtls.port)
    )
    proc = subprocess.Popen(
        [binary, "-db", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for port in (v2, v1, tls):
            wait_port(port, proc)
        yield v2, v1, tls
    finally:
        stop_process(proc)
        if proc.stderr is not None:
            proc.stderr.close()


def publish_through(port: int, pub: list[str], topic: str, payload: bytes) -> None:
    """paho subscribes through HAProxy's version 2 frontend ``port`` from 127.0.0.3, then
    mosquitto_pub (arguments ``pub``) publishes ``payload`` to ``topic``; it must arrive."""
    sub = PahoClient("127.0.0.1", port, bind_address="127.0.0.3")
    try:
        sub.connect()
        assert sub.subscribe("proxied/#", 1) == [1]
        published = subprocess.run(
            [
                program("mosquitto_pub"),
                *pub,
                "-q",
                "1",
                "-i",
                unique("pub"),
                "-t",
                topic,
                "-m",
                payload,
            ],
            capture_output=True,
            timeout=TIMEOUT,
        )
        assert published.returncode == 0, published.stderr
        messages = sub.wait_messages(1)
        assert [(m.topic, m.payload) for m in messages] == [(topic, payload)]
    finally:
        sub.close()


def test_clients_through_haproxy_are_named_by_its_header(
    broker: BrokerProcess, haproxy: tuple[int, int, int], certs: Certificates
) -> None:
    v2, v1, tls = haproxy
    mark = broker.log_mark()
    plain = ["-h", "127.0.0.1", "-p", str(v1), "-V", "mqttv311"]
    publish_through(v2, plain, "proxied/haproxy", b"through HAProxy")
    via = r" \(via 127\.0\.0\.1:\d+\)"
    assert broker.wait_for_log(
        r"connected from 127\.0\.0\.3:\d+" + via + r" \(MQTT 5\.0", since=mark
    )
    assert broker.wait_for_log(
        r"connected from 127\.0\.0\.1:\d+" + via + r" \(MQTT 3\.1\.1", since=mark
    )

    # TLS passed through: the broker checks the client certificate, whose CN names the user.
    secure = ["-h", "localhost", "-p", str(tls), "-V", "mqttv5", "--cafile", str(certs.ca)]
    certificate = ["--cert", str(certs.client_cert), "--key", str(certs.client_key)]
    publish_through(v2, secure + certificate, "proxied/tls", b"TLS through HAProxy")
    without = subprocess.run(  # no client certificate: refused in the handshake
        [program("mosquitto_pub"), *secure, "-t", "proxied/tls", "-m", "no certificate"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert without.returncode != 0

    # Straight to the broker, past HAProxy: no header, so the connection is closed unanswered.
    with socket.create_connection(("127.0.0.1", broker.addresses[0].port), TIMEOUT) as direct:
        direct.settimeout(TIMEOUT)
        direct.sendall(connect_packet(unique("direct"), MQTT_311))
        try:
            answer = direct.recv(16)
        except ConnectionResetError:  # closed with the CONNECT unread: a reset
            answer = b""
        assert answer == b""
    assert broker.wait_for_log(r"closed: no PROXY protocol header", since=mark)
    broker.assert_clean_log()
