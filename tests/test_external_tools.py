"""A test that needs a program which is not installed is skipped with the package to install, and
under ``CI=true`` fails; a CI run that skipped anything fails. Each case runs pytest on a small
test file in a subprocess, with this suite's hooks (tests/conftest.py) loaded as a plugin and a
PATH of the case's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CASES = """
import subprocess

import pytest
from support.external_tools import program


@pytest.mark.needs_mosquitto
def test_marked():
    assert subprocess.run([program("mosquitto_pub")]).returncode == 0


def test_skips_itself():
    pytest.skip("not today")


@pytest.mark.chaos
def test_long():
    pass
"""


def run_pytest(
    tmp_path: Path, test: str, path: str, ci: bool, *options: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PATH=path, PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-rs",
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            *options,
            f"test_cases.py{test and '::' + test}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_program_skips_with_the_package_to_install(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, "test_marked", str(tmp_path / "empty"), ci=False)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert (
        "mosquitto_pub, mosquitto_sub, mosquitto_ctrl not installed: "
        "apt-get install mosquitto-clients mosquitto"
    ) in result.stdout


def test_under_ci_a_missing_program_fails(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, "test_marked", str(tmp_path / "empty"), ci=True)
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
    assert "mosquitto_pub, mosquitto_sub, mosquitto_ctrl not installed" in result.stdout
    assert "CI=true: a missing tool fails the run" in result.stdout


def test_a_present_program_runs(tmp_path: Path) -> None:
    """With its programs on PATH the marked test runs, and ``program`` finds them there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mosquitto_pub", "mosquitto_sub", "mosquitto_ctrl"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    result = run_pytest(tmp_path, "test_marked", str(bin_dir), ci=True)
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout


@pytest.mark.parametrize("workers", ["0", "2"])
def test_under_ci_any_skip_fails_the_run(tmp_path: Path, workers: str) -> None:
    """Also with the test command's ``-n 2``, where the workers' reports reach the main process."""
    quiet = run_pytest(tmp_path, "test_skips_itself", os.environ["PATH"], False, "-n", workers)
    assert quiet.returncode == 0, quiet.stdout
    assert "1 skipped" in quiet.stdout
    ci = run_pytest(tmp_path, "test_skips_itself", os.environ["PATH"], True, "-n", workers)
    assert ci.returncode == 1, ci.stdout
    assert "CI=true: 1 test(s) skipped, so the run fails" in ci.stdout


def test_the_chaos_run_is_collected_first(tmp_path: Path) -> None:
    """So that with ``-n 2`` the longest test starts at once (tests/conftest.py)."""
    result = run_pytest(tmp_path, "", os.environ["PATH"], False, "--collect-only", "-q")
    assert result.returncode == 0, result.stdout
    listed = [line for line in result.stdout.splitlines() if "::" in line]
    assert listed[0] == "test_cases.py::test_long", listed
    assert len(listed) == 3, listed
