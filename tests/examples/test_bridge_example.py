"""examples/bridge-to-mosquitto.toml, run as written against a real Mosquitto (only the remote's
address is changed, to the test's Mosquitto, and the listener's port, to a free one): local
``sensors/...`` reach Mosquitto as ``site-a/sensors/...``, Mosquitto's ``site-a/commands/...``
come in as ``commands/...``, ``chat/...`` flows both ways under the same names and once, and
nothing goes a way the example does not configure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from example_support import EXAMPLES, Collector, Mosquitto, publish_all, publisher

from mqttbroker.config import load

ADDRESS = 'address = "127.0.0.1:1884"'
TOPICS = ["sensors/#", "commands/#", "chat/#", "site-a/#"]  # all but what $SYS has


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    try:
        yield broker
    finally:
        broker.stop()


def seen(collector: Collector) -> list[tuple[str, bytes]]:
    with collector.lock:
        return [(m.topic, bytes(m.payload)) for m in collector.messages]


def wait_seen(collector: Collector, topic: str, payload: bytes) -> None:
    collector.wait_count(1, payload)
    assert (topic, payload) in seen(collector), seen(collector)


def test_read_by_the_broker_as_its_comments_say() -> None:
    """The example connects without a user name or password, as its comments say (an empty
    ``username`` would be sent as a user name, which a remote with users refuses)."""
    (bridge,) = load(EXAMPLES / "bridge-to-mosquitto.toml").bridges
    assert (bridge.name, bridge.host, bridge.port) == ("mosquitto", "127.0.0.1", 1884)
    assert (bridge.username, bridge.password) == (None, None)


@pytest.mark.needs_mosquitto
def test_each_configured_direction_and_no_other(
    tmp_path: Path, start_broker: Callable[..., Any], remote: Mosquitto
) -> None:
    text = (EXAMPLES / "bridge-to-mosquitto.toml").read_text()
    assert text.count(ADDRESS) == 1, "the example's remote address is not where the test expects"
    config = tmp_path / "bridge-to-mosquitto.toml"
    config.write_text(text.replace(ADDRESS, f'address = "127.0.0.1:{remote.port}"'))
    ours = start_broker(extra_args=("--config", str(config)))
    assert ours.wait_for_log(r"bridge mosquitto: subscribed on the remote broker", 20), (
        ours.log_text()
    )
    with ExitStack() as stack:
        far = Collector(remote.port, TOPICS)  # on Mosquitto
        stack.callback(far.close)
        near = Collector(ours.port, TOPICS)  # on our broker
        stack.callback(near.close)
        local, cloud = publisher(ours.port), publisher(remote.port)
        for client in (local, cloud):
            stack.callback(client.loop_stop)
            stack.callback(client.disconnect)

        # out: local sensors/... -> site-a/sensors/...; both: chat/... as it is
        publish_all(local, "sensors/t1/temperature", [b"21.5"])
        publish_all(local, "commands/t1", [b"local command"])  # an "in" rule: stays here
        publish_all(local, "chat/room", [b"from the site"])
        wait_seen(far, "site-a/sensors/t1/temperature", b"21.5")
        wait_seen(far, "chat/room", b"from the site")

        # in: Mosquitto's site-a/commands/... -> commands/...; both: chat/... as it is
        publish_all(cloud, "site-a/commands/t1/reboot", [b"reboot"])
        publish_all(cloud, "site-a/sensors/t2", [b"remote reading"])  # an "out" rule: stays there
        publish_all(cloud, "chat/room", [b"from the cloud"])
        wait_seen(near, "commands/t1/reboot", b"reboot")
        wait_seen(near, "chat/room", b"from the cloud")

        # Markers after everything: what was published before them (and any echo) would have
        # arrived first, in order over each connection.
        publish_all(local, "chat/end", [b"end out"])
        wait_seen(far, "chat/end", b"end out")
        publish_all(cloud, "chat/end", [b"end in"])
        wait_seen(near, "chat/end", b"end in")

    assert sorted(seen(far)) == sorted(
        [
            ("site-a/sensors/t1/temperature", b"21.5"),
            ("chat/room", b"from the site"),
            ("site-a/commands/t1/reboot", b"reboot"),  # Mosquitto's own, as published
            ("site-a/sensors/t2", b"remote reading"),
            ("chat/room", b"from the cloud"),
            ("chat/end", b"end out"),
            ("chat/end", b"end in"),
        ]
    )
    assert sorted(seen(near)) == sorted(
        [
            ("sensors/t1/temperature", b"21.5"),  # ours, as published
            ("commands/t1", b"local command"),
            ("chat/room", b"from the site"),
            ("commands/t1/reboot", b"reboot"),
            ("chat/room", b"from the cloud"),
            ("chat/end", b"end out"),
            ("chat/end", b"end in"),
        ]
    )
    log = ours.log_text()
    assert "refused" not in log and "matches no in rule" not in log, log
