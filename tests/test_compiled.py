"""The compiled hot path (mypyc, see mqttbroker/compiled.py) and its pure-Python fallback.

The suite runs in whichever form is installed; the sans-I/O broker and codec tests are run again
here in the other form (in a subprocess, since the choice is made once per process), so both
forms pass the same tests. A copy of the package with one source file edited must load the
pure-Python modules, never the stale machine code.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.launcher import run_python

import mqttbroker
from mqttbroker import compiled

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(mqttbroker.__file__).resolve().parent
PROBE = (
    "import mqttbroker.compiled as c, mqttbroker.broker.connection as m; "
    "print(c.mode, m.__file__.endswith('.py'), c.stale); print(c.reason)"
)


def _probe(path: Path, **env: str) -> tuple[str, bool, bool, str]:
    first, reason = run_python(PROBE, path, **env).stdout.splitlines()
    mode, from_source, stale = first.split()
    return mode, from_source == "True", stale == "True", reason


def _built() -> bool:
    return compiled._extension_built(compiled.SHARED_LIBRARY)


def test_the_loaded_form_is_the_one_reported() -> None:
    from mqttbroker.broker import connection

    from_source = (connection.__file__ or "").endswith(".py")
    assert compiled.mode == ("pure" if from_source else "compiled"), compiled.reason
    if compiled.mode == "compiled":
        assert _built()


def test_pure_is_forced_by_the_environment() -> None:
    mode, from_source, stale, reason = _probe(ROOT, MQTTBROKER_PURE="1")
    assert (mode, from_source, stale) == ("pure", True, False)
    assert "MQTTBROKER_PURE" in reason


def test_an_edited_source_file_is_never_run_compiled(tmp_path: Path) -> None:
    """With the compiled build there, a copy whose router.py differs by one comment loads every
    hot module from source and says why; so does one whose options.py (not compiled, but its
    types are compiled into the others) differs. Without a build, the copy is pure, not stale."""
    copy = tmp_path / "mqttbroker"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if _built():
        assert _probe(tmp_path)[:3] == ("compiled", False, False)
    router = copy / "broker" / "router.py"
    router.write_text(router.read_text() + "\n# edited\n")
    mode, from_source, stale, reason = _probe(tmp_path)
    assert mode == "pure" and from_source
    if _built():
        assert stale and "broker/router.py changed" in reason
    options = copy / "broker" / "options.py"  # not compiled, but its types are built in
    router.write_text(router.read_text().removesuffix("\n# edited\n"))
    options.write_text(options.read_text() + "\n# edited\n")
    mode, from_source, stale, reason = _probe(tmp_path)
    assert mode == "pure" and from_source
    if _built():
        assert stale and "broker/options.py changed" in reason
    else:
        assert not stale and "not compiled" in reason


def test_the_other_form_passes_the_broker_and_codec_tests() -> None:
    """The sans-I/O broker and protocol tests, in the form this process did not load: pure
    Python when the suite runs compiled. (Without a compiled build there is no other form; the
    suite itself then ran pure, and this checks that the fallback really is the source.)"""
    if compiled.mode != "compiled":
        mode, from_source, _, _ = _probe(ROOT)
        assert mode == "pure" and from_source
        return
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        + ["tests/broker", "tests/protocol", "tests/storage"],
        cwd=ROOT,
        env={**os.environ, "MQTTBROKER_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = result.stdout[-3000:]
    assert result.returncode == 0, tail
    assert " passed" in tail


def test_an_unchanged_build_is_recognised_without_hashing(tmp_path: Path) -> None:
    """Choosing the form costs a stat per source file, not a read and a hash: in a copy with
    a (stand-in) build and its record, importing the package never loads hashlib. A file whose
    time changed but not its content is hashed and still matches; an edited one does not."""
    copy = tmp_path / "mqttbroker"
    shutil.copytree(
        PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", compiled.BUILD_STATUS)
    )
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in (*compiled.MODULES, compiled.SHARED_LIBRARY):
        copy.joinpath(*name.split(".")[1:]).with_suffix(suffix).write_bytes(b"")
    record = run_python(
        "import mqttbroker.compiled as c; print(c.record(), end='')", tmp_path, MQTTBROKER_PURE="1"
    ).stdout
    (copy / compiled.DIGESTS).write_text(record)
    probe = (
        "import sys; sys.modules['hashlib'] = None; import mqttbroker.compiled as c; "
        "print(c.mode, c.stale); print(c.reason)"
    )

    def run(code: str) -> list[str]:
        return run_python(code, tmp_path, MQTTBROKER_PURE="").stdout.splitlines()

    assert run(probe)[0] == "compiled False"
    router = copy / "broker" / "router.py"
    os.utime(router, ns=(router.stat().st_atime_ns, router.stat().st_mtime_ns + 10**9))
    assert run(probe.replace("sys.modules['hashlib'] = None; ", ""))[0] == "compiled False"
    router.write_text(router.read_text() + "\n# edited\n")
    first, reason = run(probe.replace("sys.modules['hashlib'] = None; ", ""))
    assert first == "pure True" and "broker/router.py changed" in reason


def test_a_shim_of_a_module_no_longer_compiled_is_found_for_removal(tmp_path: Path) -> None:
    """A build leaves each compiled module's shim beside its .py; once a module leaves MODULES,
    its shim would be imported first and fail (its code is no longer in the shared library):
    the next build removes exactly those."""
    package = tmp_path / "mqttbroker"
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    kept = [
        package / (compiled.SHARED_LIBRARY.split(".")[1] + suffix),
        package.joinpath(*compiled.MODULES[0].split(".")[1:]).with_suffix(suffix),
    ]
    left = package / "broker" / ("no_longer_compiled" + suffix)
    for path in [*kept, left]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    (package / "broker" / "plain.py").write_text("")
    assert compiled.leftover_shims(package) == [left]
