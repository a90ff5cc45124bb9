"""Reading Mosquitto's configuration: what each directive becomes, what is named as not carried
over (file and line), errors, and ``mqttbroker convert-config``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from support.launcher import run_broker

from mqttbroker.config import ConfigError, from_table
from mqttbroker.mosquitto_conf import bridges_supported, convert, load

ROOT = Path(__file__).resolve().parent.parent

FULL = """\
# global
per_listener_settings false
allow_anonymous false
password_file /etc/mosquitto/passwd
acl_file acl.conf
max_packet_size 65536
max_inflight_messages 20
max_queued_messages 1000
max_keepalive 300
max_qos 1
max_connections -1
retain_available false
persistence true
persistence_location /var/lib/mosquitto/
log_dest syslog
pid_file /run/mosquitto.pid
autosave_interval 1800
sys_interval 10

listener 1883 127.0.0.1

listener 8883
certfile /etc/mosquitto/certs/server.crt
keyfile /etc/mosquitto/certs/server.key
cafile /etc/mosquitto/ca.crt
require_certificate true
use_identity_as_username true
tls_version tlsv1.3

listener 8080
protocol websockets

connection cloud
address cloud.example.com:8883
bridge_protocol_version mqttv311
remote_clientid edge-1
remote_username edge
remote_password secret
bridge_cafile /etc/mosquitto/ca.crt
topic sensors/# out 1 "" site1/
topic commands/# in 2
"""


def write(tmp_path: Path, text: str, name: str = "mosquitto.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_directive_converted(tmp_path: Path) -> None:
    conv = convert(write(tmp_path, FULL))
    t = conv.tables
    assert t["security"] == {
        "password_file": "/etc/mosquitto/passwd",
        "acl_file": str(tmp_path / "acl.conf"),  # relative to the file, as Mosquitto has it
        "allow_anonymous": False,
    }
    assert t["broker"] == {
        "max_packet_size": 65536,
        "max_inflight": 20,
        "max_queued_messages": 1000,
        "max_keepalive": 300,
        "maximum_qos": 1,
        "max_connections": 0,
        "retain_available": False,
        "sys_interval": 10,
    }
    assert t["storage"] == {"backend": "sqlite"}
    assert t["data_dir"] == "/var/lib/mosquitto"
    assert t["listener"] == [
        {"host": "127.0.0.1", "port": 1883},
        {
            "host": "0.0.0.0",
            "port": 8883,
            "tls_cert_file": "/etc/mosquitto/certs/server.crt",
            "tls_key_file": "/etc/mosquitto/certs/server.key",
            "tls_ca_file": "/etc/mosquitto/ca.crt",
            "tls_require_certificate": True,
            "tls_certificate_username": "cn",
            "tls_min_version": "1.3",
        },
        {"host": "0.0.0.0", "port": 8080, "protocol": "ws"},
    ]
    assert t["bridge"] == [
        {
            "name": "cloud",
            "address": "cloud.example.com:8883",
            "protocol": "3.1.1",
            "client_id": "edge-1",
            "username": "edge",
            "tls": True,
            "tls_ca_file": "/etc/mosquitto/ca.crt",
            "topic": [
                {"filter": "sensors/#", "direction": "out", "qos": 1, "remote_prefix": "site1/"},
                {"filter": "commands/#", "direction": "in", "qos": 2},
            ],
        }
    ]
    names = [note.split(": ")[1] for note in conv.unsupported]
    assert "remote_password" in names
    ignored = [note.split(": ")[1] for note in conv.ignored]
    assert {"log_dest", "pid_file", "autosave_interval"} <= set(ignored)


def test_unknown_directives_named_with_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "listener 1883\nmemory_limit 100\n")
    conv = convert(path)
    assert conv.unsupported == [f"{path}:2: memory_limit: no equivalent in this broker"]


def test_converted_configuration_loads(tmp_path: Path) -> None:
    """The TOML printed is valid, and loads to the same configuration as --mosquitto-conf."""
    path = write(tmp_path, "listener 1884 127.0.0.1\nmax_qos 1\nallow_anonymous true\n")
    config, conv = load(path)
    assert [(lst.host, lst.port) for lst in config.listeners] == [("127.0.0.1", 1884)]
    assert config.broker.maximum_qos == 1
    assert config.security.allow_anonymous is True
    again = from_table(tomllib.loads(conv.toml()), "converted", tmp_path)
    assert again == config


def test_mosquitto_default_listener_and_anonymous(tmp_path: Path) -> None:
    """Without a listener Mosquitto listens on 1883; Mosquitto 2 refuses anonymous clients
    unless told otherwise."""
    config, _ = load(write(tmp_path, "max_keepalive 60\n"))
    assert [(lst.host, lst.port) for lst in config.listeners] == [("0.0.0.0", 1883)]
    assert config.security.allow_anonymous is False


def test_per_listener_anonymous(tmp_path: Path) -> None:
    text = (
        "per_listener_settings true\n"
        "listener 1883 127.0.0.1\nallow_anonymous true\n"
        "listener 1884\nallow_anonymous false\n"
    )
    config, _ = load(write(tmp_path, text))
    assert [lst.allow_anonymous for lst in config.listeners] == [True, False]


def test_include_dir(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    write(tmp_path / "conf.d", "listener 1885 127.0.0.1\n", "b.conf")
    write(tmp_path / "conf.d", "max_qos 0\n", "a.conf")
    config, _ = load(write(tmp_path, "include_dir conf.d\n"))
    assert config.broker.maximum_qos == 0
    assert config.listeners[0].port == 1885


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_qos high\n", ":1: max_qos: expected an integer, got 'high'"),
        ("listener\n", ":1: listener: needs a port"),
        ("listener 1883\nrequire_certificate maybe\n", ':2: require_certificate: expected "true"'),
        ("listener 1883\nprotocol coap\n", ':2: protocol: expected "mqtt" or "websockets"'),
        ("listener 1883\ntls_version tlsv1\n", ":2: tls_version: expected"),
        ("connection c\ntopic a/# sideways\n", ':2: topic: expected "in", "out" or "both"'),
    ],
)
def test_errors_name_file_line_and_directive(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        convert(path)
    assert str(info.value).startswith(str(path)), info.value
    assert expected in str(info.value)


def test_invalid_value_for_this_broker_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "listener 1883\nmax_qos 3\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: broker.maximum_qos")


def test_convert_config_command(tmp_path: Path) -> None:
    path = write(tmp_path, FULL.replace("acl_file acl.conf\n", ""))
    done = run_broker("convert-config", str(path))
    assert done.returncode == 0, done.stderr
    parsed = tomllib.loads(done.stdout)
    assert parsed["listener"][1]["tls_min_version"] == "1.3"
    assert parsed["bridge"][0]["topic"][0]["remote_prefix"] == "site1/"
    assert "# NOT SUPPORTED: " in done.stdout
    assert "remote_password" in done.stderr
    if not bridges_supported():
        assert "this build has no bridges" in done.stderr


def test_convert_config_error_exit_status(tmp_path: Path) -> None:
    done = run_broker("convert-config", str(tmp_path / "none.conf"))
    assert done.returncode == 2
    assert "none.conf: cannot read" in done.stderr
