"""Building the benchmark's C programs (benchmarks/c/) for their tests."""

from __future__ import annotations

import pytest

from benchmarks import cprograms


def build(name: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``benchmarks/c/<name>.c`` compiled as the runner compiles it: the program's path (the
    test is skipped where no C compiler is; .ci/run installs gcc)."""
    if cprograms.compiler() is None:
        pytest.skip("no C compiler (cc, gcc): apt-get install gcc")
    path, how = cprograms.build(name, tmp_path_factory.mktemp(name))
    assert path is not None, how
    assert how.startswith(f"benchmarks/c/{name}.c, "), how
    return path
