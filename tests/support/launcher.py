"""Programs under test as real subprocesses.

- ``BrokerProcess``: ``python -m mqttbroker`` with a data directory, on ``--port 0`` or on the
  listeners of a configuration file (``config=``). The address of every listener comes from the
  ``listening on HOST:PORT (MQTT over ...)`` lines it logs, in configuration order, so there is
  no port race; a thread per stream drains its output into lines kept for assertions
  (``log_text()``, ``wait_for_log()``). The fixtures of tests/conftest.py start it.
- ``ProgramProcess``: another program (an example) run and watched the same way.
- ``Mosquitto``: Debian's Mosquitto broker on a free port with a generated configuration.
- ``run_broker``: the broker's command line run to its end (a configuration error, a subcommand).
- ``run_python``: ``python -c`` run to its end on a copy of the package.
- ``free_port``, ``wait_port``, ``stop_process``: for programs that log no address.
- ``write_file``: an input file (a configuration, a password file) written; its path.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.external_tools import find, in_ci, program

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (\S+):(\d+) \((MQTT over [A-Za-z+]+)\)")
TCP = "MQTT over TCP"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


def child_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH (so the child runs this code)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_broker(
    *args: str, cwd: Path = ROOT, input: str = "", timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """``python -m mqttbroker ARGS`` run until it exits by itself (a configuration error, a
    subcommand such as ``check-config``); its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "mqttbroker", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
        env=child_env(),
    )


def free_port() -> int:
    """A loopback port nothing listens on now (for programs that cannot take port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports nothing listens on now, below the
    kernel's range for ports picked by bind(0) (``free_port``, the brokers' port 0), so that
    no other test running meanwhile is handed one of them (a broker whose workers take a port
    each, from the first on)."""
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    rng = random.Random()
    while True:
        first = rng.randrange(10_000, low - count)
        socks = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


def wait_port(
    port: int, proc: subprocess.Popen[Any] | None = None, timeout: float = STOP_TIMEOUT
) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``; fails if ``proc`` exits
    first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"{proc.args} exited ({proc.returncode}) before listening"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout}s") from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    kind: str  # "MQTT over TCP", "MQTT over TLS", "MQTT over WebSocket", ...


class BrokerProcess:
    """``python -m mqttbroker`` in a subprocess, with its output collected line by line.

    Without ``config`` it listens on ``--port 0``; with it, on the file's listeners, and
    ``start`` waits for ``listeners`` lines matching ``ready`` (their host, port and kind in
    ``addresses``; ``host``/``port``: the first TCP listener's, else the first's). A subclass
    sets ``args`` and ``ready`` (host and port in its first two groups) to run another program
    the same way."""

    ready = LISTENING

    def __init__(
        self,
        data_dir: Path,
        log_level: str = "info",
        extra_args: tuple[str, ...] = (),
        config: Path | None = None,
        listeners: int = 1,
    ):
        self.data_dir = data_dir
        self.args = [
            sys.executable,
            "-m",
            "mqttbroker",
            *(("--port", "0") if config is None else ("--config", str(config))),
            "--log-level",
            log_level,
            "--data-dir",
            str(data_dir),
            # The admin server (default port 18083) only where a test asks for it (its own port).
            *(() if "--admin-port" in extra_args else ("--admin-port", "0")),
            *extra_args,
        ]
        self.listeners = listeners
        self.addresses: list[Address] = []
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
        """Spawn and wait for the ``ready`` line(s)."""
        self.spawn()
        assert self.proc is not None
        found = self._wait_matches(self.ready, self.listeners, timeout, 0, stop_on_exit=True)
        if len(found) < self.listeners:
            self.stop()
            raise RuntimeError(
                f"{' '.join(self.args[1:3])} did not log {self.listeners} ready line(s) within "
                f"{timeout}s (exit code {self.proc.returncode}); its output:\n{self.log_text()}"
            )
        self.addresses = [
            Address(m.group(1), int(m.group(2)), m.group(3) if m.re.groups > 2 else "")
            for m in found
        ]
        first = next((a for a in self.addresses if a.kind == TCP), self.addresses[0])
        self.host, self.port = first.host, first.port
        return self

    def spawn(self) -> BrokerProcess:
        """Start the process (its data directory made if missing) without waiting for anything."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = child_env()
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
        stop_process(proc, timeout)
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
        found = self._wait_matches(pattern, 1, timeout, since, stop_on_exit)
        return found[0] if found else None

    def _wait_matches(
        self,
        pattern: str | re.Pattern[str],
        count: int,
        timeout: float,
        since: int,
        stop_on_exit: bool,
    ) -> list[re.Match[str]]:
        """The first ``count`` matches of ``pattern`` in the log lines at or after ``since``,
        waiting up to ``timeout`` seconds for them; fewer if they did not come."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        checked = since
        found: list[re.Match[str]] = []
        with self._cond:
            while True:
                lines = self._lines
                for index in range(checked, len(lines)):
                    match = regex.search(lines[index])
                    if match:
                        found.append(match)
                        if len(found) == count:
                            return found
                checked = max(checked, len(lines))
                if self._eof and (stop_on_exit or self._eof >= len(self._threads)):
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return found
                self._cond.wait(left)

    def assert_clean_log(self) -> None:
        """The log has no traceback and no internal error."""
        text = self.log_text()
        assert "Traceback" not in text, text
        assert "internal error" not in text, text

    def __repr__(self) -> str:
        return f"BrokerProcess({self.host}:{self.port}, pid={self.proc.pid if self.proc else None})"


