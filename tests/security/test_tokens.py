"""JWT authentication (security/tokens.py) with real keys: RS256, ES256 and EdDSA device keys
(a PEM file per device, one PEM file, a JWKS file), HS256 with a secret; what is refused:
expired, not yet valid, wrong key, ``alg: none``, HS/RS confusion, oversized, wrong audience or
issuer; what is not this source's (a password that is no token); rights from a claim; expiry of
a logged-in client."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from mqttbroker.config import JwtConfig
from mqttbroker.security.errors import SecurityFileError
from mqttbroker.security.tokens import ACCEPTED, NOT_MINE, REFUSED, TokenVerifier

# PyJWT reads the real clock: each test takes the time anew (fresh_now), margins are minutes wide.
NOW = time.time()
SECRET = b"s" * 40


def _pem(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(autouse=True)
def fresh_now() -> None:
    """The time of this test, not of the import: a long suite run would age the tokens."""
    global NOW
    NOW = time.time()


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    return {
        "RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ES256": ec.generate_private_key(ec.SECP256R1()),
        "EdDSA": ed25519.Ed25519PrivateKey.generate(),
    }


def _token(key: Any, alg: str, **claims: Any) -> bytes:
    body = {"sub": "dev-1", "exp": NOW + 600, "iat": NOW, **claims}
    headers = claims.pop("_headers", None) if "_headers" in claims else None
    body.pop("_headers", None)
    return jwt.encode(body, key, algorithm=alg, headers=headers).encode()


def _verifier(**settings: Any) -> TokenVerifier:
    return TokenVerifier(JwtConfig(enabled=True, **settings), clock=lambda: NOW)


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_a_device_key_file_verifies_that_device_s_token(
    tmp_path: Path, keys: dict[str, Any], alg: str
) -> None:
    (tmp_path / "dev-1.pem").write_bytes(_pem(keys[alg]))
    verifier = _verifier(public_key_dir=str(tmp_path))
    verdict = verifier.verify("dev-1", _token(keys[alg], alg))
    assert (verdict.status, verdict.username, verdict.expires) == (ACCEPTED, "dev-1", NOW + 600)
    # Another device has no key there: refused, whatever it signs.
    assert verifier.verify("dev-2", _token(keys[alg], alg)).status == REFUSED


def test_a_device_s_own_key_speaks_for_that_device_only(
    tmp_path: Path, keys: dict[str, Any]
) -> None:
    """dev-1 signs a token naming another user, and one granting itself rights: the first is
    refused, the second logs in as dev-1 with no rights from the token."""
    (tmp_path / "dev-1.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_dir=str(tmp_path), acl_claim="mqtt")
    forged = verifier.verify("dev-1", _token(keys["ES256"], "ES256", sub="admin"))
    assert forged.status == REFUSED and "names 'admin'" in forged.reason
    acl = {"publish": ["#"], "subscribe": ["#"]}
    verdict = verifier.verify("dev-1", _token(keys["ES256"], "ES256", mqtt=acl))
    assert (verdict.status, verdict.username, verdict.rights) == (ACCEPTED, "dev-1", None)


def test_a_token_signed_with_another_key_is_refused(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "one.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "one.pem"))
    other = ec.generate_private_key(ec.SECP256R1())
    verdict = verifier.verify("dev-1", _token(other, "ES256"))
    assert verdict.status == REFUSED and "Signature" in verdict.reason


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"exp": -400}, "ExpiredSignature"),
        ({"nbf": 400}, "ImmatureSignature"),
        ({"iat": 400}, "ImmatureSignature"),
    ],
)
def test_time_claims_are_checked_with_the_leeway(
    tmp_path: Path, keys: dict[str, Any], claims: dict[str, Any], why: str
) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"), leeway=300)
    offsets = {name: NOW + value for name, value in claims.items()}
    verdict = verifier.verify("dev-1", _token(keys["ES256"], "ES256", **offsets))
    assert verdict.status == REFUSED and why in verdict.reason
    # Within the leeway (200 s off instead of 400) the same claims are fine.
    within = {name: NOW + value + (200 if value < 0 else -200) for name, value in claims.items()}
    assert verifier.verify("dev-1", _token(keys["ES256"], "ES256", **within)).status == ACCEPTED


def test_a_token_without_exp_is_refused(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"))
    token = jwt.encode({"sub": "dev-1"}, keys["ES256"], algorithm="ES256").encode()
    assert verifier.verify("dev-1", token).status == REFUSED


def test_alg_none_is_refused(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["RS256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"))
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps({"sub": "dev-1", "exp": NOW + 600}).encode()).rstrip(
        b"="
    )
    assert verifier.verify("dev-1", header + b"." + body + b".").status == REFUSED


def test_an_hmac_token_made_with_the_public_key_is_refused(
    tmp_path: Path, keys: dict[str, Any]
) -> None:
    """The HS/RS confusion: the attacker signs with HS256, the RSA public key as the secret."""
    pem = _pem(keys["RS256"])
    (tmp_path / "k.pem").write_bytes(pem)
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"), algorithms=("RS256", "HS256"))
    import hashlib
    import hmac

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing = (
        b64(b'{"alg":"HS256","typ":"JWT"}')
        + b"."
        + b64(json.dumps({"sub": "dev-1", "exp": NOW + 600}).encode())
    )
    forged = signing + b"." + b64(hmac.new(pem, signing, hashlib.sha256).digest())
    assert verifier.verify("dev-1", forged).status == REFUSED


def test_hs256_with_a_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_JWT_SECRET", SECRET.decode())
    verifier = _verifier(secret_env="FLEET_JWT_SECRET", algorithms=("HS256",))
    assert verifier.verify("dev-1", _token(SECRET, "HS256")).status == ACCEPTED
    assert verifier.verify("dev-1", _token(b"t" * 40, "HS256")).status == REFUSED


def test_a_short_secret_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"short\n")
    with pytest.raises(SecurityFileError, match="at least 32 bytes"):
        _verifier(secret_file=str(tmp_path / "secret"))


def test_a_jwks_file_names_the_key_by_kid(tmp_path: Path, keys: dict[str, Any]) -> None:
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(keys["ES256"].public_key()))
    jwk["kid"] = "fleet-2026"
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [jwk]}))
    verifier = _verifier(jwks_file=str(tmp_path / "keys.json"))
    good = _token(keys["ES256"], "ES256", _headers={"kid": "fleet-2026"})
    assert verifier.verify("dev-1", good).status == ACCEPTED
    unknown = _token(keys["ES256"], "ES256", _headers={"kid": "other"})
    verdict = verifier.verify("dev-1", unknown)
    assert verdict.status == REFUSED and "kid 'other'" in verdict.reason


def test_audience_and_issuer_when_configured(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["EdDSA"]))
    verifier = _verifier(
        public_key_file=str(tmp_path / "k.pem"), audience="mqtt.example", issuer="fleet"
    )
    good = _token(keys["EdDSA"], "EdDSA", aud="mqtt.example", iss="fleet")
    assert verifier.verify("dev-1", good).status == ACCEPTED
    for claims in ({"aud": "other", "iss": "fleet"}, {"aud": "mqtt.example", "iss": "x"}, {}):
        assert verifier.verify("dev-1", _token(keys["EdDSA"], "EdDSA", **claims)).status == REFUSED


def test_an_oversized_token_is_refused_before_parsing(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"), max_token_size=1024)
    token = _token(keys["ES256"], "ES256", padding="x" * 2000)
    verdict = verifier.verify("dev-1", token)
    assert verdict.status == REFUSED and "most 1024" in verdict.reason


def test_a_password_that_is_no_token_is_left_to_the_next_source(
    tmp_path: Path, keys: dict[str, Any]
) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"))
    for password in (None, b"", b"hunter2", b"a.b", "pässwort".encode()):
        assert verifier.verify("dev-1", password).status == NOT_MINE


def test_rights_come_from_the_acl_claim(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    verifier = _verifier(public_key_file=str(tmp_path / "k.pem"), acl_claim="mqtt")
    acl = {"publish": ["devices/dev-1/#"], "subscribe": ["commands/dev-1/+"]}
    verdict = verifier.verify("dev-1", _token(keys["ES256"], "ES256", mqtt=acl))
    assert verdict.status == ACCEPTED and verdict.rights is not None
    rights = verdict.rights
    assert rights.may_publish("devices/dev-1/temp") and not rights.may_publish("devices/dev-2/x")
    assert rights.may_subscribe("commands/dev-1/reboot")
    assert not rights.may_subscribe("commands/#") and not rights.may_subscribe("commands/+/x")
    assert rights.may_read("commands/dev-1/x") and not rights.may_read("commands/dev-2/x")
    broken = verifier.verify("dev-1", _token(keys["ES256"], "ES256", mqtt={"publish": "x"}))
    assert broken.status == REFUSED


def test_a_logged_in_client_s_token_expires(tmp_path: Path, keys: dict[str, Any]) -> None:
    (tmp_path / "k.pem").write_bytes(_pem(keys["ES256"]))
    now = [NOW]
    verifier = TokenVerifier(
        JwtConfig(enabled=True, public_key_file=str(tmp_path / "k.pem"), leeway=30),
        clock=lambda: now[0],
    )
    for client, lifetime in (("short", 60), ("long", 3600)):
        verdict = verifier.verify(client, _token(keys["ES256"], "ES256", exp=NOW + lifetime))
        verifier.accepted(client, verdict)
    assert verifier.expired() == []
    now[0] = NOW + 60 + 30 + 1  # past exp and the leeway
    assert verifier.expired() == ["short"]
    assert verifier.expired() == []  # told once
