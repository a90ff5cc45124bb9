"""The benchmark's C TLS opener (benchmarks/c/open_many_tls.c, driven by
benchmarks/tls_fleet.py), which sets up scenario 6's connections over TLS with ``--tls``:
against our broker and Mosquitto, each serving the run's certificate (benchmarks/tlscerts.py)
on a free loopback port, it sets up 50 MQTT connections over TLS 1.3 and 1.2, with sessions
resumed or not, which the broker then holds until the opener closes them; it counts the PUBLISH
packets they were sent after their SUBACKs, one longer than its read buffer among them; and a
certificate its CA file did not sign makes it fail, saying so. A few seconds; no timed
assertions."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import c_programs

from benchmarks import brokers as br
from benchmarks import tlscerts, wire
from benchmarks.tls_fleet import CFleet

pytestmark = [
    pytest.mark.needs_openssl,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

N = 50


@pytest.fixture(scope="module")
def tls_opener(tmp_path_factory: pytest.TempPathFactory) -> str:
    return c_programs.build("open_many_tls", tmp_path_factory)


@pytest.fixture(scope="module")
def certs() -> Iterator[tuple[str, str]]:
    # (not under pytest's directory, which Mosquitto, dropping root for its user, cannot enter)
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as directory:
        yield tlscerts.make(directory, "ec")


@pytest.fixture(
    scope="module", params=["ours", pytest.param("mosquitto", marks=pytest.mark.needs_mosquitto)]
)
def tls_broker(request: pytest.FixtureRequest, certs: tuple[str, str]) -> Iterator[br.BrokerHandle]:
    """Our broker or Mosquitto with one TLS listener on a free loopback port, as the benchmark
    starts them (benchmarks/brokers.py)."""
    saved, br.TLS = br.TLS, certs
    try:
        handle = br.start_ours(False) if request.param == "ours" else br.start_mosquitto(False)
    finally:
        br.TLS = saved
    try:
        yield handle
    finally:
        handle.stop()


def _fds(pid: int | None) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _fleet(
    opener: str, broker: br.BrokerHandle, ca: str, version: str, resumption: str, tag: str
) -> CFleet:
    requests = [(wire.connect(f"tls-{tag}-{i}"), False) for i in range(N)]
    return CFleet(opener, broker.host, broker.port, requests, ca, version, resumption, 10, 30)


@pytest.mark.parametrize("resumption", ["off", "slot"])
@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_the_broker_holds_the_connections_set_up_over_tls(
    tls_opener: str,
    tls_broker: br.BrokerHandle,
    certs: tuple[str, str],
    version: str,
    resumption: str,
) -> None:
    fleet = _fleet(tls_opener, tls_broker, certs[0], version, resumption, f"{version}{resumption}")
    try:
        # slot: a priming round gave every connection a session (a TLS 1.3 ticket) to offer
        assert fleet.sessions == (N if resumption == "slot" else 0)
        tls_broker.wait_idle(10)
        before = _fds(tls_broker.pid)
        stormed = fleet.storm()
        assert stormed.connections == N and stormed.elapsed_s > 0
        assert stormed.resumed == (N if resumption == "slot" else 0)
        expected = 1024 if tls_broker.name == "ours" else 65535  # its Receive Maximum, or none
        assert fleet.receive_max == [expected] * N
        assert _fds(tls_broker.pid) >= before + N  # held open by the broker, idle
        assert fleet.close() == 0  # none dropped meanwhile
    finally:
        fleet.kill()


def _publish_retained(broker: br.BrokerHandle, ca: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish each (topic, payload) retained at QoS 1 over TLS, waiting for every PUBACK."""
    context = tlscerts.client_context(ca, "1.3")
    with context.wrap_socket(
        socket.create_connection((broker.host, broker.port), 10), server_hostname=broker.host
    ) as pub:
        pub.sendall(wire.connect("tls-retainer"))
        data = b""
        for packet_id, (topic, payload) in enumerate(messages, 1):
            packet = wire.publish(topic, payload, 1, packet_id)
            pub.sendall(bytes([packet[0] | 1]) + packet[1:])  # RETAIN
        while sum(f[0] >> 4 == 4 for f in _frames(data)) < len(messages):  # PUBACKs
            chunk = pub.recv(4096)
            assert chunk, "the broker closed the publisher"
            data += chunk
        pub.sendall(wire.disconnect())


def _frames(data: bytes) -> list[tuple[int, int, int]]:
    frames, pos = [], 0
    while (frame := wire.next_frame(data, pos)) is not None:
        frames.append(frame)
        pos = frame[2]
    return frames


def test_the_opener_counts_the_publishes_after_the_suback(
    tls_opener: str, tls_broker: br.BrokerHandle, certs: tuple[str, str]
) -> None:
    retained = [("tls-count/a", b"a" * 10), ("tls-count/b", b"b" * 3000), ("tls-count/c", b"c")]
    _publish_retained(tls_broker, certs[0], retained)
    requests = [
        (wire.connect(f"tls-count-{i}") + wire.subscribe(1, [("tls-count/#", 0)]), True)
        for i in range(N)
    ]
    fleet = CFleet(tls_opener, tls_broker.host, tls_broker.port, requests, certs[0], "1.3")
    try:
        fleet.storm()
        tls_broker.wait_idle(10)  # (each SUBACK's retained messages written)
        assert fleet.close() == 0
        assert fleet.publishes == len(retained) * N  # the 3 KiB one counted once, skipped
    finally:
        fleet.kill()
        _publish_retained(tls_broker, certs[0], [(topic, b"") for topic, _ in retained])


def test_a_certificate_the_ca_did_not_sign_fails_clearly(
    tls_opener: str, tls_broker: br.BrokerHandle, tmp_path: Path
) -> None:
    other_ca, _ = tlscerts.make(str(tmp_path), "ec")  # another self-signed certificate
    fleet = _fleet(tls_opener, tls_broker, other_ca, "1.3", "off", "wrong-ca")
    try:
        with pytest.raises(
            ConnectionError, match="TLS handshake failed: certificate verify failed"
        ):
            fleet.storm()
    finally:
        fleet.kill()
