"""Fixtures of the benchmark tools' tests: the C opener (benchmarks/c/open_many.c) built once,
and ``which``, each test that takes it run with the C opener and with the Python loop."""

from __future__ import annotations

import pytest
from support import c_programs


@pytest.fixture(scope="session")
def opener(tmp_path_factory: pytest.TempPathFactory) -> str:
    return c_programs.build("open_many", tmp_path_factory)


@pytest.fixture(params=["c", "python"])
def which(request: pytest.FixtureRequest) -> str | None:
    """The C opener, or None for the Python loop (which needs no compiler)."""
    return str(request.getfixturevalue("opener")) if request.param == "c" else None
