"""Interoperability with Mosquitto's command-line clients (mosquitto_pub, mosquitto_sub).

mosquitto_sub runs with ``-d`` under ``stdbuf -oL`` so that its "received SUBACK" line shows
up at once: the test publishes only after the subscription is in place, instead of sleeping.
Messages are printed with ``-F '%q %r %t %p'``: QoS, retain flag, topic, payload.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
from support.cleanup import ended_after
from support.clients import TIMEOUT, unique
from support.external_tools import program
from support.launcher import mosquitto_client

pytestmark = pytest.mark.needs_mosquitto

MOSQUITTO_VERSIONS = [pytest.param("mqttv5", id="v5"), pytest.param("mqttv311", id="v311")]
QOS = [pytest.param(q, id=f"qos{q}") for q in (0, 1, 2)]


@pytest.fixture(params=MOSQUITTO_VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    """Each protocol version the Mosquitto clients speak (``-V``); a test taking it runs once
    for each."""
    return str(request.param)


@pytest.fixture(params=QOS)
def qos(request: pytest.FixtureRequest) -> int:
    """Each QoS; a test taking it runs once for each."""
    return int(request.param)


FORMAT = "%q %r %t %p"


class MosquittoSub:
    """A running mosquitto_sub whose output is read line by line in a thread."""

    def __init__(self, broker, filters, qos, version, count, timeout=TIMEOUT):
        args = [
            "stdbuf",  # coreutils
            "-oL",
            program("mosquitto_sub"),
            "-h",
            broker.host,
            "-p",
            str(broker.port),
            "-V",
            version,
            "-q",
            str(qos),
            "-i",
            unique("msub"),
            "-C",
            str(count),
            "-W",
            str(int(timeout)),
            "-F",
            FORMAT,
            "-d",
        ]
        for topic_filter in filters:
            args += ["-t", topic_filter]
        self.filters = list(filters)
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_subscribed(self, timeout: float = TIMEOUT) -> None:
        """Wait for the SUBACK (mosquitto_sub subscribes to all its filters in one SUBSCRIBE)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any("received SUBACK" in line for line in self.lines):
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    raise AssertionError(f"mosquitto_sub did not subscribe: {self.lines}")
                self._cond.wait(left)

    def finish(self, timeout: float = TIMEOUT + 5) -> list[str]:
        """Wait for mosquitto_sub to exit (after its -C count); its message lines."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"mosquitto_sub did not finish: {self.lines}") from None
        self._thread.join(timeout)
        assert code == 0, f"mosquitto_sub exited with {code}: {self.lines}"
        return self.messages()

    def messages(self) -> list[str]:
        with self._cond:
            return [
                line
                for line in self.lines
                if line and not line.startswith("Client ") and not line.startswith("Subscribed")
            ]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def mosquitto_sub(broker):
    with ended_after(MosquittoSub.kill) as keep:

        def start(filters, qos, version, count):
            sub = keep(MosquittoSub(broker, filters, qos, version, count))
            sub.wait_subscribed()
            return sub

        yield start


def mosquitto_pub(broker, topic, message, qos, version, retain=False, null=False):
    """Run mosquitto_pub, then wait until the broker has handled its PUBLISH: it logs the
    DISCONNECT that mosquitto_pub sends after it (at QoS 0 nothing else tells)."""
    client_id = unique("mpub")
    mark = broker.log_mark()
    args = ["-V", version, "-q", str(qos), "-i", client_id, "-t", topic]
    args += ["-n"] if null else ["-m", message]
    if retain:
        args.append("-r")
    mosquitto_client("mosquitto_pub", broker.host, broker.port, *args, timeout=TIMEOUT)
    logged = broker.wait_for_log(rf"\b{re.escape(client_id)}\b.*disconnected", TIMEOUT, mark)
    assert logged, f"the broker did not log the disconnection of {client_id}:\n{broker.log_text()}"


def test_mosquitto_pub_to_mosquitto_sub(broker, mosquitto_sub, topic, version, qos):
    """[MQTT-4.5.0-1] [MQTT-4.6.0-6] mosquitto_pub's messages reach mosquitto_sub intact and in
    order, at the QoS used on both sides."""
    sub = mosquitto_sub([topic], qos, version, 3)
    for text in ("first", "second message", "d\u00e9j\u00e0 vu \u2603"):
        mosquitto_pub(broker, topic, text, qos, version)
    assert sub.finish() == [
        f"{qos} 0 {topic} first",
        f"{qos} 0 {topic} second message",
        f"{qos} 0 {topic} d\u00e9j\u00e0 vu \u2603",
    ]


def test_mosquitto_wildcards(broker, mosquitto_sub, topic, version, qos):
    """[MQTT-4.7.1-1] [MQTT-4.7.1-2] mosquitto_sub with '+' and '#' filters gets exactly the
    matching topics."""
    sub = mosquitto_sub([f"{topic}/+/temp", f"{topic}/house/#"], qos, version, 4)
    published = [
        f"{topic}/kitchen/temp",  # +
        f"{topic}/kitchen/humidity",  # neither
        f"{topic}/house",  # # (the parent level itself)
        f"{topic}/garden/shed/temp",  # neither
        f"{topic}/house/attic/temp",  # #
        f"{topic}/house/temp",  # + and # (one copy)
    ]
    for name in published:
        mosquitto_pub(broker, name, name.rsplit("/", 1)[-1], qos, version)
    lines = sub.finish()
    assert sorted(lines) == sorted(
        [
            f"{qos} 0 {topic}/kitchen/temp temp",
            f"{qos} 0 {topic}/house house",
            f"{qos} 0 {topic}/house/attic/temp temp",
            f"{qos} 0 {topic}/house/temp temp",
        ]
    )


def test_mosquitto_retained_messages(broker, mosquitto_sub, topic, version, qos):
    """[MQTT-3.3.1-5] [MQTT-3.3.1-6] [MQTT-3.3.1-9] A retained message from mosquitto_pub goes to
    a later mosquitto_sub with the retain flag; a newer one replaces it; an empty one clears it."""
    mosquitto_pub(broker, f"{topic}/state", "on", qos, version, retain=True)
    first = mosquitto_sub([f"{topic}/#"], 2, version, 1)
    assert first.finish() == [f"{qos} 1 {topic}/state on"]

    mosquitto_pub(broker, f"{topic}/state", "off", qos, version, retain=True)
    second = mosquitto_sub([f"{topic}/#"], 2, version, 1)
    assert second.finish() == [f"{qos} 1 {topic}/state off"]

    mosquitto_pub(broker, f"{topic}/state", "", qos, version, retain=True, null=True)
    third = mosquitto_sub([f"{topic}/#"], 2, version, 1)
    marker = unique("marker")
    mosquitto_pub(broker, f"{topic}/marker", marker, 2, version)
    assert third.finish() == [f"2 0 {topic}/marker {marker}"]


@pytest.mark.parametrize(
    "pub_version, sub_version",
    [
        pytest.param("mqttv5", "mqttv311", id="v5-to-v311"),
        pytest.param("mqttv311", "mqttv5", id="v311-to-v5"),
    ],
)
def test_mosquitto_across_protocol_versions(broker, mosquitto_sub, topic, pub_version, sub_version):
    """[MQTT-4.5.0-1] [MQTT-3.8.4-8] Messages cross between MQTT 5 and 3.1.1 clients, each at
    min(publish QoS, subscription QoS)."""
    sub = mosquitto_sub([topic], 1, sub_version, 3)
    for qos in (0, 1, 2):
        mosquitto_pub(broker, topic, f"at {qos}", qos, pub_version)
    assert sub.finish() == [f"{min(q, 1)} 0 {topic} at {q}" for q in (0, 1, 2)]
