"""examples/webhook_receiver.py, posted to with aiohttp's client as the broker's webhooks do:
a correctly signed delivery is handled and answered 2xx; the same delivery id again is answered
2xx and not handled twice; a wrong secret, a changed body, a changed metadata header, a stale
timestamp or no signature are refused (401) and not remembered; percent-encoded metadata
headers are decoded. Then end to end: our broker's [[webhook]] deliveries of a
paho client's messages, both formats, the secret from the environment or from a file."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.clients import Collector, wait_for
from support.example_programs import example, run_example

SECRET = b"correct horse battery staple"


SIGNED = ("Event", "Delivery-Id", "Topic", "Qos", "Retain", "Client-Id")


def signature(secret: bytes, timestamp: int, headers: dict[str, str], body: bytes) -> str:
    """Written out here from the format (README), not taken from the example under test: the
    timestamp and the metadata headers' values, a line each, then the body."""
    lines = [str(timestamp)] + [headers.get(f"X-Mqttbroker-{name}", "") for name in SIGNED]
    signed = "\n".join(lines).encode() + b"\n" + body
    return f"t={timestamp},v2={hmac.new(secret, signed, hashlib.sha256).hexdigest()}"


def envelope(delivery_id: str, payload: bytes, topic: str = "sensors/1") -> bytes:
    try:
        text, encoding = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode(), "base64"
    return json.dumps(
        {
            "event": "message.publish",
            "delivery_id": delivery_id,
            "timestamp": time.time(),
            "topic": topic,
            "payload": text,
            "payload_encoding": encoding,
            "qos": 1,
            "retain": False,
            "properties": {},
            "client_id": "dev-1",
            "username": None,
        }
    ).encode()


async def post(
    url: str,
    delivery_id: str,
    body: bytes,
    secret: bytes = SECRET,
    age: int = 0,
    signed_body: bytes | None = None,
    signed: bool = True,
    raw: dict[str, str] | None = None,
    changed: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """``raw``: a ``format = "raw"`` request with these metadata headers; ``changed``: headers
    changed after signing."""
    timestamp = int(time.time()) - age
    headers = {
        "Content-Type": "application/json" if raw is None else "application/octet-stream",
        "X-Mqttbroker-Delivery-Id": delivery_id,
        "X-Mqttbroker-Event": "message.publish",
        **(raw or {}),
    }
    if signed:
        headers["X-Mqttbroker-Signature"] = signature(
            secret, timestamp, headers, body if signed_body is None else signed_body
        )
    headers.update(changed or {})
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=body, headers=headers) as response:
            return response.status, await response.json()


def test_signed_deduplicated_and_forgeries_refused(
    start_program: Callable[..., Any], tmp_path: Path
) -> None:
    secret_file = tmp_path / "webhook.secret"
    secret_file.write_bytes(SECRET + b"\n")  # as `echo ... > file` writes it
    receiver = example(
        start_program,
        "webhook_receiver.py",
        "--port",
        "0",
        "--secret-file",
        str(secret_file),
        ready=r"listening on http://(\S+):(\d+)/webhook",
    )
    url = f"http://{receiver.host}:{receiver.port}/webhook"
    first, forged_first, binary, raw_id = (str(uuid.uuid4()) for _ in range(4))
    # as the broker sends a topic and a client id holding CR, LF, spaces: percent-encoded
    raw = {
        "X-Mqttbroker-Topic": "sensors/line%0D%0Abreak%20%C3%A9",
        "X-Mqttbroker-Qos": "1",
        "X-Mqttbroker-Retain": "false",
        "X-Mqttbroker-Client-Id": "dev%0A1",
    }

    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        body = envelope(first, b"21.5")
        return [
            await post(url, first, body),
            await post(url, first, body, age=5),  # a retry: re-signed, same delivery id
            await post(url, forged_first, body, secret=b"wrong"),
            await post(url, forged_first, envelope(forged_first, b"99"), signed_body=body),
            await post(url, forged_first, envelope(forged_first, b"1"), age=301),  # replayed
            await post(url, forged_first, envelope(forged_first, b"1"), signed=False),
            # the metadata headers are signed too: another topic, or QoS, is refused
            await post(url, raw_id, b"7", raw=raw, changed={"X-Mqttbroker-Topic": "other"}),
            await post(url, raw_id, b"7", raw=raw, changed={"X-Mqttbroker-Qos": "0"}),
            # the id of refused requests was not remembered: the genuine one is handled
            await post(url, forged_first, envelope(forged_first, b"genuine")),
            await post(url, binary, envelope(binary, b"\xff\x00\x01")),
            await post(url, raw_id, b"7", raw=raw),
            await post(url, str(uuid.uuid4()), b"{not json"),
        ]

    answers = asyncio.run(scenario())
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 401, 401, 401, 401, 401, 401, 200, 200, 200, 400], answers
    assert [a.get("status") for _, a in answers[:2]] == ["ok", "duplicate"]
    assert "outside the tolerance" in answers[4][1]["error"]

    log = receiver.log_text()
    handled = [line for line in log.splitlines() if " handled " in line]
    assert len(handled) == 4, log
    assert f"handled {first!r}: message.publish on 'sensors/1', 4 bytes, qos 1: b'21.5'" in log
    assert f"handled {forged_first!r}" in log and "b'genuine'" in log
    assert "3 bytes" in handled[2] and r"b'\xff\x00\x01'" in handled[2]
    # the raw delivery's topic decoded: CR, LF, a space and a non-ASCII letter
    expected = "message.publish on " + repr("sensors/line\r\nbreak é") + ", 1 bytes, qos 1"
    assert f"handled {raw_id!r}: {expected}" in handled[3], log
    assert log.count("refused a request") == 6

    receiver.stop()
    assert receiver.returncode == 0
    assert "stopped after 4 deliveries" in receiver.log_text()


