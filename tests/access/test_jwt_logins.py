"""JWT logins end to end: a real broker process (``[jwt]`` in its configuration file) and paho
clients whose password is a token signed here with keys made for the test.

Accepted: a valid token (RS256 from one PEM key, ES256 from a per-device key directory, EdDSA
from a JWKS file reloaded on SIGHUP, HS256 with a secret from the environment); its ``sub`` is
the user name and its ``acl`` claim the rights. Refused (0x86): expired, not yet valid, signed
with another key, ``alg: none``, HS256 signed with the public key (the HS/RS confusion), larger
than max_token_size. A connection is closed when its token expires (MQTT 5: DISCONNECT 0x87
"token expired"; 3.1.1: closed), but not the connection that took its client id over with a
token of its own. The chain: a password that is no token goes on to the password file."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from support.clients import MQTT_5, PahoClient, unique
from support.launcher import BrokerProcess
from support.password_files import mosquitto_pbkdf2_line

MQTT_311 = 4
SECRET = "an HMAC secret of at least thirty-two bytes, for the test"
ACL = {"publish": ["devices/{id}/#"], "subscribe": ["commands/{id}/#"]}
Start = Callable[..., BrokerProcess]  # the start fixture
Login = Callable[..., PahoClient]  # the login fixture


def pem(private: Any) -> bytes:
    data: bytes = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


class Keys:
    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()
        self.public_file = directory / "fleet.pem"
        self.public_file.write_bytes(pem(self.rsa))
        self.key_dir = directory / "devices"
        self.key_dir.mkdir()
        (self.key_dir / "ec-device.pem").write_bytes(pem(self.ec))
        self.jwks_file = directory / "keys.jwks"
        self.write_jwks([])

    def write_jwks(self, kids: list[str]) -> None:
        keys = []
        for kid in kids:
            jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(self.ed.public_key()))
            jwk["kid"] = kid
            keys.append(jwk)
        if not keys:  # a JWKS needs a key with a kid: one nobody signs with
            other = ed25519.Ed25519PrivateKey.generate().public_key()
            jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(other))
            jwk["kid"] = "unused"
            keys.append(jwk)
        self.jwks_file.write_text(json.dumps({"keys": keys}))


def token(
    key: Any,
    alg: str,
    client_id: str,
    lifetime: float = 600,
    headers: dict[str, Any] | None = None,
    **claims: Any,
) -> bytes:
    body: dict[str, Any] = {"sub": f"user-{client_id}", "exp": int(time.time() + lifetime)}
    body["acl"] = {k: [f.replace("{id}", client_id) for f in v] for k, v in ACL.items()}
    body.update(claims)
    return jwt.encode(body, key, algorithm=alg, headers=headers).encode()


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


def config_file(tmp_path: Path, keys: Keys, extra: str = "", jwt_extra: str = "") -> Path:
    path = tmp_path / "jwt.toml"
    path.write_text(
        f"{extra}\n[jwt]\nenabled = true\n"
        'algorithms = ["RS256", "ES256", "EdDSA", "HS256"]\n'
        f'public_key_file = "{keys.public_file}"\n'
        f'public_key_dir = "{keys.key_dir}"\n'
        f'jwks_file = "{keys.jwks_file}"\n'
        'secret_env = "JWT_TEST_SECRET"\n'
        'acl_claim = "acl"\n'
        "max_token_size = 2048\n"
        f"{jwt_extra}\n"
    )
    return path


@pytest.fixture
def start(
    start_broker: Callable[..., BrokerProcess],
    tmp_path: Path,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> Start:
    """``start(extra="", jwt_extra="")``: our broker checking tokens against ``keys`` and the
    HMAC secret in its environment."""
    monkeypatch.setenv("JWT_TEST_SECRET", SECRET)  # the broker process inherits it

    def run(**kwargs: Any) -> BrokerProcess:
        return start_broker(extra_args=("--config", str(config_file(tmp_path, keys, **kwargs))))

    return run


@pytest.fixture
def login(paho: Callable[..., PahoClient]) -> Login:
    """``login(server, password, client_id, version=5)``: a client that sent its CONNECT with
    ``password`` as the token, whatever the CONNACK."""

    def run(
        server: BrokerProcess, password: bytes, client_id: str, version: int = MQTT_5
    ) -> PahoClient:
        client = paho(server, version, user="ignored", password=password, connect=False,
                      client_id=client_id)  # fmt: skip
        client.connect(expect_success=False)
        return client

    return run


def test_valid_tokens_log_in_with_their_claims(start: Start, login: Login, keys: Keys) -> None:
    server = start()
    device = unique("rsa")
    client = login(server, token(keys.rsa, "RS256", device), device)
    assert client.connack is not None and client.connack[0] == 0
    assert server.wait_for_log(f"client {device} connected from .* user 'user-{device}'")
    # the acl claim: its own topics only
    assert client.acked[client.publish(f"devices/{device}/temp", b"x", qos=1).mid] == 0x10
    assert client.acked[client.publish("devices/someone-else/temp", b"x", qos=1).mid] == 0x87
    assert client.subscribe(f"commands/{device}/#", 1) == [1]
    assert client.subscribe("commands/#", 1) == [0x87]
    # a device key from the key directory (ES256), the HMAC secret (HS256)
    # a device's own key speaks for that device only: its sub is its client id
    signed = token(keys.ec, "ES256", "ec-device", sub="ec-device")
    ec_client = login(server, signed, "ec-device")
    assert ec_client.connack is not None and ec_client.connack[0] == 0
    hs = unique("hs")
    hs_client = login(server, token(SECRET, "HS256", hs), hs, MQTT_311)
    assert hs_client.connack is not None and hs_client.connack[0] == 0


def test_bad_tokens_are_refused(start: Start, login: Login, keys: Keys) -> None:
    server = start()
    device = unique("bad")
    public_pem = keys.public_file.read_bytes()
    header = jwt.utils.base64url_encode(b'{"alg":"none","typ":"JWT"}')
    claims = jwt.utils.base64url_encode(
        json.dumps({"sub": "root", "exp": int(time.time() + 600)}).encode()
    )
    # PyJWT refuses to sign HS256 with a PEM key: the forger does it by hand
    import base64
    import hashlib
    import hmac

    signing = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=") + b"." + claims
    forged = (
        signing
        + b"."
        + base64.urlsafe_b64encode(hmac.new(public_pem, signing, hashlib.sha256).digest()).rstrip(
            b"="
        )
    )
    cases = {
        "expired": token(keys.rsa, "RS256", device, lifetime=-300),
        "not yet valid": token(keys.rsa, "RS256", device, nbf=int(time.time() + 600)),
        "wrong key": token(keys.other_rsa, "RS256", device),
        "alg none": header + b"." + claims + b".",
        "HS/RS confusion": forged,
        "oversized": token(keys.rsa, "RS256", device, padding="x" * 3000),
        "ES256 with the fleet's RSA key": token(keys.ec, "ES256", device),
    }
    for index, (what, password) in enumerate(cases.items()):
        client_id = f"{device}-{index}"  # the log line of its own
        client = login(server, password, client_id)
        assert client.connack is not None and client.connack[0] == 0x86, what
        assert server.wait_for_log(f"client {client_id} from .*: token refused"), what
    # the good one still works
    client = login(server, token(keys.rsa, "RS256", device), device)
    assert client.connack is not None and client.connack[0] == 0


def test_connections_are_closed_when_their_token_expires(
    start: Start, login: Login, keys: Keys
) -> None:
    server = start(jwt_extra="leeway = 0")
    v5 = login(server, token(keys.rsa, "RS256", "short-v5", lifetime=2), "short-v5")
    v3 = login(server, token(keys.rsa, "RS256", "short-v3", lifetime=2), "short-v3", MQTT_311)
    # the same client id twice: the second connection, with a token of its own, stays
    login(server, token(keys.rsa, "RS256", "taken", lifetime=2), "taken")
    later = login(server, token(keys.rsa, "RS256", "taken", lifetime=600), "taken")
    # a witness whose token expires after the others': once it is gone, they were due too
    witness = login(server, token(keys.rsa, "RS256", "witness", lifetime=4), "witness")
    assert all(c.connack is not None and c.connack[0] == 0 for c in (v5, v3, later, witness))
    gone = v5.wait_disconnected(timeout=30)
    assert gone.from_server and gone.reason_code == 0x87
    assert (
        gone.properties is not None
        and getattr(gone.properties, "ReasonString", None) == "token expired"
    )
    v3.wait_disconnected(timeout=30)
    witness.wait_disconnected(timeout=30)
    later.sync()  # still connected, the broker answers it
    assert not later.disconnects
    assert server.wait_for_log("client short-v5: its token expired; disconnecting")


def test_sighup_reloads_the_jwks(start: Start, login: Login, keys: Keys) -> None:
    server = start()
    signed = token(keys.ed, "EdDSA", "ed-device", headers={"kid": "k2"})
    client = login(server, signed, "ed-device")
    assert client.connack is not None and client.connack[0] == 0x86
    keys.write_jwks(["k2"])
    mark = server.log_mark()
    server.send_signal(signal.SIGHUP)
    assert server.wait_for_log("reloaded the JWT keys", since=mark)
    client = login(server, signed, "ed-device")
    assert client.connack is not None and client.connack[0] == 0


def test_the_chain_passes_what_is_no_token_to_the_password_file(
    start: Start,
    login: Login,
    tmp_path: Path,
    keys: Keys,
    paho: Callable[..., PahoClient],
) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text(mosquitto_pbkdf2_line("alice", b"alice-pw") + "\n")
    extra = f'[security]\npassword_file = "{passwords}"\nchain = ["jwt", "password_file"]\n'
    server = start(extra=extra)
    alice = paho(server, user="alice", password="alice-pw", connect=False)
    assert alice.connect(expect_success=False) == 0
    stranger = paho(server, user="bob", password="nope", connect=False)
    assert stranger.connect(expect_success=False) == 0x86
    device = unique("chain")
    client = login(server, token(keys.rsa, "RS256", device, sub="alice"), device)
    assert client.connack is not None and client.connack[0] == 0
    assert client.acked[client.publish("elsewhere/x", b"x", qos=1).mid] == 0x87  # its acl
    # alice (the token's sub) takes the client id over with her password: the token's
    # rights go with it
    taker = paho(server, user="alice", password="alice-pw", client_id=device)
    client.wait_disconnected()
    assert taker.acked[taker.publish("elsewhere/x", b"x", qos=1).mid] == 0x10
