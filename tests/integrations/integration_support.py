"""Support for the integration tests: Debian's Mosquitto started on a free port with a generated
configuration (restartable on the same port), our broker started from a TOML file, and a paho
subscriber that reconnects by itself and collects what it receives."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from external_tools import find, in_ci
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def mosquitto_binary() -> str:
    path = find("mosquitto")
    if path is None:
        reason = "mosquitto not installed: apt-get install mosquitto"
        if in_ci():
            pytest.fail(f"{reason} (CI=true: a missing tool fails the run)", pytrace=False)
        pytest.skip(reason)
    return path


class Mosquitto:
    """A Mosquitto broker of the test's own; ``restart()`` keeps its port (and, with
    ``persistence``, what it saved on the way down)."""

    def __init__(self, workdir: Path, persistence: bool = False, extra: str = "") -> None:
        self.binary = mosquitto_binary()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persistence = persistence
        self.extra = extra  # more configuration (a TLS listener)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "mosquitto.log"

    def start(self) -> Mosquitto:
        conf = self.workdir / "mosquitto.conf"
        text = (
            ""
            # as root, stay root: it reads the test's files (certificates) and writes its store
            + ("user root\n" if os.geteuid() == 0 else "")
            + "per_listener_settings false\n"
            "allow_anonymous true\n"
            f"persistence {'true' if self.persistence else 'false'}\n"
            f"persistence_location {self.workdir}/\n"
            "log_type all\n"
            "max_queued_messages 100000\n"
            "set_tcp_nodelay true\n"
            f"listener {self.port} 127.0.0.1\n" + self.extra
        )
        conf.write_text(text)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(conf)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "mosquitto did not start:\n" + self.log.read_text()
                    ) from None
                time.sleep(0.02)

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def write_config(path: Path, text: str) -> tuple[str, ...]:
    """The arguments that start our broker from this TOML text."""
    path.write_text(text)
    return ("--config", str(path))


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Collector:
    """A paho client that subscribes on every (re)connection and keeps what it receives."""

    def __init__(
        self,
        port: int,
        topics: list[str],
        qos: int = 1,
        version: int = 5,
        persistent: bool = False,
        client_id: str | None = None,
    ) -> None:
        self.topics = topics
        self.qos = qos
        self.version = version
        self.lock = threading.Lock()
        self.messages: list[mqtt.MQTTMessage] = []
        self.subscribed = threading.Event()
        client_id = client_id or f"collector-{uuid.uuid4().hex[:8]}"
        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=None if version == 5 else not persistent,
        )
        self.client.reconnect_delay_set(0.05, 0.5)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        kwargs: dict[str, Any] = {}
        if version == 5:
            kwargs["clean_start"] = not persistent
            if persistent:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = 3600
                kwargs["properties"] = props
        self.client.connect("127.0.0.1", port, **kwargs)
        self.client.loop_start()
        assert self.subscribed.wait(TIMEOUT), f"{client_id}: no SUBACK"

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        client.subscribe([(topic, self.qos) for topic in self.topics])

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(msg)

    def payloads(self, prefix: bytes = b"") -> list[bytes]:
        with self.lock:
            return [bytes(m.payload) for m in self.messages if bytes(m.payload).startswith(prefix)]

    def wait_count(self, count: int, prefix: bytes = b"", timeout: float = TIMEOUT) -> None:
        wait_for(
            lambda: len(self.payloads(prefix)) >= count,
            f"{count} messages starting {prefix!r} (have {len(self.payloads(prefix))})",
            timeout,
        )

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publisher(port: int, version: int = 5) -> mqtt.Client:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"pub-{uuid.uuid4().hex[:8]}",
        protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311,
    )
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def publish_all(client: mqtt.Client, topic: str, payloads: list[bytes], qos: int = 1) -> None:
    """Publish each payload and wait until every one was acknowledged."""
    infos = [client.publish(topic, payload, qos) for payload in payloads]
    for info in infos:
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"not acknowledged: {info.mid}"


def in_python_path() -> None:
    """The transport tests' helpers (certificates) are importable from here too."""
    here = Path(__file__).resolve().parent
    for folder in ("transports",):
        path = str(here.parent / folder)
        if path not in sys.path:
            sys.path.append(path)


def env_without(name: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(name, None)
    return env
