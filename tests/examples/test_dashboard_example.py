"""examples/dashboard/ in headless Chromium: the page connects over MQTT-over-WebSocket and shows
the device simulator's readings as they change; a screenshot is kept in the test's tmp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import sync_playwright
from support.clients import unique
from support.example_programs import EXAMPLES, simulator
from support.external_tools import program

WEBSOCKET = r"listening on (\S+):(\d+) \(MQTT over WebSocket\)"


@pytest.mark.needs_chromium
def test_dashboard_shows_moving_values(
    start_broker: Callable[..., Any], start_program: Callable[..., Any], tmp_path: Path
) -> None:
    broker = start_broker(extra_args=("--ws-port", "0"))
    ws = broker.wait_for_log(WEBSOCKET, 10)
    assert ws is not None, broker.log_text()
    prefix = unique("dash")
    device = f"{prefix}-2"
    simulator(start_program, broker, prefix, "--devices", "2")
    query = urlencode({"url": f"ws://{ws.group(1)}:{ws.group(2)}/mqtt", "prefix": prefix})
    page_url = f"{(EXAMPLES / 'dashboard' / 'index.html').as_uri()}?{query}"
    card = f'[data-device="{device}"]'
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=program("chromium"), headless=True)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 500})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_url)
            page.wait_for_selector('#connection[data-state="connected"]', timeout=10_000)
            page.wait_for_selector(f'{card} .status[data-status="online"]', timeout=10_000)
            shown = """selector => [".temperature", ".seq"].map(
                part => document.querySelector(selector + " " + part).textContent)"""
            page.wait_for_function(
                "selector => /^-?\\d+\\.\\d\\d$/.test(document.querySelector(selector).textContent)",
                arg=f"{card} .temperature",
                timeout=10_000,
            )
            first = page.evaluate(shown, card)  # value and reading number, read together
            # Moving: a later reading replaces both (the readings are noisy, so the values
            # differ), and the chart has a line drawn on it.
            page.wait_for_function(
                f"""([card, first]) => ({shown})(card).every((text, i) => text !== first[i])""",
                arg=[card, first],
                timeout=10_000,
            )
            drawn = page.evaluate(
                """selector => {
                    const canvas = document.querySelector(selector);
                    const pixels = canvas.getContext("2d")
                        .getImageData(0, 0, canvas.width, canvas.height).data;
                    let painted = 0;
                    for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) painted++;
                    return painted;
                }""",
                f"{card} canvas",
            )
            assert drawn > 100, drawn
            page.wait_for_function("document.querySelectorAll('.device').length === 2")
            assert float(page.locator(f"{card} .humidity").text_content() or "nan") > 0
            screenshot = tmp_path / "dashboard.png"
            page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 1000
            assert not errors, errors
        finally:
            browser.close()
