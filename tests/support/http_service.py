"""A local HTTP service for the tests that talk to one (webhook endpoints, the auth service of
the HTTP backend): ``serve`` starts an aiohttp application on a loopback port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

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
