"""Reads asked of the HTTP service (``[http_auth] check_reads = true``), end to end: a real
broker process and a real aiohttp service (support.http_service.AuthService). Each
delivery is checked with ``action: "read"``, once per client and topic within the TTL; a
SUBSCRIBE without wildcards waits for its topic's read right (so its retained message and first
message are not withheld); through a wildcard the first message on a topic whose answer is not
in yet is withheld; and at most 4 * max_concurrent such questions are out at once. Without
``check_reads`` no read is asked (test_http_auth_service.py's test_rights_from_the_service)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from aiohttp import web
from support.cleanup import ended_after
from support.clients import TIMEOUT, Paho, wait_for
from support.http_service import AuthService
from support.launcher import BrokerProcess

Asking = Callable[..., BrokerProcess]  # the asking_broker fixture


class ReadService(AuthService):
    """Service's answers, and for reads: ``private/...`` only for the user ``owner``; a read of
    ``lag/...`` waits until ``release`` is set."""

    async def acl(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["action"] == "read":
            self.rights.append(body)
            if body["topic"].startswith("lag/"):
                self.waiting.set()
                await self.release.wait()
            if body["topic"].startswith("private/") and body["username"] != "owner":
                return web.json_response({"result": "deny"})
            return web.Response(status=204)
        return await super().acl(request)


@pytest.fixture
def auth_service() -> Iterator[ReadService]:
    with ended_after(ReadService.close) as keep:
        yield keep(ReadService().start())


def reads(auth_service: AuthService, user: str | None = None) -> list[str]:
    return [
        r["topic"]
        for r in list(auth_service.rights)
        if r["action"] == "read" and user in (None, r["username"])
    ]


def test_each_client_reads_what_the_service_allows(
    asking_broker: Asking,  # noqa: F811
    auth_service: ReadService,
    paho: Paho,
) -> None:
    server = asking_broker(http_extra="check_reads = true\ncache_ttl = 3600")
    owner = paho(server, user="owner", password="pw")
    bob = paho(server, user="bob", password="pw")
    owner.publish("private/r", b"retained", qos=1, retain=True)
    for client in (owner, bob):  # both may subscribe; only the owner may read
        for topic in ("private/x", "private/r"):
            assert client.subscribe(topic, 1) == [1]
    owner.wait_payload(b"retained")
    owner.publish("private/x", b"one", qos=1)
    owner.wait_payload(b"one")
    assert bob.subscribe("open/marker", 1) == [1]
    owner.publish("open/marker", b"marker", qos=1)
    bob.wait_payload(b"marker")
    assert [m.payload for m in bob.received()] == [b"marker"]
    assert sorted(reads(auth_service, "owner")) == ["private/r", "private/x"]
    assert sorted(reads(auth_service, "bob")) == ["open/marker", "private/r", "private/x"]

    # through a wildcard: the first message on a new topic is withheld while its read right is
    # asked, later ones come; asked once for the client and topic
    assert bob.subscribe("open/#", 1) == [1]
    sent = 0
    while not any(m.topic == "open/a" for m in bob.received()):
        assert sent < 1000, "no message on open/a came through"
        owner.publish("open/a", str(sent).encode(), qos=1)
        sent += 1
    got = [m.payload for m in bob.received() if m.topic == "open/a"]
    assert b"0" not in got
    assert reads(auth_service, "bob").count("open/a") == 1


def test_questions_for_reads_are_bounded(
    asking_broker: Asking,  # noqa: F811
    auth_service: ReadService,
    paho: Paho,
) -> None:
    """max_concurrent = 1: at most 4 read questions out at once; later deliveries are not
    asked about meanwhile (withheld), and asked again once the questions are answered."""
    server = asking_broker(http_extra="check_reads = true\ncache_ttl = 3600\nmax_concurrent = 1")
    owner = paho(server, user="owner", password="pw")
    bob = paho(server, user="bob", password="pw")
    topics = [f"lag/{i}" for i in range(20)]
    for topic in topics:  # the publish rights, in the cache before anyone reads
        owner.publish(topic, b"before", qos=1)
    assert bob.subscribe("lag/#", 1) == [1]
    for topic in topics:
        owner.publish(topic, b"held", qos=1)
    assert auth_service.waiting.wait(TIMEOUT)
    auth_service.let_go()
    owner.publish("lag/marker", b"marker", qos=1)
    wait_for(lambda: "lag/marker" in reads(auth_service), "the marker's read question")
    assert reads(auth_service) == [*topics[:4], "lag/marker"]
    assert not any(m.payload == b"held" for m in bob.received())


def test_reads_are_not_asked_by_default(
    asking_broker: Asking,  # noqa: F811
    auth_service: ReadService,
    paho: Paho,
) -> None:
    server = asking_broker()
    owner = paho(server, user="owner", password="pw")
    bob = paho(server, user="bob", password="pw")
    assert bob.subscribe("private/#", 1) == [1]
    owner.publish("private/x", b"seen", qos=1)
    bob.wait_payload(b"seen")
    assert reads(auth_service) == []
