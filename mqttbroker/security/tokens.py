"""JWT authentication of devices (``[jwt]``): the CONNECT password is a signed token.

A device proves who it is with a JSON Web Token it signed with its own key (RS256, ES256,
EdDSA...) or, for a fleet that shares one, with an HMAC secret (HS256). PyJWT verifies it; this
module only chooses the key and the algorithms and maps the claims:

* the key: the device's own PEM file ``<public_key_dir>/<client id>.pem``, one PEM file for
  every device (``public_key_file``), a JWKS file whose ``kid`` names the key (``jwks_file``),
  or the HMAC secret (``secret_file`` / ``secret_env``). The files are read at start and again
  on SIGHUP (:meth:`TokenVerifier.reload`).
* the algorithms: those configured that the key can verify. A public key never verifies an
  HMAC token (the "HS/RS confusion") and ``none`` is never accepted.
* the claims: ``exp`` is required and, with ``nbf`` and ``iat``, checked with ``leeway``
  seconds of clock skew; ``aud`` and ``iss`` when configured. The user name is the
  ``username_claim`` (``sub``); the CONNECT's own user name is not used. With ``acl_claim``,
  that claim (``{"publish": [filters], "subscribe": [filters]}``) is the device's whole right
  to publish and subscribe.
* a device's own key (``public_key_dir``) speaks for that device only: its token's user name
  must be the client id, and its ``acl_claim`` is not read (a device must not grant itself
  rights); user names and rights from claims come from keys the operator's issuer holds (the
  secret, ``public_key_file``, the JWKS).

A password that is not a token (not three base64url parts) is not this source's to judge: the
next source of the chain decides (``NOT_MINE``). The connection is closed when the token
expires (DISCONNECT 0x87, :meth:`TokenVerifier.expired`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import SYMMETRIC_ALGORITHMS, JwtConfig
from ..secret_source import read_secret
from .errors import SecurityFileError
from .filters import covers, matches, split

log = logging.getLogger("mqttbroker.security")

# A compact JWS: three base64url parts (the signature may be empty only for "none", refused).
_COMPACT = re.compile(rb"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_CLIENT_FILE = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")

ACCEPTED = "accepted"
REFUSED = "refused"
NOT_MINE = "not mine"


@dataclass(frozen=True, slots=True)
class TokenRights:
    """What a token's ``acl_claim`` lets its device do: topic filters."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()

    def may_publish(self, topic: str) -> bool:
        levels = split(topic)
        return any(matches(split(pattern), levels) for pattern in self.publish)

    def may_subscribe(self, topic_filter: str) -> bool:
        levels = split(topic_filter)
        return any(covers(split(pattern), levels) for pattern in self.subscribe)

    def may_read(self, topic: str) -> bool:
        levels = split(topic)
        return any(matches(split(pattern), levels) for pattern in self.subscribe)


@dataclass(slots=True)
class Verdict:
    status: str  # ACCEPTED, REFUSED, NOT_MINE
    reason: str = ""
    username: str | None = None
    expires: float = 0.0  # the token's exp (seconds since the epoch)
    rights: TokenRights | None = None  # None: no acl_claim configured, other sources decide


@dataclass(slots=True)
class _Keys:
    secret: bytes | None = None
    single: Any = None  # a PyJWK
    by_kid: dict[str, Any] = field(default_factory=dict)
    directory: Path | None = None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityFileError(path, f"cannot read the {what}: {exc.strerror}") from None


def _load_keys(settings: JwtConfig) -> _Keys:
    import jwt

    keys = _Keys()
    keys.secret = read_secret(
        settings.secret_file, settings.secret_env, "jwt.secret", SecurityFileError
    )
    if keys.secret is not None and len(keys.secret) < 32:
        where = settings.secret_file or f"${settings.secret_env}"
        raise SecurityFileError(where, "a JWT secret must have at least 32 bytes")
    if settings.public_key_file:
        pem = _read(settings.public_key_file, "public key")
        keys.single = _public_key(pem, settings.public_key_file)
    if settings.jwks_file:
        text = _read(settings.jwks_file, "JWKS")
        try:
            found = jwt.PyJWKSet.from_json(text.decode()).keys
        except (jwt.PyJWKSetError, jwt.InvalidKeyError, ValueError, UnicodeDecodeError) as exc:
            raise SecurityFileError(settings.jwks_file, f"not a usable JWKS: {exc}") from None
        for key in found:
            if key.key_id:
                keys.by_kid[key.key_id] = key
        if not keys.by_kid:
            raise SecurityFileError(settings.jwks_file, "no key with a kid")
    if settings.public_key_dir:
        directory = Path(settings.public_key_dir)
        if not directory.is_dir():
            raise SecurityFileError(settings.public_key_dir, "not a directory")
        keys.directory = directory
    return keys


def _public_key(pem: bytes, where: str) -> Any:
    """A PEM public key (RSA, EC or Ed25519) as PyJWT's key object; a private key is refused."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        return load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise SecurityFileError(where, f"not a PEM public key: {exc}") from None


def _algorithms_for(key: Any, wanted: tuple[str, ...]) -> list[str]:
    """The configured algorithms a public key of this type can verify."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    if isinstance(key, rsa.RSAPublicKey):
        family = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
    elif isinstance(key, ec.EllipticCurvePublicKey):
        family = {"ES256", "ES384", "ES512"}
    elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        family = {"EdDSA"}
    else:
        family = set()
    return [alg for alg in wanted if alg in family]


