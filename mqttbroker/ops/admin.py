"""The admin HTTP server (aiohttp), in the broker's process and event loop: the dashboard at
``/``, ``/metrics``, the JSON API under ``/api/v1`` (``/api/v1/openapi.json`` describes it),
``/healthz`` and ``/readyz``.

Authentication (``[admin]``): a bearer token (``token_file`` or ``token_env``) and/or HTTP Basic
logins of the password-file users named in ``admin_users``. With neither, the server must be on a
loopback address (config.py refuses anything else) and lets every request in, as the MQTT
listeners do there. The dashboard's files and the two health checks need no login; everything
else does when one is configured. A wrong token, an unknown user and a wrong password get the
same 401; an address with ``FAILURES_ALLOWED`` failures within ``FAILURE_WINDOW`` seconds gets 429
until the window has passed; each failure is logged.

State-changing calls (POST, DELETE) need the bearer token or the ``X-MQTTBroker-CSRF`` header: a
page of another site cannot send that header without a CORS preflight, and the server answers no
preflight unless its origin is in ``cors_origins``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from ..broker.core import Broker
from ..config import AdminConfig, ConfigError, ListenerConfig
from ..protocol.reasons import ReasonCode
from ..security import FileAuthenticator
from .alerts import Survey
from .api import Api, ApiError
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .sys_tree import delivered

log = logging.getLogger("mqttbroker.admin")

CSRF_HEADER = "X-MQTTBroker-CSRF"
FAILURES_ALLOWED = 5
FAILURE_WINDOW = 60.0
MAX_TRACKED = 10_000  # addresses with recent failures kept in memory
HISTORY_SECONDS = 900  # the dashboard's chart: 15 minutes
HISTORY_STEP = 2.0
OPEN_PATHS = ("/healthz", "/readyz")
STATE_CHANGING = ("POST", "DELETE", "PUT", "PATCH")
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self' ws: wss:; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; worker-src 'self' blob:; frame-ancestors 'none'"
    ),
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_token(admin: AdminConfig) -> bytes | None:
    """The bearer token, from its file or environment variable (ConfigError if empty)."""
    if admin.token_file:
        try:
            lines = Path(admin.token_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"admin.token_file: cannot read {admin.token_file}: {exc}") from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise ConfigError(f"admin.token_file: {admin.token_file} is empty")
        return token.encode()
    if admin.token_env:
        token = os.environ.get(admin.token_env, "").strip()
        if not token:
            raise ConfigError(
                f"admin.token_env: the environment variable {admin.token_env} is not set"
            )
        return token.encode()
    return None


class Failures:
    """Failed logins per address: FAILURES_ALLOWED within FAILURE_WINDOW, then 429."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[int, float]] = {}  # address -> (failures, first at)

    def blocked(self, address: str) -> float:
        """Seconds ``address`` must wait (0: it may try)."""
        entry = self._seen.get(address)
        if entry is None:
            return 0.0
        left = entry[1] + FAILURE_WINDOW - self.clock()
        if left <= 0:
            del self._seen[address]
            return 0.0
        return left if entry[0] >= FAILURES_ALLOWED else 0.0

    def record(self, address: str) -> int:
        now = self.clock()
        count, first = self._seen.get(address, (0, now))
        if now - first >= FAILURE_WINDOW:
            count, first = 0, now
        if address not in self._seen and len(self._seen) >= MAX_TRACKED:
            self._seen.pop(next(iter(self._seen)))
        self._seen[address] = (count + 1, first)
        return count + 1


class Auth:
    def __init__(
        self,
        admin: AdminConfig,
        authenticator: FileAuthenticator | None,
        offload: Callable[[Callable[[], int]], Awaitable[int]],
    ) -> None:
        self.token = read_token(admin)
        self.users = {u.strip() for u in admin.admin_users.split(",") if u.strip()}
        self.authenticator = authenticator if self.users else None
        self.open = self.token is None and not self.users
        self.offload = offload
        self.failures = Failures()
        self.challenge = "Basic" if self.users else "Bearer"

    async def check(self, request: web.Request) -> tuple[str | None, bool]:
        """(user name, authenticated with the token) of ``request``; raises ApiError 401/429."""
        if self.open:
            return None, False
        address = request.remote or "?"
        wait = self.failures.blocked(address)
        if wait:
            raise self._refuse(429, "too many failed logins; try again later", int(wait) + 1)
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.token is not None:
            if hmac.compare_digest(value.strip().encode(), self.token):
                return None, True
            self._failed(address, "wrong bearer token")
        elif scheme == "basic" and self.authenticator is not None:
            user, password = _basic(value)
            if user is not None and await self._password_ok(user, password):
                return user, False
            self._failed(address, f"wrong user name or password (user {user!r})")
        elif header:
            self._failed(address, f"unsupported Authorization scheme {scheme[:20]!r}")
        raise self._refuse(401, "authentication required")

    async def _password_ok(self, user: str, password: bytes) -> bool:
        authenticator = self.authenticator
        assert authenticator is not None
        # The same work for a known user or not (a stand-in hash): the answer does not tell.
        code = await self.offload(
            lambda: authenticator.check_password("admin-api", user, password, anonymous=False)
        )
        return code == ReasonCode.SUCCESS and user in self.users

    def _failed(self, address: str, why: str) -> None:
        count = self.failures.record(address)
        log.warning(
            "admin: failed login from %s: %s (%d within %gs)", address, why, count, FAILURE_WINDOW
        )

    def _refuse(self, status: int, message: str, retry: int = 0) -> ApiError:
        headers = {"WWW-Authenticate": f'{self.challenge} realm="mqttbroker"'}
        if retry:
            headers["Retry-After"] = str(retry)
        return ApiError(status, message, headers)


