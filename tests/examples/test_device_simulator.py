"""examples/device_simulator.py against a real broker: retained online status, QoS 1 telemetry,
the will marking a killed device offline, its session kept (a command sent while it was away is
delivered when it comes back), and Home Assistant discovery messages that point at its topics."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

from support.clients import PahoClient, unique
from support.example_programs import simulator


def latest(watcher: PahoClient, topic: str) -> Any:
    return [m for m in watcher.received() if m.topic == topic][-1]


def test_status_telemetry_will_and_session(
    fresh_broker: Any, start_program: Callable[..., Any]
) -> None:
    prefix = unique("sim")
    device = f"{prefix}-1"
    status, telemetry = f"{prefix}/{device}/status", f"{prefix}/{device}/telemetry"
    sim = simulator(start_program, fresh_broker, prefix, "--devices", "2")
    watcher = PahoClient(fresh_broker.host, fresh_broker.port)
    try:
        watcher.connect()
        watcher.subscribe(f"{prefix}/#", qos=1)
        # Retained status: a subscriber arriving later is told both devices are online.
        watcher.wait_until(
            lambda: (
                {m.topic for m in watcher.received() if m.retain and m.payload == b"online"}
                == {f"{prefix}/{prefix}-{n}/status" for n in (1, 2)}
            ),
            10,
            "both devices' retained online status",
        )

        def readings() -> list[Any]:
            return [m for m in watcher.received() if m.topic == telemetry]

        watcher.wait_until(lambda: len(readings()) >= 3, 10, "three readings of one device")
        values = [json.loads(m.payload) for m in readings()]
        assert all(m.qos == 1 for m in readings())
        first = values[0]["seq"]  # the watcher may have come after the first reading
        assert [v["seq"] for v in values] == list(range(first, first + len(values)))
        assert {"temperature", "humidity", "ts"} <= set(values[0])

        # Killed outright: the broker publishes the wills, retained.
        sim.proc.send_signal(signal.SIGKILL)
        sim.wait_exit()
        watcher.wait_until(
            lambda: latest(watcher, status).payload == b"offline", 10, "the will (offline)"
        )
        late = PahoClient(fresh_broker.host, fresh_broker.port)
        try:
            late.connect()
            late.subscribe(status, qos=1)
            [retained] = late.wait_messages(1)
            assert (retained.payload, retained.retain) == (b"offline", True)
        finally:
            late.close()

        # The session outlived the connection: a command sent now waits for the device.
        watcher.publish(f"{prefix}/{device}/command", b"reboot", qos=1)
        again = simulator(start_program, fresh_broker, prefix, "--devices", "2")
        assert again.wait_for_log(rf"{device}: command 'reboot'", 10), again.log_text()
        assert f"{device}: connected (session present: True)" in again.log_text()
        watcher.wait_until(lambda: latest(watcher, status).payload == b"online", 10, "online again")

        # Stopped cleanly, the devices say offline themselves.
        again.stop()
        watcher.wait_until(
            lambda: latest(watcher, status).payload == b"offline", 10, "offline on SIGTERM"
        )
        assert again.returncode == 0, again.log_text()
    finally:
        watcher.close()


def test_home_assistant_discovery(fresh_broker: Any, start_program: Callable[..., Any]) -> None:
    prefix = unique("ha")
    discovery = unique("discovery")
    simulator(
        start_program,
        fresh_broker,
        prefix,
        "--devices",
        "1",
        "--home-assistant",
        "--discovery-prefix",
        discovery,
    )
    device = f"{prefix}-1"
    watcher = PahoClient(fresh_broker.host, fresh_broker.port)
    try:
        watcher.connect()
        watcher.subscribe(f"{discovery}/#", qos=1)
        watcher.subscribe(f"{prefix}/{device}/telemetry", qos=1)
        watcher.wait_until(
            lambda: (
                len([m for m in watcher.received() if m.topic.startswith(discovery)]) == 2
                and any(m.topic.endswith("/telemetry") for m in watcher.received())
            ),
            10,
            "two discovery messages and a reading",
        )
        configs = {m.topic: m for m in watcher.received() if m.topic.startswith(discovery)}
        assert set(configs) == {
            f"{discovery}/sensor/{device}/temperature/config",
            f"{discovery}/sensor/{device}/humidity/config",
        }
        reading = json.loads(
            next(m.payload for m in watcher.received() if m.topic.endswith("/telemetry"))
        )
        # Retained: Home Assistant finds them whenever it (re)starts.
        late = PahoClient(fresh_broker.host, fresh_broker.port)
        try:
            late.connect()
            late.subscribe(f"{discovery}/#", qos=1)
            retained = late.wait_messages(2)
            assert {m.topic for m in retained if m.retain} == set(configs)
        finally:
            late.close()
        for topic, message in configs.items():
            config = json.loads(message.payload)
            object_id = topic.split("/")[-2]
            assert config["unique_id"] == f"{device}_{object_id}"
            assert config["state_topic"] == f"{prefix}/{device}/telemetry"
            assert config["value_template"] == f"{{{{ value_json.{object_id} }}}}"
            assert isinstance(reading[object_id], float)  # what the template reads is there
            assert config["availability_topic"] == f"{prefix}/{device}/status"
            assert (config["payload_available"], config["payload_not_available"]) == (
                "online",
                "offline",
            )
            assert config["device"]["identifiers"] == [device]
            assert config["device_class"] == object_id
    finally:
        watcher.close()
