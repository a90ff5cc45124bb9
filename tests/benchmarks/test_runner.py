"""The benchmark runner's rule for the brokers sharing core 0: before a run every managed broker
must be idle, the measured one included; one that is not is restarted, one that will not start
again is left down without ending the benchmark. Stub handles, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import brokers as br
from benchmarks import runner
from benchmarks.scenarios import SCENARIOS


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


@pytest.fixture
def restarts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """br.restart replaced by a stub: the names of the brokers started again, in order."""
    started: list[str] = []

    def restart(handle: br.BrokerHandle, pin: bool) -> br.BrokerHandle:
        started.append(handle.name)
        return StubHandle(handle.name)

    monkeypatch.setattr(br, "restart", restart)
    return started


def test_every_busy_broker_is_restarted_and_the_others_left_alone(restarts: list[str]) -> None:
    fresh = restarts
    quiet = StubHandle("ours")
    stalled = StubHandle("amqtt", idle=False)
    down = StubHandle("mosquitto", alive=False)  # the "is down" path's business
    external = StubHandle("external", idle=False, managed=False)  # not ours to restart
    handles: list[br.BrokerHandle] = [quiet, stalled, down, external]

    assert runner.settle(handles, pin=False) == ["amqtt"]
    assert fresh == ["amqtt"] and stalled.stopped
    assert handles[1] is not stalled and handles[1].name == "amqtt"
    assert handles[0] is quiet and handles[2] is down and handles[3] is external
    assert quiet.waited == [runner.IDLE_LIMIT] and not quiet.stopped
    assert not down.waited and not external.waited


def test_a_neighbour_that_does_not_start_again_does_not_end_the_benchmark(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def restart(handle: br.BrokerHandle, pin: bool) -> br.BrokerHandle:
        raise RuntimeError("no port after 20 s")

    monkeypatch.setattr(br, "restart", restart)
    stalled = StubHandle("amqtt", idle=False)
    handles: list[br.BrokerHandle] = [StubHandle("ours"), stalled]
    assert runner.settle(handles, pin=False) == ["amqtt"]
    assert handles[1] is stalled and stalled.stopped  # left down for the "is down" path
    assert "amqtt did not start again: no port after 20 s" in capsys.readouterr().err


def test_a_fresh_scenario_gets_a_newly_started_broker_for_each_run(restarts: list[str]) -> None:
    started = restarts
    idle = SCENARIOS["6"]
    shared = SCENARIOS["1"]
    assert idle.fresh and not shared.fresh
    ours, external = StubHandle("ours"), StubHandle("external", managed=False)
    handles: list[br.BrokerHandle] = [ours, external]

    assert runner.ready(handles, 0, shared, pin=False) is ours and not started
    first = runner.ready(handles, 0, idle, pin=False)
    assert first is not ours and ours.stopped and handles[0] is first
    second = runner.ready(handles, 0, idle, pin=False)
    assert second is not first and handles[0] is second and started == ["ours", "ours"]
    # an external broker is measured as it is
    assert runner.ready(handles, 1, idle, pin=False) is external and not external.stopped
    # a managed broker that is down is started again whatever the scenario
    down = StubHandle("mosquitto", alive=False)
    handles.append(down)
    assert runner.ready(handles, 2, shared, pin=False) is not down and down.stopped


def test_device_rates_are_two_positive_rates_and_a_bad_one_names_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = runner.parser().parse_args(["--device-rates", "20,40.5"])
    assert args.device_rates == (20.0, 40.5)
    assert runner.parser().parse_args([]).device_rates is None  # the Sizes defaults then
    for bad in ("100", "0,100", "50,x", "50,100,1", "50,1001"):
        with pytest.raises(SystemExit):
            runner.parser().parse_args(["--device-rates", bad])
        assert "--device-rates" in capsys.readouterr().err
