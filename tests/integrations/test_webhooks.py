"""Webhooks against a local aiohttp endpoint that fails for a while (500, then 429 with
Retry-After) before it answers 200: every message arrives at least once, signed; dead letters
are exactly the deliveries past max_attempts (or refused with a 4xx); a restart loses nothing."""

from __future__ import annotations

import base64
import json
import signal
import threading
from pathlib import Path

from support.clients import wait_for
from support.webhook_rig import SECRET, Rig, verify, write_config


def test_retries_429_retry_after_signatures_and_dead_letters(rig: Rig, secret_file: Path) -> None:
    def answer(path: str, body: bytes, count: int) -> tuple[int, dict[str, str]]:
        if path == "hook":  # 500 for a while, then 429 with Retry-After, then 200
            if count < 8:
                return 500, {}
            if count < 11:
                return 429, {"Retry-After": "1"}
            return 200, {}
        payload = json.loads(body)["payload"]
        if payload.startswith("bad"):
            return 503, {}
        if payload.startswith("reject"):
            return 400, {}
        return 200, {}

    endpoint = rig.endpoint(answer)
    config = f"""
[broker]
sys_interval = 0.2

[[webhook]]
name = "main"
url = "{endpoint.url}/hook"
topics = ["data/#"]
secret_file = "{secret_file}"
max_attempts = 50
retry_delay = 0.05
retry_max_delay = 0.2
concurrency = 2

[[webhook]]
name = "strict"
url = "{endpoint.url}/strict"
topics = ["jobs/#"]
secret_file = "{secret_file}"
max_attempts = 3
retry_delay = 0.02
retry_max_delay = 0.05
dead_letter_topic = "webhooks/dead/strict"
"""
    broker = rig.broker(config)
    dead = rig.collect(broker.port, ["webhooks/dead/#"])
    client = rig.paho(broker)
    payloads = [b"reading-%02d" % n for n in range(20)] + [b"\xff\xfe binary"]
    client.publish_all(("data/t", p, 1, False) for p in payloads)
    jobs = [b"good-1", b"bad-1", b"good-2", b"reject-1", b"bad-2", b"good-3"]
    client.publish_all(("jobs/run", p, 1, False) for p in jobs)

    wait_for(lambda: len({r.delivery_id for r in endpoint.ok("hook")}) == 21, "21 deliveries")
    delivered: dict[str, bytes] = {}
    for request in endpoint.all("hook"):
        verify(request)
        envelope = request.envelope()
        assert envelope["delivery_id"] == request.delivery_id
        assert request.headers["X-Mqttbroker-Event"] == "message.publish"
        assert set(envelope) >= {
            "event", "delivery_id", "timestamp", "topic", "payload", "payload_encoding",
            "qos", "retain", "properties", "client_id", "username",
        }  # fmt: skip
        if envelope["payload_encoding"] == "base64":
            body = base64.b64decode(envelope["payload"])
        else:
            body = envelope["payload"].encode()
        # every attempt of one delivery carries the same id and the same message
        assert delivered.setdefault(request.delivery_id, body) == body
        assert envelope["topic"] == "data/t" and envelope["qos"] == 1
        assert envelope["client_id"] == client.client_id
    assert sorted(delivered.values()) == sorted(payloads)
    # 429 with Retry-After: 1 was honoured: the next attempt of that delivery waited
    attempts = endpoint.all("hook")
    for index, request in enumerate(attempts):
        if request.status == 429:
            later = [r for r in attempts[index + 1 :] if r.delivery_id == request.delivery_id]
            assert later and later[0].at - request.at >= 0.9, (request, later[:1])

    # the strict endpoint: bad-* past max_attempts (3 tries each), reject-* at once (4xx)
    dead.wait_count(3)
    wait_for(lambda: len(endpoint.ok("strict")) == 3, "the good jobs")
    letters = [json.loads(p) for p in dead.payloads()]
    assert sorted(letter["payload"] for letter in letters) == ["bad-1", "bad-2", "reject-1"]
    for letter in letters:
        tries = [r for r in endpoint.all("strict") if r.delivery_id == letter["delivery_id"]]
        if letter["payload"].startswith("bad"):
            assert letter["attempts"] == 3 and len(tries) == 3
            assert "HTTP 503 after 3 attempts" in letter["reason"]
        else:
            assert letter["attempts"] == 1 and len(tries) == 1
            assert letter["reason"] == "HTTP 400"
        assert letter["webhook"] == "strict" and letter["topic"] == "jobs/run"
    assert sorted(json.loads(r.body)["payload"] for r in endpoint.ok("strict")) == [
        "good-1",
        "good-2",
        "good-3",
    ]
    # visible like a session's: in $SYS
    status = rig.collect(broker.port, ["$SYS/broker/webhooks/#"], qos=0)

    def figure(name: str) -> bytes | None:
        found = [m for m in status.received() if m.topic == f"$SYS/broker/webhooks/{name}"]
        return found[-1].payload if found else None

    wait_for(lambda: figure("strict/dead_letters") == b"3", "$SYS dead_letters 3")
    wait_for(lambda: figure("main/delivered") == b"21", "$SYS delivered 21")
    assert int(figure("main/failures") or 0) >= 11
    assert figure("main/queued") == b"0"
    client.close()


