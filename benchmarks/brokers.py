"""Starting, watching and stopping the brokers under test.

* ours: ``python -m mqttbroker --port 0 --log-level warning`` (its port read from /proc; another
  level with ``--log-level``, ``LOG_LEVEL``: ``info`` is the broker's default), its admin server
  off, or with ``--scrape-metrics`` (``SCRAPE_METRICS``) on a free port and its ``/metrics``
  fetched every second by a thread of the runner for as long as it runs;
* Mosquitto: ``mosquitto -c <generated config>`` on a free loopback port;
* amqtt: only when it is importable (never installed by this suite); MQTT 3.1.1 only;
* an external broker at HOST:PORT (its pid, when given, enables CPU and RSS figures);
* the floor (scenario 5 only): ``python -m benchmarks.floor PORT``, not a broker but a bare
  forwarder spinning on plain sockets, the machine's own round trip (see floor.py).

Started brokers are pinned to core 0 with taskset when taskset exists and there are two or more
cores; the generator then runs on core 1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import procfs, tlscerts
from .wire import MQTT_5, MQTT_311

REPO = Path(__file__).resolve().parent.parent
BROKER_CORE = 0
GENERATOR_CORE = 1
START_TIMEOUT = 20.0
SCRAPE_METRICS = False  # --scrape-metrics: our brokers run their admin server, scraped each second
SCRAPE_INTERVAL = 1.0
LOG_LEVEL = "warning"  # --log-level: our brokers' (the broker's own default is info)
# --tls: the server certificate and key (benchmarks/tlscerts.py) that the shared brokers' one
# listener serves TLS with (None: plain TCP)
TLS: tuple[str, str] | None = None

MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
{persistence}
max_inflight_messages 0
max_connections -1
log_dest stderr
log_type error
log_type warning
connection_messages false
"""
MOSQUITTO_VOLATILE = "persistence false\nmax_queued_messages 100000"
# Scenario 8: the offline session's queue unbounded (0), saved under the run's own directory
# (Mosquitto writes it at autosave_interval, default 1800 s, and on exit: not per message).
MOSQUITTO_PERSISTENT = "persistence true\npersistence_location {dir}/\nmax_queued_messages 0"

# Scenario 8 (QoS 1 into an offline session): our broker's per-session queue bounds raised so
# that nothing is dropped during a run; one fresh broker and data directory per variant and run.
QUEUE_MESSAGES = 10_000_000
QUEUE_BYTES = 4 * 1024**3
OURS_VARIANTS: dict[str, tuple[str, str | None]] = {  # name -> (storage backend, sync)
    "ours-memory": ("memory", None),
    "ours-normal": ("sqlite", "normal"),
    "ours-full": ("sqlite", "full"),
}


# Our broker in another configuration, measured beside the shared brokers in the scenarios that
# list it (Scenario.variants): name -> (TOML text, what the header line says of it).
# busy_poll_us: 2 ms, twice the gap between scenario 5's messages, so the loop never sleeps there.
# gather_us = 0: without the default's gathering, to show what it saves (scenario 9).
TUNED_VARIANTS: dict[str, tuple[str, str]] = {
    "ours-busy-poll": ("busy_poll_us = 2000\n", "busy_poll_us 2000"),
    "ours-no-gather": ("gather_us = 0\n", "gather_us 0"),
}


# Not a broker: the bare forwarder of floor.py, measured beside the brokers in the scenarios that
# list it (Scenario.variants), as the lowest latency this machine and probe allow a Python process.
FLOOR = "floor"


def is_variant(name: str) -> bool:
    """Measured only in the scenarios that list it (Scenario.variants)."""
    return name in TUNED_VARIANTS or name == FLOOR


def ours_config(backend: str, sync: str | None) -> str:
    lines = [
        "[broker]",
        f"max_queued_messages = {QUEUE_MESSAGES}",
        f"max_queued_bytes = {QUEUE_BYTES}",
        "",
        "[storage]",
        f'backend = "{backend}"',
    ]
    if sync:
        lines.append(f'sync = "{sync}"')
    return "\n".join(lines) + "\n"


AMQTT_LAUNCHER = """\
import asyncio, sys
from amqtt.broker import Broker

async def main(port):
    broker = Broker({"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
                     "sys_interval": 0,
                     "auth": {"allow-anonymous": True, "plugins": ["auth_anonymous"]},
                     "topic-check": {"enabled": False}})
    await broker.start()
    await asyncio.Event().wait()

asyncio.run(main(int(sys.argv[1])))
"""


def pinning_available() -> bool:
    return shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2


def pinned(core: int, cmd: list[str], pin: bool) -> list[str]:
    return ["taskset", "-c", str(core), *cmd] if pin else cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def mosquitto_path() -> str | None:
    return shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
    )


def amqtt_available() -> bool:
    return importlib.util.find_spec("amqtt") is not None


