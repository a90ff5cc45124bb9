"""The HTTP authentication and authorization backend (``[http_auth]``): the operator's service
decides who logs in and what they may do, as EMQX's HTTP authn/authz and mosquitto-go-auth do.

A login is a POST of ``{"client_id", "username", "password", "address"}`` as JSON to ``url``;
a right (``acl_url``) is a POST of ``{"client_id", "username", "address", "topic", "action"}``
with ``action`` one of ``publish``, ``subscribe``, and with ``check_reads``, ``read`` (may a
message on ``topic`` be delivered to this client: see :mod:`.chain` for when it is asked). The
answer:

* 200 or 204 with no body, or a JSON body ``{"result": "allow"}``: allowed;
* ``{"result": "deny"}``, or a 4xx status: denied;
* ``{"result": "ignore"}``: not this source's to decide; the next source of the chain does;
* a 5xx status, a time-out, a refused connection, a body that is not one of those: the service
  is down, and ``when_down`` decides (``deny`` by default; ``ignore`` passes it to the next
  source). The reason is logged (once per outage) and counted (:attr:`HttpBackend.counts`).

Answers are cached for ``cache_ttl`` seconds, keyed by everything the request says (the
password only as a keyed hash), identical requests under way at once share one call, and at
most ``max_concurrent`` calls run at once: a device reconnecting a thousand times within the
TTL costs one call (a thousand devices, a thousand: the service may answer each differently). Everything runs
on the event loop with aiohttp's pooled client, so a slow service delays only the clients that
wait for its answer. With ``token_file`` or ``token_env``, each call carries ``Authorization:
Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..config import HttpAuthConfig
from ..secret_source import read_secret_text
from .errors import SecurityFileError

log = logging.getLogger("mqttbroker.security")

ALLOW = "allow"
DENY = "deny"
IGNORE = "ignore"
ACTIONS = ("publish", "subscribe", "read")


def _token(settings: HttpAuthConfig) -> str:
    token = read_secret_text(
        settings.token_file, settings.token_env, "http_auth.token", SecurityFileError
    )
    return token or ""


class HttpBackend:
    """Asks the operator's service; see the module docstring. ``start`` and ``close`` run on
    the event loop that asks."""

    def __init__(
        self, settings: HttpAuthConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._bearer = _token(settings)
        self._key = secrets.token_bytes(32)  # for the cache's hashes of passwords
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()
        self._calls: dict[tuple[Any, ...], asyncio.Future[str]] = {}  # asked, not answered
        self._session: Any = None
        self._limit: asyncio.Semaphore | None = None
        self._down_logged = False
        self.counts = {"calls": 0, "cache_hits": 0, ALLOW: 0, DENY: 0, IGNORE: 0, "down": 0}

    async def start(self) -> None:
        import aiohttp

        settings = self.settings
        headers = {"Authorization": f"Bearer {self._bearer}"} if self._bearer else {}
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=settings.timeout),
            connector=aiohttp.TCPConnector(limit=settings.max_concurrent),
            headers=headers,
        )
        self._limit = asyncio.Semaphore(settings.max_concurrent)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def authenticate(
        self, client_id: str, username: str | None, password: bytes | None, address: str | None
    ) -> str:
        """ALLOW, DENY or IGNORE for a login."""
        secret = hmac.new(self._key, password or b"", hashlib.sha256).digest()
        key = ("login", client_id, username, secret, address)
        body = {
            "client_id": client_id,
            "username": username,
            "password": (password or b"").decode("utf-8", "replace"),
            "address": address,
        }
        return await self._ask(key, self.settings.url, body)

    async def authorize(
        self, client_id: str, username: str | None, address: str | None, topic: str, action: str
    ) -> str:
        """ALLOW, DENY or IGNORE for ``action`` (publish, subscribe, read) on ``topic``."""
        key = right_key(client_id, username, address, topic, action)
        body = {
            "client_id": client_id,
            "username": username,
            "address": address,
            "topic": topic,
            "action": action,
        }
        return await self._ask(key, self.settings.acl_url, body)

    def peek(self, key: tuple[Any, ...]) -> tuple[str | None, bool]:
        """The cached answer for ``key``, even past its TTL (None: never asked or evicted),
        and whether it is still fresh; nothing is removed. A fresh one counts as a hit."""
        item = self._cache.get(key)
        if item is None:
            return None, False
        fresh = item[0] > self.clock()
        if fresh:
            self.counts["cache_hits"] += 1
        return item[1], fresh

    def cached(self, key: tuple[Any, ...]) -> str | None:
        item = self._cache.get(key)
        if item is None:
            return None
        if item[0] <= self.clock():
            del self._cache[key]
            return None
        return item[1]

    async def _ask(self, key: tuple[Any, ...], url: str, body: dict[str, Any]) -> str:
        answer = self.cached(key)
        if answer is not None:
            self.counts["cache_hits"] += 1
            return answer
        call = self._calls.get(key)
        if call is None:  # else the same question is being asked: share its answer
            call = self._calls[key] = asyncio.ensure_future(self._settle(key, url, body))
        # A task of its own: a client that goes away while it waits cancels its wait only.
        return await asyncio.shield(call)

    async def _settle(self, key: tuple[Any, ...], url: str, body: dict[str, Any]) -> str:
        try:
            answer, cache = await self._call(url, body)
        finally:
            del self._calls[key]
        if cache:
            self._remember(key, answer)
        return answer

    def _remember(self, key: tuple[Any, ...], answer: str) -> None:
        cache = self._cache
        cache[key] = (self.clock() + self.settings.cache_ttl, answer)
        cache.move_to_end(key)
        while len(cache) > self.settings.cache_size:
            cache.popitem(last=False)

    async def _call(self, url: str, body: dict[str, Any]) -> tuple[str, bool]:
        """The service's answer, and whether to cache it (not when it was down)."""
        import aiohttp

        assert self._session is not None and self._limit is not None, "start() first"
        self.counts["calls"] += 1
        try:
            async with self._limit:
                async with self._session.post(url, json=body, allow_redirects=False) as response:
                    status = response.status
                    text = await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._down(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        answer = _answer(status, text)
        if answer is None:
            return self._down(f"HTTP {status} from {url}")
        if self._down_logged:
            self._down_logged = False
            log.info("http_auth: the service at %s answers again", url)
        self.counts[answer] += 1
        return answer, True

    def _down(self, why: str) -> tuple[str, bool]:
        self.counts["down"] += 1
        if not self._down_logged:
            self._down_logged = True
            log.warning(
                "http_auth: the service is down (%s); answering %r until it is back",
                why,
                self.settings.when_down,
            )
        return self.settings.when_down, False


def right_key(
    client_id: str, username: str | None, address: str | None, topic: str, action: str
) -> tuple[Any, ...]:
    """The cache key of a right (:meth:`HttpBackend.authorize`, :meth:`HttpBackend.peek`)."""
    return (action, client_id, username, address, topic)


def _answer(status: int, text: bytes) -> str | None:
    """ALLOW, DENY or IGNORE from a response, or None when it says the service is down."""
    import json

    if 400 <= status < 500:
        return DENY
    if status not in (200, 204):
        return None
    if not text.strip():
        return ALLOW
    try:
        result = json.loads(text).get("result")
    except (ValueError, AttributeError):
        return None
    return result if result in (ALLOW, DENY, IGNORE) else None
