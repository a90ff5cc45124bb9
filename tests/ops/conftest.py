"""Fixtures of the admin-server tests: a broker with its admin server on a port of the test's
own, and a small HTTP client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ops_support import Admin, start_admin
from support.clients import PahoClient


@pytest.fixture
def admin_broker(start_broker: Callable[..., Any], tmp_path: Path) -> Callable[..., Admin]:
    """``admin_broker(config="", args=())``: a broker (memory store unless the config says
    otherwise) whose admin server listens on a free loopback port; returns its Admin."""

    def start(config: str = "", args: tuple[str, ...] = (), memory: bool = True) -> Admin:
        return start_admin(start_broker, tmp_path, config, args, memory)

    return start


@pytest.fixture
def paho() -> Iterator[Callable[..., PahoClient]]:
    """``paho(admin, client_id=None, **kw)``: a connected paho client, closed after the test."""
    made: list[PahoClient] = []

    def make(
        admin: Admin, client_id: str | None = None, connect: bool = True, **kw: Any
    ) -> PahoClient:
        client = PahoClient(admin.broker.host, admin.broker.port, client_id=client_id, **kw)
        made.append(client)
        if connect:
            client.connect()
        return client

    yield make
    for client in made:
        client.close()
