"""server/polling.py: the poller's busy polling (busy_poll_us) and gathering (gather_us), with a
real Server.

``busy_poll_us`` with a real Server on both event loops: output starts the spin, the loop keeps
polling while the window lasts (spin passes go on while the test's own coroutine sleeps), stops
once it is over, starts again with the next output, and ends for good when the server stops. The
poller's clock is replaced by one the test moves, so the window ends when the test says, never by
timing.

``gather_us`` with a real Server on both event loops: publishers writing at the same moment make
a pass that finds several sockets ready, and once they have done so for a while (the rate of
sockets found ready is high), the poller sleeps before its next pass (its ``holds`` counter
says so); every message still reaches the subscriber. Publishers that the
broker answers (QoS 1: a PUBACK since their last read) are never held back, and without the key
the poller never sleeps. The poller's own arguments are checked too. Nothing here is timed: the
key's effect on CPU and latency is measured in benchmarks/ (scenarios 3, 8 and 9).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.clients import MQTT_311, publish_packet, subscribe_packet
from support.listeners import LOOPS, SUBACK_QOS0, memory_config, open_311, run_on

from mqttbroker.config import Config, ListenerConfig
from mqttbroker.server.app import Server
from mqttbroker.server.streams import StreamServer

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
    config = memory_config(  # gather_us off, as a file with busy_poll_us alone has it
        tmp_path,
        ListenerConfig(port=0),
        busy_poll_us=busy_poll_us,
        gather_us=0,
    )
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


GATHER_US = 10_000  # the most allowed: a pass of a few messages ends well before it
PUBLISHERS = 8
# Rounds at most: the poller sleeps only once it has found sockets ready at a high rate (over
# 10 ms), which a few rounds may not last; QoS 1 runs them all, long past that.
ROUNDS = 300


def _run(loop: str, tmp_path: Path, gather_us: int, qos: int = 0) -> int:
    """Rounds of every publisher writing one message at once (at ``qos``: with 1, each round ends
    with every PUBACK); every message must arrive. Returns the poller's holds."""
    config = memory_config(
        tmp_path,
        ListenerConfig(port=0),
        gather_us=gather_us,
    )

    async def scenario() -> int:
        server = Server(config)
        await server.start()
        writers: list[asyncio.StreamWriter] = []
        try:
            listener = server.listeners[0].server
            assert isinstance(listener, StreamServer)
            port = server.addresses[0][1]
            sub_reader, sub = await open_311(port, "gather-sub")
            writers.append(sub)
            sub.write(subscribe_packet(1, [("gather/#", 0)], MQTT_311))
            assert await asyncio.wait_for(sub_reader.readexactly(5), GUARD) == SUBACK_QOS0
            pubs = [await open_311(port, f"gather-pub{i}") for i in range(PUBLISHERS)]
            writers += [writer for _, writer in pubs]
            expected = bytearray()
            rounds = 0
            for r in range(ROUNDS):
                if not qos and gather_us and listener.poller.holds:
                    break  # held: the rate was high enough (QoS 1 runs all its rounds)
                rounds += 1
                # Written before the loop runs again: its next pass finds them all ready.
                for i, (_, pub) in enumerate(pubs):
                    topic, payload = f"gather/{i}", b"round %03d" % r
                    pub.write(publish_packet(topic, payload, qos, r + 1, MQTT_311))
                    expected += publish_packet(topic, payload, version=MQTT_311)  # as delivered
                await asyncio.sleep(0)
                for reader, _ in pubs if qos else ():
                    puback = await asyncio.wait_for(reader.readexactly(4), GUARD)
                    assert puback == b"\x40\x02" + (r + 1).to_bytes(2, "big")
            got = await asyncio.wait_for(sub_reader.readexactly(len(expected)), GUARD)
            # Each publisher's messages, each once and in order (publishers may interleave).
            for i in range(PUBLISHERS):
                mine = [f"gather/{i}".encode() + b"round %03d" % r for r in range(rounds)]
                assert all(got.count(m) == 1 for m in mine)
                assert [got.index(m) for m in mine] == sorted(got.index(m) for m in mine)
            return listener.poller.holds
        finally:
            for writer in writers:
                writer.close()
            await server.stop()

    result: int = run_on(loop, scenario)
    return result


@pytest.mark.needs_compiled  # the C transport
@pytest.mark.parametrize("loop", LOOPS)
def test_a_busy_pass_is_followed_by_a_sleep_and_every_message_arrives(
    tmp_path: Path, loop: str
) -> None:
    assert _run(loop, tmp_path, GATHER_US) >= 1


@pytest.mark.needs_compiled  # the C transport
@pytest.mark.parametrize("loop", LOOPS)
def test_publishers_waiting_for_an_answer_are_never_held_back(tmp_path: Path, loop: str) -> None:
    """Each read of a QoS 1 publisher follows the PUBACK (or CONNACK) the broker wrote it: a
    client that may be waiting for the broker, so no pass that reads one is followed by a sleep."""
    assert _run(loop, tmp_path, GATHER_US, qos=1) == 0


@pytest.mark.needs_compiled  # the C transport
def test_without_gather_us_the_poller_never_sleeps(tmp_path: Path) -> None:
    assert _run("uvloop", tmp_path, 0) == 0


@pytest.mark.needs_compiled  # the C transport
def test_the_poller_refuses_a_gather_outside_0_to_1_second() -> None:
    from mqttbroker.server import _streams

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for bad in (-0.001, 1.5, float("nan")):
            with pytest.raises(ValueError, match="gather must be between 0 and 1"):
                _streams.Poller(loop, 1.0, bad)

    asyncio.run(scenario())
