"""Fixtures of the integration tests: Mosquitto brokers and paho collectors stopped after the
test (both from tests/support), and ``rig``, all of one test's fixtures in one."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cleanup import ended_after
from support.clients import Collector, PahoClient
from support.launcher import BrokerProcess, Mosquitto
from support.webhook_rig import SECRET, Endpoint, Rig


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    """``mosquitto(persistence=False, extra="", start=True)``: a Mosquitto of the test's own."""
    count = itertools.count()
    with ended_after(Mosquitto.stop) as keep:

        def make(persistence: bool = False, extra: str = "", start: bool = True) -> Mosquitto:
            broker = keep(Mosquitto(tmp_path / f"mosquitto{next(count)}", persistence, extra))
            return broker.start() if start else broker

        yield make


@pytest.fixture
def collect() -> Iterator[Callable[..., Collector]]:
    """``collect(port, topics, qos=1, version=5, persistent=False)``: a subscribed collector."""
    with ended_after(Collector.close) as keep:
        yield lambda *args, **kwargs: keep(Collector(*args, **kwargs))


@pytest.fixture
def endpoint() -> Iterator[Callable[..., Endpoint]]:
    """``endpoint(answer)``: a webhook endpoint (support.webhook_rig.Endpoint), closed after
    the test."""
    with ended_after(Endpoint.close) as keep:
        yield lambda answer: keep(Endpoint(answer))


@pytest.fixture
def rig(
    tmp_path: Path,
    start_broker: Callable[..., BrokerProcess],
    mosquitto: Callable[..., Mosquitto],
    collect: Callable[..., Collector],
    paho: Callable[..., PahoClient],
    endpoint: Callable[..., Endpoint],
) -> Rig:
    return Rig(tmp_path, start_broker, mosquitto, collect, paho, endpoint)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """The webhooks' signing secret in a file, as ``secret_file`` names it."""
    path = tmp_path / "webhook.secret"
    path.write_bytes(SECRET + b"\n")
    return path