def _basic(value: str) -> tuple[str | None, bytes]:
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, b""
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None, b""
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None, b""


class History:
    """The counters every HISTORY_STEP seconds over the last HISTORY_SECONDS: the dashboard's
    chart starts full when the page opens."""

    def __init__(self, broker: Broker, survey: Survey) -> None:
        self.broker = broker
        self.survey = survey
        self.samples: deque[dict[str, float]] = deque(maxlen=int(HISTORY_SECONDS / HISTORY_STEP))
        self._next = 0.0

    def tick(self) -> None:
        broker = self.broker
        now = broker.clock()
        if now < self._next:
            return
        self._next = now + HISTORY_STEP
        figures = self.survey.current()
        times = getattr(broker.store, "commit_times", None)
        self.samples.append(
            {
                "t": round(time.time(), 3),
                "received": broker.received,
                "delivered": delivered(broker),
                "dropped": figures.census.dropped + broker.denied,
                "connections": sum(figures.census.connections.values()),
                "queued": figures.queued,
                "oldest_queued_age": round(figures.oldest_age, 3),
                "commits": times.count if times is not None else 0,
                "commit_seconds": round(times.total, 6) if times is not None else 0.0,
            }
        )

    def recent(self) -> list[dict[str, float]]:
        return list(self.samples)


class AdminServer:
    """The admin HTTP server; ``ready()`` says why the broker is not ready (None: it is) and
    ``holds()`` how often the TCP listeners held a pass back for ``gather_us`` (/metrics)."""

    def __init__(
        self,
        config: AdminConfig,
        broker: Broker,
        survey: Survey,
        authenticator: FileAuthenticator | None,
        ready: Callable[[], str | None],
        holds: Callable[[], int],
    ) -> None:
        self.config = config
        self.broker = broker
        self.survey = survey
        self.ready = ready
        self.history = History(broker, survey)
        self.auth = Auth(config, authenticator, self._offload)
        self.metrics = Metrics(broker, survey, survey.listener_names(), holds)
        self.origins = {o.strip() for o in config.cors_origins.split(",") if o.strip()}
        self.websockets: list[dict[str, Any]] = []
        self.api = Api(broker, survey, self.websockets, self.history.recent)
        self.runner: web.AppRunner | None = None
        self.addresses: list[tuple[str, int]] = []

    async def _offload(self, work: Callable[[], int]) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, work)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1_048_576)
        static = resources.files("mqttbroker.ops") / "static"
        app.add_routes(
            [
                web.get("/", self._index),
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/api/v1/openapi.json", self._openapi),
                web.static("/static", Path(str(static))),
                *self.api.routes(),
            ]
        )
        return app

    async def start(self, websockets: list[tuple[int, ListenerConfig]]) -> None:
        """Serve on [admin] host:port; a port in use is logged and the broker goes on without
        the admin server (its MQTT service matters more). ``websockets``: the bound ports of
        the WebSocket listeners, for the dashboard's topic viewer."""
        from ..server.tls import server_context

        config = self.config
        for port, listener in websockets:
            scheme = "wss" if listener.tls else "ws"
            self.websockets.append({"scheme": scheme, "port": port, "path": listener.ws_path})
        context = server_context(
            ListenerConfig(tls_cert_file=config.tls_cert_file, tls_key_file=config.tls_key_file),
            "admin",
        )
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port, ssl_context=context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            log.error(
                "admin server: cannot listen on %s:%d (%s); running without it",
                config.host,
                config.port,
                exc.strerror or exc,
            )
            return
        self.runner = runner
        scheme = "https" if context is not None else "http"
        for address in runner.addresses:
            host, port = address[0], address[1]
            self.addresses.append((host, port))
            log.info(
                "admin server on %s://%s:%d/ (dashboard, /metrics, /api/v1)%s",
                scheme,
                f"[{host}]" if ":" in host else host,
                port,
                " without login (loopback only)" if self.auth.open else "",
            )

    def tick(self) -> None:
        self.history.tick()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # -- middleware ---------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and origin in self.origins
        response: web.StreamResponse
        try:
            if request.method == "OPTIONS":
                if not allowed:
                    raise ApiError(
                        403, "cross-origin requests are not allowed (admin.cors_origins)"
                    )
                response = web.Response(status=204)
            else:
                response = await self._guarded(request, handler)
        except ApiError as exc:
            response = exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = ApiError(exc.status, exc.reason).response()
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        if allowed:
            assert origin is not None
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
            response.headers["Access-Control-Allow-Headers"] = (
                f"Authorization, Content-Type, {CSRF_HEADER}"
            )
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE"
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in OPEN_PATHS or path == "/" or path.startswith("/static/"):
            return await handler(request)
        user, with_token = await self.auth.check(request)
        request["user"] = user
        if (
            request.method in STATE_CHANGING
            and not with_token
            and CSRF_HEADER not in request.headers
        ):
            raise ApiError(
                403, f"state-changing requests need the bearer token or the {CSRF_HEADER} header"
            )
        return await handler(request)

    # -- handlers -----------------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.StreamResponse:
        index = resources.files("mqttbroker.ops") / "static" / "index.html"
        return web.Response(body=index.read_bytes(), content_type="text/html", charset="utf-8")

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, request: web.Request) -> web.Response:
        why = self.ready()
        if why is None:
            return web.json_response({"ready": True})
        return web.json_response({"ready": False, "reason": why}, status=503)

    async def _openapi(self, request: web.Request) -> web.Response:
        document = resources.files("mqttbroker.ops") / "openapi.json"
        return web.json_response(json.loads(document.read_text(encoding="utf-8")))
