"""Fixtures of the conformance suite: the broker under test, raw clients, unique names.

By default the suite starts this project's broker (``python -m mqttbroker --port 0 --ws-port 0``:
MQTT over TCP, and over WebSocket for chapter 6). Options:

``--broker HOST:PORT``          test a broker that is already running
``--mosquitto``                 start Debian's ``/usr/sbin/mosquitto`` with a generated config
``--limited-broker HOST:PORT``  with ``--broker``: a second broker configured as LIMITED_PROFILE
                                (tests that need it are skipped when it is not given)
``--ws-broker HOST:PORT/PATH``  with ``--broker``: its MQTT over WebSocket listener (the chapter 6
                                tests are skipped when it is not given)
``--cluster HOST:PORT,HOST:PORT``  test running nodes of one cluster: every test's clients are
                                spread over them in turn (the first, third... on the first node)
``--cluster auto``              start a redis-server and two of our nodes on it, and test them so

Every test's docstring names the statements it checks as ``[MQTT-x.y.z-n]``; they are recorded as
the JUnit property ``statements`` so that ``python -m conformance.coverage`` can count them.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .mqtt import MQTT_5, Client

REPO = Path(__file__).resolve().parent.parent
STATEMENT = re.compile(r"\[(MQTT-\d+(?:\.\d+)*-\d+)\]")
# MQTT 3.1.1's statements are tagged [MQTT311-x.y.z-n] (the same ID means something else in 5.0);
# the ID recorded is the standard's, MQTT-x.y.z-n, of spec/mqtt311-normative.tsv.
STATEMENT_311 = re.compile(r"\[MQTT311-(\d+(?:\.\d+)*-\d+)\]")
MOSQUITTO = os.environ.get("MOSQUITTO", "/usr/sbin/mosquitto")

# The second, restricted broker some tests need: Maximum QoS 1, no retained messages, a 4096-byte
# Maximum Packet Size and no inbound topic aliases.
LIMITED_PROFILE = (
    "Maximum QoS 1, Retain Available 0, Maximum Packet Size 4096, Topic Alias Maximum 0"
)
LIMITED_MAX_PACKET_SIZE = 4096

_OURS_LIMITED_TOML = f"""\
[broker]
maximum_qos = 1
retain_available = false
max_packet_size = {LIMITED_MAX_PACKET_SIZE}
topic_alias_maximum = 0
"""
# Our main broker: the optional capabilities the suite checks, switched on.
_OURS_TOML = """\
[broker]
response_information = "response/%c/"
"""


def _ours_toml(workdir: Path, config: pytest.Config) -> str:
    """Our main broker's config, with a password file that knows the SCRAM test user
    (written by ``mqttbroker passwd``; anonymous clients stay allowed on loopback)."""
    passwd = workdir / "passwd"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttbroker",
            "passwd",
            "-c",
            "--password-stdin",
            "--iterations",
            "4096",
            str(passwd),
            config.getoption("--auth-user"),
        ],
        input=config.getoption("--auth-password") + "\n",
        text=True,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return _OURS_TOML + f'\n[security]\npassword_file = "{passwd}"\n'


_MOSQUITTO_LIMITED = """\
max_qos 1
max_topic_alias 0
"""
_MOSQUITTO_LIMITED_GLOBAL = f"""\
retain_available false
max_packet_size {LIMITED_MAX_PACKET_SIZE}
"""


def statements_of(item: Any, pattern: re.Pattern[str] = STATEMENT) -> list[str]:
    """The statement IDs in a test's docstring, in order, without repeats (MQTT 5.0's; with
    ``pattern=STATEMENT_311``, MQTT 3.1.1's)."""
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    return list(dict.fromkeys(pattern.findall(doc)))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "MQTT conformance suite")
    group.addoption(
        "--broker", metavar="HOST:PORT", help="test an already running broker at HOST:PORT"
    )
    group.addoption(
        "--limited-broker",
        metavar="HOST:PORT",
        help=f"with --broker: a second running broker configured with {LIMITED_PROFILE}",
    )
    group.addoption(
        "--ws-broker",
        metavar="HOST:PORT/PATH",
        help="with --broker: its MQTT over WebSocket listener, for the chapter 6 tests",
    )
    group.addoption(
        "--auth-method",
        default="SCRAM-SHA-256",
        help="enhanced authentication method of test_12_auth (default SCRAM-SHA-256)",
    )
    group.addoption(
        "--auth-user", default="conformance", help="user the broker knows (default conformance)"
    )
    group.addoption(
        "--auth-password",
        default="conformance-password",
        help="that user's password (default conformance-password)",
    )
    group.addoption(
        "--cluster",
        metavar="HOST:PORT,HOST:PORT",
        help="test the nodes of a cluster, each test's clients spread over them; 'auto': start "
        "a redis-server and two nodes of this broker",
    )
    group.addoption(
        "--mosquitto",
        action="store_true",
        help=f"start Debian's mosquitto ({MOSQUITTO}) on a free loopback port and test it",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--cluster"):
        from . import mqtt

        mqtt.SETTLE = 0.25
    if config.getoption("--ws-broker") and not config.getoption("--broker"):
        raise pytest.UsageError("--ws-broker names the WebSocket listener of a --broker")
    config.addinivalue_line(
        "markers",
        "feature: behaviour the spec leaves optional (a MAY, or an optional capability such as "
        "enhanced authentication) that issue 4 requires of this broker; a broker that lacks "
        "it fails the test without deviating from the spec",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        ids = statements_of(item)
        if ids:
            item.user_properties.append(("statements", " ".join(ids)))
        ids = statements_of(item, STATEMENT_311)
        if ids:
            item.user_properties.append(("statements311", " ".join(f"MQTT-{i}" for i in ids)))
        if item.get_closest_marker("feature"):
            item.user_properties.append(("feature", "1"))


@pytest.fixture
def unchecked(request: pytest.FixtureRequest) -> Any:
    """``unchecked(*ids)``: the broker gave this test nothing to check for these statements of
    its docstring (e.g. "leave out the Reason String when it would not fit" from a broker that
    sends none), so a pass proves nothing about them here: the coverage report counts them
    as named, not as checkable (see coverage.py)."""

    def mark(*ids: str) -> None:
        request.node.user_properties.append(("unchecked", " ".join(ids)))

    return mark


# -- brokers ------------------------------------------------------------------------------------


@dataclass
class Broker:
    """A broker under test: its address, what it is, and (if we started it) its log."""

    host: str
    port: int
    kind: str  # "mqttbroker", "mosquitto" or "external"
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=2000))
    process: subprocess.Popen[str] | None = None
    lines: int = 0  # log lines received so far
    ws: tuple[str, int, str] | None = None  # its MQTT over WebSocket listener: host, port, path
    # A cluster: every node's address (clients go to each in turn); the other nodes we started.
    addresses: list[tuple[str, int]] = field(default_factory=list)
    others: list[Broker] = field(default_factory=list)

    def log_since(self, mark: int) -> list[str]:
        """Log lines received after the ``lines`` count ``mark``."""
        new = self.lines - mark
        return list(self.log)[-new:] if new > 0 else []

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def stop(self) -> None:
        for other in self.others:
            other.stop()
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT, an IPv6 host in brackets ("[::1]:1883")."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise pytest.UsageError(f"expected HOST:PORT, got {text!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _drain(proc: subprocess.Popen[str], broker: Broker, ready: Any) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        broker.log.append(line.rstrip("\n"))
        broker.lines += 1
        ready(line)


def _start_ours(workdir: Path, config: str | None = None, ws: bool = False) -> Broker:
    """Our broker on a free port; with ``ws``, a WebSocket listener on another (``--ws-port``)."""
    cmd = [sys.executable, "-m", "mqttbroker", "--port", "0", "--log-level", "info"]
    if ws:
        cmd += ["--ws-port", "0"]
    if config is not None:
        path = workdir / "broker.toml"
        path.write_text(config)
        cmd += ["--config", str(path)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    broker = Broker("127.0.0.1", 0, "mqttbroker", process=proc)
    found = threading.Event()
    pattern = re.compile(r"listening on ([\d.]+):(\d+) \((MQTT over (?:TCP|WebSocket))\)")

    def ready(line: str) -> None:
        m = pattern.search(line)
        if m is None or found.is_set():
            return
        if m.group(3) == "MQTT over TCP":
            broker.host, broker.port = m.group(1), int(m.group(2))
        else:
            broker.ws = (m.group(1), int(m.group(2)), "/mqtt")
        if broker.port and (broker.ws is not None or not ws):
            found.set()

    threading.Thread(target=_drain, args=(proc, broker, ready), daemon=True).start()
    deadline = time.monotonic() + 15
    while not found.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            broker.stop()
            raise RuntimeError("mqttbroker did not start:\n" + "\n".join(broker.log))
    return broker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mosquitto_passwords(workdir: Path, config: pytest.Config) -> str:
    """A ``password_file`` line for a file (mosquitto_passwd's) that knows ``--auth-user``, so
    that the password check can be tested; anonymous clients stay allowed."""
    passwd = workdir / "passwd"
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(tool).exists():
        pytest.exit("--mosquitto: mosquitto_passwd not found (apt-get install mosquitto)", 2)
    subprocess.run(
        [tool, "-c", "-b", str(passwd)]
        + [config.getoption("--auth-user"), config.getoption("--auth-password")],
        check=True,
        capture_output=True,
    )
    os.chmod(passwd, 0o644)  # read by the user mosquitto drops root for
    return f"password_file {passwd}\n"


def _start_mosquitto(workdir: Path, limited: bool = False, passwords: str = "") -> Broker:
    if not Path(MOSQUITTO).exists() and not shutil.which("mosquitto"):
        pytest.exit(f"--mosquitto: {MOSQUITTO} not found (apt-get install mosquitto)", 2)
    port = _free_port()
    conf = workdir / "mosquitto.conf"
    text = (
        "per_listener_settings false\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "log_dest stderr\n"
        "log_type all\n"
        "sys_interval 0\n"
        + passwords
        + (_MOSQUITTO_LIMITED_GLOBAL if limited else "")
        + f"listener {port} 127.0.0.1\n"
        + (_MOSQUITTO_LIMITED if limited else "")
    )
    conf.write_text(text)
    os.chmod(workdir, 0o755)
    os.chmod(conf, 0o644)
    proc = subprocess.Popen(
        [MOSQUITTO, "-c", str(conf)],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    broker = Broker("127.0.0.1", port, "mosquitto", process=proc)
    threading.Thread(target=_drain, args=(proc, broker, lambda line: None), daemon=True).start()
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(broker.address, timeout=1).close()
            return broker
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                broker.stop()
                raise RuntimeError("mosquitto did not start:\n" + "\n".join(broker.log)) from None
            time.sleep(0.02)


_brokers: list[Broker] = []


def _start_redis(workdir: Path) -> Broker:
    """redis-server on a free loopback port, nothing on disk."""
    port = _free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(port)]
        + ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    redis = Broker("127.0.0.1", port, "redis-server", process=proc)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(redis.address, timeout=1).close()
            return redis
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                redis.stop()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.02)


def _start_cluster(config: pytest.Config) -> Broker:
    """``--cluster``: the running nodes named, or (``auto``) two of ours on a new Redis."""
    option = config.getoption("--cluster")
    if option != "auto":
        addresses = [_parse_address(a.strip()) for a in option.split(",") if a.strip()]
        if len(addresses) < 2:
            raise pytest.UsageError("--cluster: name at least two nodes, HOST:PORT,HOST:PORT")
        return Broker(*addresses[0], "external", addresses=addresses)
    workdir = Path(tempfile.mkdtemp(prefix="mqtt-conformance-cluster-"))
    redis = _start_redis(workdir)
    nodes = [redis]
    try:
        for index in range(2):
            directory = workdir / f"node{index}"
            directory.mkdir()
            toml = _ours_toml(directory, config).replace(
                "[broker]",
                f'[cluster]\nredis = "redis://127.0.0.1:{redis.port}/0"\n'
                f'node_id = "conformance-{index}"\n\n[broker]',
                1,
            )
            nodes.append(_start_ours(directory, toml, ws=index == 0))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    first = nodes[1]
    first.addresses = [node.address for node in nodes[1:]]
    first.others = [nodes[2], redis]  # stopped after the first node
    return first


def _start(config: pytest.Config, limited: bool) -> Broker | None:
    if config.getoption("--cluster") and not limited:
        broker = _start_cluster(config)
        _brokers.append(broker)
        return broker
    external = config.getoption("--limited-broker" if limited else "--broker")
    if external:
        host, port = _parse_address(external)
        broker = Broker(host, port, "external")
        ws = config.getoption("--ws-broker")
        if ws and not limited:
            address, slash, path = ws.partition("/")
            broker.ws = (*_parse_address(address), slash + path or "/mqtt")
        return broker
    if config.getoption("--broker"):
        return None  # an external broker under test but no limited one given
    workdir = Path(tempfile.mkdtemp(prefix="mqtt-conformance-"))
    if config.getoption("--mosquitto"):
        passwords = "" if limited else _mosquitto_passwords(workdir, config)
        broker = _start_mosquitto(workdir, limited, passwords)
    else:
        broker = _start_ours(
            workdir,
            _OURS_LIMITED_TOML if limited else _ours_toml(workdir, config),
            ws=not limited,
        )
    _brokers.append(broker)
    return broker


@pytest.fixture(scope="session")
def broker(pytestconfig: pytest.Config) -> Iterator[Broker]:
    b = _start(pytestconfig, limited=False)
    assert b is not None
    yield b
    b.stop()


@pytest.fixture(scope="session")
def limited_broker(pytestconfig: pytest.Config) -> Iterator[Broker]:
    b = _start(pytestconfig, limited=True)
    if b is None:
        pytest.skip(f"needs --limited-broker HOST:PORT (a broker with {LIMITED_PROFILE})")
    yield b
    b.stop()


@pytest.fixture(scope="session")
def ws_broker(broker: Broker) -> tuple[str, int, str]:
    """The WebSocket listener of the broker under test: (host, port, path)."""
    if broker.ws is None:
        if broker.kind == "mosquitto":
            pytest.skip(
                "the suite gives Mosquitto no WebSocket listener: Debian's 2.0.11 is built "
                "without WebSocket support (a listener with protocol websockets does not start)"
            )
        pytest.skip("needs --ws-broker HOST:PORT/PATH (the broker's MQTT over WebSocket listener)")
    return broker.ws


def pytest_sessionfinish(session: pytest.Session) -> None:
    for b in _brokers:
        b.stop()


# -- clients ------------------------------------------------------------------------------------


class Clients:
    """Makes raw clients for one test and closes them all at its end."""

    def __init__(self, broker: Broker, uid: str) -> None:
        self.broker = broker
        self.uid = uid
        self.made: list[Client] = []
        self._count = 0
        self.log_mark = broker.lines

    def new(self, version: int = MQTT_5, name: str = "") -> Client:
        """A TCP connection, nothing sent yet."""
        self._count += 1
        addresses = self.broker.addresses or [self.broker.address]
        address = addresses[(self._count - 1) % len(addresses)]  # a cluster: each node in turn
        client = Client(address, version, name or f"{self.uid}-{self._count}")
        self.made.append(client)
        return client

    def connected(self, client_id: str | None = None, version: int = MQTT_5, **kw: Any) -> Client:
        """A connected client; its id defaults to a new unique one."""
        client = self.new(version, client_id or "")
        client.connect(client_id if client_id is not None else client.name, **kw)
        return client

    def close_all(self) -> None:
        for client in self.made:
            client.close()


@pytest.fixture
def uid() -> str:
    """A short unique name for this test's client ids and topics."""
    return "cf" + uuid.uuid4().hex[:12]


@pytest.fixture
def clients(broker: Broker, uid: str) -> Iterator[Clients]:
    made = Clients(broker, uid)
    yield made
    made.close_all()


@pytest.fixture
def limited_clients(limited_broker: Broker, uid: str) -> Iterator[Clients]:
    made = Clients(limited_broker, uid)
    yield made
    made.close_all()


@pytest.fixture
def topic(uid: str) -> str:
    """A topic no other test uses."""
    return f"conformance/{uid}"


@pytest.fixture
def retained(broker: Broker, uid: str) -> Iterator[Any]:
    """``retained(topic)`` registers a topic whose retained message is cleared after the test."""
    topics: list[str] = []
    yield topics.append
    if topics:
        try:
            client = Client(broker.address, MQTT_5, uid + "-cleanup")
            client.connect(uid + "-cleanup")
            for name in topics:
                client.publish(name, b"", retain=True)
            client.disconnect()
        except (OSError, AssertionError):
            pass


# -- reporting ----------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    # Attach what each client sent and received, and the broker's log lines, to the failure.
    for attr in ("clients", "limited_clients"):
        made = item.funcargs.get(attr) if hasattr(item, "funcargs") else None
        if isinstance(made, Clients):
            for client in made.made:
                report.sections.append((f"wire {client.name}", "\n".join(client.log[-60:])))
            tail = made.broker.log_since(made.log_mark)[-80:]
            if tail:
                report.sections.append((f"{made.broker.kind} log (tail)", "\n".join(tail)))
