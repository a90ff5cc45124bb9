"""The chain of authentication sources (``[security] chain``): the password file, the dynamic
security, JWT (:mod:`.tokens`) and the HTTP backend (:mod:`.http_backend`), asked in the order
the operator gives.

Each source answers a login with *allow*, *deny* or *not mine*; the first allow or deny decides,
and a login no source claims is refused: 0x86 when it gave a user name, else the listener's
anonymous rule decides (as without any source). What is *not mine* for each:

* ``password_file``: no user name, or one the file does not have, unless it is the chain's last
  source: then an unknown user costs the same hashing as a known one and is refused (0x86), as
  a broker with the password file alone always did;
* ``dynsec``: no user name, or one the dynamic security does not have;
* ``jwt``: a password that is not a compact JWS (three base64url parts); a token that does not
  verify is denied;
* ``http``: the service's ``{"result": "ignore"}`` (or when it is down with ``when_down =
  "ignore"``).

The password file and the dynamic security hash passwords (milliseconds each): they run on the
server's worker threads. JWT signatures are checked on the event loop (tens of microseconds),
the HTTP service is asked on it with aiohttp: nothing waits on a thread for I/O.

Rights (:class:`ChainAuthorizer`): a JWT client whose token carries the ``acl_claim`` has those
rights and no others; for every other client the rule sources decide in chain order: the ACL
file (``security.acl_file``, in the place of ``password_file``), the dynamic security's roles
(``dynsec``), the HTTP service's ``acl_url`` (``http``: publish and subscribe, and with
``check_reads`` each delivery too). The ACL file and the dynamic security answer for everyone;
the HTTP service may say *ignore*: the next rule source decides, and without one the right is
denied. A broker without rule sources lets everyone publish and subscribe anywhere, as before.

Reads from the HTTP service (``check_reads = true``): every message to every client of such a
broker is checked (``action: "read"``), from the backend's cache (``cache_ttl``, at most
``cache_size`` answers in all, least recently stored dropped first). A delivery cannot wait for
the service: a message on a topic whose answer is not in yet is withheld from that client while
the question goes out (at most ``4 * max_concurrent`` such questions at once; past that, later
ones are asked on a later message), and later messages get the answer. A SUBSCRIBE to a filter
without wildcards (one topic) waits for that topic's read right with its subscribe right, so
its retained message and first deliveries are not withheld. Without ``check_reads`` (the
default) the service is not asked about reads: what a client may subscribe to, it receives.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..broker.auth import AuthExchange, LoginRequest, Pending
from ..protocol.reasons import ReasonCode
from .authenticator import FileAuthenticator
from .dynsec import Dynsec, DynsecAuthenticator
from .http_backend import ALLOW, DENY, HttpBackend
from .tokens import ACCEPTED, REFUSED, TokenVerifier, Verdict

log = logging.getLogger("mqttbroker.security")

NOT_MINE = "not mine"


@dataclass(slots=True)
class Login:
    """A login's outcome: ``code`` (0: accepted), the user name the client has from now on (a
    token's claim; else the CONNECT's), which source decided ("" none: the anonymous rule),
    and the token's verdict when JWT decided."""

    code: int
    username: str | None
    source: str = ""
    token: Verdict | None = None