def test_a_broker_restart_loses_no_pending_delivery(rig: Rig, secret_file: Path) -> None:
    up = threading.Event()

    def answer(path: str, body: bytes, count: int) -> tuple[int, dict[str, str]]:
        return (200, {}) if up.is_set() else (503, {})

    endpoint = rig.endpoint(answer)
    config = f"""
[[webhook]]
name = "durable"
url = "{endpoint.url}/hook"
topics = ["data/#"]
secret_env = "MQTTBROKER_TEST_WEBHOOK_SECRET"
retry_delay = 0.05
retry_max_delay = 0.1
max_attempts = 1000
"""
    args = write_config(rig.tmp_path / "w.toml", config)
    data = rig.tmp_path / "data"
    import os

    os.environ["MQTTBROKER_TEST_WEBHOOK_SECRET"] = SECRET.decode()
    try:
        first = rig.start_broker(data_dir=data, extra_args=args)
        client = rig.paho(first)
        payloads = [b"p-%02d" % n for n in range(30)]
        client.publish_all(("data/x", p, 1, False) for p in payloads)
        client.client.loop_stop()
        wait_for(lambda: len(endpoint.all("hook")) >= 3, "attempts while the endpoint fails")
        first.send_signal(signal.SIGKILL)
        first.wait_exit()
        second = rig.start_broker(data_dir=data, extra_args=args)
        up.set()
        wait_for(lambda: len({r.delivery_id for r in endpoint.ok("hook")}) == 30, "all 30")
    finally:
        del os.environ["MQTTBROKER_TEST_WEBHOOK_SECRET"]
    got = sorted(json.loads(r.body)["payload"].encode() for r in endpoint.ok("hook"))
    assert sorted(set(got)) == payloads
    ids: dict[bytes, set[str]] = {}
    for request in endpoint.all("hook"):
        verify(request)
        body = json.loads(request.body)["payload"].encode()
        ids.setdefault(body, set()).add(request.delivery_id)
    # the idempotency key of a delivery is the same before and after the restart
    assert all(len(keys) == 1 for keys in ids.values()), ids
    assert "restored 1 sessions, 30 queued" in second.log_text()


def test_events_and_raw_format(rig: Rig) -> None:
    endpoint = rig.endpoint(lambda path, body, count: (200, {}))
    config = f"""
[broker]
max_queued_messages = 2

[[webhook]]
name = "events"
url = "{endpoint.url}/events"
events = ["client.connected", "client.disconnected"]

[[webhook]]
name = "drops"
url = "{endpoint.url}/drops"
events = ["message.dropped"]

[[webhook]]
name = "raw"
url = "{endpoint.url}/raw"
topics = ["raw/#"]
format = "raw"
"""
    broker = rig.broker(config)
    client = rig.paho(broker)
    client.publish("raw/bytes", b"\x00\x01binary", 1)
    client.close()
    wait_for(lambda: len(endpoint.ok("events")) == 2, "connected and disconnected")
    wait_for(lambda: len(endpoint.ok("raw")) == 1, "the raw delivery")
    events = [r.envelope() for r in endpoint.ok("events")]
    name = client.client_id
    assert [(e["event"], e["client_id"]) for e in events] == [
        ("client.connected", name),
        ("client.disconnected", name),
    ]
    assert "X-Mqttbroker-Signature" not in endpoint.ok("events")[0].headers  # no secret

    # an offline session with room for 2 messages gets 5: 3 dropped, told as events
    away = rig.collect(broker.port, ["drop/#"], persistent=True, client_id="away")
    away.close()
    again = rig.paho(broker)
    again.publish_all(("drop/x", p, 1, False) for p in [b"%d" % n for n in range(5)])
    wait_for(lambda: sum(r.envelope()["dropped"] for r in endpoint.ok("drops")) >= 3, "3 drops")
    drops = [r.envelope() for r in endpoint.ok("drops")]
    assert {d["client_id"] for d in drops} == {"away"}
    assert sum(d["dropped"] for d in drops) == 3
    assert drops[0]["event"] == "message.dropped"
    again.close()
    raw = endpoint.ok("raw")[0]
    assert raw.body == b"\x00\x01binary"
    assert raw.headers["X-Mqttbroker-Topic"] == "raw/bytes"
    assert raw.headers["X-Mqttbroker-Qos"] == "1"
    assert raw.headers["X-Mqttbroker-Client-Id"] == name


def test_a_hung_endpoint_slows_nobody_else(rig: Rig) -> None:
    """An endpoint that never answers: publishers are acknowledged and subscribers served as
    usual, while the webhook's deliveries wait in its own queue."""
    endpoint = rig.endpoint(lambda path, body, count: (200, {}))
    endpoint.hang = True
    config = f"""
[broker]
sys_interval = 0.2

[[webhook]]
name = "stuck"
url = "{endpoint.url}/hook"
topics = ["data/#"]
timeout = 60.0
"""
    broker = rig.broker(config)
    subscriber = rig.collect(broker.port, ["data/#"])
    client = rig.paho(broker)
    payloads = [b"v-%03d" % n for n in range(200)]
    client.publish_all(("data/x", p, 1, False) for p in payloads)  # every PUBACK came
    subscriber.wait_count(200, b"v-")
    assert endpoint.ok("hook") == []
    status = rig.collect(broker.port, ["$SYS/broker/webhooks/stuck/queued"], qos=0)
    wait_for(
        lambda: bool(status.payloads()) and int(status.payloads()[-1]) >= 196,
        "the webhook's own queue holding the rest",
    )
    client.close()
