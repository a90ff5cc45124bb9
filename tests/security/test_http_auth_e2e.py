"""The HTTP auth backend end to end: a real broker process (``[http_auth]`` in its file) asks a
real aiohttp service that the test runs on a thread of its own.

Logins: allowed, denied; a slow answer delays only the client waiting for it (another logs
in, publishes and subscribes meanwhile); the service down denies (logged, counted in
/metrics); 1,000 connections with the same credentials within the TTL cost one call. Rights
(``acl_url``): publish and subscribe allowed or denied by the service, a slow answer holding
only its own client's packets, the service down denying, and the cache asked once per topic."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support.cleanup import ended_after
from support.clients import PahoClient, connack_code, unique
from support.http_service import serve
from support.launcher import BrokerProcess, free_port

ADMIN_TOKEN = "an admin token for the test"


class Service:
    """The operator's auth service: logins by user name, rights by topic prefix. Users and
    topics starting with "slow" wait until ``release`` is set."""

    def __init__(self) -> None:
        self.logins: list[dict[str, Any]] = []
        self.rights: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.release = asyncio.Event()
        self.waiting = threading.Event()  # a slow request has arrived
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _start(self) -> None:
        self.runner, _ = await serve(
            [("POST", "/auth", self.auth), ("POST", "/acl", self.acl)], self.port
        )

    def start(self, port: int = 0) -> Service:
        self.port = port or free_port()
        if not self.thread.is_alive():
            self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
            self.runner = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.release.set)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def let_go(self) -> None:
        self.loop.call_soon_threadsafe(self.release.set)

    async def auth(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.logins.append(body)
        user = body.get("username") or ""
        if user.startswith("slow"):
            self.waiting.set()
            await self.release.wait()
        if user == "mallory":
            return web.json_response({"result": "deny"})
        if user == "nobody":
            return web.json_response({"result": "ignore"})
        if user == "forbidden":
            return web.Response(status=403)
        return web.json_response({"result": "allow"})

    async def acl(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.rights.append(body)
        topic = body["topic"]
        if topic.startswith("slow"):
            self.waiting.set()
            await self.release.wait()
        if topic.startswith("denied"):
            return web.json_response({"result": "deny"})
        return web.Response(status=204)


@pytest.fixture
def service() -> Iterator[Service]:
    with ended_after(Service.close) as keep:
        yield keep(Service().start())


@pytest.fixture
def start(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path, service: Service
) -> Callable[..., BrokerProcess]:
    """``start(extra="", admin_port=0, http_extra="")``: our broker asking ``service``."""

    def run(extra: str = "", admin_port: int = 0, http_extra: str = "") -> BrokerProcess:
        path = tmp_path / "http.toml"
        path.write_text(
            f"{extra}\n[http_auth]\nenabled = true\n"
            f'url = "http://127.0.0.1:{service.port}/auth"\n'
            f'acl_url = "http://127.0.0.1:{service.port}/acl"\n'
            "timeout = 20\n"
            f"{http_extra}\n"
        )
        args: tuple[str, ...] = ("--config", str(path))
        if admin_port:
            args += ("--admin-port", str(admin_port))
        return start_broker(extra_args=args)

    return run


def metrics(port: int) -> dict[str, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("mqttbroker_http_auth"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_logins_allowed_denied_ignored(
    start: Callable[..., BrokerProcess], service: Service, paho: Callable[..., PahoClient]
) -> None:
    server = start()
    alice = paho(server, user="alice", password="pw", connect=False, client_id="alice-1")
    assert alice.connect(expect_success=False) == 0
    assert service.logins[0] == {
        "client_id": "alice-1",
        "username": "alice",
        "password": "pw",
        "address": "127.0.0.1",
    }
    for user in ("mallory", "forbidden", "nobody"):  # deny, 4xx, ignore (no other source)
        client = paho(server, user=user, password="pw", connect=False)
        assert client.connect(expect_success=False) == 0x86, user


def test_a_slow_service_delays_only_its_own_client(
    start: Callable[..., BrokerProcess], service: Service, paho: Callable[..., PahoClient]
) -> None:
    server = start()
    slow = paho(server, user="slow", password="pw", connect=False)
    slow.client.connect(server.host, server.port)
    slow.client.loop_start()
    assert service.waiting.wait(10)
    # meanwhile others log in, subscribe, publish and receive
    fast = paho(server, user="alice", password="pw")
    other = paho(server, user="alice", password="pw")
    assert other.subscribe("news/#", 1) == [1]
    fast.publish("news/today", b"hello", qos=1)
    other.wait_payload(b"hello")
    assert slow.connack is None  # still waiting for the service
    service.let_go()
    slow.wait_until(lambda: slow.connack is not None, 10, "CONNACK")
    assert slow.connack is not None and slow.connack[0] == 0


def test_the_service_down_denies_and_is_counted(
    start: Callable[..., BrokerProcess],
    monkeypatch: pytest.MonkeyPatch,
    service: Service,
    paho: Callable[..., PahoClient],
) -> None:
    monkeypatch.setenv("ADMIN_TEST_TOKEN", ADMIN_TOKEN)
    admin = free_port()
    extra = '[admin]\ntoken_env = "ADMIN_TEST_TOKEN"\n'
    server = start(extra=extra, admin_port=admin)
    assert (
        paho(server, user="alice", password="pw", connect=False).connect(expect_success=False) == 0
    )
    service.stop()
    down = paho(server, user="bob", password="pw", connect=False)
    assert down.connect(expect_success=False) == 0x86
    assert server.wait_for_log("http_auth: the service is down")
    counted = metrics(admin)
    assert counted["mqttbroker_http_auth_down_total"] >= 1
    assert counted['mqttbroker_http_auth_answers_total{result="allow"}'] >= 1
    service.start(service.port)  # back: allowed again
    assert paho(server, user="bob", password="pw", connect=False).connect(expect_success=False) == 0
    assert server.wait_for_log("http_auth: the service at .* answers again")


def test_a_thousand_connections_cost_one_call_per_ttl(
    start: Callable[..., BrokerProcess], service: Service
) -> None:
    server = start(http_extra="cache_ttl = 3600")
    device = unique("flapping")
    codes = [
        connack_code(server, client_id=device, username="alice", password=b"pw")
        for _ in range(1000)
    ]
    assert codes == [0] * 1000
    assert len(service.logins) == 1
    assert (
        connack_code(server, client_id=device, username="alice", password=b"other") == 0
    )  # another password: asked
    assert len(service.logins) == 2


def test_rights_from_the_service(
    start: Callable[..., BrokerProcess], service: Service, paho: Callable[..., PahoClient]
) -> None:
    server = start()
    client = paho(server, user="alice", password="pw")
    assert client.subscribe("allowed/#", 1) == [1]
    assert client.subscribe("denied/#", 1) == [0x87]
    assert client.acked[client.publish("allowed/x", b"1", qos=1).mid] == 0
    assert client.acked[client.publish("denied/x", b"2", qos=1).mid] == 0x87
    client.wait_payload(b"1")
    asked = [(r["action"], r["topic"]) for r in service.rights]
    assert asked == [
        ("subscribe", "allowed/#"),
        ("subscribe", "denied/#"),
        ("publish", "allowed/x"),
        ("publish", "denied/x"),
    ]
    assert service.rights[0]["username"] == "alice"
    for _ in range(5):  # cached: the service is not asked again
        client.publish("allowed/x", b"again", qos=1)
    assert len(service.rights) == 4


def test_a_slow_right_holds_only_its_own_client(
    start: Callable[..., BrokerProcess], service: Service, paho: Callable[..., PahoClient]
) -> None:
    server = start()
    slow = paho(server, user="alice", password="pw")
    watcher = paho(server, user="alice", password="pw")
    assert watcher.subscribe("#", 1) == [1]
    # its PUBLISH waits for the answer, and what it sends after it waits too, in order
    first = slow.publish("slow/1", b"first", qos=1, wait=False)
    assert service.waiting.wait(10)
    second = slow.publish("allowed/2", b"second", qos=1, wait=False)
    other = paho(server, user="alice", password="pw")
    other.publish("allowed/3", b"third", qos=1)
    watcher.wait_payload(b"third")
    assert first.mid not in slow.acked and second.mid not in slow.acked
    service.let_go()
    slow.wait_published(second)
    got = [m.payload for m in watcher.wait_messages(3)]
    assert got == [b"third", b"first", b"second"]
    assert slow.acked[first.mid] == 0  # allowed, and the watcher had it


def test_rights_denied_while_the_service_is_down(
    start: Callable[..., BrokerProcess], service: Service, paho: Callable[..., PahoClient]
) -> None:
    server = start()
    client = paho(server, user="alice", password="pw")
    service.stop()
    assert client.acked[client.publish("allowed/y", b"1", qos=1).mid] == 0x87
    assert client.subscribe("allowed/#", 1) == [0x87]
