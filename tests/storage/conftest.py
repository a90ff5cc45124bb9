"""Fixtures of the SQLite store tests: a fake wall clock patched into the store, a database path,
a broker on it."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest
from support.sqlite_harness import FakeTime, Node

import mqttbroker.storage.sqlite.store as sqlite_store


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    """The broker's clock and the store's wall clock, moved only by the test."""
    t = FakeTime()
    fake_module = types.SimpleNamespace(
        time=t.time, strftime=time.strftime, monotonic=time.monotonic, localtime=time.localtime
    )
    monkeypatch.setattr(sqlite_store, "time", fake_module)
    return t


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "mqttbroker.db"


@pytest.fixture
def node(db_path: Path, fake_time: FakeTime) -> Node:
    """A broker on ``db_path`` with the fake clocks; ``async_test`` starts it in the test's loop."""
    return Node(db_path, fake_time)
