"""$SYS/broker/... from a real broker, watched by paho: Mosquitto's names (uptime, bytes, loads,
clients/connected, version), deliveries counted as PUBLISH packets sent, and the $SYS topics not
counted as retained messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from support.clients import TIMEOUT

LOADS = [
    f"$SYS/broker/load/{name}/{period}"
    for name in (
        "messages/received",
        "messages/sent",
        "bytes/received",
        "bytes/sent",
        "connections",
    )
    for period in ("1min", "5min", "15min")
]


def test_sys_topics_over_the_network(start_broker: Any, make_client: Any, tmp_path: Path) -> None:
    config = tmp_path / "sys.toml"
    config.write_text('[broker]\nsys_interval = 1.0\n\n[storage]\nbackend = "memory"\n')
    broker = start_broker(extra_args=("--config", str(config)))
    watcher = make_client(server=broker)
    watcher.subscribe("$SYS/#", 0)
    subscriber = make_client(server=broker)
    subscriber.subscribe("work/#", 1)
    publisher = make_client(server=broker)
    for i in range(5):
        publisher.publish("work/t", b"m%d" % i, qos=1)
    subscriber.wait_messages(5)

    def latest() -> dict[str, str]:
        return {m.topic: m.payload.decode() for m in watcher.received()}

    def settled() -> bool:
        now = latest()
        return now.get("$SYS/broker/messages/received") == "5" and all(
            name in now for name in LOADS
        )

    watcher.wait_until(settled, TIMEOUT, "$SYS figures counting the 5 messages")
    sys = latest()
    assert re.fullmatch(r"\d+ seconds", sys["$SYS/broker/uptime"])
    assert sys["$SYS/broker/version"].startswith("mqttbroker version ")
    assert sys["$SYS/broker/clients/connected"] == "3"
    # every $SYS topic is retained, and none of them counts as a retained message
    assert sys["$SYS/broker/retained messages/count"] == "0"
    # the 5 to the subscriber, plus the $SYS messages sent to the watcher before this update
    assert int(sys["$SYS/broker/messages/delivered"]) >= 5
    # each of the 5 PUBLISHes is 15 bytes (2 fixed header, 8 topic, 2 packet id, 1 property
    # length, 2 payload), in from the publisher and out to the subscriber, CONNECTs and CONNACKs
    # and the rest besides
    assert int(sys["$SYS/broker/bytes/received"]) > 5 * 15
    assert int(sys["$SYS/broker/bytes/sent"]) > 5 * 15
    assert all(float(sys[name]) >= 0 for name in LOADS)
    assert float(sys["$SYS/broker/load/connections/1min"]) > 0
    assert float(sys["$SYS/broker/load/messages/received/1min"]) > 0
