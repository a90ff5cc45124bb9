"""The [cluster] keys and ``workers``: each bad value is refused naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttbroker.config import ConfigError, load


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


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
        load(config(tmp_path, text))


def test_a_node_id_defaults_to_the_host_name(tmp_path: Path) -> None:
    import socket

    loaded = load(config(tmp_path, '[cluster]\nredis = "redis://127.0.0.1:6379/0"'))
    assert loaded.cluster.node_id == socket.gethostname()
    assert loaded.cluster.stream_max_length == 10_000


def test_a_redis_password_is_not_shown() -> None:
    from mqttbroker.cluster.node import redacted

    assert redacted("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"
