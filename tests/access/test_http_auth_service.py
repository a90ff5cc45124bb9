"""The HTTP auth backend end to end: a real broker process (``[http_auth]`` in its file) asks a
real aiohttp service that the test runs on a thread of its own.

Logins: allowed, denied; a slow answer delays only the client waiting for it (another logs
in, publishes and subscribes meanwhile); the service down denies (logged, counted in
/metrics); 1,000 connections with the same credentials within the TTL cost one call. Rights
(``acl_url``): publish and subscribe allowed or denied by the auth_service, a slow answer holding
only its own client's packets, the service down denying, and the cache asked once per topic."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from support.clients import Paho, PahoClient, connack_code, unique
from support.http_service import AuthService
from support.launcher import BrokerProcess, free_port

Asking = Callable[..., BrokerProcess]  # the asking_broker fixture
Login = Callable[[], PahoClient]  # the alice fixture

ADMIN_TOKEN = "an admin token for the test"


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
    asking_broker: Asking, auth_service: AuthService, paho: Paho
) -> None:
    server = asking_broker()
    alice = paho(server, user="alice", password="pw", connect=False, client_id="alice-1")
    assert alice.connect(expect_success=False) == 0
    assert auth_service.logins[0] == {
        "client_id": "alice-1",
        "username": "alice",
        "password": "pw",
        "address": "127.0.0.1",
    }
    for user in ("mallory", "forbidden", "nobody"):  # deny, 4xx, ignore (no other source)
        client = paho(server, user=user, password="pw", connect=False)
        assert client.connect(expect_success=False) == 0x86, user


def test_a_slow_service_delays_only_its_own_client(
    asking_broker: Asking, auth_service: AuthService, paho: Paho
) -> None:
    server = asking_broker()
    slow = paho(server, user="slow", password="pw", connect=False)
    slow.client.connect(server.host, server.port)
    slow.client.loop_start()
    assert auth_service.waiting.wait(10)
    # meanwhile others log in, subscribe, publish and receive
    fast = paho(server, user="alice", password="pw")
    other = paho(server, user="alice", password="pw")
    assert other.subscribe("news/#", 1) == [1]
    fast.publish("news/today", b"hello", qos=1)
    other.wait_payload(b"hello")
    assert slow.connack is None  # still waiting for the service
    auth_service.let_go()
    slow.wait_until(lambda: slow.connack is not None, 10, "CONNACK")
    assert slow.connack is not None and slow.connack[0] == 0


def test_the_service_down_denies_and_is_counted(
    asking_broker: Asking,
    monkeypatch: pytest.MonkeyPatch,
    auth_service: AuthService,
    paho: Paho,
) -> None:
    monkeypatch.setenv("ADMIN_TEST_TOKEN", ADMIN_TOKEN)
    admin = free_port()
    extra = '[admin]\ntoken_env = "ADMIN_TEST_TOKEN"\n'
    server = asking_broker(extra=extra, admin_port=admin)
    assert (
        paho(server, user="alice", password="pw", connect=False).connect(expect_success=False) == 0
    )
    auth_service.stop()
    down = paho(server, user="bob", password="pw", connect=False)
    assert down.connect(expect_success=False) == 0x86
    assert server.wait_for_log("http_auth: the service is down")
    counted = metrics(admin)
    assert counted["mqttbroker_http_auth_down_total"] >= 1
    assert counted['mqttbroker_http_auth_answers_total{result="allow"}'] >= 1
    auth_service.start(auth_service.port)  # back: allowed again
    assert paho(server, user="bob", password="pw", connect=False).connect(expect_success=False) == 0
    assert server.wait_for_log("http_auth: the service at .* answers again")


def test_a_thousand_connections_cost_one_call_per_ttl(
    asking_broker: Asking, auth_service: AuthService
) -> None:
    server = asking_broker(http_extra="cache_ttl = 3600")
    device = unique("flapping")
    codes = [
        connack_code(server, client_id=device, username="alice", password=b"pw")
        for _ in range(1000)
    ]
    assert codes == [0] * 1000
    assert len(auth_service.logins) == 1
    assert (
        connack_code(server, client_id=device, username="alice", password=b"other") == 0
    )  # another password: asked
    assert len(auth_service.logins) == 2


@pytest.fixture
def alice(asking_broker: Asking, paho: Paho) -> Login:
    """Each call logs alice in to one broker that asks the auth service for rights."""
    server = asking_broker()
    return lambda: paho(server, user="alice", password="pw")


def test_rights_from_the_service(alice: Login, auth_service: AuthService) -> None:
    client = alice()
    assert client.subscribe("allowed/#", 1) == [1]
    assert client.subscribe("denied/#", 1) == [0x87]
    assert client.acked[client.publish("allowed/x", b"1", qos=1).mid] == 0
    assert client.acked[client.publish("denied/x", b"2", qos=1).mid] == 0x87
    client.wait_payload(b"1")
    asked = [(r["action"], r["topic"]) for r in auth_service.rights]
    assert asked == [
        ("subscribe", "allowed/#"),
        ("subscribe", "denied/#"),
        ("publish", "allowed/x"),
        ("publish", "denied/x"),
    ]
    assert auth_service.rights[0]["username"] == "alice"
    for _ in range(5):  # cached: the service is not asked again
        client.publish("allowed/x", b"again", qos=1)
    assert len(auth_service.rights) == 4


def test_a_slow_right_holds_only_its_own_client(alice: Login, auth_service: AuthService) -> None:
    slow = alice()
    watcher = alice()
    assert watcher.subscribe("#", 1) == [1]
    # its PUBLISH waits for the answer, and what it sends after it waits too, in order
    first = slow.publish("slow/1", b"first", qos=1, wait=False)
    assert auth_service.waiting.wait(10)
    second = slow.publish("allowed/2", b"second", qos=1, wait=False)
    other = alice()
    other.publish("allowed/3", b"third", qos=1)
    watcher.wait_payload(b"third")
    assert first.mid not in slow.acked and second.mid not in slow.acked
    auth_service.let_go()
    slow.wait_published(second)
    got = [m.payload for m in watcher.wait_messages(3)]
    assert got == [b"third", b"first", b"second"]
    assert slow.acked[first.mid] == 0  # allowed, and the watcher had it


def test_rights_denied_while_the_service_is_down(alice: Login, auth_service: AuthService) -> None:
    client = alice()
    auth_service.stop()
    assert client.acked[client.publish("allowed/y", b"1", qos=1).mid] == 0x87
    assert client.subscribe("allowed/#", 1) == [0x87]
