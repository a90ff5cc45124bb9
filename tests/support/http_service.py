"""A local HTTP service for the tests that talk to one (webhook endpoints, the auth service of
the HTTP backend): ``serve`` starts an aiohttp application on a loopback port;
``AuthService`` is the operator's auth service the HTTP backend asks, on a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from support.launcher import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(
    routes: Iterable[tuple[str, str, Handler]], port: int = 0
) -> tuple[web.AppRunner, int]:
    """An aiohttp application answering ``routes`` (method, path, handler) on 127.0.0.1:``port``
    (0: a free one), on the running loop: its runner (``cleanup()`` stops it) and its port."""
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


class AuthService:
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

    def start(self, port: int = 0) -> AuthService:
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
