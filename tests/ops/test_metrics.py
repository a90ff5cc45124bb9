"""/metrics in the Prometheus text format, parsed with prometheus-client's own parser, moving
with real traffic (paho, mosquitto_pub/sub)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.admin_client import Admin, AdminBroker
from support.clients import (
    MQTT_311,
    TIMEOUT,
    Paho,
    RawClient,
    binary,
    connect_packet,
    parse_connack,
    publish_packet,
    unique,
    utf8,
    wait_for,
)
from support.external_tools import program
from support.launcher import ROOT
from support.password_files import password_file

from mqttbroker.ops.metrics import REFUSAL_REASONS


def scrape_when(admin: Admin, ready: Callable[[dict[Any, float]], bool]) -> dict[Any, float]:
    """Scrape until ``ready`` holds (the walk over sessions is redone at most once a second)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        samples = scrape(admin)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def scrape(admin: Admin) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = admin.get("/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.needs_mosquitto
def test_metrics_follow_the_traffic(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker(
        '[storage]\nbackend = "sqlite"\n[[listener]]\nport = 0\n[[listener]]\nport = 0\n',
        memory=False,
    )
    before = scrape(admin)
    assert before[("mqttbroker_messages_received_total", (("qos", "1"),))] == 0
    assert before[("mqttbroker_connections", (("listener", "listener[1]"),))] == 0
    topic = unique("metrics")
    sub = paho(admin)
    sub.subscribe(topic, qos=1)
    pub = [
        program("mosquitto_pub"),
        "-h",
        admin.broker.host,
        "-p",
        str(admin.broker.port),
        "-t",
        topic,
        "-q",
        "1",
        "-m",
        "x" * 100,
        "-V",
        "mqttv5",
    ]
    for _ in range(3):
        subprocess.run(pub, check=True, timeout=TIMEOUT)
    sub.wait_messages(3)
    retained = unique("kept")
    subprocess.run([*pub[:5], "-t", retained, "-r", "-m", "r"], check=True, timeout=TIMEOUT)
    online = ("mqttbroker_sessions", (("state", "online"),))
    after = scrape_when(admin, lambda samples: samples[online] == 1)
    assert after[("mqttbroker_messages_received_total", (("qos", "1"),))] == 3
    assert after[("mqttbroker_messages_received_total", (("qos", "0"),))] == 1
    assert after[("mqttbroker_messages_delivered_total", ())] >= 3
    assert after[("mqttbroker_bytes_received_total", ())] > 300
    assert after[("mqttbroker_bytes_sent_total", ())] > 300
    assert after[("mqttbroker_subscriptions", ())] == 1
    assert after[("mqttbroker_retained_messages", ())] == 1
    assert after[("mqttbroker_connections", (("listener", "listener[0]"),))] == 1
    assert after[("mqttbroker_sessions", (("state", "online"),))] == 1
    assert after[("mqttbroker_messages_dropped_total", (("reason", "queue"),))] == 0
    # The SQLite store committed the QoS 1 traffic's changes: the histogram counts commits.
    assert after[("mqttbroker_store_commit_seconds_count", ())] >= 1
    assert (
        after[("mqttbroker_store_commit_seconds_bucket", (("le", "+Inf"),))]
        == after[("mqttbroker_store_commit_seconds_count", ())]
    )
    assert after[("process_resident_memory_bytes", ())] > 0
    # The Grafana dashboard of examples/ asks only for metrics the broker has.
    names = {name for name, _ in after}
    grafana = (ROOT / "examples" / "grafana" / "mqttbroker.json").read_text()
    wanted = set(re.findall(r"\b((?:mqttbroker|process)_[a-z_]+)\{", grafana))
    assert wanted and wanted <= names, wanted - names


def test_oldest_queued_age_is_the_maximum_over_sessions(
    admin_broker: AdminBroker, paho: Paho
) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    admin = admin_broker()
    topic = unique("age")
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 60
    away = paho(admin, connect_properties=props)
    away.subscribe(topic, qos=1)
    away.disconnect()
    away.wait_disconnected()
    assert scrape(admin)[("mqttbroker_oldest_queued_message_age_seconds", ())] == 0
    paho(admin).publish(topic, b"waiting", qos=1)
    age = ("mqttbroker_oldest_queued_message_age_seconds", ())
    samples = scrape_when(admin, lambda samples: samples[age] >= 1.0)
    assert samples[("mqttbroker_queued_messages", ())] == 1
    assert samples[("mqttbroker_sessions", (("state", "offline"),))] == 1
    assert samples[age] >= 1.0


def test_the_benchmark_option_scrapes_our_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m benchmarks --scrape-metrics``: our broker runs its admin server, a thread
    fetches /metrics every second, and the MQTT port found in /proc is not the admin port."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import brokers as br

    monkeypatch.setattr(br, "SCRAPE_METRICS", True)
    monkeypatch.setattr(br, "SCRAPE_INTERVAL", 0.2)
    handle = br.start_ours(pin=False)
    try:
        assert handle.admin_port and handle.port and handle.port != handle.admin_port
        assert "admin on, /metrics scraped" in handle.description
        scraper = handle.scraper
        assert scraper is not None
        wait_for(lambda: scraper.scrapes >= 2, "two scrapes of /metrics", TIMEOUT)
        assert scraper.failures == 0
    finally:
        handle.stop()
    assert handle.scraper is None


def test_received_messages_are_counted_per_qos(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    topic = unique("qos")
    publisher = paho(admin)
    for qos, count in ((0, 3), (1, 2), (2, 1)):
        for _ in range(count):
            publisher.publish(topic, b"m", qos=qos)  # acknowledged (QoS 0: synced)

    def received(qos: int) -> tuple[str, tuple[tuple[str, str], ...]]:
        return ("mqttbroker_messages_received_total", (("qos", str(qos)),))

    samples = scrape(admin)
    assert [samples[received(qos)] for qos in (0, 1, 2)] == [3, 2, 1]
    overview = admin.ok("GET", "/api/v1/overview")
    assert overview["messages_received"] == 6
    assert overview["messages_received_by_qos"] == {"0": 3, "1": 2, "2": 1}


@pytest.mark.needs_compiled  # gathering is the C transport's
def test_held_passes_are_counted(admin_broker: AdminBroker) -> None:
    """Publishers writing at the same moment, again and again: a pass of the broker finds
    several connections ready, none answered since their last read, at a high rate, and with
    gather_us (on by default) the next pass is held back; /metrics counts it. Bursts of 500
    rounds of one message per publisher until it shows, at most 40."""
    admin = admin_broker()
    publishers = [RawClient(admin.broker.host, admin.broker.port) for _ in range(8)]
    try:
        for raw in publishers:
            raw.send(connect_packet(unique("hold"), MQTT_311))
            assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
        holds = 0.0
        for _ in range(40):
            for _ in range(500):
                for raw in publishers:
                    raw.send(publish_packet("hold/x", b"m", version=MQTT_311))
            holds = scrape(admin)[("mqttbroker_gather_holds_total", ())]
            if holds:
                break
        assert holds >= 1
    finally:
        for raw in publishers:
            raw.close()


def refused_connect(admin: Admin, packet: bytes, version: int = 5) -> int:
    """Send one CONNECT on a new connection: the refusal's reason code (the broker closes)."""
    with RawClient(admin.broker.host, admin.broker.port) as raw:
        raw.send(packet)
        answer = raw.read_until_closed()
    return parse_connack(answer, version)[1] if answer else -1


def test_refused_connections_are_counted_by_reason(
    admin_broker: AdminBroker, paho: Paho, tmp_path: Path
) -> None:
    passwords = password_file(tmp_path / "passwd", {"dev": b"dev-pw"}, 1000)
    token = tmp_path / "token"
    token.write_text("metrics-token\n")
    admin = admin_broker(  # with a password file, the admin server needs a login
        f"[admin]\ntoken_file = {str(token)!r}\n"
        f"[security]\npassword_file = {str(passwords)!r}\nallow_anonymous = true\n"
    )
    admin.headers["Authorization"] = "Bearer metrics-token"
    before = scrape(admin)
    reasons = {
        labels[0][1]: value
        for (name, labels), value in before.items()
        if name == "mqttbroker_connections_refused_total"
    }
    # Every label is there from the start, at 0: one per CONNACK refusal code, and the limits.
    assert set(reasons) == {*REFUSAL_REASONS.values(), "connection_limit", "other"}
    assert set(reasons.values()) == {0}
    wrong = paho(admin, connect=False)
    wrong.client.username_pw_set("dev", "wrong-pw")
    assert wrong.connect(expect_success=False) == 0x86
    reserved = connect_packet("$bridge/mine")
    assert refused_connect(admin, reserved) == 0x85
    # MQTT 3.1.1: an empty client id with a persistent session (return code 2, same reason)
    assert refused_connect(admin, connect_packet("", MQTT_311, clean=False), MQTT_311) == 2
    unknown_method = connect_packet(unique("m"), properties=b"\x15" + utf8("NOPE"))
    assert refused_connect(admin, unknown_method) == 0x8C
    data_alone = connect_packet(unique("d"), properties=b"\x16" + binary(b"x"))
    assert refused_connect(admin, data_alone) == 0x82
    assert refused_connect(admin, connect_packet("big" * 8000)) == 0x95
    label = "mqttbroker_connections_refused_total"
    expected = {
        "bad_user_name_or_password": 1,
        "client_identifier_not_valid": 2,
        "bad_authentication_method": 1,
        "protocol_error": 1,
        "packet_too_large": 1,
        "not_authorized": 0,
        "connection_limit": 0,
    }
    samples = scrape_when(admin, lambda s: s[(label, (("reason", "packet_too_large"),))] == 1)
    assert {r: samples[(label, (("reason", r),))] for r in expected} == expected
    overview = admin.ok("GET", "/api/v1/overview")
    assert {r: overview["connections_refused"][r] for r in expected} == expected


def test_clients_show_messages_and_bytes_in_and_out(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    topic = unique("io")
    receiver = paho(admin, client_id=unique("receiver"))
    receiver.subscribe(topic, qos=1)
    sender = paho(admin, client_id=unique("sender"))
    for qos in (0, 1, 2):
        sender.publish(topic, b"p" * 1000, qos=qos)
    receiver.wait_messages(3)

    def client(client_id: str) -> dict[str, Any]:
        return admin.ok("GET", f"/api/v1/clients/{client_id}")  # type: ignore[no-any-return]

    sent = client(sender.client_id)
    assert sent["messages_received"] == 3 and sent["messages_sent"] == 0
    # 3 PUBLISHes of 1000 bytes of payload, CONNECT, PUBREL and PINGREQ besides
    assert 3000 < sent["bytes_received"] < 3400
    assert 0 < sent["bytes_sent"] < 200  # CONNACK, PUBACK, PUBREC, PUBCOMP, PINGRESP
    got = client(receiver.client_id)
    assert got["messages_received"] == 0 and got["messages_sent"] == 3
    assert 3000 < got["bytes_sent"] < 3400
    assert 0 < got["bytes_received"] < 200
    listed = admin.ok("GET", f"/api/v1/clients?client_id={sender.client_id}")["items"]
    assert listed == [sent] or listed[0]["bytes_received"] >= sent["bytes_received"]
