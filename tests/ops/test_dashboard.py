"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): every page loads
without console errors, the clients table shows a connected paho client, the chart moves while
messages flow, a subscriber that stops reading turns red, kick works, the live viewer shows
messages through the WebSocket listener, and a phone-sized window has no sideways scrolling. A
screenshot of each page goes to the test's temporary directory (and the overview to
``$MQTTBROKER_DASHBOARD_SCREENSHOT`` when set: that is how docs/dashboard.png is made)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from support.admin_client import DYNSEC_TOKEN, Admin, AdminBroker
from support.clients import (
    TIMEOUT,
    Paho,
    stalled_subscriber,
    unique,
)
from support.dashboard_page import WAIT_MS, Page

pytestmark = pytest.mark.needs_chromium


def publish_forever(admin: Admin, paho: Paho, topic: str, stop: threading.Event) -> None:
    publisher = paho(admin)
    while not stop.wait(0.05):
        publisher.client.publish(topic, b"tick", qos=1)


def test_dashboard_pages_in_chromium(
    admin_broker: AdminBroker, paho: Paho, browser: Any, tmp_path: Path
) -> None:
    admin = admin_broker(
        "[alerts]\noldest_queued_age = 1\n"
        '[[listener]]\nport = 0\n[[listener]]\nport = 0\nprotocol = "ws"\n'
    )
    topic = unique("flow")
    watcher = paho(admin, client_id=unique("dashboard-watcher"))
    watcher.subscribe(topic, qos=0)
    stop = threading.Event()
    flow = threading.Thread(target=publish_forever, args=(admin, paho, topic, stop), daemon=True)
    flow.start()
    slow_id = unique("slow")
    try:
        shots = tmp_path / "screenshots"
        ui = Page(browser, admin, shots, viewport={"width": 1280, "height": 900})
        # -- overview: the chart moves while messages flow
        page = ui.open("overview")
        page.wait_for_function(
            "() => Number(document.getElementById('rate-chart').dataset.lastReceivedRate) > 0",
            timeout=WAIT_MS * 2,
        )
        points = int(page.get_attribute("#rate-chart", "data-points") or 0)
        page.wait_for_function(
            f"() => Number(document.getElementById('rate-chart').dataset.points) > {points}",
            timeout=WAIT_MS,
        )
        assert page.locator("#rate-chart canvas").count() >= 1
        # received and delivered often coincide: they differ in width and dash, so both show
        styles = page.evaluate(
            "() => chart.series.slice(1).map(s => [s.label, s.width, String(s.dash || '')])"
        )
        assert styles[0][0] == "received" and styles[1][0] == "delivered"
        assert styles[0][1] >= 2 * styles[1][1] and styles[0][2] != styles[1][2], styles
        overview = ui.shot("overview")
        # -- a subscriber that stops reading: MQTT 5, Receive Maximum 1, never acknowledges
        with stalled_subscriber(admin.broker, slow_id, topic):
            page = ui.open("sessions")
            page.wait_for_selector(
                f'#sessions-table tr.stuck[data-client-id="{slow_id}"]', timeout=WAIT_MS
            )
            colour = page.eval_on_selector(
                f'#sessions-table tr[data-client-id="{slow_id}"] td',
                "td => getComputedStyle(td).color",
            )
            assert colour == "rgb(217, 45, 32)"  # red
            ui.shot("sessions")
        # -- clients: the paho client is listed, and kick disconnects it with 0x98
        page = ui.open("clients")
        row = f'#clients-table tr[data-client-id="{watcher.client_id}"]'
        page.wait_for_selector(row, timeout=WAIT_MS)
        assert "MQTT 5" in page.inner_text(row)
        # bytes in (CONNECT, SUBSCRIBE) and out (CONNACK, SUBACK, the messages it gets)
        assert int(page.inner_text(f"{row} td.bytes-in")) > 0
        assert int(page.inner_text(f"{row} td.bytes-out")) > 0
        ui.shot("clients")
        page.click(f"{row} button")
        gone = watcher.wait_disconnected()
        assert gone.from_server and gone.reason_code == 0x98
        page.wait_for_selector(row, state="detached", timeout=WAIT_MS)
        # -- subscriptions, retained
        paho(admin).publish(f"{topic}/kept", b"21.5", qos=1, retain=True)
        for member in (paho(admin), paho(admin)):
            member.subscribe(f"$share/workers/{topic}/jobs", qos=1)
        page = ui.open("subscriptions")
        page.wait_for_selector(
            '#shared-table td:text-is("$share/workers/' + topic + '/jobs")', timeout=WAIT_MS
        )
        ui.shot("subscriptions")
        page = ui.open("retained")
        page.wait_for_selector(f'#retained-table td:text-is("{topic}/kept")', timeout=WAIT_MS)
        ui.shot("retained")
        # -- live: MQTT.js over the WebSocket listener
        page = ui.open("live")
        page.fill("#live-filter", topic)
        page.click("#live-start")
        page.wait_for_selector('#live-table td:text-is("tick")', timeout=WAIT_MS)
        ui.shot("live")
        assert ui.errors == [], "\n".join(ui.errors)
        # -- a phone-sized window: everything fits its width; tables scroll inside their box
        phone = Page(
            browser,
            admin,
            shots,
            viewport={"width": 390, "height": 844},
            is_mobile=True,
            has_touch=True,
        )
        for tab in ("overview", "clients", "sessions"):
            page = phone.open(tab)
            page.wait_for_selector("#version:not(:empty)", timeout=WAIT_MS)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{tab}: the page is {width}px wide on a 390px screen"
            phone.shot(f"phone-{tab}")
        assert phone.errors == []
    finally:
        stop.set()
        flow.join(TIMEOUT)
    target = os.environ.get("MQTTBROKER_DASHBOARD_SCREENSHOT")
    if target:
        shutil.copyfile(overview, target)


def test_security_page_lists_and_disables_dynsec_clients(
    dynsec_admin: tuple[Admin, Path], browser: Any, tmp_path: Path
) -> None:
    admin, _ = dynsec_admin
    name = unique("api-made")
    admin.ok("POST", "/api/v1/dynsec/clients", {"username": name, "password": "pw"})
    ui = Page(browser, admin, tmp_path / "screenshots", DYNSEC_TOKEN)
    page = ui.open("security")
    row = f'#dynsec-table tr[data-username="{name}"]'
    page.wait_for_selector(row, timeout=WAIT_MS)
    assert page.inner_text(f"{row} td.state") == "enabled"
    # created on the page, then disabled on the page
    other = unique("page-made")
    page.fill("#dynsec-username", other)
    page.fill("#dynsec-password", "pw2")
    page.click("#dynsec-create")
    page.wait_for_selector(f'#dynsec-table tr[data-username="{other}"]', timeout=WAIT_MS)
    page.click(f"{row} button")
    page.wait_for_selector(f'{row} td.state:text-is("disabled")', timeout=WAIT_MS)
    assert admin.ok("GET", f"/api/v1/dynsec/clients/{name}")["disabled"] is True
    ui.shot("security")
    assert ui.errors == [], "\n".join(ui.errors)
