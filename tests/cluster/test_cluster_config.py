"""The [cluster] keys and ``workers``: each bad value is refused naming the file and the key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from support.launcher import write_file
from support.redis_server import RedisServer

from mqttbroker.config import ConfigError, load


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[cluster]\nredis = "http://x"', r"c.toml: cluster.redis: expected a redis://"),
        ('[cluster]\nredis = "redis://h:notaport/0"', r"c.toml: cluster.redis: not a valid"),
        (
            '[cluster]\nredis = "redis://h/0"\nnode_id = "a b"',
            r"c.toml: cluster.node_id: letters, digits",
        ),
        (
            '[cluster]\nredis = "redis://h/0"\nstream_max_length = 10',
            r"c.toml: cluster.stream_max_length: must be at least 100",
        ),
        ('[cluster]\nredis = "redis://h/0"\nnode_ttl = 0.5', r"c.toml: cluster.node_ttl"),
        ('[cluster]\nredis = "redis://h/0"\nadopt_after = -1', r"c.toml: cluster.adopt_after"),
        ("[cluster]\nredis = 6379", r"c.toml: cluster.redis: expected a string"),
        ("[cluster]\nnodes = 2", r"c.toml: cluster.nodes: unknown key"),
        ("workers = 2", r"c.toml: workers: more than 1 needs \[cluster\] redis"),
        ("workers = 0", r"c.toml: workers: must be between 1 and"),
        (
            'workers = 2\n[cluster]\nredis = "redis://h/0"\n[[listener]]\nport = 0',
            r"c.toml: listener\[0\].port: 0 \(any free port\) cannot be shared by workers",
        ),
    ],
)
def test_bad_cluster_settings_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(write_file(tmp_path / "c.toml", text))


def test_a_node_id_defaults_to_the_host_name(tmp_path: Path) -> None:
    import socket

    loaded = load(write_file(tmp_path / "c.toml", '[cluster]\nredis = "redis://127.0.0.1:6379/0"'))
    assert loaded.cluster.node_id == socket.gethostname()
    assert loaded.cluster.stream_max_length == 10_000


def test_a_redis_password_is_not_shown() -> None:
    from mqttbroker.cluster.node import redacted

    assert redacted("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'password_file = "pw"\npassword_env = "PW"',
            r"c.toml: cluster.password_env: password_file is set too; choose one",
        ),
        ('password_file = "{d}/none"', r"c.toml: cluster.password_file: cannot read {d}/none: "),
        ('password_file = "{d}/empty"', r"c.toml: cluster.password_file: {d}/empty is empty"),
        (
            'password_env = "MQTTBROKER_TEST_UNSET"',
            r"c.toml: cluster.password_env: the environment variable MQTTBROKER_TEST_UNSET is "
            "not set",
        ),
        (
            'password_file = "{d}/pw"\nredis = "redis://:other@h/0"',
            r"c.toml: cluster.password_file: the redis URL has a password as well; keep one",
        ),
    ],
)
def test_bad_redis_password_settings_name_the_key(
    tmp_path: Path, text: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MQTTBROKER_TEST_UNSET", raising=False)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "pw").write_text("secret\n")
    url = "" if "redis =" in text else 'redis = "redis://h/0"\n'
    text = "[cluster]\n" + url + text.format(d=tmp_path)
    with pytest.raises(ConfigError) as info:
        load(write_file(tmp_path / "c.toml", text))
    assert str(info.value).startswith(str(tmp_path / "c.toml"))
    assert message.format(d=tmp_path).removeprefix("c.toml") in str(info.value)


PASSWORD = "s3cret /:@%"  # characters a URL would otherwise take apart


@pytest.fixture
def redis_with_password(redis_server: RedisServer) -> RedisServer:
    """The test's redis-server, requiring PASSWORD from every new connection (requirepass)."""
    client = redis_server.client()
    client.config_set("requirepass", PASSWORD)
    client.close()
    return redis_server


def test_a_node_reads_the_redis_password_from_a_file(
    redis_with_password: RedisServer, start_node: Callable[..., Any], tmp_path: Path
) -> None:
    """The password from password_file (its trailing newline stripped) opens a Redis with
    requirepass; it is in no log line; without it the node does not start."""
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    node = start_node("a", config=f'[cluster]\npassword_file = "{secret}"\n')
    authed = redis.Redis(host="127.0.0.1", port=redis_with_password.port, password=PASSWORD)
    try:
        assert any(b"node:a" in key for key in authed.keys("*"))
    finally:
        authed.close()
    assert PASSWORD not in node.log_text() and quote(PASSWORD, safe="") not in node.log_text()
    refused = start_node("b", wait=False)
    assert refused.wait_exit() == 2
    assert "cluster.redis: cannot reach Redis at redis://127.0.0.1:" in refused.log_text()
    assert "AUTH" in refused.log_text()  # (Redis asks for the password)


def test_a_node_reads_the_redis_password_from_the_environment(
    redis_with_password: RedisServer,
    start_node: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MQTTBROKER_TEST_REDIS_PASSWORD", PASSWORD)
    node = start_node("c", config='[cluster]\npassword_env = "MQTTBROKER_TEST_REDIS_PASSWORD"\n')
    assert PASSWORD not in node.log_text()
    monkeypatch.setenv("MQTTBROKER_TEST_REDIS_PASSWORD", "not-the-password-8c1f")
    refused = start_node(
        "d", config='[cluster]\npassword_env = "MQTTBROKER_TEST_REDIS_PASSWORD"\n', wait=False
    )
    assert refused.wait_exit() == 2
    assert "not-the-password-8c1f" not in refused.log_text()
    assert "cluster.redis: cannot reach Redis at redis://:***@127.0.0.1:" in refused.log_text()
