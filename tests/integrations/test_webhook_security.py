"""Webhooks against hostile or careless input, each against a real aiohttp endpoint: the
secrets of a webhook URL (user name, password, query) are shown nowhere; a topic or client id
holding CR/LF reaches the endpoint percent-encoded, and a request that cannot be made is a dead
letter at once instead of stalling the webhook; redirects are not followed; the signature
covers the metadata headers. Also: the documented defaults of [[bridge]] and [[webhook]] are
the code's."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from support.clients import wait_for
from support.webhook_rig import Endpoint, Rig, verify

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.config.integrations import parse
from mqttbroker.integrations.webhooks import Webhook, redact_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://example.com/in", "https://example.com/***"),
        ("https://example.com/", "https://example.com/"),
        ("https://example.com", "https://example.com"),
        ("https://u:p%40ss@example.com:8443/in", "https://***@example.com:8443/***"),
        ("http://token@example.com/in", "http://***@example.com/***"),
        ("https://example.com/in?key=abc&v=2", "https://example.com/***?key=***&v=***"),
        ("https://example.com/?s3cret&a=", "https://example.com/?***&a=***"),
        ("https://u:p@[::1]:80/a?k=v#frag", "https://***@[::1]:80/***?k=***"),
        # the secret in the path: Slack, Discord, Teams
        ("https://hooks.slack.com/services/T0/B0/XyZsecret", "https://hooks.slack.com/***"),
        ("https://discord.com/api/webhooks/123/tok3n", "https://discord.com/***"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_url_secrets_are_shown_nowhere(rig: Rig) -> None:
    """The endpoint gets the URL as configured (Basic credentials, the query); $SYS (which
    the admin API's retained listing shows too), the dead letter and the log lines (a failure,
    a dead letter, "answers again") show it redacted."""

    def answer(path: str, body: bytes, count: int) -> tuple[int, dict[str, str]]:
        return [(503, {}), (400, {})][count] if count < 2 else (200, {})

    endpoint = rig.endpoint(answer)
    secrets = ("hookuser", "pa55w0rd", "t0ps3cret")
    url = f"http://hookuser:pa55w0rd@127.0.0.1:{endpoint.port}/hook?token=t0ps3cret&region=eu"
    shown = f"http://***@127.0.0.1:{endpoint.port}/***?token=***&region=***"
    config = f"""
[broker]
sys_interval = 0.2

[[webhook]]
name = "secretive"
url = "{url}"
topics = ["data/#"]
retry_delay = 0.02
retry_max_delay = 0.05
dead_letter_topic = "webhooks/dead"
"""
    broker = rig.broker(config)
    status = rig.collect(broker.port, ["$SYS/broker/webhooks/#"], qos=0)
    dead = rig.collect(broker.port, ["webhooks/dead"])
    client = rig.paho(broker)
    client.publish("data/1", b"refused", 1)  # 503, then 400: a dead letter
    dead.wait_count(1)
    client.publish("data/2", b"taken", 1)
    wait_for(lambda: len(endpoint.ok("hook")) == 1, "the second delivery")
    wait_for(
        lambda: (
            [m.payload for m in status.received() if m.topic.endswith("/delivered")][-1:] == [b"1"]
        ),
        "$SYS delivered 1",
    )
    # the real URL was used
    first = endpoint.all("hook")[0]
    assert first.query == "token=t0ps3cret&region=eu"
    expected = "Basic " + base64.b64encode(b"hookuser:pa55w0rd").decode()
    assert first.headers["Authorization"] == expected
    # and shown redacted
    figures = {m.topic: m.payload for m in status.received()}
    assert figures["$SYS/broker/webhooks/secretive/url"] == shown.encode()
    letter = json.loads(dead.payloads()[0])
    assert letter["url"] == shown and letter["reason"] == "HTTP 400"
    log = broker.log_text()
    assert f"webhook secretive: {shown}: HTTP 503; retrying" in log, log
    assert f"webhook secretive: {shown} answers again" in log, log
    seen = [
        log,
        *(m.payload.decode() for m in status.received()),
        *map(bytes.decode, dead.payloads()),
    ]
    for secret in secrets:
        assert not [text for text in seen if secret in text], secret
    client.close()


def test_cr_lf_in_topic_and_client_id_are_percent_encoded(rig: Rig, secret_file: Path) -> None:
    """MQTT allows CR and LF in topics and client ids: in format "raw" they travel in headers,
    percent-encoded, so they add no header; the signature covers them as sent; the webhook goes
    on with the next deliveries."""
    endpoint = rig.endpoint(lambda path, body, count: (200, {}))
    config = f"""
