"""The broker's Authenticator: anonymous access on or off, CONNECT passwords checked against the
password file, and SCRAM-SHA-256/512 enhanced authentication against the same file.

A password check costs one key derivation (about a quarter of a second at the default iteration
counts); the server runs it on worker threads, beside the event loop. Four things keep it from
hurting the other clients, or from being a way to guess passwords at speed:

* a successful check is remembered (a keyed hash of the password, per user, in memory only), so
  a client that reconnects with the same password costs nothing until the file is reloaded;
* failed logins are counted per source address (an IPv6 address's /64 network) and per user
  name (:class:`LoginFailures`): an address with ``max_login_failures`` of them within
  ``login_failure_window`` seconds is refused at once, without a check, with 0x9F Connection
  Rate Exceeded (it gets one more try each ``window / limit`` seconds). A user name with as many failures is a target: it may then
  be tried only from addresses without recent failures, so guessing it from many addresses is
  slowed down too, while its owner, whose address has no failures, still logs in;
* the derivations share a time budget (half of each second, with a burst of two seconds): past
  it, CONNECTs that need one are refused with 0x89 Server Busy until the budget refills. Half of
  the burst is kept for addresses without recent failures, so a flood of bad passwords cannot
  take logins away from everyone else. The admin server's logins (HTTP Basic, same file) have a
  budget of their own, so that guessing there costs MQTT logins nothing;
* an unknown user costs the same derivation as a usual entry of the file, and SCRAM answers it
  with a salt and an iteration count that look like a real user's and stay the same across
  restarts (derived from the installation's secret: see :func:`load_secret`).

SCRAM itself hashes nothing costly on the server (the client derives the key), so it runs on the
event loop; its failures count like failed passwords, and a locked-out address or a targeted
user is refused the same way.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..broker.auth import AuthExchange, LoginRequest
from ..protocol.reasons import ReasonCode
from .errors import SecurityFileError
from .passwords import (
    DEFAULT_ITERATIONS,
    Entry,
    MosquittoHash,
    PasswordFile,
    ScramCredential,
    write_atomically,
)
from .scram import MECHANISMS, ScramExchange

log = logging.getLogger("mqttbroker.security")

_REMEMBERED_MAX = 10_000
SECRET_BYTES = 32


def load_secret(path: str | Path) -> bytes:
    """The installation's secret in ``path`` (hex), made (mode 0600) if the file is missing.
    SecurityFileError names the file when it cannot be read, written or is not a secret."""
    target = Path(path)
    try:
        text = target.read_text("ascii").strip()
    except FileNotFoundError:
        secret = secrets.token_bytes(SECRET_BYTES)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(target, secret.hex().encode() + b"\n", 0o600)
        except OSError as exc:
            raise SecurityFileError(str(path), f"cannot write: {exc.strerror}") from None
        log.info("made a new secret for the password checks in %s", path)
        return secret
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else "not a hex secret"
        raise SecurityFileError(str(path), f"cannot read: {detail}") from None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < SECRET_BYTES:
        raise SecurityFileError(
            str(path), f"expected at least {SECRET_BYTES} bytes in hex (delete it to make one)"
        )
    return secret


class FailureCounter:
    """Failures per key (a source address, a user name), each draining away at ``limit`` per
    ``window`` seconds: a key at the limit gets one more try every ``window / limit`` seconds.
    At most ``max_keys`` keys are kept; past that the least recently failed are forgotten."""

    def __init__(self, limit: int, window: float, max_keys: int = 20_000) -> None:
        self.limit = limit
        self.drain = limit / window
        self.max_keys = max_keys
        self._counts: dict[str, tuple[float, float]] = {}  # key -> (count, when), oldest first

    def count(self, key: str, now: float) -> float:
        item = self._counts.get(key)
        if item is None:
            return 0.0
        value = item[0] - (now - item[1]) * self.drain
        if value <= 0.0:
            del self._counts[key]
            return 0.0
        return value

    def add(self, key: str, now: float) -> float:
        value = self.count(key, now) + 1.0
        self._counts.pop(key, None)
        if len(self._counts) >= self.max_keys:
            for old in list(self._counts)[: self.max_keys // 10 + 1]:
                del self._counts[old]
        self._counts[key] = (value, now)
        return value

    def over(self, key: str, now: float) -> bool:
        return self.count(key, now) >= self.limit

    def wait(self, key: str, now: float) -> float:
        """Seconds until one more failure of ``key`` stays within the limit (0: now)."""
        excess = self.count(key, now) + 1.0 - self.limit
        return excess / self.drain if excess > 0.0 else 0.0

    def forgive(self, key: str, now: float) -> None:
        """Take back one failure of ``key``: one counted ahead (before a check that may take
        a while, so that checks running at once count) whose check then succeeded."""
        value = self.count(key, now) - 1.0
        if value > 0.0:
            self._counts[key] = (value, now)
        else:
            self._counts.pop(key, None)


def source(address: str | None) -> str | None:
    """What failed logins from ``address`` count against: the address itself, or for IPv6 its
    /64 network (a single host often has a whole /64 to take addresses from)."""
    if address is None or ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.split("%", 1)[0])
    except ValueError:
        return address  # not an address (a Unix socket's path...): counted as it is
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))


class LoginFailures:
    """Failed logins per source address and per user name (see the module docstring);
    ``limit`` 0: none counted, nobody refused."""

    def __init__(self, limit: int = 10, window: float = 300.0) -> None:
        self.limit = limit
        self.window = window
        self.addresses = FailureCounter(limit, window) if limit else None
        self.users = FailureCounter(limit, window) if limit else None
        self.refused = 0

    def clean(self, address: str | None, now: float) -> bool:
        """Whether ``address`` has no recent failures (an unknown address counts as clean)."""
        address = source(address)
        return address is None or self.addresses is None or not self.addresses.count(address, now)

    def refusal(self, address: str | None, username: str, now: float) -> str:
        """Why a login from ``address`` as ``username`` is refused without a check, or ""."""
        if self.addresses is None or self.users is None:
            return ""
        address = source(address)
        if address is not None and self.addresses.over(address, now):
            return f"{address} had {self.limit} failed logins within {self.window:g} s"
        if not self.clean(address, now) and self.users.over(username, now):
            return (
                f"user {username!r} had {self.limit} failed logins within {self.window:g} s "
                f"and {address} failed recently too"
            )
        return ""

    def failed(self, address: str | None, username: str | None, now: float) -> None:
        if self.addresses is None or self.users is None:
            return
        address = source(address)
        if address is not None and _reached(self.addresses.add(address, now), self.limit):
            log.warning(
                "%s: %d failed logins within %g s: its logins are refused (0x9F) for now",
                address,
                self.limit,
                self.window,
            )
        if username is not None and _reached(self.users.add(username, now), self.limit):
            log.warning(
                "user %r: %d failed logins within %g s: it may be tried only from addresses "
                "without failed logins for now",
                username,
                self.limit,
                self.window,
            )


def _reached(count: float, limit: int) -> bool:
    """Whether the failure that made ``count`` took it to ``limit`` (logged once a time)."""
    return count - 1.0 < limit <= count


class KdfBudget:
    """A token bucket measured in seconds of key derivation. ``reserve`` (seconds of the burst)
    is kept for the clients :meth:`available` is told are clean."""

    def __init__(
        self,
        rate: float = 0.5,
        burst: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        reserve: float | None = None,
        refusing: str = "logins with 0x89 Server Busy",
    ) -> None:
        self.refusing = refusing  # what the warning says is refused past the budget
        self.rate = rate
        self.burst = burst
        self.reserve = burst / 2 if reserve is None else reserve
        self.clock = clock
        self._tokens = burst
        self._updated = clock()
        self.refused = 0
        self._warned_at = float("-inf")

    def available(self, clean: bool = True) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens > (0.0 if clean else self.reserve):
            return True
        self.refused += 1
        if now - self._warned_at >= 10.0:
            self._warned_at = now
            log.warning(
                "password checks are over their CPU budget: refusing %s for now (%d so far); "
                "many failed logins may be under way",
                self.refusing,
                self.refused,
            )
        return False

    def spend(self, seconds: float) -> None:
        self._tokens -= seconds


class FileAuthenticator:
    """Implements :class:`mqttbroker.broker.auth.Authenticator`. ``secret``: the installation's
    (:func:`load_secret`); None: one for this process only."""

    def __init__(
        self,
        passwords: PasswordFile | None,
        allow_anonymous: bool,
        budget: KdfBudget | None = None,
        nonce: Callable[[], str] | None = None,
        failures: LoginFailures | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.passwords = passwords
        self.allow_anonymous = allow_anonymous
        self.budget = budget or KdfBudget()
        self.failures = failures or LoginFailures()
        self._nonce = nonce
        self._secret = secret if secret is not None else secrets.token_bytes(SECRET_BYTES)
        self._remembered: dict[str, tuple[Entry, bytes]] = {}
        self._stand_in: Entry | None = None
        # Checks run on worker threads: the counters and the budget change under this lock.
        self._lock = threading.Lock()

    def replace_passwords(self, passwords: PasswordFile | None) -> None:
        self.passwords = passwords
        self._remembered.clear()
        self._stand_in = None

    # -- failed logins --------------------------------------------------------------------

    def refusal(self, client_id: str, username: str, address: str | None) -> int:
        """0x9F if logins from ``address`` as ``username`` are refused for now (logged, at
        most once per doubling of the count), else 0."""
        with self._lock:
            why = self.failures.refusal(address, username, self.budget.clock())
            if not why:
                return 0
            self.failures.refused += 1
            refused = self.failures.refused
        if refused & (refused - 1) == 0:  # the 1st, 2nd, 4th, 8th... refusal
            log.warning(
                "client %s from %s: login as %r refused without a check (0x9F): %s "
                "(%d refused so far)",
                client_id,
                address,
                username,
                why,
                refused,
            )
        return ReasonCode.CONNECTION_RATE_EXCEEDED

    def failed(self, username: str, address: str | None, known: bool | None = None) -> None:
        """Count a failed login. ``known``: whether ``username`` is a user of the source that
        checked it (only those are counted as targets: other names are not); None: whether the
        password file has it."""
        if known is None:
            passwords = self.passwords
            known = passwords is not None and passwords.get(username) is not None
        with self._lock:
            self.failures.failed(address, username if known else None, self.budget.clock())

    def guarded(
        self,
        client_id: str,
        username: str,
        password: bytes | None,
        address: str | None,
        verify: Callable[[bytes], bool],
        known: bool,
        budget: KdfBudget | None = None,
        free: Callable[[bytes], bool] | None = None,
    ) -> int:
        """A password check within the limits every hashing source shares (the password
        file's and the dynamic security's, see the module docstring): 0x9F without a check for
        a locked-out address or a targeted user, 0x86 for no password, success at once when
        ``free(password)`` knows it (a remembered login), 0x89 past the ``budget`` (None: the
        MQTT logins'), else ``verify(password)`` (the hashing, as costly for an unknown user as
        for a known one), timed and taken from the budget; a failure is counted (the user name
        too when ``known``). Runs on a worker thread."""
        budget = self.budget if budget is None else budget
        code = self.refusal(client_id, username, address)  # before the cache: no free guesses
        if code:
            return code
        if password is None:
            log.info("client %s from %s: user %r gave no password", client_id, address, username)
            self.failed(username, address, known)
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if free is not None and free(password):
            return ReasonCode.SUCCESS
        with self._lock:
            clean = self.failures.clean(address, budget.clock())
            if not budget.available(clean):
                return ReasonCode.SERVER_BUSY
        started = time.perf_counter()
        ok = verify(password)
        spent = time.perf_counter() - started
        with self._lock:
            budget.spend(spent)
        if not ok:
            log.info(
                "client %s from %s: bad password for %s user %r",
                client_id,
                address,
                "known" if known else "unknown",
                username,
            )
            self.failed(username, address, known)
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        return ReasonCode.SUCCESS

    # -- CONNECT user name and password ---------------------------------------------------

    def check_password(self, login: LoginRequest, budget: KdfBudget | None = None) -> int:
        """The answer to a login (a reason code). ``budget``: the time budget the key
        derivation is taken from (the admin server has its own); None: the MQTT logins'."""
        client_id, username, password = login.client_id, login.username, login.password
        address = login.address
        allowed = self.allow_anonymous if login.anonymous is None else login.anonymous
        if username is None:
            if allowed:
                return ReasonCode.SUCCESS
            log.info("client %s from %s: anonymous access refused", client_id, address)
            return ReasonCode.NOT_AUTHORIZED
        passwords = self.passwords
        if passwords is None:
            # No password file: user names cannot be checked, so they are only names, and the
            # client is as anonymous as one without (the listener's rule, when it has one).
            if allowed:
                return ReasonCode.SUCCESS
            log.info(
                "client %s from %s: refused: no password file to check user %r",
                client_id,
                address,
                username,
            )
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        entry = passwords.get(username)

        def remembered(password: bytes) -> bool:
            known = self._remembered.get(username)
            return (
                entry is not None
                and known is not None
                and known[0] is entry
                and hmac.compare_digest(known[1], hmac.digest(self._secret, password, "sha256"))
            )

        def verify(password: bytes) -> bool:
            if entry is None:
                self._stand_in_entry(passwords).verify(password)  # the same work: no hint
                return False
            return entry.verify(password)

        code = self.guarded(
            client_id, username, password, address, verify, entry is not None, budget, remembered
        )
        if code == ReasonCode.SUCCESS and entry is not None and password is not None:
            if len(self._remembered) >= _REMEMBERED_MAX:
                self._remembered.clear()
            self._remembered[username] = (entry, hmac.digest(self._secret, password, "sha256"))
        return code

    def _stand_in_entry(self, passwords: PasswordFile) -> Entry:
        """An entry no password opens, as costly to check as the file's usual entry."""
        if self._stand_in is None:
            scheme, iterations = passwords.usual_cost()
            if scheme in ("7", "6"):
                fake = MosquittoHash(
                    scheme, iterations, secrets.token_bytes(12), secrets.token_bytes(64)
                )
                self._stand_in = Entry("", 0, mosquitto=fake)
            else:
                derived = ScramCredential.derive(scheme, secrets.token_bytes(16), iterations)
                self._stand_in = Entry("", 0, scram=(derived,))
        return self._stand_in

    # -- enhanced authentication ----------------------------------------------------------

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> AuthExchange | None:
        if method not in MECHANISMS or self.passwords is None:
            return None

        def admit(user: str) -> int:
            return self.refusal(client_id, user, address)

        def failed(user: str) -> None:
            self.failed(user, address)

        return ScramExchange(
            method,
            self._lookup,
            self._secret,
            client_id,
            username,
            nonce=self._nonce,
            admit=admit,
            failed=failed,
            iterations=self._usual_iterations,
        )

    def _usual_iterations(self, mechanism: str) -> int:
        passwords = self.passwords
        if passwords is None:
            return DEFAULT_ITERATIONS[mechanism]
        return passwords.usual_iterations(mechanism)

    def _lookup(self, username: str, mechanism: str) -> ScramCredential | None:
        passwords = self.passwords
        entry = passwords.get(username) if passwords is not None else None
        if entry is None:
            return None
        credential = entry.credential(mechanism)
        if credential is None:
            log.info(
                "user %r cannot use %s: the password file holds no verifier for it (%s entry)",
                username,
                mechanism,
                entry.kind,
            )
        return credential
