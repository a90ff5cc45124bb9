"""Fixtures for cluster mode: a redis-server of the test's own on a free loopback port, and
broker nodes on it (``python -m mqttbroker --cluster URL --node-id ID``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cleanup import ended_after
from support.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    with ended_after(RedisServer.stop) as keep:
        yield keep(RedisServer(directory).start())


@pytest.fixture
def start_node(
    start_broker: Callable[..., Any], redis_server: RedisServer, tmp_path: Path
) -> Callable[..., Any]:
    """``start_node(node_id, data_dir=None, memory=True, config="", wait=True)``: a broker
    node of the cluster on ``redis_server``; ``config`` is the text of a config file."""

    def start(
        node_id: str,
        data_dir: Path | None = None,
        memory: bool = True,
        config: str = "",
        wait: bool = True,
        url: str | None = None,
    ) -> Any:
        args = ["--cluster", url or redis_server.url, "--node-id", node_id]
        if memory:
            args.append("--memory")
        if config:
            path = tmp_path / f"{node_id}.toml"
            path.write_text(config)
            args += ["--config", str(path)]
        return start_broker(data_dir=data_dir, extra_args=tuple(args), wait=wait)

    return start