class TokenVerifier:
    """Verifies the tokens of CONNECT passwords and remembers when each client's expires."""

    def __init__(self, settings: JwtConfig, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.keys = _load_keys(settings)
        self._expiries: dict[str, float] = {}  # client id -> its token's exp
        self.rights: dict[str, TokenRights] = {}  # client id -> rights from acl_claim

    def reload(self) -> None:
        """Read the key files again (SIGHUP); on an error the previous keys stay."""
        self.keys = _load_keys(self.settings)

    def verify(self, client_id: str, password: bytes | None) -> Verdict:
        import jwt

        settings = self.settings
        if not password or not _COMPACT.fullmatch(password):
            return Verdict(NOT_MINE)
        if len(password) > settings.max_token_size:
            return Verdict(
                REFUSED, f"token of {len(password)} bytes (most {settings.max_token_size})"
            )
        try:
            header = jwt.get_unverified_header(password)
        except jwt.InvalidTokenError as exc:
            return Verdict(REFUSED, f"malformed token: {exc}")
        alg = header.get("alg")
        key, algorithms, own = self._key_for(client_id, header)
        if key is None:
            return Verdict(REFUSED, algorithms[0] if algorithms else "no key for this device")
        if alg not in algorithms:
            return Verdict(REFUSED, f"algorithm {alg!r} not accepted for this key")
        try:
            claims = jwt.decode(
                password,
                key,
                algorithms=algorithms,
                audience=settings.audience or None,
                issuer=settings.issuer or None,
                leeway=settings.leeway,
                options={"require": ["exp"]},
            )
        except jwt.InvalidTokenError as exc:
            return Verdict(REFUSED, f"{type(exc).__name__}: {exc}")
        username = claims.get(settings.username_claim)
        if not isinstance(username, str) or not username:
            return Verdict(REFUSED, f"claim {settings.username_claim!r} is not a string")
        if own:  # a device's own key speaks for that device only, and grants no rights
            if username != client_id:
                return Verdict(
                    REFUSED, f"a token signed with the key of {client_id!r} names {username!r}"
                )
            return Verdict(ACCEPTED, "", username, float(claims["exp"]), None)
        rights = None
        if settings.acl_claim:
            rights = _rights(claims.get(settings.acl_claim))
            if rights is None:
                return Verdict(REFUSED, f"claim {settings.acl_claim!r} is not an ACL")
        return Verdict(ACCEPTED, "", username, float(claims["exp"]), rights)

    def _key_for(self, client_id: str, header: dict[str, Any]) -> tuple[Any, list[str], bool]:
        """The key for this token, the algorithms it may use, and whether it is the device's
        own key (``<public_key_dir>/<client id>.pem``); (None, [why], False) if none."""
        keys = self.keys
        wanted = self.settings.algorithms
        alg = header.get("alg")
        if alg in SYMMETRIC_ALGORITHMS:
            if keys.secret is None:
                return None, [f"algorithm {alg!r}: no JWT secret configured"], False
            return keys.secret, [a for a in wanted if a in SYMMETRIC_ALGORITHMS], False
        kid = header.get("kid")
        if kid is not None and keys.by_kid:
            jwk = keys.by_kid.get(kid)
            if jwk is None:
                return None, [f"no key with kid {kid!r}"], False
            return jwk.key, _algorithms_for(jwk.key, wanted), False
        if keys.directory is not None and _CLIENT_FILE.fullmatch(client_id):
            path = keys.directory / f"{client_id}.pem"
            if path.exists():
                try:
                    key = _public_key(path.read_bytes(), str(path))
                except (SecurityFileError, OSError) as exc:
                    log.warning("jwt: %s", exc)
                    return None, [f"the key of {client_id!r} is not usable"], False
                return key, _algorithms_for(key, wanted), True
        if keys.single is not None:
            return keys.single, _algorithms_for(keys.single, wanted), False
        return None, ["no key for this device"], False

    # -- the tokens of connected clients ------------------------------------------------------

    def accepted(self, client_id: str, verdict: Verdict) -> None:
        """Remember a client's token (its expiry, its rights) once it is logged in."""
        self._expiries[client_id] = verdict.expires
        if verdict.rights is not None:
            self.rights[client_id] = verdict.rights
        else:
            self.rights.pop(client_id, None)

    def forget(self, client_id: str) -> None:
        self._expiries.pop(client_id, None)
        self.rights.pop(client_id, None)

    def expired(self) -> list[str]:
        """The clients whose token has expired (past the leeway), forgotten as they are told."""
        limit = self.clock() - self.settings.leeway
        due = [client for client, when in self._expiries.items() if when < limit]
        for client in due:
            self.forget(client)
        return due


def _rights(value: Any) -> TokenRights | None:
    if not isinstance(value, dict):
        return None
    lists = []
    for name in ("publish", "subscribe"):
        filters = value.get(name, [])
        if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
            return None
        lists.append(tuple(filters))
    return TokenRights(lists[0], lists[1])
