"""The broker's periodic pass (keep-alive, expiry, delayed wills, $SYS, the survey) survives an
error in one of its parts: it is logged, and the next pass runs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mqttbroker.config import Config
from mqttbroker.server import app
from mqttbroker.server.app import Server


def test_an_error_in_one_pass_does_not_stop_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(app, "TICK_SECONDS", 0.01)
    passes: list[int] = []

    async def scenario() -> None:
        config = Config()
        config.storage.backend = "memory"
        config.listeners[0].port = 0
        config.admin.port = 0
        server = Server(config)
        sys_tick = server.sys_tree.tick

        def failing_once() -> None:
            passes.append(len(passes))
            if len(passes) == 1:
                raise RuntimeError("a part of the pass failed")
            sys_tick()

        monkeypatch.setattr(server.sys_tree, "tick", failing_once)
        await server.start()
        try:
            for _ in range(1000):  # until three passes ran (or give up after ~10 s)
                if len(passes) >= 3:
                    break
                await asyncio.sleep(0.01)
        finally:
            await server.stop()

    with caplog.at_level(logging.ERROR, logger="mqttbroker"):
        asyncio.run(scenario())
    assert len(passes) >= 3
    errors = [r for r in caplog.records if r.getMessage() == "error in the broker's periodic pass"]
    assert len(errors) == 1 and errors[0].exc_info is not None
