"""Fixtures for cluster mode: a redis-server of the test's own on a free loopback port, and
broker nodes on it (``python -m mqttbroker --cluster URL --node-id ID``)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from external_tools import program

START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """redis-server on 127.0.0.1, no snapshots; with ``aof`` an append-only file synced on every
    write (``appendfsync always``), so a restart keeps everything."""

    def __init__(self, directory: Path, aof: bool = False) -> None:
        self.directory = directory
        self.aof = aof
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            program("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes" if self.aof else "no",
        ]
        if self.aof:
            args += ["--appendfsync", "always"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)
            finally:
                client.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory).start()
    try:
        yield server
    finally:
        server.stop()


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
