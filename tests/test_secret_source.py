"""Every secret read from a file or an environment variable (the admin token, the cluster's
Redis password, the HTTP auth token, the JWT secret, an integration's secret) is read the same
way (mqttbroker.secret_source): trailing line ends removed and nothing else, and errors that
name the key and the file or variable."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqttbroker.config import (
    AdminConfig,
    ClusterConfig,
    ConfigError,
    HttpAuthConfig,
    JwtConfig,
    redis_password,
)
from mqttbroker.config.keys import secret
from mqttbroker.ops.admin import read_token
from mqttbroker.secret_source import read_secret
from mqttbroker.security.http_backend import _token
from mqttbroker.security.tokens import _load_keys

SECRET = " a secret of more than thirty-two bytes, spaces kept "
VARIABLE = "MQTTBROKER_TEST_SECRET_SOURCE"


def _jwt(file: str, env: str) -> bytes | None:
    return _load_keys(JwtConfig(secret_file=file, secret_env=env)).secret


# Each consumer: (file, variable) -> the secret as bytes, and how its messages name the key.
READERS: dict[str, tuple[Callable[[str, str], bytes | str | None], str]] = {
    "admin": (lambda f, e: read_token(AdminConfig(token_file=f, token_env=e)), "admin.token"),
    "cluster": (
        lambda f, e: redis_password(ClusterConfig(password_file=f, password_env=e)),
        "cluster.password",
    ),
    "http_auth": (
        lambda f, e: _token(HttpAuthConfig(token_file=f, token_env=e)),
        "http_auth.token",
    ),
    "jwt": (_jwt, "jwt.secret"),
    "integration": (
        lambda f, e: secret({"secret_file": f, "secret_env": e}, "secret", ""),
        "secret",
    ),
}


@pytest.fixture
def variable() -> Iterator[str]:
    yield VARIABLE
    os.environ.pop(VARIABLE, None)


def as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


@pytest.mark.parametrize("name", sorted(READERS))
def test_one_trimming_rule(name: str, tmp_path: Path, variable: str) -> None:
    read, _ = READERS[name]
    path = tmp_path / "secret"
    for written in (SECRET, SECRET + "\n", SECRET + "\r\n"):
        path.write_text(written, newline="")
        assert as_bytes(read(str(path), "")) == SECRET.encode(), repr(written)
        os.environ[variable] = written
        assert as_bytes(read("", variable)) == SECRET.encode(), repr(written)


@pytest.mark.parametrize("name", sorted(READERS))
def test_errors_name_the_key_and_the_source(name: str, tmp_path: Path, variable: str) -> None:
    read, key = READERS[name]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    gone = tmp_path / "gone"
    os.environ.pop(variable, None)
    cases = [
        (str(gone), "", f"{key}_file: cannot read {gone}: No such file or directory"),
        (str(empty), "", f"{key}_file: {empty} is empty"),
        ("", variable, f"{key}_env: the environment variable {variable} is not set"),
        (str(empty), variable, f"{key}_env: {key.rpartition('.')[2]}_file is set too"),
    ]
    for file, env, message in cases:
        with pytest.raises(ConfigError) as raised:
            read(file, env)
        assert message in str(raised.value)
    os.environ[variable] = "\n"
    with pytest.raises(ConfigError, match=f"the environment variable {variable} is empty"):
        read("", variable)


def test_neither_set_is_none() -> None:
    assert read_secret("", "", "x") is None
