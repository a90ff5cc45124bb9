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
from support.clients import Collector
from support.example_programs import EXAMPLES
from support.launcher import Mosquitto

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
    return [(m.topic, m.payload) for m in collector.received()]


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
    tmp_path: Path,
    start_broker: Callable[..., Any],
    remote: Mosquitto,
    paho: Callable[..., Any],
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
        local, cloud = paho(ours), paho(remote)

        # out: local sensors/... -> site-a/sensors/...; both: chat/... as it is
        local.publish("sensors/t1/temperature", b"21.5", 1)
        local.publish("commands/t1", b"local command", 1)  # an "in" rule: stays here
        local.publish("chat/room", b"from the site", 1)
        wait_seen(far, "site-a/sensors/t1/temperature", b"21.5")
        wait_seen(far, "chat/room", b"from the site")

        # in: Mosquitto's site-a/commands/... -> commands/...; both: chat/... as it is
        cloud.publish("site-a/commands/t1/reboot", b"reboot", 1)
        cloud.publish("site-a/sensors/t2", b"remote reading", 1)  # an "out" rule: stays there
        cloud.publish("chat/room", b"from the cloud", 1)
        wait_seen(near, "commands/t1/reboot", b"reboot")
        wait_seen(near, "chat/room", b"from the cloud")

        # Markers after everything: what was published before them (and any echo) would have
        # arrived first, in order over each connection.
        local.publish("chat/end", b"end out", 1)
        wait_seen(far, "chat/end", b"end out")
        cloud.publish("chat/end", b"end in", 1)
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
