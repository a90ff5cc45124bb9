"""The SQLite store's writer under load (SQLiteStore._write_loop): after a commit of at least
GATHER_MIN changes, the next commit waits until about as many changes again are recorded (the
publishers' next messages, brought by the acknowledgements just released), at most GATHER_WAIT
seconds; a wait that falls short stops the gathering for GATHER_PAUSE commits. Small commits,
a ``sync`` level that does not fsync each commit and a configured ``commit_interval`` never
gather.

The tests set GATHER_WAIT to an hour where a wait must not happen: only the changes recorded can
then start the commit, and a test whose commit would wait for the timer fails on its guard."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.sqlite_harness import TIMEOUT, async_test, rows

from mqttbroker.broker.message import Message
from mqttbroker.storage.sqlite import SQLiteStore

HOUR = 3600.0


@contextlib.asynccontextmanager
async def _opened(path: Path, **options: Any) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(path, **options)
    await store.load(time.monotonic)
    try:
        yield store
    finally:
        await store.close()


def _record(store: SQLiteStore, count: int) -> None:
    """``count`` changes: retained messages on new topics."""
    start = store.writes
    for n in range(count):
        store.save_retained(Message(f"r/{start + n}", b"x", 1, True))


async def _committed(store: SQLiteStore) -> None:
    """Wait until what is recorded so far is committed (failing after TIMEOUT seconds)."""
    done = asyncio.get_running_loop().create_future()
    store.after_commit(lambda: done.done() or done.set_result(None))
    await asyncio.wait_for(done, TIMEOUT)


async def _assert_held(store: SQLiteStore, count: int) -> None:
    """The last ``count`` changes are still in the batch being recorded: no commit took them,
    though the loop ran (a writer woken takes the batch at once, before its first await)."""
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(store._batch.retained) == count


def _retained(path: Path) -> int:
    return int(rows(path, "SELECT count(*) FROM retained")[0][0])


@async_test
async def test_after_a_large_commit_the_next_waits_for_as_many_changes(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = HOUR
        _record(store, 32)
        await _committed(store)
        commits = store.commits

        _record(store, 1)
        waiting = asyncio.get_running_loop().create_future()
        store.after_commit(lambda: waiting.set_result(None))
        await _assert_held(store, 1)  # gathering: 1 of 28

        _record(store, 27)  # 32 less an eighth
        await asyncio.wait_for(waiting, TIMEOUT)
        assert store.commits == commits + 1  # the 28 changes in one commit
        assert _retained(db_path) == 60


@async_test
async def test_a_wait_that_falls_short_commits_and_pauses_the_gathering(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = 0.001
        _record(store, 32)
        await _committed(store)
        _record(store, 1)  # no more come: the wait ends on its timer
        await _committed(store)
        assert _retained(db_path) == 33

        store.GATHER_WAIT = HOUR
        assert store.GATHER_PAUSE % 2 == 0
        for _ in range(store.GATHER_PAUSE // 2):  # paused: the commit after 32 does not wait
            _record(store, 32)
            await _committed(store)
            _record(store, 1)
            await _committed(store)
        assert _retained(db_path) == 33 + 33 * store.GATHER_PAUSE // 2

        _record(store, 32)  # then it gathers again
        await _committed(store)
        _record(store, 1)
        await _assert_held(store, 1)


@async_test
async def test_small_commits_never_wait(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = HOUR
        for count in (1, 1, store.GATHER_MIN - 1, 1):
            commits = store.commits
            _record(store, count)
            await _committed(store)
            assert store.commits == commits + 1
        assert _retained(db_path) == store.GATHER_MIN + 2


@pytest.mark.parametrize(
    "options", [{"commit_interval": 0.001}, {"sync": "normal"}, {"sync": "off"}], ids=str
)
def test_without_an_fsync_per_commit_or_with_a_commit_interval_none_waits(
    db_path: Path, options: dict[str, Any]
) -> None:
    @async_test
    async def run() -> None:
        async with _opened(db_path, **options) as store:
            store.GATHER_WAIT = HOUR
            _record(store, 32)
            await _committed(store)
            _record(store, 1)
            await _committed(store)
            assert _retained(db_path) == 33

    run()
