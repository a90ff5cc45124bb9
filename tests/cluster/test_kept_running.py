"""A cluster node's background loops (writer, listener, stream reader, lease) survive an error
they did not expect: it is logged with its traceback and the loop starts again. No Redis
needed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mqttbroker.cluster.node import kept_running


def test_a_loop_that_fails_is_logged_and_started_again(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    async def _write_loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise KeyError("a session that is not there")

    async def scenario() -> None:
        await asyncio.wait_for(kept_running(_write_loop), 10)

    with caplog.at_level(logging.ERROR, logger="mqttbroker.cluster"):
        asyncio.run(scenario())
    assert runs == [0, 1]
    [record] = caplog.records
    assert record.getMessage() == "cluster: error in write_loop, started again"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_cancelling_stops_the_loop_without_a_log(caplog: pytest.LogCaptureFixture) -> None:
    async def _listen() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> None:
        task = asyncio.create_task(kept_running(_listen))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.DEBUG, logger="mqttbroker.cluster"):
        asyncio.run(scenario())
    assert caplog.records == []
