"""Reading Mosquitto's configuration: what each directive becomes, what is named as not carried
over (file and line), errors, and ``mqttbroker convert-config``."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.clients import MQTT_311, RawClient, connect_packet, unique
from support.external_tools import find
from support.launcher import (
    BrokerProcess,
    free_port,
    mosquitto_binary,
    run_broker,
    stop_process,
    wait_port,
    write_file,
)

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


def test_every_directive_converted(tmp_path: Path) -> None:
    conv = convert(write_file(tmp_path / "mosquitto.conf", FULL))
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
    path = write_file(tmp_path / "mosquitto.conf", "listener 1883\nmemory_limit 100\n")
    conv = convert(path)
    assert conv.unsupported == [f"{path}:2: memory_limit: no equivalent in this broker"]


def test_converted_configuration_loads(tmp_path: Path) -> None:
    """The TOML printed is valid, and loads to the same configuration as --mosquitto-conf."""
    path = write_file(
        tmp_path / "mosquitto.conf", "listener 1884 127.0.0.1\nmax_qos 1\nallow_anonymous true\n"
    )
    config, conv = load(path)
    assert [(lst.host, lst.port) for lst in config.listeners] == [("127.0.0.1", 1884)]
    assert config.broker.maximum_qos == 1
    assert config.security.allow_anonymous is True
    again = from_table(tomllib.loads(conv.toml()), "converted", tmp_path)
    assert again == config


def test_mosquitto_default_listener_and_anonymous(tmp_path: Path) -> None:
    """Without a listener Mosquitto listens on 1883; Mosquitto 2 refuses anonymous clients
    unless told otherwise."""
    config, _ = load(write_file(tmp_path / "mosquitto.conf", "max_keepalive 60\n"))
    assert [(lst.host, lst.port) for lst in config.listeners] == [("0.0.0.0", 1883)]
    assert config.security.allow_anonymous is False


def test_per_listener_anonymous(tmp_path: Path) -> None:
    text = (
        "per_listener_settings true\n"
        "listener 1883 127.0.0.1\nallow_anonymous true\n"
        "listener 1884\nallow_anonymous false\n"
    )
    config, _ = load(write_file(tmp_path / "mosquitto.conf", text))
    assert [lst.allow_anonymous for lst in config.listeners] == [True, False]


def test_include_dir(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    write_file(tmp_path / "conf.d" / "b.conf", "listener 1885 127.0.0.1\n")
    write_file(tmp_path / "conf.d" / "a.conf", "max_qos 0\n")
    config, _ = load(write_file(tmp_path / "mosquitto.conf", "include_dir conf.d\n"))
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
    path = write_file(tmp_path / "mosquitto.conf", text)
    with pytest.raises(ConfigError) as info:
        convert(path)
    assert str(info.value).startswith(str(path)), info.value
    assert expected in str(info.value)


def test_invalid_value_for_this_broker_names_the_file(tmp_path: Path) -> None:
    path = write_file(tmp_path / "mosquitto.conf", "listener 1883\nmax_qos 3\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: broker.maximum_qos")


def test_convert_config_command(tmp_path: Path) -> None:
    path = write_file(tmp_path / "mosquitto.conf", FULL.replace("acl_file acl.conf\n", ""))
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


# --- per_listener_settings: each listener's own security settings ---------------------------


def test_per_listener_anonymous_is_refused_unless_the_listener_allows_it(tmp_path: Path) -> None:
    """Mosquitto 2 refuses anonymous clients on a listener that says nothing, loopback too."""
    text = "per_listener_settings true\nlistener 1883 127.0.0.1\nlistener 1884 127.0.0.1\n"
    config, _ = load(write_file(tmp_path / "mosquitto.conf", text))
    assert [lst.allow_anonymous for lst in config.listeners] == [False, False]


def test_per_listener_one_password_file_for_all(tmp_path: Path) -> None:
    text = (
        "per_listener_settings true\n"
        "listener 1883 127.0.0.1\nallow_anonymous true\npassword_file passwd\nacl_file acl\n"
        "listener 1884\npassword_file ./passwd\nacl_file acl\n"
    )
    conv = convert(write_file(tmp_path / "mosquitto.conf", text))
    assert conv.tables["security"] == {
        "password_file": str(tmp_path / "passwd"),
        "acl_file": str(tmp_path / "acl"),
    }
    assert [lst["allow_anonymous"] for lst in conv.tables["listener"]] == [True, False]


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        (  # a password file per listener: each one's users on its own listener only
            "listener 1883\npassword_file a\nlistener 1884\npassword_file b\n",
            5,
            "password_file: with per_listener_settings true Mosquitto checks the clients of each "
            "listener against that listener's own password_file (listener 0.0.0.0:1884: {d}/b; "
            "listener 0.0.0.0:1883: {d}/a); this broker has one password_file for all listeners",
        ),
        (  # a listener without one: no user of the other's file may log in there
            "listener 1883\npassword_file a\nlistener 1884\nallow_anonymous true\n",
            4,
            "password_file: with per_listener_settings true Mosquitto checks the clients of each "
            "listener against that listener's own password_file (listener 0.0.0.0:1884: none;",
        ),
        (
            "listener 1883\nacl_file a\nlistener 1884\nacl_file b\n",
            5,
            "acl_file: with per_listener_settings true Mosquitto checks the clients of each "
            "listener against that listener's own acl_file",
        ),
        (  # before the first listener: Mosquitto's default listener's, not the ones below
            "password_file a\nlistener 1883\n",
            2,
            "password_file: with per_listener_settings true, a security setting before the first "
            "listener belongs to Mosquitto's default listener (port 1883 on every interface",
        ),
        (
            "allow_anonymous true\nlistener 1883\n",
            2,
            "allow_anonymous: with per_listener_settings true, a security setting before the "
            "first listener belongs to Mosquitto's default listener",
        ),
    ],
)
def test_per_listener_settings_not_carried_over_are_refused(
    tmp_path: Path, text: str, line: int, expected: str
) -> None:
    path = write_file(tmp_path / "mosquitto.conf", "per_listener_settings true\n" + text)
    with pytest.raises(ConfigError) as info:
        convert(path)
    assert str(info.value).startswith(f"{path}:{line}: "), info.value
    assert expected.format(d=tmp_path) in str(info.value)


def test_per_listener_settings_without_listener_lines_go_to_the_default_listener(
    tmp_path: Path,
) -> None:
    """Security settings before any listener are Mosquitto's default listener's: with no
    `listener` line that is the only one (1883 on every interface, or the `port` line's)."""
    text = "per_listener_settings true\nallow_anonymous true\npassword_file passwd\n"
    conv = convert(write_file(tmp_path / "mosquitto.conf", text))
    assert conv.tables["listener"] == [{"host": "0.0.0.0", "port": 1883, "allow_anonymous": True}]
    assert conv.tables["security"] == {"password_file": str(tmp_path / "passwd")}
    # a `port` line after them: the same listener; a later setting for it wins
    text += "port 1999\nallow_anonymous false\n"
    conv = convert(write_file(tmp_path / "mosquitto.conf", text))
    assert conv.tables["listener"] == [{"host": "0.0.0.0", "port": 1999, "allow_anonymous": False}]
    assert conv.tables["security"] == {"password_file": str(tmp_path / "passwd")}


def test_per_listener_settings_after_a_security_setting_is_refused(tmp_path: Path) -> None:
    """As Mosquitto refuses it (its error: must be set before any other security settings)."""
    path = write_file(
        tmp_path / "mosquitto.conf",
        "listener 1883\nallow_anonymous true\nper_listener_settings true\n",
    )
    with pytest.raises(ConfigError) as info:
        convert(path)
    assert str(info.value) == (
        f"{path}:3: per_listener_settings: must come before every security setting (Mosquitto "
        f"refuses it after one: {path}:2)"
    )


def test_message_size_limit_names_the_close_key(tmp_path: Path) -> None:
    """Mosquitto's message_size_limit bounds the payload and drops a larger message without
    disconnecting; max_packet_size bounds the packet and disconnects: named, not mapped."""
    path = write_file(tmp_path / "mosquitto.conf", "listener 1883\nmessage_size_limit 1000\n")
    conv = convert(path)
    assert "max_packet_size" not in conv.tables.get("broker", {})
    assert conv.unsupported == [
        f"{path}:2: message_size_limit: no equivalent: Mosquitto drops a message whose payload "
        "is larger and completes its QoS flow, the client staying connected; the closest here is "
        "[broker] max_packet_size, the largest packet a client may send (payload, topic and "
        "headers), past which the client is disconnected (0x95)"
    ]


def _password_file(path: Path, users: dict[str, str]) -> Path:
    """A password file as mosquitto_passwd writes it (both brokers read it)."""
    mosquitto_binary()  # the mosquitto package, with mosquitto_passwd
    tool = find("mosquitto_passwd")
    assert tool is not None, "mosquitto_passwd not found beside mosquitto"
    for user, password in users.items():
        create = () if path.exists() else ("-c",)
        subprocess.run([tool, *create, "-b", str(path), user, password], check=True)
    return path


def _accepted(port: int, user: str | None, password: str | None) -> bool:
    """Whether a broker on 127.0.0.1:``port`` accepts an MQTT 3.1.1 CONNECT with these
    credentials (CONNACK return code 0)."""
    with RawClient("127.0.0.1", port) as client:
        client.send(
            connect_packet(
                unique("plx"),
                MQTT_311,
                username=user,
                password=None if password is None else password.encode(),
            )
        )
        try:
            connack = client.read_packet()
        except ConnectionError:
            return False
        return connack[0] == 0x20 and connack[3] == 0


LOGINS = [
    (None, None),  # anonymous
    ("alice", "alice-pw"),
    ("alice", "wrong"),
    ("bob", "bob-pw"),
]


def _logins(ports: list[int]) -> dict[tuple[int, str | None, str | None], bool]:
    return {
        (index, user, password): _accepted(port, user, password)
        for index, port in enumerate(ports)
        for user, password in LOGINS
    }


def _per_listener_conf(path: Path, ports: list[int], passwd: list[Path]) -> Path:
    """per_listener_settings true, two loopback listeners: the first also takes anonymous
    clients; ``passwd``: each listener's password file."""
    text = ("user root\n" if os.geteuid() == 0 else "") + "per_listener_settings true\n"
    text += f"listener {ports[0]} 127.0.0.1\nallow_anonymous true\npassword_file {passwd[0]}\n"
    text += f"listener {ports[1]} 127.0.0.1\npassword_file {passwd[1]}\n"
    path.write_text(text)
    return path


def _mosquitto_logins(tmp_path: Path, passwd: list[Path]) -> dict[Any, bool]:
    ports = [free_port(), free_port()]
    conf = _per_listener_conf(tmp_path / "mosquitto.conf", ports, passwd)
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for port in ports:
            wait_port(port, proc)
        return _logins(ports)
    finally:
        stop_process(proc)


def test_per_listener_settings_as_mosquitto_does(tmp_path: Path) -> None:
    """The same configuration, run by Mosquitto and by this broker (--mosquitto-conf): every
    login on every listener gets the same answer (anonymous only where allowed)."""
    passwd = _password_file(tmp_path / "passwd", {"alice": "alice-pw", "bob": "bob-pw"})
    expected = _mosquitto_logins(tmp_path, [passwd, passwd])
    assert expected[(1, None, None)] is False and expected[(0, None, None)] is True
    conf = _per_listener_conf(tmp_path / "ours.conf", [free_port(), free_port()], [passwd] * 2)
    ours = BrokerProcess(tmp_path / "data", extra_args=("--mosquitto-conf", str(conf)), listeners=2)
    try:
        ours.start()
        assert _logins([address.port for address in ours.addresses]) == expected
    finally:
        ours.stop()


def test_per_listener_password_files_refused_where_mosquitto_splits_them(
    tmp_path: Path,
) -> None:
    """A password file per listener: Mosquitto accepts each file's users on their own listener
    only. This broker, with one password file, refuses the configuration and says why."""
    first = _password_file(tmp_path / "first", {"alice": "alice-pw"})
    second = _password_file(tmp_path / "second", {"bob": "bob-pw"})
    mosquitto = _mosquitto_logins(tmp_path, [first, second])
    assert {key for key, accepted in mosquitto.items() if accepted} == {
        (0, None, None),
        (0, "alice", "alice-pw"),
        (1, "bob", "bob-pw"),
    }
    conf = _per_listener_conf(tmp_path / "ours.conf", [free_port(), free_port()], [first, second])
    done = run_broker("--mosquitto-conf", str(conf), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2, done.stderr
    line = conf.read_text().splitlines().index(f"password_file {second}") + 1
    assert f"{conf}:{line}: password_file: with per_listener_settings true" in done.stderr


def _default_listener_conf(path: Path, port: int, passwd: Path) -> Path:
    """per_listener_settings true and the security settings before any listener, with no
    `listener` line: Mosquitto's default listener (here on a free loopback port) has them."""
    text = ("user root\n" if os.geteuid() == 0 else "") + "per_listener_settings true\n"
    text += f"allow_anonymous true\npassword_file {passwd}\nport {port}\nbind_address 127.0.0.1\n"
    path.write_text(text)
    return path


def test_default_listener_settings_as_mosquitto_does(tmp_path: Path) -> None:
    passwd = _password_file(tmp_path / "passwd", {"alice": "alice-pw", "bob": "bob-pw"})
    port = free_port()
    conf = _default_listener_conf(tmp_path / "mosquitto.conf", port, passwd)
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, proc)
        expected = _logins([port])
    finally:
        stop_process(proc)
    assert expected == {
        (0, None, None): True,
        (0, "alice", "alice-pw"): True,
        (0, "alice", "wrong"): False,
        (0, "bob", "bob-pw"): True,
    }
    conf = _default_listener_conf(tmp_path / "ours.conf", free_port(), passwd)
    ours = BrokerProcess(tmp_path / "data", extra_args=("--mosquitto-conf", str(conf)))
    try:
        ours.start()
        assert _logins([ours.port]) == expected
    finally:
        ours.stop()
