"""Fixtures of the admin-server tests: a broker with its admin server on a port of the test's
own (``admin_broker``; ``dynsec_admin`` with the dynamic security behind a token), paho clients
of it, a headless Chromium for the dashboard (``browser``); ``make_harness`` and ``h``
(support.harness) for the $SYS tree tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.admin_client import Admin, AdminBroker, start_admin, start_dynsec_admin
from support.clients import PahoClient
from support.dashboard_page import sync_playwright
from support.external_tools import program
from support.harness import h, make_harness

__all__ = ["admin_broker", "browser", "dynsec_admin", "h", "make_harness", "paho"]


@pytest.fixture
def admin_broker(start_broker: Callable[..., Any], tmp_path: Path) -> AdminBroker:
    """``admin_broker(config="", args=())``: a broker (memory store unless the config says
    otherwise) whose admin server listens on a free loopback port; returns its Admin."""

    def start(config: str = "", args: tuple[str, ...] = (), memory: bool = True) -> Admin:
        return start_admin(start_broker, tmp_path, config, args, memory)

    return start


@pytest.fixture
def paho(paho: Callable[..., PahoClient]) -> Callable[..., PahoClient]:
    """``paho(admin, client_id=None, **kw)``: tests/conftest.py's paho client, of the admin
    server's broker."""

    def make(
        admin: Admin, client_id: str | None = None, connect: bool = True, **kw: Any
    ) -> PahoClient:
        return paho(admin.broker, client_id=client_id, connect=connect, **kw)

    return make


@pytest.fixture
def dynsec_admin(start_broker: Callable[..., Any], tmp_path: Path) -> tuple[Admin, Path]:
    """``support.admin_client.start_dynsec_admin``'s broker: its Admin (logged in with
    ``DYNSEC_TOKEN``) and its dynamic security's state file."""
    return start_dynsec_admin(start_broker, tmp_path)


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's), closed after the test."""
    chromium = program("chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        try:
            yield browser
        finally:
            browser.close()
