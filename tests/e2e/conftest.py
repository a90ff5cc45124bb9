"""Fixtures of the end-to-end tests: paho clients that are closed after the test, and a topic
prefix of the test's own (the session broker is shared, retained messages included)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from support.clients import MQTT_5, PahoClient, Server, unique

ClientFactory = Callable[..., PahoClient]


@pytest.fixture
def make_client(broker: Server, paho: ClientFactory) -> ClientFactory:
    """``make_client(version=5, connect=True, server=broker, **PahoClient options)``: the
    ``paho`` fixture's client, of the session broker unless ``server`` is given."""

    def make(
        version: int = MQTT_5, connect: bool = True, server: Server | None = None, **kw: Any
    ) -> PahoClient:
        return paho(broker if server is None else server, version, connect=connect, **kw)

    return make


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic prefix no other test uses, e.g. ``e2e/test_x_v5/e2e-3-1a2b3c4d``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    return f"e2e/{name}/{unique()}"
