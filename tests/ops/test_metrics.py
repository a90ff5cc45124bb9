"""/metrics in the Prometheus text format, parsed with prometheus-client's own parser, moving
with real traffic (paho, mosquitto_pub/sub)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from external_tools import program
from ops_support import ROOT, Admin
from prometheus_client.parser import text_string_to_metric_families
from support.clients import TIMEOUT, unique

Paho = Callable[..., Any]


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
def test_metrics_follow_the_traffic(admin_broker: Callable[..., Admin], paho: Paho) -> None:
    admin = admin_broker(
        '[storage]\nbackend = "sqlite"\n[[listener]]\nport = 0\n[[listener]]\nport = 0\n',
        memory=False,
    )
    before = scrape(admin)
    assert before[("mqttbroker_messages_received_total", ())] == 0
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
    assert after[("mqttbroker_messages_received_total", ())] == 4
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
    admin_broker: Callable[..., Admin], paho: Paho
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
        deadline = time.monotonic() + TIMEOUT
        while scraper.scrapes < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scraper.scrapes >= 2 and scraper.failures == 0
    finally:
        handle.stop()
    assert handle.scraper is None
