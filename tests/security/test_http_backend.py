"""The HTTP authentication/authorization backend (security/http_backend.py) against a real
aiohttp service started by the test: its answers (status and body), a service that is down or
slow, the cache (a thousand logins at once with the same credentials make one call per TTL),
the bearer token, and redirects, which are not followed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from support.http_service import serve

from mqttbroker.config import HttpAuthConfig
from mqttbroker.security.http_backend import ALLOW, DENY, IGNORE, HttpBackend

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Service:
    """An aiohttp service on a free loopback port; ``reply(body) -> (status, text)``."""

    def __init__(self, reply: Callable[[dict[str, Any]], tuple[int, str]]) -> None:
        self.reply = reply
        self.calls: list[dict[str, Any]] = []
        self.headers: list[str] = []
        self.delay = 0.0
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append(body)
        self.headers.append(request.headers.get("Authorization", ""))
        if self.delay:
            await asyncio.sleep(self.delay)
        status, text = self.reply(body)
        if status in (301, 302, 307, 308):
            raise web.HTTPTemporaryRedirect(text)
        return web.Response(status=status, text=text)

    async def start(self) -> Service:
        self.runner, self.port = await serve(
            [("POST", "/auth", self.handle), ("POST", "/acl", self.handle)]
        )
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def run(
    reply: Callable[[dict[str, Any]], tuple[int, str]],
    scenario: Callable[[Service, Callable[..., HttpBackend]], Awaitable[None]],
) -> None:
    async def main() -> None:
        service = await Service(reply).start()
        made: list[HttpBackend] = []

        def backend(**settings: Any) -> HttpBackend:
            values = {"url": service.url("/auth"), "acl_url": service.url("/acl"), **settings}
            made.append(HttpBackend(HttpAuthConfig(enabled=True, **values)))
            return made[-1]

        try:
            await scenario(service, backend)
        finally:
            for each in made:
                await each.close()
            await service.stop()

    asyncio.run(main())


def by_user(body: dict[str, Any]) -> tuple[int, str]:
    """alice: 200 with allow; bob: 200 with deny; carol: 403; dave: 204; erin: ignore;
    anyone else: 500."""
    user = body.get("username")
    return {
        "alice": (200, json.dumps({"result": "allow"})),
        "bob": (200, json.dumps({"result": "deny"})),
        "carol": (403, ""),
        "dave": (204, ""),
        "erin": (200, json.dumps({"result": "ignore"})),
    }.get(user, (500, "boom"))


def test_the_service_s_answers() -> None:
    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend()
        await http.start()
        answers = {
            user: await http.authenticate("c1", user, b"pw", "127.0.0.1")
            for user in ("alice", "bob", "carol", "dave", "erin", "zed")
        }
        assert answers == {
            "alice": ALLOW,
            "bob": DENY,
            "carol": DENY,
            "dave": ALLOW,
            "erin": IGNORE,
            "zed": DENY,  # 500: down, and when_down is deny
        }
        first = service.calls[0]
        assert first == {
            "client_id": "c1",
            "username": "alice",
            "password": "pw",
            "address": "127.0.0.1",
        }
        assert http.counts["down"] == 1

    run(by_user, scenario)


def test_authorization_asks_with_the_topic_and_action() -> None:
    def reply(body: dict[str, Any]) -> tuple[int, str]:
        allowed = body["action"] == "publish" and body["topic"].startswith("dev/")
        return 200, json.dumps({"result": ALLOW if allowed else DENY})

    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend()
        await http.start()
        assert await http.authorize("c1", "u", None, "dev/1", "publish") == ALLOW
        assert await http.authorize("c1", "u", None, "dev/1", "subscribe") == DENY
        assert await http.authorize("c1", "u", None, "other", "publish") == DENY
        assert service.calls[0] == {
            "client_id": "c1",
            "username": "u",
            "address": None,
            "topic": "dev/1",
            "action": "publish",
        }

    run(reply, scenario)


def test_a_thousand_logins_at_once_make_one_call_per_ttl() -> None:
    now = [0.0]

    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        service.delay = 0.05  # all thousand ask while the first call is under way
        http = backend(cache_ttl=60)
        http.clock = lambda: now[0]
        await http.start()
        answers = await asyncio.gather(
            *(http.authenticate("c", "alice", b"pw", "10.0.0.1") for _ in range(1000))
        )
        assert set(answers) == {ALLOW}
        assert len(service.calls) == 1
        assert await http.authenticate("c", "alice", b"pw", "10.0.0.1") == ALLOW
        assert len(service.calls) == 1  # from the cache
        assert await http.authenticate("c", "alice", b"other", "10.0.0.1") == ALLOW
        assert len(service.calls) == 2  # another password is another question
        now[0] = 61.0  # past the TTL: asked again
        assert await http.authenticate("c", "alice", b"pw", "10.0.0.1") == ALLOW
        assert len(service.calls) == 3

    run(by_user, scenario)


def test_a_waiter_that_goes_away_does_not_cancel_the_others() -> None:
    """Two clients ask the same question; the first disconnects (its wait is cancelled) while
    the call is under way: the second still gets the answer, from the one call."""

    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        service.delay = 0.2
        http = backend()
        await http.start()
        first = asyncio.ensure_future(http.authenticate("c", "alice", b"pw", None))
        second = asyncio.ensure_future(http.authenticate("c", "alice", b"pw", None))
        await asyncio.sleep(0.05)
        first.cancel()
        assert await second == ALLOW
        assert first.cancelled() and len(service.calls) == 1

    run(by_user, scenario)


def test_a_service_that_is_down_denies_and_is_not_cached() -> None:
    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend()
        await http.start()
        await service.stop()
        service.runner = None
        assert await http.authenticate("c", "alice", b"pw", None) == DENY
        assert http.counts["down"] == 1
        passing = backend(when_down=IGNORE)
        await passing.start()
        assert await passing.authenticate("c", "alice", b"pw", None) == IGNORE
        await service.start()  # back, on another port: a new backend asks it
        http = backend()
        await http.start()
        assert await http.authenticate("c", "alice", b"pw", None) == ALLOW

    async def wrapped(service: Service, backend: Callable[..., HttpBackend]) -> None:
        try:
            await scenario(service, backend)
        finally:
            if service.runner is None:
                await service.start()

    run(by_user, wrapped)


def test_a_slow_service_times_out_and_delays_only_its_own_questions() -> None:
    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend(timeout=0.5)
        await http.start()
        assert await http.authenticate("c", "alice", b"pw", None) == ALLOW  # cached
        service.delay = 5.0
        slow = asyncio.ensure_future(http.authenticate("c", "bob", b"pw", None))
        await asyncio.sleep(0)
        # While the slow question waits, a cached one is answered at once.
        assert await http.authenticate("c", "alice", b"pw", None) == ALLOW
        assert not slow.done()
        assert await slow == DENY  # timed out: down, and when_down is deny
        assert http.counts["down"] == 1

    run(by_user, scenario)


def test_redirects_are_not_followed() -> None:
    def reply(body: dict[str, Any]) -> tuple[int, str]:
        return 307, "/acl"  # followed, it would be asked again (and again)

    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend()
        await http.start()
        assert await http.authenticate("c", "alice", b"pw", None) == DENY
        assert len(service.calls) == 1 and http.counts["down"] == 1

    run(reply, scenario)


def test_the_bearer_token_comes_from_a_file(tmp_path: Any) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")

    async def scenario(service: Service, backend: Callable[..., HttpBackend]) -> None:
        http = backend(token_file=str(tmp_path / "token"))
        await http.start()
        await http.authenticate("c", "alice", b"pw", None)
        assert service.headers == ["Bearer s3cret-token"]

    run(by_user, scenario)


def test_an_empty_token_variable_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mqttbroker.security.errors import SecurityFileError

    monkeypatch.setenv("AUTH_TOKEN", "")
    with pytest.raises(
        SecurityFileError, match="http_auth.token_env: the environment variable AUTH_TOKEN is empty"
    ):
        HttpBackend(HttpAuthConfig(enabled=True, url="http://x", token_env="AUTH_TOKEN"))
