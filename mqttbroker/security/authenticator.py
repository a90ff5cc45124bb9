"""The broker's Authenticator: anonymous access on or off, CONNECT passwords checked against the
password file, and SCRAM-SHA-256/512 enhanced authentication against the same file.

A password check costs one key derivation (about a quarter of a second at the default iteration
counts), and it runs on the event loop. Two things keep that from hurting the other clients:

* a successful check is remembered (a keyed hash of the password, per user, in memory only), so
  a client that reconnects with the same password costs nothing until the file is reloaded;
* the derivations share a time budget (half of each second, with a burst of two seconds): past
  it, CONNECTs that need one are refused with 0x89 Server Busy until the budget refills, so a
  flood of bad passwords cannot take the broker away from everyone else.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Callable

from ..broker.auth import AuthExchange
from ..protocol.reasons import ReasonCode
from .passwords import DEFAULT_ITERATIONS, Entry, MosquittoHash, PasswordFile, ScramCredential
from .scram import MECHANISMS, ScramExchange

log = logging.getLogger("mqttbroker.security")

_REMEMBERED_MAX = 10_000


class KdfBudget:
    """A token bucket measured in seconds of key derivation."""

    def __init__(
        self,
        rate: float = 0.5,
        burst: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = burst
        self._updated = clock()
        self.refused = 0
        self._warned_at = float("-inf")

    def available(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens > 0:
            return True
        self.refused += 1
        if now - self._warned_at >= 10.0:
            self._warned_at = now
            log.warning(
                "password checks are over their CPU budget: refusing logins with 0x89 Server "
                "Busy for now (%d so far); many failed logins may be under way",
                self.refused,
            )
        return False

    def spend(self, seconds: float) -> None:
        self._tokens -= seconds


class FileAuthenticator:
    """Implements :class:`mqttbroker.broker.auth.Authenticator`."""

    def __init__(
        self,
        passwords: PasswordFile | None,
        allow_anonymous: bool,
        budget: KdfBudget | None = None,
        nonce: Callable[[], str] | None = None,
    ) -> None:
        self.passwords = passwords
        self.allow_anonymous = allow_anonymous
        self.budget = budget or KdfBudget()
        self._nonce = nonce
        self._secret = secrets.token_bytes(32)  # per process: remembered passwords, stand-ins
        self._remembered: dict[str, tuple[Entry, bytes]] = {}
        self._stand_in: Entry | None = None

    def replace_passwords(self, passwords: PasswordFile | None) -> None:
        self.passwords = passwords
        self._remembered.clear()
        self._stand_in = None

    # -- CONNECT user name and password ---------------------------------------------------

    def check_password(
        self,
        client_id: str,
        username: str | None,
        password: bytes | None,
        anonymous: bool | None = None,
    ) -> int:
        allowed = self.allow_anonymous if anonymous is None else anonymous
        if username is None:
            if allowed:
                return ReasonCode.SUCCESS
            log.info("client %s: anonymous access refused", client_id)
            return ReasonCode.NOT_AUTHORIZED
        passwords = self.passwords
        if passwords is None:
            # No password file: user names cannot be checked, so they are only names, and the
            # client is as anonymous as one without (the listener's rule, when it has one).
            if allowed:
                return ReasonCode.SUCCESS
            log.info("client %s: refused: no password file to check user %r", client_id, username)
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        entry = passwords.get(username)
        if password is None:
            log.info("client %s: user %r gave no password", client_id, username)
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        mark = hmac.digest(self._secret, password, "sha256")
        if entry is not None:
            remembered = self._remembered.get(username)
            if (
                remembered is not None
                and remembered[0] is entry
                and hmac.compare_digest(remembered[1], mark)
            ):
                return ReasonCode.SUCCESS
        if not self.budget.available():
            return ReasonCode.SERVER_BUSY
        started = time.perf_counter()
        if entry is None:
            self._stand_in_entry(passwords).verify(password)  # the same work: no timing hint
            ok = False
        else:
            ok = entry.verify(password)
        self.budget.spend(time.perf_counter() - started)
        if not ok:
            log.info(
                "client %s: bad password for %s user %r",
                client_id,
                "known" if entry is not None else "unknown",
                username,
            )
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        assert entry is not None
        if len(self._remembered) >= _REMEMBERED_MAX:
            self._remembered.clear()
        self._remembered[username] = (entry, mark)
        return ReasonCode.SUCCESS

    def _stand_in_entry(self, passwords: PasswordFile) -> Entry:
        """An entry no password opens, as costly to check as the file's first entry."""
        if self._stand_in is None:
            model = next((e for e in passwords.entries.values() if not e.unsupported), None)
            if model is not None and model.mosquitto is not None:
                old = model.mosquitto
                fake = MosquittoHash(
                    old.scheme, old.iterations, secrets.token_bytes(12), secrets.token_bytes(64)
                )
                self._stand_in = Entry("", 0, mosquitto=fake)
            else:
                mechanism, iterations = "SCRAM-SHA-512", DEFAULT_ITERATIONS["SCRAM-SHA-512"]
                if model is not None:
                    cred = model.credential("SCRAM-SHA-512") or model.scram[0]
                    mechanism, iterations = cred.mechanism, cred.iterations
                derived = ScramCredential.derive(mechanism, secrets.token_bytes(16), iterations)
                self._stand_in = Entry("", 0, scram=(derived,))
        return self._stand_in

    # -- enhanced authentication ----------------------------------------------------------

    def exchange(self, method: str, client_id: str, username: str | None) -> AuthExchange | None:
        if method not in MECHANISMS or self.passwords is None:
            return None
        if self._nonce is not None:
            return ScramExchange(
                method, self._lookup, self._secret, client_id, username, nonce=self._nonce
            )
        return ScramExchange(method, self._lookup, self._secret, client_id, username)

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
