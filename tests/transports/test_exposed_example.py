"""config/exposed.toml does what its comments promise: run as written (with test certificates,
password and ACL files in place of those under /etc, and free ports), an anonymous client is
accepted on the loopback listener for local tools and refused on the TLS listener for devices,
where a user of the password file gets in."""

from __future__ import annotations

from pathlib import Path

from support.certs import Certificates, client_context
from support.clients import PahoClient
from support.launcher import ROOT, BrokerProcess
from support.password_files import password_file

EXAMPLE = ROOT / "config" / "exposed.toml"
NOT_AUTHORIZED = 0x87


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, f"config/exposed.toml no longer has {old!r}"
    return text.replace(old, new)


def test_loopback_listener_is_anonymous_and_the_exposed_one_is_not(
    tmp_path: Path, certs: Certificates
) -> None:
    passwd = password_file(tmp_path / "passwd", {"sensor": b"correct horse"})
    acl = tmp_path / "acl"
    acl.write_text("pattern readwrite devices/%u/#\n")
    text = EXAMPLE.read_text()
    for old, new in [
        ('"/etc/mqttbroker/tls/server.pem"', f'"{certs.server_cert}"'),
        ('"/etc/mqttbroker/tls/server.key"', f'"{certs.server_key}"'),
        ('"/etc/mqttbroker/passwd"', f'"{passwd}"'),
        ('"/etc/mqttbroker/acl"', f'"{acl}"'),
        ('"/var/lib/mqttbroker"', f'"{tmp_path / "data"}"'),
        ("port = 1883\n", "port = 0\n"),
        ("port = 8883\n", "port = 0\n"),
        ("port = 8884\n", "port = 0\n"),
    ]:
        text = replace_once(text, old, new)
    config = tmp_path / "exposed.toml"
    config.write_text(text)
    broker = BrokerProcess(tmp_path, config=config, listeners=3).start()
    try:
        local, devices, _browsers = broker.addresses
        assert local.host == "127.0.0.1" and devices.host == "0.0.0.0"
        anonymous_local = PahoClient("127.0.0.1", local.port)
        try:
            anonymous_local.connect()
        finally:
            anonymous_local.close()
        anonymous_device = PahoClient("localhost", devices.port, tls=client_context(certs))
        try:
            assert anonymous_device.connect(expect_success=False) == NOT_AUTHORIZED
        finally:
            anonymous_device.close()
        device = PahoClient("localhost", devices.port, tls=client_context(certs))
        device.client.username_pw_set("sensor", "correct horse")
        try:
            device.connect()
        finally:
            device.close()
    finally:
        broker.stop()
