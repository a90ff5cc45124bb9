"""Fixtures for the broker state-machine tests (see tests/support/harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.harness import Harness


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    """A factory: ``make_harness(receive_maximum=10, ...)`` builds a broker with those options.
    On teardown every connection is checked for writes after close (MQTT-3.14.4-1)."""
    made: list[Harness] = []

    def make(**options: Any) -> Harness:
        harness = Harness(**options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.check_no_write_after_close()


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    """A broker with the default options."""
    return make_harness()
