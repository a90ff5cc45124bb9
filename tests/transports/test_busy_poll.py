"""``busy_poll_us`` with a real Server on both event loops: output starts the spin, the loop keeps
polling while the window lasts (spin passes go on while the test's own coroutine sleeps), stops
once it is over, starts again with the next output, and ends for good when the server stops. The poller's clock is replaced by one the
test moves, so the window ends when the test says, never by timing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.clients import (
    MQTT_311,
    publish_packet,
    subscribe_packet,
)
from support.transports import LOOPS, SUBACK_QOS0, open_311, run_on

from mqttbroker.config import Config, ListenerConfig
from mqttbroker.server.app import Server

GUARD = 10.0  # seconds: a failure guard, never a measured time
WINDOW_US = 5000
LOOP_TIME = 0.05  # seconds the test's coroutine sleeps while the loop runs without it


class StillClock:
    """Stands still until moved; counts the poller's reads, one per spin pass."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _config(tmp_path: Path, busy_poll_us: int) -> Config:
    config = Config(  # gather_us off, as a file with busy_poll_us alone has it
        listeners=[ListenerConfig(port=0)],
        data_dir=str(tmp_path),
        busy_poll_us=busy_poll_us,
        gather_us=0,
    )
    config.storage.backend = "memory"
    return config


@pytest.mark.parametrize("loop", LOOPS)
def test_output_keeps_the_loop_polling_for_the_window(tmp_path: Path, loop: str) -> None:
    message = publish_packet("bp/t", b"payload", version=MQTT_311)

    async def scenario() -> None:
        server = Server(_config(tmp_path, WINDOW_US))
        await server.start()
        poll = server.busy_poll
        assert poll is not None and poll.window == WINDOW_US / 1_000_000
        clock = poll.clock = StillClock()
        writers = []
        stopped = False
        try:
            sub_reader, sub = await open_311(server.addresses[0][1], "bp-sub")
            _, pub = await open_311(server.addresses[0][1], "bp-pub")
            writers += [sub, pub]
            sub.write(subscribe_packet(1, [("bp/t", 0)], MQTT_311))
            assert await asyncio.wait_for(sub_reader.readexactly(5), GUARD) == SUBACK_QOS0

            pub.write(message)
            assert await asyncio.wait_for(sub_reader.readexactly(len(message)), GUARD) == message
            assert poll.spinning
            before = clock.reads
            await asyncio.sleep(LOOP_TIME)
            assert clock.reads - before > 1, "the loop slept inside the window"
            assert poll.spinning

            clock.now += WINDOW_US / 1_000_000  # the window is over
            await asyncio.sleep(LOOP_TIME)
            assert not poll.spinning
            stopped = clock.reads
            await asyncio.sleep(LOOP_TIME)
            assert clock.reads == stopped, "still spinning after the window"

            pub.write(message)  # the next output starts it again
            assert await asyncio.wait_for(sub_reader.readexactly(len(message)), GUARD) == message
            assert poll.spinning
            before = clock.reads
            await asyncio.sleep(LOOP_TIME)
            assert clock.reads - before > 1

            # Shutting down (its DISCONNECTs are output too) ends the spin for good, although
            # the test's clock never reaches the window's end.
            await server.stop()
            stopped = True
            assert not poll.spinning
            reads = clock.reads
            await asyncio.sleep(LOOP_TIME)
            assert clock.reads == reads
        finally:
            for writer in writers:
                writer.close()
            if not stopped:
                await server.stop()

    run_on(loop, scenario)


def test_off_by_default(tmp_path: Path) -> None:
    """Without busy_poll_us the broker's wake only schedules the flush: nothing spins."""

    async def scenario() -> None:
        server = Server(_config(tmp_path, Config().busy_poll_us))
        await server.start()
        try:
            assert server.busy_poll is None
        finally:
            await server.stop()

    asyncio.run(scenario())