@dataclass(eq=False)
class AuthChain:
    """The login sources in the operator's order. ``run_blocking(fn)`` runs ``fn`` on a worker
    thread and returns an awaitable of its result (the server's executor)."""

    names: list[str]
    files: FileAuthenticator
    dynsec: Dynsec | None = None
    tokens: TokenVerifier | None = None
    http: HttpBackend | None = None
    # the dynamic security's logins, within the password file's limits (failures, budget)
    dynsec_logins: DynsecAuthenticator | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        dynsec = self.dynsec
        self.dynsec_logins = None if dynsec is None else DynsecAuthenticator(dynsec, self.files)

    async def login(
        self,
        run_blocking: Callable[[Callable[[], int | None]], Awaitable[int | None]],
        request: LoginRequest,
    ) -> Login:
        last = len(self.names) - 1
        for index, name in enumerate(self.names):
            if name == "jwt":
                login = self._jwt(request)
            elif name == "http":
                login = await self._http(request)
            else:  # password_file, dynsec: hashing, on a worker thread
                work = self._hashing(name, request, index == last)
                if work is None:
                    continue
                code = await run_blocking(work)
                login = None if code is None else Login(code, request.username, name)
            if login is not None:
                return login
        return self._nobody(request)

    def login_now(self, request: LoginRequest) -> Login:
        """The same without an event loop (a broker without the server's offload: tests);
        the HTTP service cannot be asked here and denies."""
        last = len(self.names) - 1
        for index, name in enumerate(self.names):
            login: Login | None
            if name == "jwt":
                login = self._jwt(request)
            elif name == "http" and self.http is not None and not self.http.settings.url:
                continue
            elif name == "http":
                log.warning("client %s: http_auth needs the server's event loop", request.client_id)
                login = Login(ReasonCode.BAD_USER_NAME_OR_PASSWORD, request.username, name)
            else:
                work = self._hashing(name, request, index == last)
                code = None if work is None else work()
                login = None if code is None else Login(code, request.username, name)
            if login is not None:
                return login
        return self._nobody(request)

    # -- the sources --------------------------------------------------------------------------

    def _hashing(
        self, name: str, request: LoginRequest, last: bool
    ) -> Callable[[], int | None] | None:
        """The check to run on a worker thread (its reason code, None: not mine), or None when
        it is not this source's at all (no user name; no need for a thread)."""
        username = request.username
        if username is None:
            return None
        if name == "password_file":
            files = self.files
            passwords = files.passwords
            if passwords is None or (not last and passwords.get(username) is None):
                return None
            mine = replace(request, anonymous=False)
            return lambda: files.check_password(mine)
        logins = self.dynsec_logins
        if logins is None or username not in logins.state.clients:
            return None
        return lambda: logins.check_password(request)

    def _jwt(self, request: LoginRequest) -> Login | None:
        tokens = self.tokens
        assert tokens is not None
        client_id = request.client_id
        verdict = tokens.verify(client_id, request.password)
        if verdict.status == ACCEPTED:
            return Login(ReasonCode.SUCCESS, verdict.username, "jwt", verdict)
        if verdict.status == REFUSED:
            log.info(
                "client %s from %s: token refused: %s", client_id, request.address, verdict.reason
            )
            return Login(ReasonCode.BAD_USER_NAME_OR_PASSWORD, None, "jwt")
        return None

    async def _http(self, request: LoginRequest) -> Login | None:
        http = self.http
        assert http is not None
        if not http.settings.url:  # the service answers rights only
            return None
        username = request.username
        answer = await http.authenticate(
            request.client_id, username, request.password, request.address
        )
        if answer == ALLOW:
            return Login(ReasonCode.SUCCESS, username, "http")
        if answer == DENY:
            log.info(
                "client %s from %s: login as %r denied by the HTTP service",
                request.client_id,
                request.address,
                username,
            )
            return Login(ReasonCode.BAD_USER_NAME_OR_PASSWORD, username, "http")
        return None

    def _nobody(self, request: LoginRequest) -> Login:
        """No source claimed the login: the anonymous rule without a user name, else 0x86."""
        username = request.username
        if username is None:
            return Login(self.files.check_password(request), None)
        log.info(
            "client %s from %s: no source knows user %r",
            request.client_id,
            request.address,
            username,
        )
        return Login(ReasonCode.BAD_USER_NAME_OR_PASSWORD, username)


class ChainAuthenticator:
    """The broker's Authenticator over an :class:`AuthChain`: the server checks logins with
    :meth:`AuthChain.login` (its offload); ``check_password`` is the same check where there
    is no event loop. Enhanced authentication (SCRAM) and the admin server's logins are the
    password file's."""

    def __init__(self, chain: AuthChain) -> None:
        self.chain = chain
        self.files = chain.files

    def check_password(self, login: LoginRequest) -> int:
        return self.chain.login_now(login).code

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> AuthExchange | None:
        return self.files.exchange(method, client_id, username, address)

    def __getattr__(self, name: str) -> Any:  # the password file's extras (admin logins...)
        return getattr(self.files, name)


# -- rights ---------------------------------------------------------------------------------


