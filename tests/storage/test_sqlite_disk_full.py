"""A disk that fills up while the broker runs: SQLite fails the commit (SQLITE_FULL, here real,
from a database limited to its current size with ``PRAGMA max_page_count``) and rolls the
transaction back itself. The acknowledgement waits, the log names the real cause once (not the
ROLLBACK that then fails), the batch is retried with backoff, and once the disk has room again
it is committed, acknowledged and logged once more. A stop while the disk is still full gives
up after one more attempt, without acknowledging."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.sqlite_harness import TIMEOUT, FakeTime, Node, async_test, pk, rows

from mqttbroker.storage.sqlite import SQLiteStore

FULL = "database or disk is full (SQLITE_FULL)"


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fast retries, and a record of every commit attempt."""
    monkeypatch.setattr(SQLiteStore, "RETRY_FIRST", 0.01, raising=False)
    monkeypatch.setattr(SQLiteStore, "RETRY_MAX", 0.02, raising=False)
    made: list[int] = []
    apply = SQLiteStore._apply

    async def counted(self: SQLiteStore, batch: Any) -> None:
        made.append(1)
        await apply(self, batch)

    monkeypatch.setattr(SQLiteStore, "_apply", counted)
    return made


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(TIMEOUT / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def disk_full(node: Node, full: bool) -> None:
    db = node.s._db
    assert db is not None
    await db.execute(f"PRAGMA max_page_count = {1 if full else 2**31 - 2}")


async def publisher_facing_a_full_disk(node: Node, attempts: list[int]) -> tuple[Any, int, int]:
    """An offline persistent subscriber, a publisher, the disk full, and a QoS 1 PUBLISH whose
    commit has failed three times: (publisher, its output before, the packet id)."""
    sub = await node.connect("sub", expiry=300)
    await sub.subscribe("full/#", 1)
    await sub.disconnect()
    pub = await node.connect("pub")
    before = len(pub.written())
    await disk_full(node, True)
    start = len(attempts)
    packet_id = pub.publish("full/x", os.urandom(100_000), 1)
    assert packet_id is not None
    await until(lambda: len(attempts) >= start + 3, "three failed commits")
    node.b.flush()
    assert pub.written()[before:] == [], "acknowledged although not stored"
    return pub, before, packet_id


@async_test
async def test_full_disk_holds_the_ack_logs_the_cause_once_and_recovers(
    db_path: Path, fake_time: FakeTime, attempts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    node = await Node(db_path, fake_time).start()
    with caplog.at_level(logging.INFO, logger="mqttbroker.storage"):
        pub, before, packet_id = await publisher_facing_a_full_disk(node, attempts)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors
        assert str(db_path) in errors[0] and FULL in errors[0], errors
        assert "rollback" not in errors[0], errors
        assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]

        await disk_full(node, False)
        received = await pub.receive()
    assert [(type(p), p.packet_id) for p in received] == [(pk.Puback, packet_id)]
    assert rows(db_path, "SELECT count(*) FROM deliveries WHERE client_id = 'sub'") == [(1,)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "commits succeed again" in warnings[0], warnings
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    await node.close()


@async_test
async def test_stop_while_the_disk_is_full_gives_up_without_acknowledging(
    db_path: Path, fake_time: FakeTime, attempts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    node = await Node(db_path, fake_time).start()
    pub, before, _ = await publisher_facing_a_full_disk(node, attempts)
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        await asyncio.wait_for(node.close(), TIMEOUT)
    node.b.flush()
    assert pub.written()[before:] == []
    assert "stopping with changes that could not be written" in caplog.text
    assert FULL in caplog.text
    assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]
