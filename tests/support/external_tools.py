"""The programs outside Python that some tests run, and what happens when one is missing.

A test that runs one is marked with its marker (``@pytest.mark.needs_mosquitto``; registered in
pyproject.toml) and finds the program with ``program(name)``. A missing program skips the test
with the reason and the package to install; with ``CI=true`` in the environment it fails the test
instead, since a CI run must run everything (tests/conftest.py also fails a CI run that skipped
anything). ``pytest -m "not needs_node"`` leaves such tests out altogether.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

# Debian installs daemons (haproxy, mosquitto) in sbin, which a user's PATH may not include.
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


@dataclass(frozen=True)
class Tool:
    programs: tuple[str, ...]
    install: str


TOOLS = {
    # mosquitto_ctrl is in mosquitto-clients upstream, in mosquitto on Debian 12
    "needs_mosquitto": Tool(
        ("mosquitto_pub", "mosquitto_sub", "mosquitto_ctrl"),
        "apt-get install mosquitto-clients mosquitto",
    ),
    "needs_haproxy": Tool(("haproxy",), "apt-get install haproxy"),
    "needs_node": Tool(("node", "npm"), "apt-get install nodejs npm"),
    "needs_openssl": Tool(("openssl",), "apt-get install openssl"),
    "needs_systemd": Tool(("systemd-analyze",), "apt-get install systemd"),
    "needs_chromium": Tool(("chromium",), "apt-get install chromium"),
    "needs_redis": Tool(("redis-server",), "apt-get install redis-server"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def find(name: str) -> str | None:
    """The path of program ``name`` on PATH (or in an sbin directory), or None."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN])
    return shutil.which(name, path=search)


def require(marker: str) -> None:
    """Skip the running test (fail it under CI) unless every program of ``marker`` is there."""
    tool = TOOLS[marker]
    missing = [name for name in tool.programs if find(name) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed: {tool.install}"
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing tool fails the run)", pytrace=False)
    pytest.skip(reason)


def require_compiled() -> None:
    """Skip the running test (fail it under CI) unless the compiled form runs: the mypyc hot
    path and the broker's own C transport (``needs_compiled``). The reason is the install's."""
    from mqttbroker import compiled
    from mqttbroker.server import streams

    if streams.available():
        return
    why = compiled.reason if compiled.mode != "compiled" else "the C transport was not built"
    reason = (
        f"needs the compiled form, and the pure one runs ({why}); "
        "install with a C compiler and Python.h: pip install -e '.[test,fast]'"
    )
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the compiled form must run)", pytrace=False)
    pytest.skip(reason)


def program(name: str) -> str:
    """The path of program ``name``, one of TOOLS; skips (or, under CI, fails) when missing."""
    marker = next(marker for marker, tool in TOOLS.items() if name in tool.programs)
    require(marker)
    path = find(name)
    assert path is not None
    return path
