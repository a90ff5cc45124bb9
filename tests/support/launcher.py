"""The broker (or another program) as a real subprocess: ``python -m mqttbroker --port 0`` with a
data directory; its port comes from the ``listening on HOST:PORT (MQTT over TCP)`` line it logs,
so there is no port race, and a thread per stream drains its output into lines kept for
assertions (``log_text()``, ``wait_for_log()``). The fixtures of tests/conftest.py and the
persistence tests start their brokers with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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

    def kill(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGKILL (no shutdown code runs); the exit code once its output is read."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.wait_exit(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (the broker's clean stop); the exit code once its output is read."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

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
