"""What the broker says and settles when it starts: its version and configuration file, the
absolute store path, ``data_dir`` relative to the configuration file, library loggers kept at
info unless ``log_levels`` asks, and ``--allow-anonymous`` (named by the warning of a broker that
would refuse every client)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from mqttbroker import __version__
from mqttbroker.config import ConfigError, load


def test_data_dir_in_a_config_file_is_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "broker.toml"
    path.write_text('data_dir = "state"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load(path).store_path == conf / "state" / "mqttbroker.db"
    monkeypatch.chdir(conf)
    assert load("broker.toml").store_path == conf / "state" / "mqttbroker.db"
    path.write_text('data_dir = "/var/lib/mqtt"\n')
    assert load(path).store_path == Path("/var/lib/mqtt/mqttbroker.db")


def test_log_levels_must_name_levels(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('log_levels = { aiosqlite = "loud" }\n')
    with pytest.raises(ConfigError) as info:
        load(path)
    assert f"{path}: log_levels.aiosqlite: expected one of debug, info" in str(info.value)
    path.write_text('log_levels = "debug"\n')
    with pytest.raises(ConfigError) as info:
        load(path)
    assert f"{path}: log_levels: expected a table of logger = level" in str(info.value)
    path.write_text('log_levels = { aiosqlite = "DEBUG", asyncio = "warning" }\n')
    assert load(path).log_levels == {"aiosqlite": "debug", "asyncio": "warning"}


def test_startup_lines_name_the_version_the_config_file_and_the_absolute_store(
    start_broker: Callable, tmp_path: Path
) -> None:
    """A relative --data-dir stays relative to the working directory; the log says where."""
    work = tmp_path / "work"
    work.mkdir()
    broker = start_broker(cwd=work, extra_args=("--data-dir", "rel"))
    log = broker.log_text()
    assert f"mqttbroker {__version__}, no config file" in log, log
    assert f"store {work / 'rel' / 'mqttbroker.db'}: opening" in log, log

    config = tmp_path / "conf" / "broker.toml"
    config.parent.mkdir()
    config.write_text('data_dir = "state"\n')
    relative = os.path.relpath(config, work)
    broker = start_broker(cwd=work, extra_args=("--config", relative, "--data-dir", "rel2"))
    log = broker.log_text()
    assert f"mqttbroker {__version__}, config file {config}" in log, log
    assert f"store {work / 'rel2' / 'mqttbroker.db'}: opening" in log, log


def test_debug_leaves_library_loggers_at_info_unless_log_levels_asks(
    start_broker: Callable, tmp_path: Path
) -> None:
    broker = start_broker(log_level="debug")
    assert broker.wait_for_log(r"DEBUG mqttbroker", 0), broker.log_text()
    assert " DEBUG aiosqlite" not in broker.log_text(), broker.log_text()

    config = tmp_path / "broker.toml"
    config.write_text('log_levels = { aiosqlite = "debug" }\n')
    broker = start_broker(extra_args=("--config", str(config)))
    assert broker.wait_for_log(r" DEBUG aiosqlite", 0), broker.log_text()
    assert " DEBUG mqttbroker" not in broker.log_text(), broker.log_text()


def test_allow_anonymous_flag_and_the_warning_that_names_it(start_broker: Callable) -> None:
    refused = start_broker(extra_args=("--host", "0.0.0.0"))
    warning = refused.wait_for_log(r"WARNING .*every client will be refused", 0)
    assert warning is not None, refused.log_text()
    assert "--allow-anonymous" in warning.string and "allow_anonymous = true" in warning.string

    allowed = start_broker(extra_args=("--host", "0.0.0.0", "--allow-anonymous"))
    assert "every client will be refused" not in allowed.log_text()
    with socket.create_connection(("127.0.0.1", allowed.port), timeout=10) as sock:
        # CONNECT, MQTT 5, clean start, no user name
        sock.sendall(bytes.fromhex("101000044d5154540502003c000003616e6f"))
        connack = sock.recv(64)
    assert connack[:1] == b"\x20" and connack[3] == 0, connack.hex(" ")
