"""The admin HTTP server (aiohttp), in the broker's process and event loop: the dashboard at
``/``, ``/metrics``, the JSON API under ``/api/v1`` (``/api/v1/openapi.json`` describes it),
``/healthz`` and ``/readyz``.

Authentication (``[admin]``): a bearer token (``token_file`` or ``token_env``) and/or HTTP Basic
logins of the password-file users named in ``admin_users``. With neither, the server must be on a
loopback address (config/check.py refuses anything else), and it lets every request in only while MQTT
itself has no login or ACL either (:func:`mqtt_protection`): otherwise any local process would
get through the admin server what MQTT refuses it (retained payloads an ACL hides, kicks, session
deletes). The broker still starts then (its MQTT service matters more, as when the admin port is
taken), logs a warning naming the keys to set, and answers everything but the dashboard's files
and the two health checks with 403 saying the same. The dashboard's files and the health checks
never need a login.

A wrong token, an unknown user and a wrong password get the same 401. Failed logins are counted
per address (an IPv6 address's /64) with the password checks' own counter
(:class:`~mqttbroker.security.authenticator.FailureCounter`): ``FAILURES_ALLOWED`` within
``FAILURE_WINDOW`` seconds, then 429 (one more try each ``FAILURE_WINDOW / FAILURES_ALLOWED``
seconds). A password check is counted as a failure before it starts and taken back if it
succeeds, so that checks running at once count too. The password checks of the admin server have
their own CPU budget (``ADMIN_KDF_RATE``, ``ADMIN_KDF_BURST``; past it 429), apart from the MQTT
logins', and pass the client's address, so a failed admin login counts against that address for
MQTT too (``security.max_login_failures``).

On a loopback address only requests for a loopback host name are answered (``Host``:
``localhost``, ``127.x.x.x`` or ``[::1]``, with or without a port; anything else 421): a web page
whose name an attacker's DNS points at 127.0.0.1 (DNS rebinding) sends its own name.

State-changing calls (POST, DELETE) need the bearer token or the ``X-MQTTBroker-CSRF`` header: a
page of another site cannot send that header without a CORS preflight, and the server answers no
preflight unless its origin is in ``cors_origins``. Each is logged in one audit line: who (the
user, the token, or no login), from which address, the method and path, the answer and what it
did. A request aiohttp cannot parse (a request line or header over 8 KB, not HTTP) is logged in
one line without a traceback, at most once per ``BAD_REQUEST_LOG_INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..broker.auth import LoginRequest
from ..broker.core import Broker
from ..config import AdminConfig, ConfigError, ListenerConfig, is_loopback
from ..protocol.reasons import ReasonCode
from ..secret_source import joined, read_secret
from ..security import FileAuthenticator
from ..security.authenticator import FailureCounter, KdfBudget, source
from ..security.dynsec import DynsecAuthorizer
from .alerts import Survey
from .api import API_CLIENT_ID, Api, ApiError
from .dynsec_api import DynsecApi
from .metrics import CONTENT_TYPE_LATEST, Metrics

log = logging.getLogger("mqttbroker.admin")

CSRF_HEADER = "X-MQTTBroker-CSRF"
FAILURES_ALLOWED = 5
FAILURE_WINDOW = 60.0
MAX_TRACKED = 10_000  # addresses with recent failures kept in memory
# The admin logins' own budget of password-check time: seconds per second, and burst (seconds).
ADMIN_KDF_RATE = 0.25
ADMIN_KDF_BURST = 1.0
BAD_REQUEST_LOG_INTERVAL = 60.0
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
    """The bearer token, from its file or environment variable (see
    :mod:`mqttbroker.secret_source`; ConfigError if it cannot be had)."""
    return read_secret(admin.token_file, admin.token_env, "admin.token", joined(ConfigError))


def mqtt_protection(
    authenticator: FileAuthenticator | None, broker: Broker, listeners: Sequence[object]
) -> str:
    """The setting that puts MQTT behind a login or an ACL ("": none, MQTT is open to every
    local process, and so may the admin server be): the password file, a login source of the
    chain (the dynamic security, JWT, the HTTP service), the ACL file, client certificates
    required, or taken as user names."""
    if authenticator is not None and authenticator.passwords is not None:
        return "security.password_file"
    chain = getattr(broker.authenticator, "chain", None)  # security.chain's ChainAuthenticator
    names = getattr(chain, "names", ())
    for name, setting in (
        ("dynsec", "dynsec.enabled"),
        ("jwt", "jwt.enabled"),
        ("http", "http_auth.enabled"),
    ):
        if name in names:
            return setting
    if isinstance(broker.authorizer, DynsecAuthorizer):
        return "dynsec.enabled"
    if broker.authorizer is not None:
        return "security.acl_file"
    if any(getattr(listener, "tls_require_certificate", False) for listener in listeners):
        return "listener.tls_require_certificate"
    if any(
        getattr(listener, "tls_certificate_username", "none") != "none" for listener in listeners
    ):
        return "listener.tls_certificate_username"
    return ""


def loopback_host(value: str) -> bool:
    """Whether a Host header names this machine's loopback: ``localhost``, ``127.x.x.x`` or
    ``[::1]``, each with or without a port."""
    host = value.strip().lower()
    port = ""
    if host.startswith("["):
        name, bracket, port = host[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return False
        port = port[1:] if port else ""
        version = 6
    else:
        name, colon, port = host.partition(":")
        if colon and not port:
            return False
        version = 4
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return False
    if version == 4 and name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.version == version and address.is_loopback


class Auth:
    """Who a request comes from: ``check`` answers or raises ApiError 401/403/429."""

    def __init__(
        self,
        admin: AdminConfig,
        authenticator: FileAuthenticator | None,
        offload: Callable[[Callable[[], int]], Awaitable[int]],
        protection: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = read_token(admin)
        self.users = {u.strip() for u in admin.admin_users.split(",") if u.strip()}
        self.authenticator = authenticator if self.users else None
        no_login = self.token is None and not self.users
        # No login configured while MQTT has one (or an ACL): nothing protected is served.
        self.locked = protection if no_login else ""
        self.open = no_login and not protection
        self.offload = offload
        self.clock = clock
        self.failures = FailureCounter(FAILURES_ALLOWED, FAILURE_WINDOW, MAX_TRACKED)
        self.budget = KdfBudget(
            ADMIN_KDF_RATE, ADMIN_KDF_BURST, clock, refusing="admin logins with 429"
        )
        self.challenge = "Basic" if self.users else "Bearer"

    def locked_message(self) -> str:
        return (
            f"the admin server needs a login while MQTT has one ({self.locked} is set): set "
            "admin.token_file, admin.token_env or admin.admin_users"
        )

    async def check(self, request: web.Request) -> tuple[str | None, bool]:
        """(user name, authenticated with the token) of ``request``; raises ApiError 401/429,
        or 403 when no login is configured but one is needed."""
        if self.open:
            return None, False
        if self.locked:
            raise ApiError(403, self.locked_message())
        address = request.remote or "?"
        key = source(address) or "?"
        wait = self.failures.wait(key, self.clock())
        if wait:
            raise self._refuse(429, "too many failed logins; try again later", math.ceil(wait))
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.token is not None:
            if hmac.compare_digest(value.strip().encode(), self.token):
                return None, True
            self._failed(key, address, "wrong bearer token")
        elif scheme == "basic" and self.authenticator is not None:
            user, password = _basic(value)
            if user is None:
                self._failed(key, address, "malformed Basic credentials")
            else:
                # Counted before the check and taken back if it succeeds: checks that run at
                # once (each awaits a worker thread) all count, so the limit holds for them too.
                count = self.failures.add(key, self.clock())
                code = await self._password(user, password, address)
                if code == ReasonCode.SERVER_BUSY:
                    self.failures.forgive(key, self.clock())  # not checked: not a failure
                    raise self._refuse(
                        429, "too many admin password checks at once; try again later", 2
                    )
                if code == ReasonCode.SUCCESS and user in self.users:
                    self.failures.forgive(key, self.clock())
                    return user, False
                if code == ReasonCode.CONNECTION_RATE_EXCEEDED:
                    self._log_failure(address, "its logins are refused for now", count)
                    raise self._refuse(
                        429,
                        "too many failed logins from this address (security.max_login_failures)",
                        math.ceil(FAILURE_WINDOW / FAILURES_ALLOWED),
                    )
                self._log_failure(address, f"wrong user name or password (user {user!r})", count)
        elif header:
            self._failed(key, address, f"unsupported Authorization scheme {scheme[:20]!r}")
        raise self._refuse(401, "authentication required")

    async def _password(self, user: str, password: bytes, address: str) -> int:
        authenticator = self.authenticator
        assert authenticator is not None
        budget = self.budget
        # The same work for a known user or not (a stand-in hash): the answer does not tell.
        return await self.offload(
            lambda: authenticator.check_password(
                LoginRequest(API_CLIENT_ID, user, password, False, address), budget
            )
        )

    def _failed(self, key: str, address: str, why: str) -> None:
        self._log_failure(address, why, self.failures.add(key, self.clock()))

    def _log_failure(self, address: str, why: str, count: float) -> None:
        log.warning(
            "admin: failed login from %s: %s (%d within %gs)",
            address,
            why,
            math.ceil(count),
            FAILURE_WINDOW,
        )

    def _refuse(self, status: int, message: str, retry: int = 0) -> ApiError:
        headers = {"WWW-Authenticate": f'{self.challenge} realm="mqttbroker"'}
        if retry:
            headers["Retry-After"] = str(retry)
        return ApiError(status, message, headers)


def _printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, anything but printable ASCII escaped (log lines
    hold what a client sent)."""
    cut = text[:limit]
    if cut.isascii() and cut.isprintable():
        return cut + ("..." if len(text) > limit else "")
    escaped = cut.encode("unicode_escape", "backslashreplace").decode("ascii")
    return escaped + ("..." if len(text) > limit else "")


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


