"""A redis-server of the test's own on a free loopback port (``RedisServer``), for the cluster
tests; their fixtures (tests/cluster/conftest.py) start it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from support.external_tools import program
from support.launcher import free_port, stop_process

START_TIMEOUT = 10.0


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
                # (a PONG while this process runs: not an answer from something else)
                if client.ping() is True and self.proc.poll() is None:
                    return self
            except redis.ConnectionError:
                pass
            finally:
                client.close()
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def kill(self) -> None:
        """Redis gone at once (SIGKILL), as in a crash; ``start`` brings it back on its port."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None
