"""Configuration: the shipped example matches the defaults, and every error names file and key."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from support.launcher import BrokerProcess, run_broker

from mqttbroker.config import (
    BridgeConfig,
    Config,
    ConfigError,
    ListenerConfig,
    TopicRule,
    WebhookConfig,
    load,
)
from mqttbroker.config.integrations import EXTRA_KEYS
from mqttbroker.config.keys import key_types
from mqttbroker.config.read import TABLES

ROOT = Path(__file__).resolve().parent.parent


def test_example_config_lists_the_defaults() -> None:
    """config/mqttbroker.toml documents every key; its values must be the real defaults."""
    assert load(ROOT / "config" / "mqttbroker.toml") == Config()


def test_example_config_names_every_key() -> None:
    """Each key the configuration reads stands in config/mqttbroker.toml: set in its table, or
    as a commented-out line (keys without a default value, [[bridge]] and [[webhook]])."""
    text = (ROOT / "config" / "mqttbroker.toml").read_text()
    data = tomllib.loads(text)
    commented = set(re.findall(r"^# (\w+) = ", text, re.MULTILINE))
    tables: dict[str, tuple[set[str], set[str]]] = {
        name: (set(key_types(cls)), set(data.get(name, {}))) for name, cls in TABLES.items()
    }
    tables["listener"] = (set(key_types(ListenerConfig)), set(data["listener"][0]))
    tables["top level"] = (set(key_types(Config)) - set(TABLES), set(data))
    for kind, cls in (("bridge", BridgeConfig), ("webhook", WebhookConfig)):
        tables[kind] = ((set(key_types(cls)) | set(EXTRA_KEYS[kind])) - {"topic"}, set())
    tables["bridge.topic"] = (set(key_types(TopicRule)), set())
    for name, (keys, set_there) in tables.items():
        assert keys - set_there - commented == set(), name


def test_no_file_gives_defaults() -> None:
    assert load(None) == Config()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[broker]\nmax_packet_size = 'big'\n", "broker.max_packet_size: expected an integer"),
        (
            "[broker]\nmax_packet_sise = 10\n",
            "broker.max_packet_sise: unknown key; did you mean max_packet_size?",
        ),
        ("log_levl = 'info'\n", "log_levl: unknown key; did you mean log_level?"),
        ("[cluster]\nredis_url = ''\n", "cluster.redis_url: unknown key; did you mean redis?"),
        ("[broker]\nretain_available = 1\n", "broker.retain_available: expected true or false"),
        ("[broker]\nmax_packet_size = true\n", "broker.max_packet_size: expected an integer"),
        ("[broker]\nreceive_maximum = 0\n", "broker.receive_maximum must be between"),
        ("[storage]\nsync = 'sometimes'\n", "storage.sync: expected"),
        ("[storage]\non_corrupt = 'delete'\n", "storage.on_corrupt: expected"),
        ("[storage]\ndefer_wait = -0.1\n", "storage.defer_wait: must be between 0 and 60"),
        ("[storage]\ndefer_wait = 61\n", "storage.defer_wait: must be between 0 and 60"),
        ("[storage]\ndefer_wait = 'soon'\n", "storage.defer_wait: expected a number"),
        ("[[listener]]\nport = 70000\n", "listener[0].port: must be between"),
        (
            "workers = 2\n[cluster]\nredis = 'redis://127.0.0.1/0'\n[admin]\nport = 65535\n"
            "[[listener]]\nport = 1883\n",
            "admin.port: 65535 + 1 (one port per worker) is past 65535",
        ),
        (
            "workers = 3\n[cluster]\nredis = 'redis://127.0.0.1/0'\n[admin]\nport = 18083\n"
            "[[listener]]\nport = 18085\n",
            "admin.port: worker 2's admin port 18085 is listener[0]'s port",
        ),
        ("[[listener]]\nhots = 'x'\n", "listener[0].hots: unknown key; did you mean host?"),
        ("[storage]\nzzz = 1\n", "storage.zzz: unknown key; known keys: backend, commit_interval"),
        ("log_level = 'loud'\n", "log_level: expected one of"),
        ("gc_threshold = -1\n", "gc_threshold: must be between 0 and 2147483647"),
        ("gc_threshold = 3000000000\n", "gc_threshold: must be between 0 and 2147483647"),
        ("gc_threshold = '700'\n", "gc_threshold: expected an integer"),
        ("fd_table = -1\n", "fd_table: must be between 0 (off) and 1,048,576"),
        ("fd_table = 16384.0\n", "fd_table: expected an integer"),
        (
            "[[listener]]\nprotocol = 'ws'\nws_trusted_proxies = '10.0.0.0/8, 10.0.0.0/33'\n",
            "listener[0].ws_trusted_proxies: not an IP address or network: '10.0.0.0/33'",
        ),
        (
            "[[listener]]\nprotocol = 'ws'\nws_trusted_proxies = ' , '\n",
            "listener[0].ws_trusted_proxies: no address in ' , '",
        ),
        (
            "[[listener]]\nws_trusted_proxies = '127.0.0.1'\n",
            'listener[0].ws_trusted_proxies: needs protocol = "ws"',
        ),
        ("busy_poll_us = -1\n", "busy_poll_us: must be between 0 (off) and 1,000,000"),
        ("busy_poll_us = 1000001\n", "busy_poll_us: must be between 0 (off) and 1,000,000"),
        ("busy_poll_us = 2.5\n", "busy_poll_us: expected an integer"),
        ("gather_us = -1\n", "gather_us: must be between 0 (off) and 10,000 (10 ms)"),
        ("gather_us = 10001\n", "gather_us: must be between 0 (off) and 10,000 (10 ms)"),
        ("gather_us = '200'\n", "gather_us: expected an integer"),
        (
            "gather_us = 200\nbusy_poll_us = 2000\n",
            "gather_us and busy_poll_us: set one or the other",
        ),
        (
            "[broker]\nconnection_log_interval = -1\n",
            "broker.connection_log_interval must not be negative",
        ),
        (
            "[broker]\nconnection_log_interval = 'often'\n",
            "broker.connection_log_interval: expected a number",
        ),
        (
            "[broker]\nconnection_log_rate = -1\n",
            "broker.connection_log_rate must not be negative",
        ),
        (
            "[broker]\nconnection_log_rate = 1.5\n",
            "broker.connection_log_rate: expected an integer",
        ),
        ("colour = 'blue'\n", "colour: unknown key"),
        ("broker = 3\n", "broker: expected a table"),
        ("[broker\n", "not valid TOML"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nothere.toml: file not found"):
        load(tmp_path / "nothere.toml")


def test_values_are_applied(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(
        "data_dir = '/var/lib/mqtt'\n[broker]\nmax_keepalive = 30\nconnect_timeout = 5\n"
        "[[listener]]\nhost = '0.0.0.0'\nport = 1884\n[storage]\nsync = 'normal'\n"
    )
    config = load(path)
    assert config.broker.max_keepalive == 30
    assert config.broker.connect_timeout == 5.0
    assert [(x.host, x.port) for x in config.listeners] == [("0.0.0.0", 1884)]
    assert config.storage.sync == "normal"
    assert config.store_path == Path("/var/lib/mqtt/mqttbroker.db")


def test_storage_values_reach_the_store(tmp_path: Path) -> None:
    from mqttbroker.server.app import Server
    from mqttbroker.storage.sqlite import SQLiteStore

    path = tmp_path / "store.toml"
    path.write_text(
        f"data_dir = '{tmp_path}'\n[storage]\nsync = 'normal'\ncommit_interval = 0.25\n"
        "defer_wait = 0\n"
    )
    store = Server._make_store(load(path))
    assert isinstance(store, SQLiteStore)
    assert (store.sync, store.commit_interval, store.defer_wait) == ("normal", 0.25, 0)
    default = Server._make_store(Config())
    assert isinstance(default, SQLiteStore) and default.defer_wait == 0.05


@pytest.mark.parametrize(
    ("text", "gather_us"),
    [
        ("", 200),  # on by default
        ("busy_poll_us = 2000\n", 0),  # busy polling alone turns it off
        ("busy_poll_us = 2000\ngather_us = 0\n", 0),
        ("gather_us = 50\n", 50),
        ("gather_us = 0\n", 0),
    ],
)
def test_gather_us_is_on_unless_busy_polling(tmp_path: Path, text: str, gather_us: int) -> None:
    path = tmp_path / "gather.toml"
    path.write_text(text)
    assert load(path).gather_us == gather_us


def test_cli_reports_config_errors_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[broker]\nmaximum_qos = 3\n")
    result = run_broker("--config", str(path))
    assert result.returncode == 2
    assert f"{path}: broker.maximum_qos must be 0, 1 or 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_exposed_example_has_only_known_keys() -> None:
    """config/exposed.toml (the worked example for an internet-facing broker) parses; the only
    complaint on a machine without its certificate files is the first missing file."""
    with pytest.raises(ConfigError) as info:
        load(ROOT / "config" / "exposed.toml")
    assert "tls_cert_file: file not found: /etc/mqttbroker/tls/server.pem" in str(info.value)


def _gc_after(code: str) -> list[str]:
    code = f"import gc; {code}; print(gc.get_threshold()); print(gc.get_freeze_count() > 0)"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()


def test_gc_threshold_is_applied() -> None:
    """gc_threshold sets the collector's first threshold (the middle generation every fifth of
    those, a full collection at most every thousandth) and 0 leaves Python's own; either way
    the objects that exist at start are frozen out of later collections."""
    default = _gc_after("pass")[0]
    tune = "from mqttbroker.server.app import _tune_gc; _tune_gc"
    assert _gc_after(f"{tune}(0)") == [default, "True"]
    tuned = _gc_after(f"{tune}(1234)")
    assert tuned[0].startswith("(1234, ") and tuned[1] == "True"
    if sys.version_info < (3, 14):  # the three generations of the classic collector
        assert tuned[0] == "(1234, 5, 200)"


def _fd_table_size(pid: int | str = "self") -> int:
    """The size of a process's file descriptor table (Linux: FDSize in /proc/<pid>/status)."""
    return int(Path(f"/proc/{pid}/status").read_text().split("FDSize:")[1].split()[0])


