"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as MQTT 5 enhanced authentication.

The Authentication Method is the SASL mechanism name; the Authentication Data carries the SCRAM
messages::

    CONNECT  method, data = client-first-message    n,,n=<user>,r=<client nonce>
    AUTH 18  data = server-first-message             r=<nonce>,s=<salt>,i=<iterations>
    AUTH 18  data = client-final-message             c=biws,r=<nonce>,p=<proof>
    CONNACK  data = server-final-message             v=<server signature>

(re-authentication runs the same exchange, started by AUTH 0x19 and ended by AUTH 0x00). The
server keeps only StoredKey and ServerKey (see :mod:`.passwords`). Channel binding is not
offered (no -PLUS mechanisms): a client that asks for it is refused. Every failure is reported as
0x86 Bad User Name or Password; the log says why. An unknown user, or one whose entry has no
verifier for this hash, gets a made-up salt (derived from the user name and the installation's
secret, so the same each time, across restarts too) and the iteration count the file's entries
usually have, so the answers do not tell which user names exist, and fails at the proof. After
too many failed logins (see :mod:`.authenticator`) a client is refused at its first message with
0x9F Connection Rate Exceeded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable

from ..broker.auth import CONTINUE, FAIL, SUCCESS, AuthOutcome
from ..protocol.reasons import ReasonCode
from .passwords import DEFAULT_ITERATIONS, SALT_BYTES, SCRAM_HASHES, ScramCredential, b64decode

log = logging.getLogger("mqttbroker.security")

MECHANISMS = tuple(sorted(SCRAM_HASHES))  # "SCRAM-SHA-256", "SCRAM-SHA-512"

Lookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism) -> credential
_FAILED = ReasonCode.BAD_USER_NAME_OR_PASSWORD


class ScramError(Exception):
    """Why an exchange failed (logged, never sent), and the reason code it is answered with."""

    def __init__(self, message: str, code: int = _FAILED) -> None:
        super().__init__(message)
        self.code = code


def _nonce() -> str:
    return base64.b64encode(secrets.token_bytes(18)).decode("ascii")


