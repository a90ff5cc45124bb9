"""``[jwt]``, ``[http_auth]`` and ``[security] chain`` in the configuration file: errors name
the key; the default chain is the configured sources in today's order (dynsec, password_file),
so a configuration written before the chain behaves as it did; the broker's authenticator and
authorizer are then what they were (no chain object in the way of a broker without one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.launcher import write_file
from support.password_files import mosquitto_pbkdf2_line

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.config import ConfigError, configured_sources, load
from mqttbroker.security import build_security
from mqttbroker.security.acl import AclAuthorizer
from mqttbroker.security.authenticator import FileAuthenticator
from mqttbroker.security.chain import AskingAuthorizer, ChainAuthenticator


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[jwt]\nenabled = true\nalgorithm = []\n", "jwt.algorithm: unknown key; did you mean"),
        ("[jwt]\nenabled = true\nleeway = 'x'\n", "jwt.leeway: expected a number"),
        ("[jwt]\nenabled = true\nalgorithms = ['none']\nsecret_env = 'X'\n", "'none' is not"),
        ("[jwt]\nenabled = true\nalgorithms = ['HS256']\n", "HS* needs jwt.secret_file"),
        ("[jwt]\nenabled = true\n", "need jwt.public_key_file"),
        ("[http_auth]\nenabled = true\n", "http_auth: give url"),
        ("[http_auth]\nenabled = true\nurl = 'ftp://x/'\n", "http_auth.url: expected an http"),
        ("[http_auth]\nenabled = true\nurl = 'http://x/'\nwhen_down = 'allow'\n", "when_down"),
        (
            "[http_auth]\nenabled = true\nurl = 'http://x/'\ncheck_reads = true\n",
            "http_auth.check_reads: needs acl_url",
        ),
        ("[security]\nchain = ['ldap']\n", "security.chain: unknown source 'ldap'"),
        ("[security]\nchain = ['jwt']\n", "security.chain: 'jwt' needs jwt.enabled"),
        (
            "[security]\nchain = ['http']\n[http_auth]\nenabled = true\nurl = 'http://x/'\n"
            "[dynsec]\nenabled = true\n",
            "'dynsec' is configured (dynsec.enabled): name it too",
        ),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(write_file(tmp_path / "broker.toml", text))


def test_the_default_chain_is_todays(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(mosquitto_pbkdf2_line("alice", b"pw") + "\n")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite a/#\n")
    text = f"[security]\npassword_file = '{passwd}'\nacl_file = '{acl}'\n"
    config = load(write_file(tmp_path / "broker.toml", text))
    assert configured_sources(config) == ["password_file"]
    security = build_security(config)
    assert isinstance(security.broker_authorizer, AclAuthorizer)  # asked directly, as before
    assert isinstance(security.broker_authenticator, ChainAuthenticator)
    config = load(
        write_file(
            tmp_path / "broker.toml", "[dynsec]\nenabled = true\n" + text.split("acl_file")[0]
        )
    )
    assert configured_sources(config) == ["dynsec", "password_file"]
    bare = build_security(load(write_file(tmp_path / "broker.toml", "")))
    assert bare.chain is None and bare.broker_authorizer is None
    assert isinstance(bare.broker_authenticator, FileAuthenticator)


def test_http_rights_make_an_asking_authorizer_in_chain_order(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite a/#\n")
    config = load(
        write_file(
            tmp_path / "broker.toml",
            f"[security]\nacl_file = '{acl}'\n"
            "[http_auth]\nenabled = true\nacl_url = 'http://127.0.0.1:9/acl'\n",
        )
    )
    security = build_security(config)
    authorizer = security.broker_authorizer
    assert isinstance(authorizer, AskingAuthorizer)
    assert [name for name, _ in authorizer.rules] == ["password_file", "http"]
    # acl_url alone logs nobody in: named clients are as anonymous as without a source
    assert security.chain is None
    assert security.broker_authenticator.check_password(LoginRequest("c", "bob", b"pw", True)) == 0


def test_the_example_chain_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config/examples/auth-chain.toml, its files made in a test directory."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ed25519

    root = Path(__file__).resolve().parents[2]
    text = (root / "config" / "examples" / "auth-chain.toml").read_text()
    text = text.replace("/etc/mqttbroker/", f"{tmp_path}/")
    (tmp_path / "devices").mkdir()
    (tmp_path / "passwd").write_text(mosquitto_pbkdf2_line("alice", b"pw") + "\n")
    (tmp_path / "acl").write_text("user alice\ntopic readwrite a/#\n")
    key = json.loads(
        jwt.algorithms.OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate().public_key())
    )
    (tmp_path / "fleet.jwks").write_text(json.dumps({"keys": [{**key, "kid": "k1"}]}))
    for name in ("server.pem", "server.key"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("MQTT_AUTH_SERVICE_TOKEN", "t")
    config = load(write_file(tmp_path / "broker.toml", text))
    assert config.security.chain == ["jwt", "password_file", "http"]
    security = build_security(config)
    assert security.chain is not None and security.chain.names == ["jwt", "password_file", "http"]
    assert [name for name, _ in security.broker_authorizer.rules] == ["password_file", "http"]  # type: ignore[union-attr]
