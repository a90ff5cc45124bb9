"""The install (setup.py): a machine without a C compiler gets the pure-Python form, and the
broker says why, loudly, when it starts; the compiled build never reads a third-party package,
so pip's isolated build environment compiles the same as a used machine (``.ci/run`` installs
as the README says, in a fresh virtual environment, and checks the compiled form runs)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.launcher import BrokerProcess, run_python

import mqttbroker
from mqttbroker import compiled

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(mqttbroker.__file__).resolve().parent


def _third_party_imports() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names} - {"mqttbroker"}


def test_the_compiled_build_reads_none_of_the_third_party_packages_the_broker_imports() -> None:
    """Every third-party package the broker imports is one mypyc's mypy skips (setup.py), so
    whether pip's build environment has it cannot change or break the build; mypy_extensions
    comes with mypy itself."""
    assert _third_party_imports() - {"mypy_extensions"} == set(compiled.UNREAD_IMPORTS)


def test_a_compiler_that_fails_fails_the_build_saying_what_to_do(tmp_path: Path) -> None:
    """A C compiler that is there but fails (here ``false``) fails the install, loudly: the
    build stops with the compiler's error and what to do about it (fix the compiler, or ask
    for the pure form), never a quiet pure-Python install. setup.py's own build command on one
    small extension, so that mypyc need not run."""
    (tmp_path / "probe.c").write_text("int probe;\n")
    script = (
        "import runpy\n"
        "from setuptools import Distribution, Extension\n"
        f"setup = runpy.run_path({str(ROOT / 'setup.py')!r}, run_name='setup_under_test')\n"
        "dist = Distribution({'name': 'probe', 'ext_modules': [Extension('probe', ['probe.c'])]})\n"
        "command = setup['BuildExt'](dist)\n"
        "command.build_lib, command.build_temp = 'lib', 'temp'\n"
        "command.ensure_finalized()\n"
        "command.run()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "CC": "false"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: mqttbroker's hot path and C transport could not be compiled")
    assert "false'" in last  # the command that failed, by name
    assert "MQTTBROKER_COMPILE=0 to install the pure-Python form" in last
    assert not (tmp_path / "lib" / "mqttbroker" / compiled.DIGESTS).exists()


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built as on a machine without a C compiler (CC names no program)."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(  # a copy, so that the build's record does not touch this checkout
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / name.decode()
        if path.is_file():
            target = source / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"] + ["-w", str(out), str(source)],
        env={**os.environ, "CC": "no-such-compiler-here", "MQTTBROKER_COMPILE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = out.glob("mqttbroker-*.whl")
    unpacked = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


def form_line(installed: Path, data: Path) -> str:
    """The line saying which form runs ("hot path: ...") that a broker logs at start when run
    from the package in ``installed`` (first on its path, not this checkout)."""
    process = BrokerProcess(data, extra_args=("--memory",))
    process.args[1:3] = [
        "-c",
        f"import sys; sys.path.insert(0, {str(installed)!r}); "
        "from mqttbroker.cli import main; sys.exit(main())",
    ]
    process.start()
    try:
        found = process.wait_for_log("hot path:")
    finally:
        process.stop()
    assert found is not None, process.log_text()
    return found.string


def test_without_a_compiler_the_pure_form_is_installed_with_the_reason(pure_wheel: Path) -> None:
    package = pure_wheel / "mqttbroker"
    assert not list(package.rglob("*.so"))
    assert not (package / compiled.DIGESTS).exists()
    status = (package / compiled.BUILD_STATUS).read_text()
    assert "no C compiler ('no-such-compiler-here' is not on PATH)" in status


def test_the_broker_of_a_pure_install_warns_why_at_start(pure_wheel: Path, tmp_path: Path) -> None:
    line = form_line(pure_wheel, tmp_path / "data")
    assert "WARNING" in line and "pure Python" in line
    assert "not compiled at install: no C compiler ('no-such-compiler-here'" in line


def test_a_pure_install_over_a_compiled_one_runs_pure(tmp_path: Path) -> None:
    """Reinstalling in place with MQTTBROKER_COMPILE=0 leaves the earlier machine code beside
    the sources: the status file the install wrote decides, and asking for the pure form is
    not worth a warning."""
    copy = tmp_path / "mqttbroker"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / compiled.BUILD_STATUS).write_text("MQTTBROKER_COMPILE=0 at install\n")
    probe = (
        "import mqttbroker.compiled as c, mqttbroker.broker.connection as m; "
        "print(c.mode, c.degraded, m.__file__.endswith('.py')); print(c.reason)"
    )
    first, reason = run_python(probe, tmp_path, MQTTBROKER_PURE="").stdout.splitlines()
    assert first == "pure False True"
    assert reason == "not compiled at install: MQTTBROKER_COMPILE=0 at install"


@pytest.mark.needs_compiled
def test_a_compiled_install_without_its_tcp_transport_warns_at_start(tmp_path: Path) -> None:
    """The install builds the C transport with the compiled modules (setup.py: all or the
    install fails); a copy of the compiled package without it (a module that does not load)
    still runs compiled, on the loop's transport, and its log says so as a warning, with why."""
    copy = tmp_path / "installed" / "mqttbroker"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "_streams*.so"))
    line = form_line(copy.parent, tmp_path / "data")
    assert "WARNING" in line and "hot path: compiled (mypyc)" in line, line
    assert "not the broker's own TCP transport (cannot import name '_streams'" in line, line