def _decode_saslname(text: str) -> str:
    """``=2C`` and ``=3D`` stand for ``,`` and ``=``; any other ``=`` is malformed."""
    out: list[str] = []
    index = 0
    while index < len(text):
        ch = text[index]
        if ch == "=":
            code = text[index : index + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise ScramError("malformed user name (bad '=' escape)")
            index += 3
        else:
            out.append(ch)
            index += 1
    return "".join(out)


def _attributes(text: str) -> list[tuple[str, str]]:
    """``a=value,b=value`` -> [(a, value), ...], each name one letter."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha() or not part[0].isascii():
            raise ScramError(f"malformed attribute {part[:20]!r}")
        pairs.append((part[0], part[2:]))
    return pairs


class ScramExchange:
    """One SCRAM exchange, server side: client-first, then client-final."""

    def __init__(
        self,
        mechanism: str,
        lookup: Lookup,
        secret: bytes,
        client_id: str,
        connect_username: str | None = None,
        nonce: Callable[[], str] | None = None,
        admit: Callable[[str], int] | None = None,
        failed: Callable[[str], None] | None = None,
        iterations: Callable[[str], int] | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.hash_name = SCRAM_HASHES[mechanism]
        self._lookup = lookup
        self._secret = secret
        self._client_id = client_id
        self._connect_username = connect_username
        self._make_nonce = nonce or _nonce
        # admit(user): 0, or the reason code refusing it before any work (failed logins);
        # failed(user): a failed login to count; iterations(mechanism): what a real user's
        # entry usually has, for the made-up answers (the default count without it).
        self._admit = admit
        self._failed = failed
        self._iterations = iterations
        self._state = 0  # 0: expect client-first, 1: expect client-final, 2: done
        self._credential: ScramCredential | None = None
        self._known = False
        self._username = ""
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def step(self, data: bytes | None) -> AuthOutcome:
        try:
            if self._state == 0:
                return self._client_first(data)
            if self._state == 1:
                return self._client_final(data)
            raise ScramError("the exchange is over")
        except ScramError as exc:
            self._state = 2
            username = self._username or self._connect_username
            log.info(
                "client %s: %s authentication of %r failed: %s",
                self._client_id,
                self.mechanism,
                username,
                exc,
            )
            if self._failed is not None and username and exc.code == _FAILED:
                self._failed(username)  # (not a refusal by ``admit``: no failure counted)
            return AuthOutcome(FAIL, reason_code=exc.code)

    @staticmethod
    def _text(data: bytes | None, what: str) -> str:
        if not data:
            raise ScramError(f"no {what} in the Authentication Data")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError(f"the {what} is not UTF-8") from None

    def _client_first(self, data: bytes | None) -> AuthOutcome:
        message = self._text(data, "client-first-message")
        parts = message.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed client-first-message")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            raise ScramError("channel binding requested but not offered")
        if cbind not in ("n", "y"):
            raise ScramError("malformed channel-binding flag")
        attrs = _attributes(bare)
        if attrs[0][0] == "m":
            raise ScramError("mandatory extension not supported")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise ScramError("client-first-message must start with n= and r=")
        username = _decode_saslname(attrs[0][1])
        self._username = username
        client_nonce = attrs[1][1]
        if not username:
            raise ScramError("empty user name")
        if not client_nonce or any(not 0x21 <= ord(c) <= 0x7E for c in client_nonce):
            raise ScramError("malformed nonce")
        if authzid:
            if not authzid.startswith("a=") or _decode_saslname(authzid[2:]) != username:
                raise ScramError("authorization identity differs from the user name")
        if self._connect_username is not None and self._connect_username != username:
            raise ScramError("the CONNECT user name differs from the SCRAM user name")
        if self._admit is not None:
            code = self._admit(username)
            if code:
                raise ScramError("refused after failed logins", code)
        credential = self._lookup(username, self.mechanism)
        self._known = credential is not None
        if credential is None:
            credential = self._stand_in(username)
        self._credential = credential
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._make_nonce()
        salt = base64.b64encode(credential.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = 1
        return AuthOutcome(CONTINUE, self._server_first.encode("utf-8"))

    def _stand_in(self, username: str) -> ScramCredential:
        """A credential no password opens, with a salt derived from the user name and a
        server secret: the same every time this user name is tried."""
        salt = hmac.digest(self._secret, f"{self.mechanism}\0{username}".encode(), "sha256")
        size = hashlib.new(self.hash_name).digest_size
        iterations = self._iterations
        return ScramCredential(
            self.mechanism,
            iterations(self.mechanism) if iterations else DEFAULT_ITERATIONS[self.mechanism],
            salt[:SALT_BYTES],
            secrets.token_bytes(size),
            secrets.token_bytes(size),
        )

    def _client_final(self, data: bytes | None) -> AuthOutcome:
        message = self._text(data, "client-final-message")
        without_proof, sep, proof_text = message.rpartition(",p=")
        if not sep:
            raise ScramError("client-final-message without a proof")
        attrs = _attributes(without_proof)
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("client-final-message must start with c= and r=")
        try:
            binding = b64decode(attrs[0][1])
            proof = b64decode(proof_text)
        except ValueError as exc:
            raise ScramError(str(exc)) from None
        if binding != self._gs2_header.encode("utf-8"):
            raise ScramError("channel binding data differs from the GS2 header")
        if not hmac.compare_digest(attrs[1][1].encode(), self._nonce.encode()):
            raise ScramError("nonce mismatch")
        credential = self._credential
        assert credential is not None
        auth_message = ",".join(
            (self._client_first_bare, self._server_first, without_proof)
        ).encode("utf-8")
        signature = hmac.digest(credential.stored_key, auth_message, self.hash_name)
        if len(proof) != len(signature):
            raise ScramError("proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        valid = hmac.compare_digest(
            hashlib.new(self.hash_name, client_key).digest(), credential.stored_key
        )
        if not valid or not self._known:
            raise ScramError(
                "invalid proof" if self._known else "unknown user, or no verifier for this hash"
            )
        server_signature = hmac.digest(credential.server_key, auth_message, self.hash_name)
        self._state = 2
        log.debug(
            "client %s authenticated as %r with %s", self._client_id, self._username, self.mechanism
        )
        return AuthOutcome(
            SUCCESS,
            b"v=" + base64.b64encode(server_signature),
            username=self._username,
        )
