"""server/app.py: the broker's periodic pass (keep-alive, expiry, delayed wills, $SYS, the
survey) survives an error in one of its parts: it is logged, and the next pass runs; it gives
the allocator's free memory back after a burst of connections."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import signal

import pytest

from mqttbroker.config import Config
from mqttbroker.server import app
from mqttbroker.server.app import Server
from mqttbroker.server.memory import Trimmer
from tests.support.clients import connect_packet


def quick_server(monkeypatch: pytest.MonkeyPatch, gc_threshold: int = 10_000) -> Server:
    """A broker on the memory store, free ports, its periodic pass every 10 ms."""
    monkeypatch.setattr(app, "TICK_SECONDS", 0.01)
    config = Config()
    config.storage.backend = "memory"
    config.listeners[0].port = 0
    config.admin.port = 0
    config.gc_threshold = gc_threshold
    return Server(config)


def test_an_error_in_one_pass_does_not_stop_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passes: list[int] = []

    async def scenario() -> None:
        server = quick_server(monkeypatch)
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


@pytest.mark.parametrize("threshold", [10_000, 0])
def test_the_pass_ages_young_objects_unless_the_collector_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, threshold: int
) -> None:
    """A container the collector does not yet count as old is walked whole at every collection:
    a session's queue can grow to hundreds of thousands of deliveries before the count that
    starts one is reached (what it holds is mostly not tracked). The periodic pass ages what
    is young, so it is walked while small; with ``gc_threshold = 0`` the collector is left as
    Python has it."""
    young_objects: list[bool] = []

    async def scenario() -> None:
        server = quick_server(monkeypatch, threshold)
        passes: list[int] = []
        sys_tick = server.sys_tree.tick

        def counted() -> None:
            passes.append(1)
            sys_tick()

        monkeypatch.setattr(server.sys_tree, "tick", counted)
        await server.start()
        try:
            queue: collections.deque[int] = collections.deque()  # young: made after the start
            assert any(o is queue for o in gc.get_objects(0))
            seen = len(passes)
            for _ in range(1000):  # two passes after it was made (or give up after ~10 s)
                if len(passes) >= seen + 2:
                    break
                await asyncio.sleep(0.01)
            young_objects.append(any(o is queue for o in gc.get_objects(0)))
        finally:
            await server.stop()

    saved = gc.get_threshold()
    gc.set_threshold(10**9)  # no collection of the collector's own meanwhile
    try:
        asyncio.run(scenario())
    finally:
        gc.set_threshold(*saved)
    assert young_objects == [threshold == 0]


def test_what_starting_built_is_kept_out_of_the_collections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the start succeeded, what it built (here: the listeners) joins what existed before
    it out of the cycle collector's walks, rather than waiting young for the first collection
    under load."""
    walked: list[bool] = []

    async def scenario() -> None:
        server = quick_server(monkeypatch)
        served = asyncio.create_task(server.run_until_signalled())
        for _ in range(1000):  # until it serves (or give up after ~10 s)
            if server.listeners and server.ready() is None:
                break
            await asyncio.sleep(0.01)
        for _ in range(100):  # the freeze follows the start's task by a few loop passes
            await asyncio.sleep(0.01)
            if not any(o is server.listeners for o in gc.get_objects()):
                break
        walked.append(any(o is server.listeners for o in gc.get_objects()))
        os.kill(os.getpid(), signal.SIGTERM)  # the broker's own handler: a clean stop
        await served

    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()  # this test process's objects are the collector's again
    assert walked == [False]


def test_the_pass_trims_once_a_burst_of_connections_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """70 clients connect (CONNECT, CONNACK) and stay: the periodic pass counts them, and
    trims once, when a pass sees no more coming after 64 or more came; nothing before."""
    trims: list[int] = []

    async def scenario() -> None:
        server = quick_server(monkeypatch)
        server.trimmer = Trimmer(lambda: trims.append(len(server.broker.connections)))
        await server.start()
        try:
            await asyncio.sleep(0.05)  # idle passes
            assert trims == []
            port = server.addresses[0][1]
            clients = []
            for i in range(70):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(connect_packet(f"burst-{i}"))
                await reader.readexactly(2)  # the CONNACK's fixed header (and more, MQTT 5)
                clients.append(writer)
            for _ in range(500):  # until a pass trimmed (or give up after ~5 s)
                if trims:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # ten more passes, quiet: no second trim
            for writer in clients:
                writer.close()
        finally:
            await server.stop()

    asyncio.run(scenario())
    assert len(trims) == 1 and trims[0] >= 64
