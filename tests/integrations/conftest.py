"""Fixtures of the integration tests: Mosquitto brokers and paho collectors stopped after the
test (both from tests/support), and ``rig``, all of one test's fixtures in one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.clients import Collector, PahoClient
from support.integrations import SECRET, Rig
from support.launcher import BrokerProcess, Mosquitto


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    """``mosquitto(persistence=False, extra="", start=True)``: a Mosquitto of the test's own."""
    made: list[Mosquitto] = []

    def make(persistence: bool = False, extra: str = "", start: bool = True) -> Mosquitto:
        broker = Mosquitto(tmp_path / f"mosquitto{len(made)}", persistence, extra)
        made.append(broker)
        return broker.start() if start else broker

    yield make
    for broker in made:
        broker.stop()


@pytest.fixture
def collect() -> Iterator[Callable[..., Collector]]:
    """``collect(port, topics, qos=1, version=5, persistent=False)``: a subscribed collector."""
    made: list[Collector] = []

    def make(*args: Any, **kwargs: Any) -> Collector:
        collector = Collector(*args, **kwargs)
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.close()


@pytest.fixture
def rig(
    tmp_path: Path,
    start_broker: Callable[..., BrokerProcess],
    mosquitto: Callable[..., Mosquitto],
    collect: Callable[..., Collector],
    paho: Callable[..., PahoClient],
) -> Rig:
    return Rig(tmp_path, start_broker, mosquitto, collect, paho)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """The webhooks' signing secret in a file, as ``secret_file`` names it."""
    path = tmp_path / "webhook.secret"
    path.write_bytes(SECRET + b"\n")
    return path