class BadRequests(logging.Filter):
    """On aiohttp's server logger: a request it cannot parse (a request line or a header over
    8 KB, bytes that are not HTTP) is logged in one line without its traceback, and at most once
    per ``interval`` seconds, with the number left unlogged since. Anyone who can reach the port
    could otherwise write a traceback into the log per request."""

    def __init__(
        self,
        interval: float = BAD_REQUEST_LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self.unlogged = 0
        self._next = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = self.clock()
        if now < self._next:
            self.unlogged += 1
            return False
        self._next = now + self.interval
        args = record.args if isinstance(record.args, tuple) else ()
        address = args[0] if args else "?"
        why = " ".join(str(exc.message or type(exc).__name__).split())[:200]
        since = f" ({self.unlogged} more not logged since)" if self.unlogged else ""
        self.unlogged = 0
        record.msg = "admin server: bad HTTP request from %s, answered 400: %s%s"
        record.args = (address, why, since)
        record.exc_info = None
        record.exc_text = None
        record.levelno = logging.WARNING
        record.levelname = logging.getLevelName(logging.WARNING)
        return True


HTTP_LOG = logging.getLogger("mqttbroker.admin.http")  # aiohttp's server logger, for this server
HTTP_LOG.addFilter(BadRequests())


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
        snap = broker.stats.snapshot(broker.connections, figures.census.dropped)
        times = getattr(broker.store, "commit_times", None)
        self.samples.append(
            {
                "t": round(time.time(), 3),
                "received": snap.received,
                "delivered": snap.delivered,
                "dropped": snap.dropped,
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
        self.auth = Auth(
            config,
            authenticator,
            self._offload,
            mqtt_protection(authenticator, broker, survey.listeners),
        )
        self.loopback = is_loopback(config.host)  # then only loopback Host names are answered
        self._host_warned_at = float("-inf")
        self.metrics = Metrics(broker, survey, survey.listener_names(), holds)
        self.origins = {o.strip() for o in config.cors_origins.split(",") if o.strip()}
        self.websockets: list[dict[str, Any]] = []
        self.api = Api(broker, survey, self.websockets, self.history.recent)
        self.dynsec = DynsecApi()  # its service set by the server once the broker runs
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
                *self.dynsec.routes(),
            ]
        )
        return app

    async def start(self, websockets: list[tuple[int, ListenerConfig]]) -> None:
        """Serve on [admin] host:port; a port in use is logged and the broker goes on without
        the admin server (its MQTT service matters more). ``websockets``: the bound ports of
        the WebSocket listeners, for the dashboard's topic viewer."""
        from ..security.tls import server_context

        config = self.config
        for port, listener in websockets:
            scheme = "wss" if listener.tls else "ws"
            self.websockets.append({"scheme": scheme, "port": port, "path": listener.ws_path})
        context = server_context(
            ListenerConfig(tls_cert_file=config.tls_cert_file, tls_key_file=config.tls_key_file),
            "admin",
        )
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, logger=HTTP_LOG)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port, ssl_context=context)
        try:
            await site.start()
        except (OSError, AttributeError) as exc:  # aiohttp on uvloop: a server without socket
            await runner.cleanup()
            log.error(
                "admin server: cannot listen on %s:%d (%s); running without it",
                config.host,
                config.port,
                getattr(exc, "strerror", None) or exc,
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
        if self.auth.locked:
            log.warning(
                "admin server: everything but the dashboard's files and /healthz, /readyz "
                "answers 403: %s",
                self.auth.locked_message(),
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
            if self.loopback and not loopback_host(request.headers.get("Host", "")):
                raise ApiError(421, self._wrong_host(request))
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
        if user is not None:
            who = f"user {user!r}"
        else:
            who = "the bearer token" if with_token else "no login (loopback)"
        request["who"] = who
        if request.method not in STATE_CHANGING:
            return await handler(request)
        try:
            if not with_token and CSRF_HEADER not in request.headers:
                raise ApiError(
                    403,
                    f"state-changing requests need the bearer token or the {CSRF_HEADER} header",
                )
            response = await handler(request)
        except ApiError as exc:
            self._audit(request, who, exc.status, exc.message)
            raise
        except web.HTTPException as exc:
            self._audit(request, who, exc.status, exc.reason)
            raise
        self._audit(request, who, response.status, str(request.get("audit", "")))
        return response

    @staticmethod
    def _audit(request: web.Request, who: str, status: int, what: str) -> None:
        """One line per state-changing call: who, from where, what, and the answer."""
        log.info(
            "admin audit: %s from %s: %s %s -> %d%s",
            who,
            request.remote or "?",
            request.method,
            _printable(request.raw_path, 300),
            status,
            f": {_printable(what, 300)}" if what else "",
        )

    def _wrong_host(self, request: web.Request) -> str:
        host = request.headers.get("Host")
        got = "no Host header" if host is None else f"Host {_printable(host, 80)!r}"
        now = time.monotonic()
        if now >= self._host_warned_at + BAD_REQUEST_LOG_INTERVAL:  # at most once a minute
            self._host_warned_at = now
            log.warning(
                "admin server: refused a request from %s for %s (421): on loopback it answers "
                "only localhost, 127.x.x.x and [::1]; a web page may be trying DNS rebinding",
                request.remote or "?",
                got,
            )
        return (
            f"this admin server is on a loopback address and answers only requests for "
            f"localhost, 127.x.x.x or [::1] (with or without a port), not {got}: a page under "
            "another name that reaches it (DNS rebinding) is refused"
        )

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
