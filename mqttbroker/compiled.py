"""The hot-path modules compiled to C with mypyc, and the pure-Python source as the fallback.

``pip install`` compiles the modules in :data:`MODULES` (``setup.py``) from the very same source
files, when a C compiler is there: the compiled broker runs the same code, about twice as fast.
:func:`select` runs when the package is imported, before any of them is, and decides which
form is loaded:

* the compiled one when it is built and was built from the source files now on disk: every
  file of ``protocol/``, ``broker/``, ``storage/`` and ``server/``, since mypyc also builds in
  the types of the modules the compiled ones import (their SHA-256 digests, sizes and
  modification times are recorded in ``compiled.sha256`` once the build has succeeded).
  Checking costs a ``stat`` per file: a file is read and hashed only when its size or modification time differs from the
  record (touched, copied without its times, or edited), so an unchanged install pays no
  hashing;
* the pure-Python one when the last install did not compile (``compiled.build``, written by
  setup.py, says why: no C compiler, no Python headers, or ``MQTTBROKER_COMPILE=0``; the broker
  logs it as a warning at start unless it was asked for), when nothing was compiled (a checkout
  run without installing), when ``MQTTBROKER_PURE`` is set to a non-empty
  value other than ``0``, or when a source file changed since the build (an edited checkout must
  never run stale machine code: reinstall to compile again). A meta-path finder then loads these
  modules from their ``.py`` files, all of them, since compiled modules call each other directly.

The test suite runs in whichever form is installed, and ``tests/test_compiled.py`` runs the
sans-I/O broker tests again in the other form.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

MODULES = (
    "mqttbroker.protocol.packets",
    "mqttbroker.protocol.rules",
    "mqttbroker.protocol.properties",
    "mqttbroker.protocol.fastpath",
    "mqttbroker.broker.options",
    "mqttbroker.broker.state",
    "mqttbroker.broker.auth",
    "mqttbroker.broker.retained",
    "mqttbroker.broker.message",
    "mqttbroker.broker.topics",
    "mqttbroker.broker.router",
    "mqttbroker.broker.session",
    "mqttbroker.broker.framing",
    "mqttbroker.broker.output",
    "mqttbroker.broker.rights",
    "mqttbroker.broker.aliases",
    "mqttbroker.broker.connection",
    "mqttbroker.broker.connection_log",
    "mqttbroker.broker.connect",
    "mqttbroker.broker.publish",
    "mqttbroker.broker.subscribe",
    "mqttbroker.broker.deliver",
    "mqttbroker.broker.passes",
    "mqttbroker.broker.stats",
    "mqttbroker.broker.core",
    "mqttbroker.storage.sqlite.batch",
    "mqttbroker.server.tcp",
)
# Hand-written C beside them, loaded with them (Linux only): the TCP transport of streams.py.
NATIVE = ("mqttbroker.server._streams",)
SHARED_LIBRARY = "mqttbroker.native__mypyc"  # the C code of all of them; the modules are shims
DIGESTS = "compiled.sha256"  # written by setup.py next to this file
# Written by setup.py when it installed the pure form: why (no C compiler, no Python.h...).
BUILD_STATUS = "compiled.build"
# The third-party packages the broker imports, which mypyc's mypy never reads (setup.py), so
# that the build is the same whether pip's build environment has them or not; tests check
# that this lists every one the package imports (mypy_extensions comes with mypy itself).
UNREAD_IMPORTS = (
    "aiohttp",
    "aiosqlite",
    "construct",
    "cryptography",
    "jwt",
    "prometheus_client",
    "redis",
    "uvloop",
)
_PACKAGE_DIR = Path(__file__).resolve().parent

# What select() decided: "compiled" or "pure", and why.
mode = "pure"
reason = "not selected yet"
stale = False  # compiled modules are there but do not match the source (or are incomplete)
# The form that runs is not the one a user expects (a stale build, or an install that could
# not compile): the broker logs the reason as a warning.
degraded = False


def source_path(module: str) -> Path:
    return _PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")


def native_source(module: str) -> Path:
    return source_path(module).with_suffix(".c")


def sources() -> list[Path]:
    """What the compiled code was built from: the compiled modules, and the modules beside them
    whose types mypyc built in (options, packets, store...): every file of protocol/, broker/,
    storage/, storage/sqlite/ and server/, and the C sources of :data:`NATIVE`."""
    return sorted(
        [
            path
            for folder in ("protocol", "broker", "storage", "storage/sqlite", "server")
            for path in (_PACKAGE_DIR / folder).glob("*.py")
        ]
        + [native_source(module) for module in NATIVE]
    )


def leftover_shims(package: Path) -> list[Path]:
    """Compiled shims under ``package`` (the ``mqttbroker`` folder) of modules no longer in
    MODULES, left by a build of an earlier list: Python would load one before the .py beside
    it, and fail, since the shared library no longer has its code. The build removes them."""
    wanted = {*MODULES, *NATIVE, SHARED_LIBRARY}
    return sorted(
        path
        for path in package.rglob("*.so")
        if ".".join(path.relative_to(package.parent).with_suffix("").with_suffix("").parts)
        not in wanted
    )


def _sha256(path: Path) -> str:
    import hashlib  # only when a file's size or time changed: most imports never need it

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _signature(path: Path) -> str:
    status = path.stat()
    return f"{status.st_size} {status.st_mtime_ns}"


def record() -> str:
    """The text of ``compiled.sha256`` for the sources on disk now, one line per file:
    ``SHA-256 SIZE MTIME_NS  PATH`` (the path relative to the package). Written by setup.py."""
    return "".join(
        f"{_sha256(path)} {_signature(path)}  {path.relative_to(_PACKAGE_DIR).as_posix()}\n"
        for path in sources()
    )


def _changed(recorded: dict[str, tuple[str, str]]) -> list[str]:
    """The sources that differ from the record, added or removed. A file whose size and
    modification time are the recorded ones is taken as unchanged without reading it."""
    now = {path.relative_to(_PACKAGE_DIR).as_posix(): path for path in sources()}
    changed = []
    for name in sorted(now.keys() | recorded.keys()):
        path = now.get(name)
        if path is None or name not in recorded:
            changed.append(name)
            continue
        digest, signature = recorded[name]
        if signature != _signature(path) and digest != _sha256(path):
            changed.append(name)
    return changed


def _extension_built(module: str) -> bool:
    stem = source_path(module).with_suffix("")
    return any(
        stem.with_name(stem.name + suffix).exists()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _recorded() -> dict[str, tuple[str, str]]:
    """Path -> (digest, "size mtime_ns") from ``compiled.sha256`` (see :func:`record`)."""
    try:
        text = (_PACKAGE_DIR / DIGESTS).read_text()
    except OSError:
        return {}
    recorded: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        fields, _, name = line.partition("  ")
        digest, _, signature = fields.partition(" ")
        if name:
            recorded[name] = (digest, signature)
    return recorded


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from their ``.py`` files instead."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def _use_source(why: str, outdated: bool = False) -> None:
    global mode, reason, stale, degraded
    mode, reason, stale, degraded = "pure", why, outdated, outdated
    if not any(isinstance(finder, _SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def select() -> None:
    """Decide between the compiled and the pure-Python modules (see the module docstring)."""
    global mode, reason, degraded
    loaded = [name for name in MODULES if name in sys.modules]
    if loaded:  # too late to choose: keep what is there
        module = sys.modules[loaded[0]]
        compiled = not (module.__file__ or "").endswith(".py")
        mode, reason = ("compiled" if compiled else "pure"), "already imported"
        return
    flag = os.environ.get("MQTTBROKER_PURE", "")
    if flag and flag != "0":
        _use_source("MQTTBROKER_PURE is set")
        return
    try:  # the last install chose the pure form (machine code of an earlier one may be left)
        why = (_PACKAGE_DIR / BUILD_STATUS).read_text().strip()
    except OSError:
        why = ""
    if why:
        _use_source(f"not compiled at install: {why}")
        degraded = not why.startswith("MQTTBROKER_COMPILE=0")
        return
    built = [name for name in (*MODULES, SHARED_LIBRARY) if _extension_built(name)]
    if not built:
        mode = "pure"
        reason = "not compiled: run from a checkout that was not installed (pip install .)"
        return
    if len(built) != len(MODULES) + 1:
        _use_source("only part of the compiled modules is there; reinstall to compile again", True)
        return
    recorded = _recorded()
    if not recorded:
        _use_source(f"{DIGESTS} is missing; reinstall to compile again", True)
        return
    changed = _changed(recorded)
    if changed:
        _use_source(
            f"{', '.join(changed)} changed since the modules were compiled; "
            "reinstall (pip install -e .) to compile again",
            True,
        )
        return
    mode, reason = "compiled", "built from the current sources"