@dataclass
class BrokerHandle:
    name: str
    host: str
    port: int = 0
    pid: int | None = None
    version: int = MQTT_5  # the MQTT version the generator speaks to it
    proc: subprocess.Popen[bytes] | None = None
    workdir: str | None = None
    log_path: str | None = None
    crashes: int = 0
    description: str = ""
    admin_port: int = 0  # our broker's admin server, when SCRAPE_METRICS
    scraper: Scraper | None = None

    @property
    def managed(self) -> bool:
        return self.proc is not None

    def alive(self) -> bool:
        if self.proc is None:
            return port_open(self.host, self.port)
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path:
            return ""
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
            self.scraper = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def wait_idle(self, limit: float = 30.0, busy: float = 0.10) -> tuple[float, bool]:
        """Wait until the broker uses under ``busy`` of a core (what a previous run left it doing
        must not count against the next); returns the seconds waited and whether it got there
        (True too when its CPU cannot be read)."""
        start = time.monotonic()
        if self.pid is None:
            time.sleep(0.3)
            return time.monotonic() - start, True
        quiet = 0
        last = procfs.cpu_seconds(self.pid)
        while time.monotonic() - start < limit and last is not None:
            time.sleep(0.1)
            now = procfs.cpu_seconds(self.pid)
            if now is None:
                break
            quiet = quiet + 1 if now - last <= busy * 0.1 + 1e-9 else 0
            last = now
            if quiet >= 2:
                return time.monotonic() - start, True
        return time.monotonic() - start, last is None


def _spawn(
    name: str, cmd: list[str], workdir: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    log_path = os.path.join(workdir, f"{name}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C in the runner's terminal is the runner's to handle
        )
    return proc, log_path


def _wait_port(handle: BrokerHandle, find_port: bool) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    assert handle.proc is not None and handle.pid is not None
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError(
                f"{handle.name} exited with {handle.proc.returncode} while starting:\n"
                + handle.log_tail()
            )
        if find_port and not handle.port:
            ports = [p for p in procfs.listening_ports(handle.pid) if p != handle.admin_port]
            if ports:
                handle.port = ports[0]
        if handle.port and port_open(handle.host, handle.port):
            return
        time.sleep(0.05)
    handle.stop()
    raise RuntimeError(f"{handle.name} did not start listening in {START_TIMEOUT:.0f} s")


def _hot_path_form(env: dict[str, str]) -> str:
    """ "compiled" or "pure" (mqttbroker/compiled.py decides the same way in the broker)."""
    probe = "import mqttbroker.compiled as c; print(c.mode)"
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    return result.stdout.strip() or "unknown"


def start_ours(
    pin: bool,
    version: int = MQTT_5,
    name: str = "ours",
    config: str | None = None,
    description: str = "mqttbroker",
) -> BrokerHandle:
    """Our broker with its defaults, or with ``config`` (TOML text) written to its directory."""
    workdir = tempfile.mkdtemp(prefix="bench-ours-")
    cmd = [
        sys.executable,
        "-m",
        "mqttbroker",
        "--port",
        "0",
        "--log-level",
        LOG_LEVEL,
        "--data-dir",
        os.path.join(workdir, "data"),
    ]
    admin_port = free_port() if SCRAPE_METRICS else 0
    cmd += ["--admin-port", str(admin_port)]
    if TLS is not None and config is None:
        config = tlscerts.listener_toml(*TLS)
        description += ", TLS listener"
    if config is not None:
        path = os.path.join(workdir, "mqttbroker.toml")
        Path(path).write_text(config)
        cmd += ["--config", path]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    description += f", {_hot_path_form(env)} hot path"
    if LOG_LEVEL != "warning":
        description += f", log level {LOG_LEVEL}"
    if admin_port:
        description += f", admin on, /metrics scraped every {SCRAPE_INTERVAL:g} s"
    proc, log_path = _spawn(name, pinned(BROKER_CORE, cmd, pin), workdir, env)
    handle = BrokerHandle(
        name,
        "127.0.0.1",
        0,
        proc.pid,
        version,
        proc,
        workdir,
        log_path,
        description=description,
        admin_port=admin_port,
    )
    _wait_port(handle, find_port=True)
    if admin_port:
        handle.scraper = Scraper(f"http://127.0.0.1:{admin_port}/metrics")
    return handle


class Scraper:
    """Fetches a /metrics URL every SCRAPE_INTERVAL seconds on a thread, as Prometheus would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_INTERVAL):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def mosquitto_tls(conf: str, cert: str, key: str) -> str:
    """Mosquitto configuration ``conf`` with its first listener (its first line) serving TLS
    with ``cert`` and ``key``, Mosquitto's defaults otherwise."""
    return conf.replace("\n", f"\ncertfile {cert}\nkeyfile {key}\n", 1)


def start_mosquitto(pin: bool, version: int = MQTT_5, persistent: bool = False) -> BrokerHandle:
    binary = mosquitto_path()
    if binary is None:
        raise RuntimeError("mosquitto is not installed")
    workdir = tempfile.mkdtemp(prefix="bench-mosquitto-")
    port = free_port()
    conf = os.path.join(workdir, "mosquitto.conf")
    persistence = MOSQUITTO_VOLATILE
    if persistent:
        data = os.path.join(workdir, "data")
        os.mkdir(data)
        os.chmod(data, 0o777)  # written by the user mosquitto drops root for
        persistence = MOSQUITTO_PERSISTENT.format(dir=data)
    text = MOSQUITTO_CONF.format(port=port, persistence=persistence)
    if TLS is not None and not persistent:
        text = mosquitto_tls(text, *TLS)
    Path(conf).write_text(text)
    os.chmod(workdir, 0o755)  # mosquitto drops root for its own user and must read the config
    os.chmod(conf, 0o644)
    proc, log_path = _spawn("mosquitto", pinned(BROKER_CORE, [binary, "-c", conf], pin), workdir)
    handle = BrokerHandle(
        "mosquitto", "127.0.0.1", port, proc.pid, version, proc, workdir, log_path
    )
    _wait_port(handle, find_port=False)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=5).stdout
        handle.description = out.splitlines()[0].strip() if out else "mosquitto"
    if persistent:
        handle.description += " (persistence true, max_queued_messages 0)"
    return handle