def _fd_table_after(count: int, soft_limit: int = 0) -> tuple[int, int]:
    code = (
        "import resource, sys; sys.path.insert(0, 'tests'); from test_config import _fd_table_size"
        "\nfrom mqttbroker.server.app import _size_fd_table"
        f"\nif {soft_limit}: resource.setrlimit(resource.RLIMIT_NOFILE, "
        f"({soft_limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))"
        f"\nprint(_size_fd_table({count}), _fd_table_size())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RCU: Linux only")
def test_fd_table_is_sized_at_start_up_to_the_open_file_limit() -> None:
    """fd_table: the descriptor table holds that many descriptors at once (Linux rounds up to a
    power of two), never more than the open-file limit allows; 0 leaves it to grow."""
    untouched = _fd_table_after(0)
    assert untouched[0] == 0 and untouched[1] < 1000
    assert _fd_table_after(5000, soft_limit=min(6000, _hard_limit())) == (5000, 8192)
    assert _fd_table_after(5000, soft_limit=1024) == (1024, 1024)


def _hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_the_broker_sizes_its_descriptor_table_before_clients_arrive(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """A fresh broker's table already holds its clients' descriptors: at the default
    (16,384), capped by an open-file limit of 4,096, it has 4,096 slots before any client
    connects; with fd_table = 0 it starts at the kernel's small default."""
    limit = min(4096, _hard_limit())

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, _hard_limit()))

    default = start_broker(preexec_fn=lower_limit)
    assert default.proc is not None
    assert _fd_table_size(default.proc.pid) == limit
    off = tmp_path / "off.toml"
    off.write_text("fd_table = 0\n")
    unsized = start_broker(preexec_fn=lower_limit, extra_args=("--config", str(off)))
    assert unsized.proc is not None
    assert _fd_table_size(unsized.proc.pid) < min(limit, 1024)


def test_an_unknown_command_suggests_the_likely_one() -> None:
    result = run_broker("chek-config", "broker.toml")
    assert result.returncode == 2
    assert (
        result.stderr == "mqttbroker: unknown command 'chek-config'; did you mean check-config?\n"
    )
    result = run_broker("start")
    assert result.returncode == 2
    assert "unknown command 'start'; commands: passwd, check-config, convert-config" in (
        result.stderr
    )


def test_the_cluster_install_hint_is_the_readme_s(tmp_path: Path) -> None:
    """Without the redis package, [cluster] redis names the install command the README gives."""
    readme = (ROOT / "README.md").read_text()
    command = "pip install '.[cluster]'"
    assert command in readme
    path = tmp_path / "cluster.toml"
    path.write_text('[cluster]\nredis = "redis://127.0.0.1:6379/0"\n')
    code = (
        "import sys; sys.modules['redis'] = None  # as if the redis package were not installed\n"
        "from mqttbroker.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "check-config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert f"cluster.redis: cluster mode needs the redis package ({command}" in result.stderr
