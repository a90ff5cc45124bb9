#!/usr/bin/env python3
"""Simulated devices: each one an MQTT 5 client that

- announces itself with a retained ``online`` on ``<prefix>/<device>/status`` and leaves a will
  (retained ``offline`` on the same topic) that the broker publishes if the device vanishes;
- sends a reading every ``--interval`` seconds at QoS 1 to ``<prefix>/<device>/telemetry``
  (JSON: ``seq``, ``temperature``, ``humidity``, ``ts``);
- keeps its session for ``--session-expiry`` seconds (Clean Start 0), so commands published at
  QoS 1 to ``<prefix>/<device>/command`` while it is away are delivered when it comes back;
- with ``--home-assistant``, publishes retained Home Assistant MQTT discovery messages
  (``homeassistant/sensor/<device>/<temperature|humidity>/config``), so the devices and their
  sensors appear in Home Assistant with their availability.

    python examples/device_simulator.py --devices 5 --interval 1 --home-assistant

Stops on Ctrl-C or SIGTERM, marking each device offline itself; killed outright, the broker does
it with the wills.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import signal
import sys
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ONLINE = "online"
OFFLINE = "offline"
# (object id, name, device class, unit, mean, amplitude) of each simulated sensor.
SENSORS = (
    ("temperature", "Temperature", "temperature", "°C", 21.0, 3.0),
    ("humidity", "Humidity", "humidity", "%", 50.0, 10.0),
)


log = logging.getLogger("device_simulator")


class Device:
    """One simulated device: its own MQTT connection, status, will and readings."""

    def __init__(self, args: argparse.Namespace, device_id: str, index: int) -> None:
        self.args = args
        self.id = device_id
        base = f"{args.prefix}/{device_id}"
        self.status_topic = f"{base}/status"
        self.telemetry_topic = f"{base}/telemetry"
        self.command_topic = f"{base}/command"
        self.seq = 0
        self.phase = index * 1.3  # devices do not move in step
        self.connected = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5
        )
        if args.username:
            self.client.username_pw_set(args.username, args.password)
        self.client.will_set(self.status_topic, OFFLINE, qos=1, retain=True)
        self.client.on_connect = self.on_connect
        self.client.on_message = self.on_message

    def start(self) -> None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = self.args.session_expiry
        # Clean Start 0 on every connection: resume the session the broker kept.
        self.client.connect_async(
            self.args.host,
            self.args.port,
            keepalive=self.args.keepalive,
            clean_start=False,
            properties=properties,
        )
        self.client.loop_start()

    def on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: Any,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            log.warning("%s: connection refused: %s", self.id, reason_code)
            return
        client.publish(self.status_topic, ONLINE, qos=1, retain=True)
        if not flags.session_present:  # a resumed session still has its subscription
            client.subscribe(self.command_topic, qos=1)
        if self.args.home_assistant:
            self.publish_discovery()
        log.info("%s: connected (session present: %s)", self.id, flags.session_present)
        self.connected.set()

    def on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        command = message.payload.decode("utf-8", "replace")
        log.info("%s: command %r", self.id, command)

    def publish_discovery(self) -> None:
        device = {
            "identifiers": [self.id],
            "name": f"Simulated {self.id}",
            "manufacturer": "mqttbroker examples",
            "model": "device_simulator.py",
        }
        for object_id, name, device_class, unit, _, _ in SENSORS:
            config = {
                "name": name,
                "unique_id": f"{self.id}_{object_id}",
                "state_topic": self.telemetry_topic,
                "value_template": f"{{{{ value_json.{object_id} }}}}",
                "device_class": device_class,
                "unit_of_measurement": unit,
                "state_class": "measurement",
                "availability_topic": self.status_topic,
                "payload_available": ONLINE,
                "payload_not_available": OFFLINE,
                "qos": 1,
                "device": device,
            }
            topic = f"{self.args.discovery_prefix}/sensor/{self.id}/{object_id}/config"
            self.client.publish(topic, json.dumps(config), qos=1, retain=True)

    def reading(self, now: float) -> dict[str, Any]:
        self.seq += 1
        values: dict[str, Any] = {"seq": self.seq, "ts": round(now, 3)}
        for number, (object_id, _, _, _, mean, amplitude) in enumerate(SENSORS):
            wave = math.sin(now / 20.0 + self.phase + number)
            values[object_id] = round(mean + amplitude * wave + random.uniform(-0.2, 0.2), 2)
        return values

    def publish_reading(self, now: float) -> None:
        if self.client.is_connected():
            payload = json.dumps(self.reading(now))
            self.client.publish(self.telemetry_topic, payload, qos=1)

    def stop(self) -> None:
        """Leave cleanly: say offline ourselves (a normal DISCONNECT discards the will)."""
        if self.client.is_connected():
            info = self.client.publish(self.status_topic, OFFLINE, qos=1, retain=True)
            info.wait_for_publish(timeout=5)
        self.client.disconnect()
        self.client.loop_stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--username", default="")
    parser.add_argument("--password", default=None)
    parser.add_argument("--devices", type=int, default=3, help="how many devices (default 3)")
    parser.add_argument("--id-prefix", default="sensor", help="device ids: PREFIX-1, PREFIX-2...")
    parser.add_argument("--prefix", default="devices", help="topic prefix (default devices)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    parser.add_argument("--count", type=int, default=0, help="readings per device, 0: forever")
    parser.add_argument("--keepalive", type=int, default=30)
    parser.add_argument(
        "--session-expiry", type=int, default=3600, help="seconds the broker keeps each session"
    )
    parser.add_argument(
        "--home-assistant", action="store_true", help="publish Home Assistant discovery messages"
    )
    parser.add_argument("--discovery-prefix", default="homeassistant")
    args = parser.parse_args(argv)
    if args.devices < 1 or args.interval <= 0:
        parser.error("--devices must be at least 1 and --interval positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    devices = [Device(args, f"{args.id_prefix}-{n}", n) for n in range(1, args.devices + 1)]
    for device in devices:
        device.start()
    waits = 0
    for device in devices:
        while not device.connected.wait(0.2) and not stop.is_set():
            waits += 1
            if waits == 25:  # 5 s
                log.warning("still connecting to %s:%d ...", args.host, args.port)
    if not stop.is_set():
        log.info(
            "running on %s:%d: %d devices, topics %s/#",
            args.host,
            args.port,
            len(devices),
            args.prefix,
        )
    rounds = 0
    while not stop.is_set() and (args.count == 0 or rounds < args.count):
        now = time.time()
        for device in devices:
            device.publish_reading(now)
        rounds += 1
        stop.wait(args.interval)
    for device in devices:
        device.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