def start_for_own(name: str, pin: bool, version: int = MQTT_5) -> BrokerHandle:
    """A fresh broker for one run of a scenario measured on brokers of its own (scenario 8):
    one of OURS_VARIANTS, or "mosquitto" with persistence on."""
    if name == "mosquitto":
        return start_mosquitto(pin, version, persistent=True)
    backend, sync = OURS_VARIANTS[name]
    description = f"mqttbroker, storage {backend}" + (f" sync {sync}" if sync else "")
    description += f", max_queued_messages {QUEUE_MESSAGES}, max_queued_bytes {QUEUE_BYTES}"
    return start_ours(pin, version, name, ours_config(backend, sync), description)


def start_tuned(name: str, pin: bool, version: int = MQTT_5) -> BrokerHandle:
    """One of TUNED_VARIANTS."""
    config, description = TUNED_VARIANTS[name]
    return start_ours(pin, version, name, config, f"mqttbroker, {description}")


def start_amqtt(pin: bool) -> BrokerHandle:
    workdir = tempfile.mkdtemp(prefix="bench-amqtt-")
    port = free_port()
    cmd = [sys.executable, "-c", AMQTT_LAUNCHER, str(port)]
    proc, log_path = _spawn("amqtt", pinned(BROKER_CORE, cmd, pin), workdir)
    handle = BrokerHandle(
        "amqtt",
        "127.0.0.1",
        port,
        proc.pid,
        MQTT_311,
        proc,
        workdir,
        log_path,
        description="amqtt (MQTT 3.1.1)",
    )
    _wait_port(handle, find_port=False)
    return handle


def start_floor(pin: bool, version: int = MQTT_5) -> BrokerHandle:
    """The floor; it answers CONNECT in the version the generator speaks (``version``)."""
    workdir = tempfile.mkdtemp(prefix="bench-floor-")
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "benchmarks.floor", str(port)]
    proc, log_path = _spawn(FLOOR, pinned(BROKER_CORE, cmd, pin), workdir, env)
    handle = BrokerHandle(
        FLOOR,
        "127.0.0.1",
        port,
        proc.pid,
        version,
        proc,
        workdir,
        log_path,
        description="a bare forwarder spinning on plain sockets (benchmarks/floor.py), not a broker",
    )
    _wait_port(handle, find_port=False)
    return handle


def start_variant(name: str, pin: bool, version: int = MQTT_5) -> BrokerHandle:
    """One of TUNED_VARIANTS, or the floor."""
    return start_floor(pin, version) if name == FLOOR else start_tuned(name, pin, version)


def external(address: str, pid: int | None, version: int = MQTT_5) -> BrokerHandle:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--broker wants HOST:PORT, got {address!r}")
    return BrokerHandle(
        "ours", host.strip("[]"), int(port), pid, version, description=f"external {address}"
    )


def restart(handle: BrokerHandle, pin: bool) -> BrokerHandle:
    """Start a managed broker again (after it died, or stalled); stop() has removed the old
    one's directory, its log with it, so a run record keeps the tail it needs first."""
    if handle.name == "amqtt":
        fresh = start_amqtt(pin)
    elif handle.name == "mosquitto":
        fresh = start_mosquitto(pin, handle.version)
    elif is_variant(handle.name):
        fresh = start_variant(handle.name, pin, handle.version)
    else:
        fresh = start_ours(pin, handle.version)
    fresh.crashes = handle.crashes
    return fresh
