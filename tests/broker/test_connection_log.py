"""The lines about each client connected, disconnected or lost, and the counting lines that
take their place past connection_log_rate a second or with connection_log_interval
(broker/connection_log.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.harness import Harness, pk

COUNTS = "mqttbroker.broker"
MakeHarness = Callable[..., Harness]  # the make_harness fixture


class Log:
    """The broker's log lines as the test captured them."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records]

    def client_lines(self) -> list[str]:
        return [m for m in self.messages() if m.startswith("client ")]

    def count_lines(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records if r.name == COUNTS]

    def counted_at_the_end_of(self, period: float, h: Harness, line: str) -> None:
        """No counting line half way through the ``period``, ``line`` at its end, and none in
        the next one, in which nothing happened."""
        h.tick(period / 2)
        assert self.count_lines() == []
        h.tick(period / 2)
        assert self.count_lines() == [line]
        h.tick(period)
        assert len(self.count_lines()) == 1


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Log:
    """The broker's lines from INFO up, captured."""
    caplog.set_level(logging.INFO, logger="mqttbroker")
    return Log(caplog)


def _storm(h: Harness, names: list[str]) -> None:
    """Clients ``names`` connect; the first then disconnects, the second's connection is lost."""
    clients = [h.connect(name) for name in names]
    clients[0].send(pk.Disconnect())
    clients[1].lose()


def test_by_default_a_storm_past_100_a_second_is_counted_in_one_line(h: Harness, log: Log) -> None:
    for i in range(130):
        h.connect(f"storm-{i}")
    lines = log.client_lines()
    assert len(lines) == 100
    assert lines[0].startswith("client storm-0 connected from")
    assert lines[-1].startswith("client storm-99 connected from")
    log.counted_at_the_end_of(
        1.0,
        h,
        "past 100 lines in 1s (connection_log_rate): 30 more clients connected, "
        "0 disconnected, 0 connections lost",
    )


def test_lines_one_by_one_again_in_the_next_second(make_harness: MakeHarness, log: Log) -> None:
    h = make_harness(connection_log_rate=2)
    _storm(h, [f"c{i}" for i in range(3)])
    assert len(log.client_lines()) == 2
    h.clock.advance(1)
    h.connect("late")  # the next second: its own line, after the counts of the last one
    assert log.messages()[-2:] == [
        "past 2 lines in 1s (connection_log_rate): 1 more clients connected, "
        "1 disconnected, 1 connections lost",
        "client late connected from peer-late (MQTT 5.0 over a test link, user None, "
        "keep alive 0s, session new)",
    ]


def test_rate_0_writes_every_line(make_harness: MakeHarness, log: Log) -> None:
    h = make_harness(connection_log_rate=0)
    _storm(h, [f"c{i}" for i in range(150)])
    h.tick(1)
    lines = log.client_lines()
    assert len(lines) == 152
    assert lines[-2:] == ["client c0 disconnected (reason 0x00)", "client c1: connection lost"]
    assert log.count_lines() == []


def test_interval_counts_instead_of_a_line_each(make_harness: MakeHarness, log: Log) -> None:
    h = make_harness(connection_log_interval=10.0)
    h.tick()
    _storm(h, [f"storm-{i}" for i in range(5)])
    assert log.client_lines() == []
    log.counted_at_the_end_of(
        10.0,
        h,
        "in the last 10s: 5 clients connected, 1 disconnected, 1 connections lost",
    )


def test_nothing_counted_when_info_is_off(make_harness: MakeHarness, log: Log) -> None:
    log.caplog.set_level(logging.WARNING, logger="mqttbroker")
    h = make_harness(connection_log_rate=1)
    for i in range(3):
        h.connect(f"c{i}")
    log.caplog.set_level(logging.INFO, logger="mqttbroker")
    h.tick(1)
    assert log.messages() == []