class ProgramProcess(BrokerProcess):
    """Another program, run and watched as the broker is: ``args`` its command line, ``ready``
    the line it logs (on stderr) once it is ready, with host and port in its first two groups."""

    def __init__(self, workdir: Path, args: list[str], ready: str) -> None:
        super().__init__(workdir)
        self.args = args
        self.ready = re.compile(ready)


CLIENT_TIMEOUT = 10.0  # a guard: a client program that runs longer has hung


def mosquitto_client(
    name: str,
    host: str,
    port: int,
    *args: str,
    timeout: float = CLIENT_TIMEOUT,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run Mosquitto's client program ``name`` (mosquitto_pub, mosquitto_sub) against
    ``host``:``port`` with ``args`` to its end; with ``check``, it must succeed (the assertion
    shows its stderr)."""
    command = [program(name), "-h", host, "-p", str(port), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{name} failed ({done.returncode}): {done.stderr}"
    return done


def run_module(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository's root with the root on PYTHONPATH (as the
    benchmark suite runs), to its end; its exit status and output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_python(code: str, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` run to its end in ``directory``, which is its PYTHONPATH (a copy of
    the package, say), with ``env`` added to the environment; fails if it fails."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(directory), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result


def write_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSON-lines file (one object a line; blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def mosquitto_binary() -> str:
    """The path of Debian's ``mosquitto`` broker; skips the test (fails it under CI) if missing."""
    path = find("mosquitto")
    if path is None:
        reason = "mosquitto not installed: apt-get install mosquitto"
        if in_ci():
            pytest.fail(f"{reason} (CI=true: a missing tool fails the run)", pytrace=False)
        pytest.skip(reason)
    return path


class Mosquitto:
    """A Mosquitto broker of the test's own on 127.0.0.1 with a generated configuration
    (``extra``: more of it, a TLS listener); ``restart()`` keeps its port (and, with
    ``persistence``, what it saved on the way down)."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path, persistence: bool = False, extra: str = "") -> None:
        self.binary = mosquitto_binary()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persistence = persistence
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "mosquitto.log"

    def start(self) -> Mosquitto:
        conf = self.workdir / "mosquitto.conf"
        text = (
            ""
            # as root, stay root: it reads the test's files (certificates) and writes its store
            + ("user root\n" if os.geteuid() == 0 else "")
            + "per_listener_settings false\n"
            "allow_anonymous true\n"
            f"persistence {'true' if self.persistence else 'false'}\n"
            f"persistence_location {self.workdir}/\n"
            "log_type all\n"
            "max_queued_messages 100000\n"
            "set_tcp_nodelay true\n"
            f"listener {self.port} 127.0.0.1\n" + self.extra
        )
        conf.write_text(text)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(conf)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as exc:
            raise RuntimeError(
                f"mosquitto did not start ({exc}):\n{self.log.read_text()}"
            ) from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
