"""Shared fixtures: the broker as a real subprocess, and paho clients of it.

``broker`` (one per test session), ``fresh_broker`` (one per test, for tests that stop it or
depend on timing of their own) and ``start_broker`` (a factory, for several per test) run
``python -m mqttbroker --port 0`` with a temporary data directory. The port comes from the
``listening on HOST:PORT (MQTT over TCP)`` line the broker logs, so there is no port race. A
thread keeps draining the broker's output, so its pipe never fills, and keeps every line for
assertions (``log_text()``, ``wait_for_log()``): see ``support/launcher.py``.
``start_program`` runs another program (an example, say) the same way, until its ready line.
``paho`` makes paho clients (``support.clients.PahoClient``) that are closed after the test.

A test marked ``needs_mosquitto``, ``needs_haproxy``, ``needs_node``, ``needs_openssl`` or
``needs_chromium`` is skipped when that program is missing, and fails instead under ``CI=true``;
a CI run that skipped any test, for whatever reason, fails (``support/external_tools.py``). So
is one marked ``needs_compiled`` (the broker's own C transport and the mypyc hot path) when the
pure form is installed, with the reason the install gave.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cleanup import ended_after

# The repository's root, for the tests that import the benchmarks and conformance packages (the
# tests folder itself is on sys.path as this file's folder, for ``support`` and friends).
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from support.clients import MQTT_5, PahoClient  # noqa: E402
from support.external_tools import TOOLS, in_ci, require, require_compiled  # noqa: E402
from support.launcher import BrokerProcess, ProgramProcess  # noqa: E402


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole test session. Tests share it, so each uses its own topics.
    Tests look for their own clients' lines in its log while others connect hundreds at once,
    so it writes every connection's line (``connection_log_rate = 0``) rather than counting
    those past 100 a second."""
    data_dir = tmp_path_factory.mktemp("broker-data")
    config = data_dir / "every-line.toml"
    config.write_text("[broker]\nconnection_log_rate = 0\n")
    process = BrokerProcess(data_dir, extra_args=("--config", str(config))).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """``start_broker(data_dir=None, log_level="info", extra_args=())``: start another broker
    (by default with a new data directory; pass the same one again to restart on its data).
    ``wait=False`` only spawns it (for a broker that is not expected to listen); ``cwd``,
    ``preexec_fn`` set the process's, and ``launcher`` replaces ``-m mqttbroker`` (a script
    that runs ``mqttbroker.cli.main``). Every broker started is stopped after the test."""
    counter = itertools.count()

    def start(
        data_dir: Path | None = None,
        log_level: str = "info",
        extra_args: tuple[str, ...] = (),
        wait: bool = True,
        cwd: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> BrokerProcess:
        if data_dir is None:
            data_dir = tmp_path / f"data{next(counter)}"
        process = keep(BrokerProcess(data_dir, log_level, extra_args))
        process.cwd = cwd or data_dir
        process.preexec_fn = preexec_fn
        if launcher:
            process.args[1:3] = launcher
        return process.start() if wait else process.spawn()

    with ended_after(BrokerProcess.stop) as keep:
        yield start


@pytest.fixture
def fresh_broker(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker of the test's own, for tests that stop it or need it otherwise untouched."""
    return start_broker()


@pytest.fixture
def start_program(tmp_path: Path) -> Iterator[Callable[..., ProgramProcess]]:
    """``start_program(args, ready)``: start ``args`` in the test's tmp_path and wait for its
    ready line (``ProgramProcess``); every program started is stopped after the test."""
    started: list[ProgramProcess] = []

    def start(args: list[str], ready: str) -> ProgramProcess:
        process = ProgramProcess(tmp_path, args, ready)
        started.append(process)
        return process.start()

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()


@pytest.fixture
def paho() -> Iterator[Callable[..., PahoClient]]:
    """``paho(server, version=5, user=None, password=None, connect=True, **PahoClient options)``:
    a paho client of ``server`` (anything with ``host`` and ``port``), logging in as ``user``
    if given, connected (CONNACK received) unless ``connect=False``; all are closed after the
    test."""
    with ended_after(PahoClient.close) as keep:

        def make(
            server: Any,
            version: int = MQTT_5,
            user: str | None = None,
            password: bytes | str | None = None,
            connect: bool = True,
            **options: Any,
        ) -> PahoClient:
            client = keep(PahoClient(server.host, server.port, version, **options))
            if user is not None:
                client.client.username_pw_set(user, password)
            if connect:
                client.connect()
            return client

        yield make


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The chaos run's short form first: the longest test by far (about 100 s), so that with
    ``-n 2`` it starts at once and the other worker's tests run beside it, rather than being
    the tail of the run (docs/testing.md)."""
    items.sort(key=lambda item: item.get_closest_marker("chaos") is None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test's fixtures start anything: the programs its markers name are there."""
    for marker in TOOLS:
        if item.get_closest_marker(marker) is not None:
            require(marker)
    if item.get_closest_marker("needs_compiled") is not None:
        require_compiled()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under ``CI=true`` a run that skipped a test fails: CI must run every test."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if in_ci() and skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(
                f"CI=true: {len(skipped)} test(s) skipped, so the run fails (see SKIPPED above)",
                red=True,
                bold=True,
            )