def test_without_a_secret_it_does_not_start(tmp_path: Path) -> None:
    result = run_example(
        "webhook_receiver.py",
        "--port",
        "0",
        "--secret-file",
        str(tmp_path / "missing"),
        timeout=30,
    )
    assert result.returncode != 0
    assert f"--secret-file {tmp_path / 'missing'}: No such file or directory" in result.stderr


def last_figure(collector: Collector, figure: str) -> int:
    values = [int(m.payload) for m in collector.received() if m.topic.endswith("/" + figure)]
    return values[-1] if values else 0


@pytest.mark.parametrize("secret_from", ["env", "file"])
def test_the_broker_webhooks_end_to_end(
    start_program: Callable[..., Any],
    start_broker: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    secret_from: str,
    paho: Callable[..., Any],
) -> None:
    """Our broker's [[webhook]] deliveries (json and raw) of a paho client's messages and events,
    to the receiver started as examples/README.md says: each verified and handled once, also
    when the receiver stalls and the broker sends the same delivery again."""
    if secret_from == "env":  # the broker and the receiver read the same variable
        monkeypatch.setenv("WEBHOOK_SECRET", "s3cret")
        receiver_args: tuple[str, ...] = ()
        secret = 'secret_env = "WEBHOOK_SECRET"'
    else:
        monkeypatch.delenv("WEBHOOK_SECRET", raising=False)
        secret_file = tmp_path / "webhook.secret"
        secret_file.write_bytes(b"s3cret\n")  # as `echo s3cret > webhook.secret` writes it
        receiver_args = ("--secret-file", str(secret_file))
        secret = f'secret_file = "{secret_file}"'
    receiver = example(
        start_program,
        "webhook_receiver.py",
        "--port",
        "0",
        *receiver_args,
        ready=r"listening on http://(\S+):(\d+)/webhook",
    )
    url = f"http://{receiver.host}:{receiver.port}/webhook"
    config = tmp_path / "webhooks.toml"
    config.write_text(
        f"""
[broker]
sys_interval = 0.2

[[webhook]]
name = "receiver"
url = "{url}"
topics = ["sensors/#"]
events = ["message.publish", "client.connected"]
{secret}
timeout = 0.5
retry_delay = 0.05
retry_max_delay = 0.1

[[webhook]]
name = "raw"
url = "{url}"
topics = ["raw/#"]
format = "raw"
{secret}
"""
    )
    broker = start_broker(extra_args=("--config", str(config)))
    handled = r"handled '(receiver-\d+-[0-9a-f]+)': "

    client = paho(broker)
    watch: Collector | None = None
    try:
        client.publish("sensors/t1", b"21.5", 1)
        client.publish("raw/t1", b"\xff\x00raw", 1)
        name = client.client_id
        for line in (
            handled + re.escape(f"client.connected, client {name!r}"),
            handled + re.escape("message.publish on 'sensors/t1', 4 bytes, qos 1: b'21.5'"),
            r"handled 'raw-\d+-[0-9a-f]+': "
            + re.escape(r"message.publish on 'raw/t1', 5 bytes, qos 1: b'\xff\x00raw'"),
        ):
            assert receiver.wait_for_log(line, 20), receiver.log_text() + broker.log_text()

        # The receiver stalls: the broker's request times out, and it sends the same delivery
        # again (twice at least) before the receiver goes on and answers them all.
        watch = Collector(broker.port, ["$SYS/broker/webhooks/receiver/+"], 0, client_id="watch")
        assert receiver.wait_for_log(handled + "client.connected, client 'watch'", 20)
        receiver.send_signal(signal.SIGSTOP)
        try:
            client.publish("sensors/t2", b"22.0", 1)
            wait_for(lambda: last_figure(watch, "failures") >= 2, "two attempts timed out")
        finally:
            receiver.send_signal(signal.SIGCONT)
        again = receiver.wait_for_log(r"delivery '(receiver-\d+-[0-9a-f]+)' again", 20)
        assert again, receiver.log_text()
        wait_for(lambda: last_figure(watch, "delivered") == 4, "4 deliveries acknowledged")
    finally:
        client.close()
        if watch is not None:
            watch.close()

    log = receiver.log_text()
    assert "refused" not in log, log  # every signature verified
    assert re.search(handled + re.escape("message.publish on 'sensors/t2', 4 bytes"), log), log
    handled_ids = re.findall(r"handled '([^']+)'", log)
    assert again.group(1) in handled_ids
    assert len(handled_ids) == len(set(handled_ids)) == 5, log  # each once, duplicates aside
    receiver.stop()
    assert receiver.returncode == 0
    assert "stopped after 5 deliveries" in receiver.log_text()
