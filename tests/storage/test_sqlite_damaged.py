"""A damaged database must not brick the broker: it is moved aside to ``<name>.damaged-<stamp>``
(never deleted) with a loud log line naming the file, and the broker starts empty; or, with
``on_corrupt="refuse"``, loading raises StoreError naming the file and what to do."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from support.sqlite_harness import FakeTime, Node, async_test, rows, snapshot

import mqttbroker.storage.sqlite.store as sqlite_store
from mqttbroker.storage import StoreError

GARBAGE = bytes(range(256)) * 64  # 16 KiB that is not an SQLite database


async def filled(db_path: Path, fake_time: FakeTime) -> None:
    """A database with a session and enough retained messages to span many pages."""
    node = await Node(db_path, fake_time).start()
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    for i in range(200):
        await client.publish_acked(f"r/{i}", os.urandom(900), 0, retain=True)
    await node.close()


def damaged_files(db_path: Path) -> list[Path]:
    return sorted(db_path.parent.glob(f"{db_path.name}.damaged-*"))


@async_test
async def test_garbage_file_is_moved_aside_and_the_broker_starts_empty(
    db_path: Path, fake_time: FakeTime, caplog
):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time).start()
    moved = damaged_files(db_path)
    assert len(moved) == 1
    assert moved[0].read_bytes() == GARBAGE  # moved, never deleted or changed
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert str(db_path) in errors[0] and str(moved[0]) in errors[0]
    assert "EMPTY" in errors[0] and "on_corrupt" in errors[0]

    # empty, and usable
    assert node.b.sessions == {}
    client = await node.connect("new", expiry=300)
    await client.subscribe("n/#", 1)
    await node.close()
    assert rows(db_path, "SELECT client_id FROM sessions") == [("new",)]


@async_test
async def test_database_with_damaged_pages_is_moved_aside(
    db_path: Path, fake_time: FakeTime, caplog
):
    await filled(db_path, fake_time)
    size = db_path.stat().st_size
    assert size > 8 * 4096
    with open(db_path, "r+b") as fh:  # keep the header page, overwrite the b-tree pages
        fh.seek(2 * 4096)
        fh.write(b"\xa5" * (size - 3 * 4096))
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time).start()
    assert len(damaged_files(db_path)) == 1
    assert "STORE DAMAGED" in caplog.text and str(db_path) in caplog.text
    assert node.b.sessions == {}
    assert node.b.router.retained.count == 0


@async_test
async def test_damaged_main_file_with_a_write_ahead_log_loses_nothing_silently(
    db_path: Path, fake_time: FakeTime
):
    """The broker was killed with its last commits in the -wal file, and the main file is then
    damaged. Either SQLite recovers the state from the WAL, or the WAL is moved aside with the
    main file: the acknowledged message is never silently gone."""
    node = await Node(db_path, fake_time).start()
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    await client.disconnect()
    publisher = await node.connect("pub")
    await publisher.publish_acked("k/last", b"acknowledged", 1)
    crashed = snapshot(db_path)  # the main file and its -wal, as a SIGKILL leaves them
    wal = Path(f"{crashed}-wal")
    assert wal.stat().st_size > 0
    wal_bytes = wal.read_bytes()
    crashed.write_bytes(GARBAGE)

    node2 = await Node(crashed, fake_time).start()
    session = node2.b.sessions.get("keep")
    if session is not None:  # recovered from the WAL
        assert [d.message.payload for d in session.queue] == [b"acknowledged"]
    else:
        moved = [p for p in damaged_files(crashed) if p.name.endswith("-wal")]
        assert [p.read_bytes() for p in moved] == [wal_bytes]


@async_test
async def test_damaged_main_file_keeps_a_log_without_its_first_page(
    db_path: Path, fake_time: FakeTime
):
    """The last commits are only in the -wal (everything before was checkpointed into the main
    file, page 1 too), and the main file is then damaged: SQLite deletes such a log when the
    connection that found the damage closes. The broker keeps it and moves it aside with the
    main file, byte for byte."""
    node = await Node(db_path, fake_time).start()
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    await client.disconnect()
    # All of it in the main file, log empty: retried while the store's own checkpoint
    # connection holds the checkpoint lock (SQLite then answers busy and leaves the log).
    for _ in range(100):
        if rows(db_path, "PRAGMA wal_checkpoint(TRUNCATE)") == [(0, 0, 0)]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the log could not be checkpointed")
    publisher = await node.connect("pub")
    await publisher.publish_acked("k/last", b"acknowledged", 1)
    crashed = snapshot(db_path)
    wal_bytes = Path(f"{crashed}-wal").read_bytes()
    assert wal_bytes
    crashed.write_bytes(GARBAGE)

    node2 = await Node(crashed, fake_time).start()
    assert node2.b.sessions == {}
    moved = [p for p in damaged_files(crashed) if p.name.endswith("-wal")]
    assert [p.read_bytes() for p in moved] == [wal_bytes]
    assert not Path(f"{crashed}-wal.kept").exists()


@async_test
async def test_refuse_keeps_the_log_beside_the_damaged_file(db_path: Path, fake_time: FakeTime):
    """``on_corrupt = "refuse"``: the file and its log stay where they are, for the operator."""
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    log_bytes = b"\x37\x7f\x06\x82" + bytes(28)  # a log header (no valid frame)
    Path(f"{db_path}-wal").write_bytes(log_bytes)
    with pytest.raises(StoreError):
        await Node(db_path, fake_time, store_options={"on_corrupt": "refuse"}).start()
    assert Path(f"{db_path}-wal").read_bytes() == log_bytes
    assert not Path(f"{db_path}-wal.kept").exists()


@async_test
async def test_refuse_raises_store_error_naming_the_file_and_what_to_do(
    db_path: Path, fake_time: FakeTime
):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    with pytest.raises(StoreError) as info:
        await Node(db_path, fake_time, store_options={"on_corrupt": "refuse"}).start()
    message = str(info.value)
    assert str(db_path) in message
    assert "damaged" in message
    assert "Move it aside" in message and 'on_corrupt = "move"' in message
    assert db_path.read_bytes() == GARBAGE  # untouched
    assert damaged_files(db_path) == []


@async_test
async def test_two_damaged_files_moved_in_the_same_second_are_both_kept(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
):
    """The issue: the damaged file is moved aside, never deleted. A broker restarted by its
    supervisor can meet a damaged file twice within one second (the stamp has one-second
    resolution); the second move must not overwrite the first moved file."""
    monkeypatch.setattr(sqlite_store.time, "strftime", lambda fmt, *a: "20240101-000000")
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    node = await Node(db_path, fake_time).start()
    await node.close()
    db_path.write_bytes(GARBAGE[::-1])
    Path(f"{db_path}-wal").unlink(missing_ok=True)
    Path(f"{db_path}-shm").unlink(missing_ok=True)
    await Node(db_path, fake_time).start()
    contents = {
        p.read_bytes() for p in damaged_files(db_path) if not p.name.endswith(("-wal", "-shm"))
    }
    assert GARBAGE in contents and GARBAGE[::-1] in contents
