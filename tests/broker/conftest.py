"""Fixtures for the broker state-machine tests (see tests/support/harness.py): ``make_harness``
and ``h``."""

from support.harness import h, make_harness

__all__ = ["h", "make_harness"]
