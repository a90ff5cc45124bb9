"""Fixtures for the broker state-machine tests (see tests/support/harness.py): ``make_harness``
and ``h``; ``ha``, a broker whose logins go through ``ToyAuthenticator``."""

from collections.abc import Callable

import pytest
from support.harness import Harness, ToyAuthenticator, h, make_harness

__all__ = ["h", "ha", "make_harness"]


@pytest.fixture
def ha(make_harness: Callable[..., Harness]) -> Harness:
    harness = make_harness()
    harness.broker.authenticator = ToyAuthenticator()
    return harness
