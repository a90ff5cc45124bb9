"""Shared fixtures: the broker as a real subprocess.

``broker`` (one per test session), ``fresh_broker`` (one per test, for tests that stop it or
depend on timing of their own) and ``start_broker`` (a factory, for several per test) run ``python -m mqttbroker --port 0`` with a temporary data
directory. The port comes from the ``listening on HOST:PORT (MQTT over TCP)`` line the broker logs,
so there is no port race. A thread keeps draining the broker's output, so its pipe never fills,
and keeps every line for assertions (``log_text()``, ``wait_for_log()``).
``start_program`` runs another program (an example, say) the same way, until its ready line.

A test marked ``needs_mosquitto``, ``needs_haproxy``, ``needs_node``, ``needs_openssl`` or
``needs_chromium`` is skipped when that program is missing, and fails instead under ``CI=true``;
a CI run that skipped any test, for whatever reason, fails (``external_tools.py``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from external_tools import TOOLS, in_ci, require

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on (\S+):(\d+) \(MQTT over TCP\)")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


class BrokerProcess:
    """``python -m mqttbroker`` in a subprocess, with its output collected line by line.

    ``start`` waits for the line matching ``ready`` (host and port in its first two groups);
    a subclass sets ``args`` and ``ready`` to run another program the same way."""

    ready = LISTENING

    def __init__(self, data_dir: Path, log_level: str = "info", extra_args: tuple[str, ...] = ()):
        self.data_dir = data_dir
        self.args = [
            sys.executable,
            "-m",
            "mqttbroker",
            "--port",
            "0",
            "--log-level",
            log_level,
            "--data-dir",
            str(data_dir),
            # The admin server (default port 18083) only where a test asks for it (its own port).
            *(() if "--admin-port" in extra_args else ("--admin-port", "0")),
            *extra_args,
        ]
        self.host = ""
        self.port = 0
        self.cwd = data_dir  # the process's working directory
        self.preexec_fn: Callable[[], None] | None = None  # run in the child before the broker
        self.proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []  # stderr (the log)
        self._stdout: list[str] = []
        self._cond = threading.Condition()
        self._eof = 0  # streams that reached end of file
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> BrokerProcess:
        """Spawn and wait for the ``ready`` line."""
        self.spawn()
        assert self.proc is not None
        match = self.wait_for_log(self.ready, timeout, stop_on_exit=True)
        if match is None:
            self.stop()
            raise RuntimeError(
                f"{' '.join(self.args[1:3])} did not log its ready line within {timeout}s "
                f"(exit code {self.proc.returncode}); its output:\n{self.log_text()}"
            )
        self.host, self.port = match.group(1), int(match.group(2))
        return self

    def spawn(self) -> BrokerProcess:
        """Start the process without waiting for anything."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(self.cwd),
            env=env,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            preexec_fn=self.preexec_fn,
        )
        for stream, sink in ((self.proc.stderr, self._lines), (self.proc.stdout, self._stdout)):
            thread = threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _drain(self, stream: object, sink: list[str]) -> None:
        assert stream is not None
        for line in stream:  # type: ignore[attr-defined]
            with self._cond:
                sink.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof += 1
            self._cond.notify_all()

    def send_signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait for the process to exit and for its output to be fully read; its exit code."""
        assert self.proc is not None
        code = self.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._eof < len(self._threads):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return code

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after ``timeout``; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        for thread in self._threads:
            thread.join(timeout)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return proc.returncode

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    # -- the log ----------------------------------------------------------------------------

    def log_lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def log_text(self) -> str:
        return "\n".join(self.log_lines())

    def stdout_text(self) -> str:
        with self._cond:
            return "\n".join(self._stdout)

    def log_mark(self) -> int:
        """A position in the log; pass it to ``log_since``/``wait_for_log`` to look only after it."""
        with self._cond:
            return len(self._lines)

    def log_since(self, mark: int) -> str:
        with self._cond:
            return "\n".join(self._lines[mark:])

    def wait_for_log(
        self,
        pattern: str | re.Pattern[str],
        timeout: float = 10.0,
        since: int = 0,
        stop_on_exit: bool = False,
    ) -> re.Match[str] | None:
        """The first log line at or after ``since`` matching ``pattern`` (a regex), waiting up to
        ``timeout`` seconds for it; None if it did not come."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        checked = since
        with self._cond:
            while True:
                lines = self._lines
                for index in range(checked, len(lines)):
                    found = regex.search(lines[index])
                    if found:
                        return found
                checked = max(checked, len(lines))
                if self._eof and (stop_on_exit or self._eof >= len(self._threads)):
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def __repr__(self) -> str:
        return f"BrokerProcess({self.host}:{self.port}, pid={self.proc.pid if self.proc else None})"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole test session. Tests share it, so each uses its own topics."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker-data")).start()
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
    started: list[BrokerProcess] = []
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
        data_dir.mkdir(parents=True, exist_ok=True)
        process = BrokerProcess(data_dir, log_level, extra_args)
        process.cwd = cwd or data_dir
        process.preexec_fn = preexec_fn
        if launcher:
            process.args[1:3] = launcher
        started.append(process)
        return process.start() if wait else process.spawn()

    try:
        yield start
    finally:
        for process in started:
            process.stop()


@pytest.fixture
def fresh_broker(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker of the test's own, for tests that stop it or need it otherwise untouched."""
    return start_broker()


class ProgramProcess(BrokerProcess):
    """Another program, run and watched as the broker is: ``args`` its command line, ``ready``
    the line it logs (on stderr) once it is ready, with host and port in its first two groups."""

    def __init__(self, workdir: Path, args: list[str], ready: str) -> None:
        super().__init__(workdir)
        self.args = args
        self.ready = re.compile(ready)


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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test's fixtures start anything: the programs its markers name are there."""
    for marker in TOOLS:
        if item.get_closest_marker(marker) is not None:
            require(marker)


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
