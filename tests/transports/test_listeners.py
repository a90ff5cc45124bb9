"""server/listeners.py: the [[listener]] tables and what each listener hands the broker.

[[listener]] settings: values applied, errors naming the file and the key (missing and broken
certificate files, impossible combinations), ``--ws-port``, and the log line of every kind.

Each listener's rules reach the broker as a ListenerPolicy handed over with every connection
it accepts; the configuration is read, never rewritten, and the broker reads no listener
setting of its own.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from support.certs import Certificates
from support.clients import PahoClient, connect_packet
from support.launcher import BrokerProcess, run_broker
from support.listeners import memory_config, toml_listener

from mqttbroker.broker.policy import ListenerPolicy
from mqttbroker.config import ConfigError, ListenerConfig, load
from mqttbroker.security import listener_policy
from mqttbroker.server.app import Server


def test_listener_values_are_applied(tmp_path: Path, certs: Certificates) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(
        toml_listener(port=1883)
        + toml_listener(
            host="0.0.0.0",
            port=8884,
            protocol="ws",
            ws_path="/ws",
            tls_cert_file=str(certs.server_cert),
            tls_key_file=str(certs.server_key),
            tls_min_version="1.3",
            tls_ciphers="ECDHE-ECDSA-AES128-GCM-SHA256",
            tls_ca_file=str(certs.ca),
            tls_require_certificate=True,
            tls_certificate_username="san",
        )
    )
    first, second = load(path).listeners
    assert first == ListenerConfig(port=1883)
    assert (first.kind, second.kind) == ("MQTT over TCP", "MQTT over WebSocket+TLS")
    assert second.host == "0.0.0.0" and second.port == 8884
    assert (second.protocol, second.ws_path, second.tls_min_version) == ("ws", "/ws", "1.3")
    assert second.tls_ca_file == str(certs.ca) and second.tls_require_certificate
    assert second.tls_certificate_username == "san"


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"protocol": "http"}, 'listener[0].protocol: expected "mqtt" or "ws"'),
        ({"protocol": "ws", "ws_path": "mqtt"}, "listener[0].ws_path: must start with '/'"),
        ({"tls_min_version": "1.1"}, 'listener[0].tls_min_version: expected "1.2" or "1.3"'),
        ({"tls_certificate_username": "dn"}, "listener[0].tls_certificate_username: expected"),
        ({"tls_key_file": "k.pem"}, "listener[0].tls_key_file: needs tls_cert_file"),
        ({"tls_ca_file": "ca.pem"}, "listener[0].tls_ca_file: needs tls_cert_file"),
        ({"tls_require_certificate": "yes"}, "listener[0].tls_require_certificate: expected true"),
        ({"tls_cert_file": "/nonexistent/server.pem"}, "listener[0].tls_cert_file: file not found"),
        ({"backlog": 0}, "listener[0].backlog: must be between 1 and 65535"),
        ({"backlog": 65536}, "listener[0].backlog: must be between 1 and 65535"),
        ({"backlog": "many"}, "listener[0].backlog: expected an integer"),
    ],
)
def test_listener_errors_name_the_file_and_the_key(
    tmp_path: Path, table: dict[str, object], expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml_listener(**table))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_tls_combinations_and_files(tmp_path: Path, certs: Certificates) -> None:
    tls = {"tls_cert_file": str(certs.server_cert), "tls_key_file": str(certs.server_key)}
    cases = [
        ({**tls, "tls_require_certificate": True}, "tls_require_certificate: needs tls_ca_file"),
        ({**tls, "tls_certificate_username": "cn"}, "tls_certificate_username: needs tls_ca_file"),
        ({**tls, "tls_key_file": str(tmp_path / "no.key")}, "tls_key_file: file not found"),
        ({**tls, "tls_ca_file": str(tmp_path / "no-ca.pem")}, "tls_ca_file: file not found"),
    ]
    for index, (table, expected) in enumerate(cases):
        path = tmp_path / f"bad{index}.toml"
        path.write_text(toml_listener(port=1883) + toml_listener(port=8883, **table))  # type: ignore[arg-type]
        with pytest.raises(ConfigError) as info:
            load(path)
        assert str(info.value).startswith(f"{path}: listener[1].{expected}"), info.value


def listen_backlogs() -> dict[int, int]:
    """The backlog of every IPv4 TCP socket listening on this machine, by port, as the kernel
    reports it (sock_diag over netlink: idiag_wqueue of a listening socket is its backlog)."""
    request = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << 10)
    request += bytes(48)  # inet_diag_sockid: any
    header = struct.pack("=IHHII", 16 + len(request), 20, 0x301, 1, 0)  # SOCK_DIAG_BY_FAMILY, dump
    backlogs: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as diag:  # NETLINK_SOCK_DIAG
        diag.send(header + request)
        while True:
            data, pos = diag.recv(1 << 16), 0
            while pos < len(data):
                length, kind = struct.unpack_from("=IH", data, pos)
                if kind == 3:  # NLMSG_DONE
                    return backlogs
                assert kind == 20, f"sock_diag answered message type {kind}"
                (port,) = struct.unpack_from(">H", data, pos + 20)
                (backlogs[port],) = struct.unpack_from("=I", data, pos + 76)
                pos += (length + 3) & ~3


def kernel_somaxconn() -> int:
    """The kernel's cap on every listening socket's backlog, read here, not from the broker."""
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def test_backlog_is_applied_to_every_kind_of_listener(tmp_path: Path) -> None:
    """Each listener's backlog reaches its listening socket, on the broker's own TCP transport,
    behind the PROXY protocol and on asyncio's server (WebSocket); 1024 when not set. The kernel
    caps each at net.core.somaxconn."""
    somaxconn = kernel_somaxconn()
    path = tmp_path / "backlog.toml"
    path.write_text(
        toml_listener(port=0, backlog=300)
        + toml_listener(port=0, backlog=200, protocol="ws")
        + toml_listener(port=0, backlog=150, proxy_protocol="127.0.0.1")
        + toml_listener(port=0)
    )
    broker = BrokerProcess(
        tmp_path / "data", config=path, listeners=4, extra_args=("--memory",)
    ).start()
    try:
        backlogs = listen_backlogs()
        found = [backlogs.get(address.port) for address in broker.addresses]
    finally:
        assert broker.stop() == 0
    assert found == [min(backlog, somaxconn) for backlog in (300, 200, 150, 1024)]
    assert "net.core.somaxconn" not in broker.log_text()


def test_a_backlog_above_somaxconn_is_a_warning(tmp_path: Path) -> None:
    """The kernel silently caps a listener's backlog at net.core.somaxconn: the broker says so
    at start, naming the listener, and serves with the capped backlog."""
    somaxconn = kernel_somaxconn()
    path = tmp_path / "backlog.toml"
    path.write_text(toml_listener(port=0) + toml_listener(port=0, backlog=65535))
    broker = BrokerProcess(
        tmp_path / "data", config=path, listeners=2, extra_args=("--memory",)
    ).start()
    try:
        found = listen_backlogs().get(broker.addresses[1].port)
        client = PahoClient("127.0.0.1", broker.addresses[1].port)
        client.connect()
        client.disconnect()
    finally:
        assert broker.stop() == 0
    assert found == min(65535, somaxconn)
    warnings = [line for line in broker.log_lines() if "net.core.somaxconn" in line]
    if somaxconn < 65535:
        assert len(warnings) == 1, broker.log_text()
        assert "WARNING" in warnings[0] and "listener[1].backlog = 65535" in warnings[0]
        assert f"net.core.somaxconn ({somaxconn})" in warnings[0]
    else:  # a kernel that holds it all has nothing to warn about
        assert warnings == [], broker.log_text()


def test_two_listeners_on_one_port(tmp_path: Path) -> None:
    path = tmp_path / "twice.toml"
    path.write_text(toml_listener(port=1883) + toml_listener(port=1883, protocol="ws"))
    with pytest.raises(ConfigError, match=r"listener\[1\]\.port: 127\.0\.0\.1:1883 is already"):
        load(path)


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("cert", "listener[0].tls_cert_file: {garbage} holds no PEM certificate"),
        ("key", "listener[0].tls_key_file: {garbage} holds no PEM private key"),
        ("mismatch", "listener[0].tls_cert_file: cannot load the certificate and private key"),
        ("encrypted", "listener[0].tls_key_file: the private key in {key} is encrypted"),
        ("ca", "listener[0].tls_ca_file: cannot load CA certificates"),
        ("ciphers", "listener[0].tls_ciphers: no cipher matches 'NO-SUCH-CIPHER'"),
    ],
)
def test_broken_tls_material_is_a_configuration_error(
    tmp_path: Path, certs: Certificates, which: str, expected: str
) -> None:
    """Files that exist but do not load, and a cipher list that matches nothing: the broker
    exits with status 2 naming the file and the key, before listening."""
    table = {
        "port": 0,
        "tls_cert_file": str(certs.garbage if which == "cert" else certs.server_cert),
        "tls_key_file": str(certs.garbage if which == "key" else certs.server_key),
    }
    if which == "mismatch":  # alice's key does not go with the server's certificate
        table["tls_key_file"] = str(certs.client_key)
    if which == "encrypted":  # the server's key under a passphrase: never prompted for
        key = serialization.load_pem_private_key(certs.server_key.read_bytes(), None)
        encrypted = tmp_path / "encrypted.key"
        encrypted.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
        table["tls_key_file"] = str(encrypted)
    if which == "ca":
        table["tls_ca_file"] = str(certs.garbage)
    if which == "ciphers":
        table["tls_ciphers"] = "NO-SUCH-CIPHER"
    path = tmp_path / "broken.toml"
    path.write_text(toml_listener(**table))  # type: ignore[arg-type]
    result = run_broker(
        "--config", str(path), "--memory", "--data-dir", str(tmp_path), cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    expected = expected.format(garbage=certs.garbage, key=table["tls_key_file"])
    assert f"{path}: {expected}" in result.stderr, result.stderr


def test_cli_missing_certificate_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    path.write_text(toml_listener(port=0, tls_cert_file=str(tmp_path / "gone.pem")))
    result = run_broker(
        "--config", str(path), "--memory", "--data-dir", str(tmp_path), cwd=tmp_path
    )
    assert result.returncode == 2
    assert f"{path}: listener[0].tls_cert_file: file not found: {tmp_path / 'gone.pem'}" in (
        result.stderr
    )


def test_ws_port_option_and_log_lines(tmp_path: Path, certs: Certificates) -> None:
    """``--ws-port`` adds a WebSocket listener on the first listener's host; ``--port`` changes
    only the first listener's port (a TLS first listener stays TLS). Each kind logs its line."""
    path = tmp_path / "cli.toml"
    path.write_text(
        toml_listener(
            port=8883,
            tls_cert_file=str(certs.server_cert),
            tls_key_file=str(certs.server_key),
        )
        + toml_listener(
            port=0,
            protocol="ws",
            tls_cert_file=str(certs.server_cert),
            tls_key_file=str(certs.server_key),
        )
    )
    broker = BrokerProcess(
        tmp_path / "data",
        config=path,
        listeners=3,
        extra_args=("--port", "0", "--ws-port", "0", "--memory"),
    ).start()
    try:
        kinds = [a.kind for a in broker.addresses]
        assert kinds == ["MQTT over TLS", "MQTT over WebSocket+TLS", "MQTT over WebSocket"]
        assert all(a.host == "127.0.0.1" and a.port for a in broker.addresses)
        ws = broker.addresses[2]
        client = PahoClient(ws.host, ws.port, transport="websockets")
        try:
            client.connect()
        finally:
            client.close()
    finally:
        assert broker.stop() == 0
    broker.assert_clean_log()


