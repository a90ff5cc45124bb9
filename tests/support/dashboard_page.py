"""The admin server's dashboard in a real headless Chromium (Debian's, driven by Playwright):
``sync_playwright`` (a missing playwright package skips, or fails under ``CI=true``), ``Page``
(one page of the dashboard, collecting console errors and taking screenshots) and ``WAIT_MS``
(how long a page may take to show what it must)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.admin_client import Admin
from support.clients import TIMEOUT
from support.external_tools import in_ci

WAIT_MS = int(TIMEOUT * 1000)


def sync_playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        reason = "the playwright package is not installed: pip install -e '.[test]'"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return start()


class Page:
    """A page of the dashboard, collecting console errors and uncaught exceptions."""

    def __init__(
        self, browser: Any, admin: Admin, shots: Path, token: str = "", **context: Any
    ) -> None:
        """``shots``: the folder its screenshots go to (made if missing); ``token``: the admin
        token the page logs in with (none: no login); ``context``: of the browser page."""
        shots.mkdir(exist_ok=True)
        self.page = browser.new_page(**context)
        if token:
            self.page.add_init_script(f"sessionStorage.setItem('mqttbroker-token', {token!r})")
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.admin = admin
        self.shots = shots

    def open(self, tab: str) -> Any:
        self.page.goto(f"{self.admin.base}/#{tab}")
        self.page.wait_for_selector(f"section#{tab}:not([hidden])", timeout=WAIT_MS)
        return self.page

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        return path