[[webhook]]
name = "raw"
url = "{endpoint.url}/raw"
topics = ["lines/#"]
format = "raw"
secret_file = "{secret_file}"
retry_delay = 0.05
retry_max_delay = 300.0
"""
    broker = rig.broker(config)
    client_id = "dev\r\nX-Injected: client"
    client = rig.paho(broker, client_id=client_id)
    topics = ["lines/a\r\nX-Injected: topic", "lines/100% é;x", "lines/plain"]
    for n, topic in enumerate(topics):
        client.publish(topic, b"%d" % n, 1)
    wait_for(lambda: len(endpoint.ok("raw")) == 3, "the three deliveries")
    got = {}
    for request in endpoint.ok("raw"):
        verify(request)
        headers = request.headers
        assert not [name for name in headers if "injected" in name.lower()], headers
        assert unquote(headers["X-Mqttbroker-Client-Id"]) == client_id
        got[unquote(headers["X-Mqttbroker-Topic"])] = request.body
    assert got == {topic: b"%d" % n for n, topic in enumerate(topics)}
    sent = {r.body: r.headers["X-Mqttbroker-Topic"] for r in endpoint.ok("raw")}
    assert sent[b"0"] == "lines/a%0D%0AX-Injected:%20topic"
    assert sent[b"1"] == "lines/100%25%20%C3%A9;x"
    client.close()


def test_redirects_are_not_followed(rig: Rig, secret_file: Path) -> None:
    """A 307 would POST the body and its signature to another address, a 302 GET it: neither
    is followed; the delivery is a dead letter at once, like a 4xx."""
    endpoint = rig.endpoint(
        lambda path, body, count: (
            (200, {})
            if path == "elsewhere"
            else (int(path[-3:]), {"Location": f"{endpoint.url}/elsewhere"})
        )
    )
    config = f"""
[[webhook]]
name = "to307"
url = "{endpoint.url}/moved307"
topics = ["a/#"]
secret_file = "{secret_file}"
dead_letter_topic = "webhooks/dead/to307"

[[webhook]]
name = "to302"
url = "{endpoint.url}/moved302"
topics = ["a/#"]
secret_file = "{secret_file}"
dead_letter_topic = "webhooks/dead/to302"
"""
    broker = rig.broker(config)
    dead = rig.collect(broker.port, ["webhooks/dead/#"])
    rig.paho(broker).publish("a/1", b"secret stuff", 1)
    dead.wait_count(2)
    reasons = sorted(json.loads(p)["reason"] for p in dead.payloads())
    assert reasons == [
        "HTTP 302 (redirects are not followed)",
        "HTTP 307 (redirects are not followed)",
    ]
    assert len(endpoint.all("moved307")) == len(endpoint.all("moved302")) == 1
    assert endpoint.all("elsewhere") == []


def test_a_request_that_cannot_be_made_is_a_dead_letter_at_once(tmp_path: Path) -> None:
    """A delivery the webhook cannot turn into a request (here an event record that is not
    JSON, as a damaged store could hold; aiohttp refusing a header takes the same path) is
    given up at once as a dead letter: the webhook does not stall (retry_max_delay is 300 s)
    and delivers the next one. In-process: the broker core, the webhook, a real endpoint."""
    endpoint = Endpoint(lambda path, body, count: (200, {}))
    try:
        (config,) = parse(
            "webhook",
            [
                {
                    "name": "inproc",
                    "url": f"{endpoint.url}/events",
                    "events": ["client.connected"],
                    "retry_max_delay": 300.0,
                    "dead_letter_topic": "webhooks/dead",
                }
            ],
            "test",
        )

        async def scenario() -> Webhook:
            broker = Broker()
            webhook = Webhook(broker, config)
            now = broker.clock()
            good = json.dumps({"client_id": "c2", "username": None}).encode()
            for payload in (b"not json", good):  # as the webhook queues its events
                message = Message("$event/client.connected", payload, 1)
                webhook.session.deliver(message, 1, False, (), now)
            webhook.start()
            try:
                deadline = time.monotonic() + 20
                while not endpoint.ok("events") and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
            finally:
                await webhook.stop()
            return webhook

        webhook = asyncio.run(scenario())
        (request,) = endpoint.ok("events")
        assert request.envelope()["client_id"] == "c2"
        status = webhook.status()
        assert status["dead_letters"] == 1 and status["delivered"] == 1, status
        assert status["inflight"] == 0 and status["queued"] == 0, status
        assert re.fullmatch(r"request not sent: JSONDecodeError: .*", status["last_error"]), status
    finally:
        endpoint.close()


def documented(section: str) -> dict[str, Any]:
    """config/mqttbroker.toml's commented-out ``[[section]]`` example, its keys uncommented."""
    text = (ROOT / "config" / "mqttbroker.toml").read_text()
    lines = text.splitlines()
    start = lines.index(f"# [[{section}]]")
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    table: dict[str, Any] = tomllib.loads("\n".join(block))[section][0]
    return table


def test_the_documented_defaults_are_the_code_defaults() -> None:
    """Each key config/mqttbroker.toml shows for [[bridge]] and [[webhook]] holds its default
    (but the required and example ones): one default per key. A bridge's max_queued_messages
    (its own queue, 100000) is a key of its own, not [broker]'s (a client session's, 1000)."""
    for section, example_keys in (
        ("bridge", {"name", "address", "topic", "client_id", "username"}),
        ("webhook", {"name", "url", "topics"}),
    ):
        table = documented(section)
        required = {key: table[key] for key in example_keys}
        (shown,) = parse(section, [table], "documented")
        (default,) = parse(section, [required], "defaults")
        assert shown == default, section
    assert documented("bridge")["max_queued_messages"] == 100_000
