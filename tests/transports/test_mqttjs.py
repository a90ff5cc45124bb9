"""MQTT.js (the browser dashboards' client) in Node over ws:// and wss://: connect, subscribe,
publish, receive its own message; a paho subscriber on plain TCP receives it too.

MQTT.js comes from npm into tests/transports/node/node_modules (not committed; the ``mqttjs``
fixture installs it when missing). Without node and npm the tests are skipped (``needs_node``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.certs import Certificates
from support.clients import PahoClient, unique
from support.external_tools import program
from support.listeners import Listeners


@pytest.mark.needs_node
@pytest.mark.parametrize(
    ("secure", "version"),
    [(False, 5), (False, 4), (True, 5)],
    ids=["ws-v5", "ws-v311", "wss-v5"],
)
def test_mqttjs_round_trip(
    listeners: Listeners, certs: Certificates, mqttjs: Path, secure: bool, version: int
) -> None:
    address = listeners.wss if secure else listeners.ws
    scheme = "wss" if secure else "ws"
    host = "localhost" if secure else address.host  # the server certificate names localhost
    url = f"{scheme}://{host}:{address.port}/mqtt"
    topic = f"mqttjs/{unique()}"
    node = program("node")
    watcher = PahoClient(listeners.tcp.host, listeners.tcp.port)
    try:
        watcher.connect()
        assert watcher.subscribe(topic, 1) == [1]
        args = [node, "roundtrip.js", url, topic, str(version)]
        if secure:
            args.append(str(certs.ca))
        result = subprocess.run(args, cwd=mqttjs, capture_output=True, text=True, timeout=30)
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        assert result.returncode == 0, (result.stdout, result.stderr)
        kinds = [e["event"] for e in events]
        assert kinds[0] == "connect" and events[0]["reasonCode"] == 0, events
        assert {"suback", "puback", "message", "end"} <= set(kinds), events
        suback = next(e for e in events if e["event"] == "suback")
        assert suback["qos"] == [1]
        message = next(e for e in events if e["event"] == "message")
        assert (message["topic"], message["payload"], message["qos"]) == (
            topic,
            "hello from mqtt.js",
            1,
        )
        [seen] = watcher.wait_messages(1)
        assert seen.payload == b"hello from mqtt.js"
    finally:
        watcher.close()