GUARD = 10.0


def test_the_policy_follows_the_listener_and_the_security_setting() -> None:
    loopback = ListenerConfig(host="127.0.0.1", port=0)
    public = ListenerConfig(host="0.0.0.0", port=0, protocol="ws")
    own_rule = ListenerConfig(host="0.0.0.0", port=0, allow_anonymous=True)
    assert listener_policy(loopback, None) == ListenerPolicy(True, True, "MQTT over TCP")
    assert listener_policy(loopback, False) == ListenerPolicy(False, True, "MQTT over TCP")
    assert listener_policy(public, None) == ListenerPolicy(False, False, "MQTT over WebSocket")
    assert listener_policy(own_rule, False).allow_anonymous is True


def test_a_running_server_hands_each_connection_its_listener_policy(tmp_path: Path) -> None:
    """Two listeners with opposite anonymous rules: a client without a user name is let in on
    one (local-only, no rule of its own: allowed) and refused (0x87) on the other; the
    configuration keeps what the file said (no rule is written into it)."""
    open_listener = ListenerConfig(host="127.0.0.1", port=0)
    closed_listener = ListenerConfig(host="127.0.0.1", port=0, allow_anonymous=False)
    config = memory_config(
        tmp_path,
        open_listener,
        closed_listener,
    )

    async def scenario() -> list[bytes]:
        server = Server(config)
        await server.start()
        answers = []
        try:
            for host, port in server.addresses:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(connect_packet("policy-probe", version=5))
                answers.append(await asyncio.wait_for(reader.read(64), GUARD))
                writer.close()
        finally:
            await server.stop()
        return answers

    answers = asyncio.run(scenario())
    assert [answer[3] for answer in answers] == [0x00, 0x87]
    assert (open_listener.allow_anonymous, closed_listener.allow_anonymous) == (None, False)
