"""Fixtures of the persistence tests: a data directory that outlives broker runs, and a factory of
broker processes on it, each killed at the end of the test if it is still running."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cleanup import ended_after
from support.clients import PahoClient
from support.launcher import BrokerProcess


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def brokers(data_dir: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """``brokers(*extra_args)``: a started broker on ``data_dir``."""

    def kill(proc: BrokerProcess) -> None:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()

    with ended_after(kill) as keep:

        def make(*extra: str, start: bool = True) -> BrokerProcess:
            proc = keep(BrokerProcess(data_dir, extra_args=extra))
            proc.cwd = data_dir.parent
            return proc.start() if start else proc.spawn()

        yield make


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    """Paho clients to stop after the test (append them)."""
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()
