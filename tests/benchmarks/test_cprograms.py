"""The benchmark's C programs (benchmarks/c/*.c) compile without a warning (-Wall -Wextra
-Werror), each linked with its libraries (cprograms.LIBS); what each does is checked in
test_c_publisher.py, test_c_opener.py, test_c_tls_opener.py and test_c_one_per_write.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import cprograms

PROGRAMS = sorted(p.stem for p in cprograms.SOURCES.glob("*.c"))


def test_the_programs_are_found() -> None:  # (an empty list would check nothing below)
    assert {"one_per_write", "open_many", "open_many_tls", "windowed_pub"} <= set(PROGRAMS)


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_source_compiles_without_warnings(name: str, tmp_path: Path) -> None:
    cc = cprograms.compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc): apt-get install gcc")
    src = str(cprograms.source(name))
    cmd = [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / name), src]
    cmd += cprograms.libs(name)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
