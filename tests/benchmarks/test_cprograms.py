"""The benchmark's C programs (benchmarks/c/*.c) compile without a warning (-Wall -Wextra
-Werror); what each does is checked in test_benchmark_c_publisher.py,
test_benchmark_c_opener.py and test_benchmark_c_one_per_write.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import cprograms

PROGRAMS = sorted(p.stem for p in cprograms.SOURCES.glob("*.c"))


def test_the_programs_are_found() -> None:  # (an empty list would check nothing below)
    assert {"one_per_write", "open_many", "windowed_pub"} <= set(PROGRAMS)


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_source_compiles_without_warnings(name: str, tmp_path: Path) -> None:
    cc = cprograms.compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc): apt-get install gcc")
    src = str(cprograms.source(name))
    cmd = [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / name), src]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
