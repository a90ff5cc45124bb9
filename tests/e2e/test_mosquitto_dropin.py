"""A Mosquitto configuration runs unchanged (``--mosquitto-conf``), and its ACL file gives the same
deliveries on both brokers: the same scenario is run against a real Mosquitto started with the
same file, then against this broker."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.external_tools import find
from support.launcher import BrokerProcess, mosquitto_binary, stop_process, wait_port

from conformance.mqtt import MQTT_5, PUBLISH, SUBACK, Client, connect, subscribe

pytestmark = pytest.mark.needs_mosquitto

ACL = """\
user reader
topic readwrite #
topic deny secret/x

user writer
topic write #
"""
FILTERS = ["#", "+/+", "secret/+", "secret/x", "public/#"]
TOPICS = ["secret/x", "secret/y", "public/a", "other/b"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_of(conf: Path) -> int:
    line = next(x for x in conf.read_text().splitlines() if x.startswith("listener "))
    return int(line.split()[1])


def write_conf(folder: Path) -> Path:
    folder.mkdir()
    folder.chmod(0o755)
    passwd = folder / "passwd"
    passwd.write_text("")
    for user in ("reader", "writer"):
        subprocess.run(
            [find("mosquitto_passwd") or "mosquitto_passwd", "-b", str(passwd), user, user + "-pw"],
            check=True,
            capture_output=True,
        )
    (folder / "acl").write_text(ACL)
    store = folder / "store"
    store.mkdir()
    store.chmod(0o777)  # Mosquitto started as root writes as the user "mosquitto"
    for path in (passwd, folder / "acl"):
        path.chmod(0o644)
    conf = folder / "mosquitto.conf"
    conf.write_text(
        "# as a Mosquitto 2 installation has it\n"
        "per_listener_settings false\n"
        "allow_anonymous false\n"
        "password_file passwd\n"
        "acl_file acl\n"
        f"listener {_free_port()} 127.0.0.1\n"
        "max_packet_size 65536\n"
        "max_inflight_messages 20\n"
        "max_queued_messages 500\n"
        "max_keepalive 300\n"
        "persistence true\n"
        "persistence_location store/\n"
        "log_dest stderr\n"
        "log_type all\n"
        "sys_interval 10\n"
    )
    conf.chmod(0o644)
    return conf


def scenario(port: int) -> dict[str, tuple[int, list[str]]]:
    """For each filter: the reader's SUBACK code, and the topics it then receives."""
    address = ("127.0.0.1", port)
    readers: dict[str, Client] = {}
    seen: dict[str, tuple[int, list[str]]] = {}
    try:
        for index, topic_filter in enumerate(FILTERS):
            client = readers[topic_filter] = Client(address, MQTT_5, f"reader{index}")
            client.connect(f"reader{index}", username="reader", password=b"reader-pw")
            client.send(subscribe(1, [(topic_filter, 0)]))
            suback = client.expect(SUBACK)
            seen[topic_filter] = (suback.reason_codes[0], [])
        writer = Client(address, MQTT_5, "writer")
        writer.connect("writer", username="writer", password=b"writer-pw")
        for topic in TOPICS:
            writer.publish(topic, b"x", qos=1, packet_id=TOPICS.index(topic) + 1)
            writer.read()  # PUBACK
        writer.close()
        for topic_filter, client in readers.items():
            # everything sent to it before the PINGRESP: all the writer's messages, acknowledged
            for packet in client.ping():
                assert packet.type == PUBLISH, packet
                seen[topic_filter][1].append(packet.topic)
    finally:
        for client in readers.values():
            client.close()
    return seen


@contextmanager
def mosquitto(conf: Path) -> Iterator[int]:
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)], cwd=conf.parent, stderr=subprocess.PIPE, text=True
    )
    port = _port_of(conf)
    try:
        wait_port(port, proc)
        yield port
    finally:
        stop_process(proc)


@contextmanager
def ours(conf: Path, cwd: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(cwd)
    process.args = [sys.executable, "-m", "mqttbroker", "--mosquitto-conf", str(conf)]
    process.cwd = cwd
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_same_configuration_same_deliveries(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "etc")
    with mosquitto(conf) as port:
        expected = scenario(port)
    # Mosquitto: broad filters granted, secret/x never delivered through them
    assert expected["#"] == (0, ["secret/y", "public/a", "other/b"])
    assert expected["+/+"] == (0, ["secret/y", "public/a", "other/b"])
    # It also grants secret/x itself and delivers nothing through it; this broker refuses a
    # filter that a denial covers whole (0x87, with a Reason String saying so).
    assert expected["secret/x"] == (0, [])
    expected["secret/x"] = (0x87, [])
    run = tmp_path / "run"
    run.mkdir()
    with ours(conf, run) as broker:
        port = _port_of(conf)
        assert broker.port == port  # the file's own listener
        assert scenario(port) == expected
        log = broker.log_text()
    assert "Mosquitto directive not carried over" not in log, log
    assert (tmp_path / "etc" / "store" / "mqttbroker.db").exists()  # persistence_location


def test_anonymous_refused_as_the_file_says(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "etc")
    run = tmp_path / "run"
    run.mkdir()
    with ours(conf, run) as broker:
        client = Client((broker.host, broker.port), MQTT_5, "anon")
        try:
            client.send(connect("anon"))  # no user name: allow_anonymous false
            client.expect_refused({0x86, 0x87}, required=True)
        finally:
            client.close()
