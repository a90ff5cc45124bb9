"""The benchmark runner's rule for the brokers that share the measured one's core: before a run,
every other managed broker must be idle; one that is not is restarted, one that will not start
again is left down without ending the benchmark. Stub handles, no processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import brokers as br  # noqa: E402
from benchmarks import runner  # noqa: E402


class StubHandle(br.BrokerHandle):
    def __init__(self, name: str, idle: bool = True, managed: bool = True, alive: bool = True):
        super().__init__(name, "127.0.0.1")
        self.idle = idle
        self.is_managed = managed
        self.is_alive = alive
        self.stopped = False
        self.waited: list[float] = []

    @property
    def managed(self) -> bool:
        return self.is_managed

    def alive(self) -> bool:
        return self.is_alive

    def wait_idle(self, limit: float = 30.0, busy: float = 0.10) -> tuple[float, bool]:
        self.waited.append(limit)
        return (0.2 if self.idle else limit), self.idle

    def stop(self) -> None:
        self.stopped = True


def test_a_busy_neighbour_is_restarted_and_the_measured_broker_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh: list[str] = []

    def restart(handle: br.BrokerHandle, pin: bool) -> br.BrokerHandle:
        fresh.append(handle.name)
        return StubHandle(handle.name)

    monkeypatch.setattr(br, "restart", restart)
    measured = StubHandle("ours", idle=False)  # its own wait is run_one's business
    quiet = StubHandle("mosquitto")
    stalled = StubHandle("amqtt", idle=False)
    external = StubHandle("external", idle=False, managed=False)
    handles: list[br.BrokerHandle] = [measured, quiet, stalled, external]

    assert runner.quiet_neighbours(handles, 0, pin=False) == ["amqtt"]
    assert fresh == ["amqtt"] and stalled.stopped
    assert handles[2] is not stalled and handles[2].name == "amqtt"
    assert handles[:2] == [measured, quiet] and handles[3] is external
    assert not measured.waited and not measured.stopped and not quiet.stopped
    assert quiet.waited == [runner.IDLE_LIMIT]  # the same rule as the measured broker's
    assert not external.waited  # not ours to restart


def test_a_neighbour_that_does_not_start_again_does_not_end_the_benchmark(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def restart(handle: br.BrokerHandle, pin: bool) -> br.BrokerHandle:
        raise RuntimeError("no port after 20 s")

    monkeypatch.setattr(br, "restart", restart)
    stalled = StubHandle("amqtt", idle=False)
    handles: list[br.BrokerHandle] = [StubHandle("ours"), stalled]
    assert runner.quiet_neighbours(handles, -1, pin=False) == ["amqtt"]
    assert handles[1] is stalled and stalled.stopped  # left down for the "is down" path
    assert "amqtt did not start again: no port after 20 s" in capsys.readouterr().err