class ChainAuthorizer:
    """The broker's Authorizer over the rule sources (see the module docstring). ``rules``:
    (name, authorizer) in chain order, the authorizer None for ``http`` (asked through
    ``http``). ``spawn`` starts a coroutine on the event loop.

    The HTTP service cannot answer at once: on the input path (``ask_publish``,
    ``ask_subscribe``, called by the connection for a right it has not cached) a question
    without a cached answer raises :class:`~mqttbroker.broker.auth.Pending`, the connection
    holds its input, and the packet is handled again once the answer is in (kept in
    ``_fresh`` until the next tick, whether the service's answer may be cached or not).
    Elsewhere (a will, a SIGHUP recheck, the admin API) the last answer the service gave is
    used even past its TTL while a fresh one is asked for; never asked: denied.
    ``generation`` moves on every ``cache_ttl`` seconds (:meth:`expire`, the server's tick),
    so the connections' own caches of rights ask again as often as the backend's cache."""

    def __init__(
        self,
        rules: list[tuple[str, Any]],
        tokens: TokenVerifier | None = None,
        http: HttpBackend | None = None,
        spawn: Callable[[Any], Any] | None = None,
    ) -> None:
        self.rules = rules
        self.tokens = tokens
        self.http = http
        self.spawn = spawn
        self._parts = [authorizer for _, authorizer in rules if authorizer is not None]
        self._epoch = 0
        # Without a rule source, a right no token decides is everyone's (as without an ACL).
        self.default = not rules
        self.addresses: dict[str, str | None] = {}  # client id -> address (the HTTP service's)
        self._fresh: dict[tuple[Any, ...], str] = {}
        self._asking: set[tuple[Any, ...]] = set()
        asks = http is not None and any(part is None for _, part in rules)
        # [http_auth] check_reads: each delivery asks the service's "read" right too
        self.reads = asks and http is not None and http.settings.check_reads
        # questions started without a packet waiting for them (reads, wills...) at once
        self.max_asking = 4 * http.settings.max_concurrent if http is not None else 0

    @property
    def generation(self) -> int:
        generation = self._epoch
        for part in self._parts:
            generation += part.generation
        return generation

    @generation.setter
    def generation(self, value: int) -> None:
        self._epoch += 1

    def expire(self) -> None:
        """The HTTP answers connections cached are stale: ask again (every cache_ttl)."""
        self._epoch += 1

    def tick(self) -> None:
        self._fresh.clear()

    def forget(self, client_id: str) -> None:
        self.addresses.pop(client_id, None)

    # -- the Authorizer ---------------------------------------------------------------------

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self._decide(client_id, username, topic, "publish", False)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self._decide(client_id, username, topic_filter, "subscribe", False)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        rights = self._rights(client_id)
        if rights is not None:
            return bool(rights.may_read(topic))
        if self.reads:
            return self._decide(client_id, username, topic, "read", False)
        parts = self._parts  # the HTTP service is not asked about reads
        return bool(parts[0].can_read(client_id, username, topic)) if parts else True

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        if self._rights(client_id) is not None:
            return False  # a granted filter is covered by a subscribe filter of the token
        if self.reads:
            return True  # the service may refuse any topic
        parts = self._parts
        return (
            bool(parts[0].needs_read_check(client_id, username, topic_filter)) if parts else False
        )

    def can_unsubscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        check = getattr(self._parts[0], "can_unsubscribe", None) if self._parts else None
        return True if check is None else bool(check(client_id, username, topic_filter))

    # -- the chain --------------------------------------------------------------------------

    def _rights(self, client_id: str) -> Any:
        tokens = self.tokens
        return None if tokens is None else tokens.rights.get(client_id)

    def _decide(
        self, client_id: str, username: str | None, what: str, action: str, ask: bool
    ) -> bool:
        rights = self._rights(client_id)
        if rights is not None:
            return bool(
                rights.may_publish(what) if action == "publish" else rights.may_subscribe(what)
            )
        for _name, part in self.rules:
            if part is None:  # http
                answer = self._http(client_id, username, what, action, ask)
                if answer is None:
                    continue
                return answer == ALLOW
            if action == "publish":
                return bool(part.can_publish(client_id, username, what))
            if action == "read":
                return bool(part.can_read(client_id, username, what))
            return bool(part.can_subscribe(client_id, username, what))
        return self.default

    def _http(
        self, client_id: str, username: str | None, topic: str, action: str, ask: bool
    ) -> str | None:
        """ALLOW, DENY, or None: not the service's (ignore)."""
        from .http_backend import IGNORE, right_key

        http = self.http
        assert http is not None
        address = self.addresses.get(client_id)
        key = right_key(client_id, username, address, topic, action)
        answer = self._fresh.get(key)
        if answer is None:
            answer, fresh = http.peek(key)
            if not fresh:
                if ask:
                    raise Pending(lambda resume: self._start(key, resume))
                self._start(key, None)  # for the next time
                if answer is None:
                    return DENY
        return None if answer == IGNORE else answer

    def _start(self, key: tuple[Any, ...], resume: Callable[[], None] | None) -> None:
        """Ask the service for the right ``key`` (:func:`~.http_backend.right_key`) on the
        event loop; ``resume``, if any, is called once the answer is in."""
        if resume is None and (key in self._asking or len(self._asking) >= self.max_asking):
            return  # asked already, or too many questions out: asked again another time
        assert self.spawn is not None
        self._asking.add(key)
        self.spawn(self._fetch(key, resume))

    async def _fetch(self, key: tuple[Any, ...], resume: Callable[[], None] | None) -> None:
        http = self.http
        assert http is not None
        action, client_id, username, address, topic = key
        answer = DENY
        try:
            answer = await http.authorize(client_id, username, address, topic, action)
        except Exception:
            log.exception("http_auth: asking for %s %r failed", action, topic)
        finally:
            self._asking.discard(key)
            self._fresh[key] = answer
            if resume is not None:
                resume()


class AskingAuthorizer(ChainAuthorizer):
    """A chain with the HTTP service's ``acl_url``: the connection asks through these (see
    :class:`ChainAuthorizer`); a broker without it has no such methods, and pays nothing."""

    def ask_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self._decide(client_id, username, topic, "publish", True)

    def ask_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        allowed = self._decide(client_id, username, topic_filter, "subscribe", True)
        if allowed and self.reads and "+" not in topic_filter and "#" not in topic_filter:
            # one topic: its read right now, so that its first deliveries are not withheld
            self._decide(client_id, username, topic_filter, "read", True)
        return allowed
