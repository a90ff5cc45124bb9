"""The lines about each client connected, disconnected or lost, and the counting lines that
take their place past connection_log_rate a second or with connection_log_interval
(broker/connection_log.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.harness import Harness, pk

COUNTS = "mqttbroker.broker"


@pytest.fixture
def info_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The broker's lines from INFO up are captured."""
    caplog.set_level(logging.INFO, logger="mqttbroker")


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def _client_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in _messages(caplog) if m.startswith("client ")]


def _count_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == COUNTS]


def _storm(h: Harness, names: list[str]) -> None:
    """Clients ``names`` connect; the first then disconnects, the second's connection is lost."""
    clients = [h.connect(name) for name in names]
    clients[0].send(pk.Disconnect())
    clients[1].lose()


def _counted_at_the_end_of(
    period: float, h: Harness, caplog: pytest.LogCaptureFixture, line: str
) -> None:
    """No counting line half way through the ``period``, ``line`` at its end, and none in the
    next one, in which nothing happened."""
    h.tick(period / 2)
    assert _count_lines(caplog) == []
    h.tick(period / 2)
    assert _count_lines(caplog) == [line]
    h.tick(period)
    assert len(_count_lines(caplog)) == 1


def test_by_default_a_storm_past_100_a_second_is_counted_in_one_line(
    h: Harness, caplog: pytest.LogCaptureFixture, info_logged: None
) -> None:
    for i in range(130):
        h.connect(f"storm-{i}")
    lines = _client_lines(caplog)
    assert len(lines) == 100
    assert lines[0].startswith("client storm-0 connected from")
    assert lines[-1].startswith("client storm-99 connected from")
    _counted_at_the_end_of(
        1.0,
        h,
        caplog,
        "past 100 lines in 1s (connection_log_rate): 30 more clients connected, "
        "0 disconnected, 0 connections lost",
    )


def test_lines_one_by_one_again_in_the_next_second(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture, info_logged: None
) -> None:
    h = make_harness(connection_log_rate=2)
    _storm(h, [f"c{i}" for i in range(3)])
    assert len(_client_lines(caplog)) == 2
    h.clock.advance(1)
    h.connect("late")  # the next second: its own line, after the counts of the last one
    assert _messages(caplog)[-2:] == [
        "past 2 lines in 1s (connection_log_rate): 1 more clients connected, "
        "1 disconnected, 1 connections lost",
        "client late connected from peer-late (MQTT 5.0 over a test link, user None, "
        "keep alive 0s, session new)",
    ]


def test_rate_0_writes_every_line(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture, info_logged: None
) -> None:
    h = make_harness(connection_log_rate=0)
    _storm(h, [f"c{i}" for i in range(150)])
    h.tick(1)
    lines = _client_lines(caplog)
    assert len(lines) == 152
    assert lines[-2:] == ["client c0 disconnected (reason 0x00)", "client c1: connection lost"]
    assert _count_lines(caplog) == []


def test_interval_counts_instead_of_a_line_each(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture, info_logged: None
) -> None:
    h = make_harness(connection_log_interval=10.0)
    h.tick()
    _storm(h, [f"storm-{i}" for i in range(5)])
    assert _client_lines(caplog) == []
    _counted_at_the_end_of(
        10.0,
        h,
        caplog,
        "in the last 10s: 5 clients connected, 1 disconnected, 1 connections lost",
    )


def test_nothing_counted_when_info_is_off(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker")
    h = make_harness(connection_log_rate=1)
    for i in range(3):
        h.connect(f"c{i}")
    caplog.set_level(logging.INFO, logger="mqttbroker")
    h.tick(1)
    assert _messages(caplog) == []
