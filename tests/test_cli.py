"""``mqttbroker check-config FILE`` (exit 0 or 2, nothing started) and ``log_format = "json"``
(one object per line with stable keys, client strings escaped)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import RawClient, connect_packet
from support.launcher import ROOT, run_broker


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return run_broker("check-config", str(path))


def test_check_config_accepts_the_shipped_example() -> None:
    result = check_config(ROOT / "config" / "mqttbroker.toml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("mqttbroker.toml: valid")


def test_check_config_names_the_file_and_key_and_binds_nothing(tmp_path: Path) -> None:
    # The port is taken: a broker would fail to bind it; check-config does not try.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        good = tmp_path / "good.toml"
        good.write_text(f"[[listener]]\nport = {port}\n[admin]\nport = {port}\n")
        assert check_config(good).returncode == 0
    cases = {
        "[alerts]\noldest_queued_age = -1\n": "alerts.oldest_queued_age: must not be negative",
        '[admin]\nhost = "10.1.2.3"\n': "admin.host: '10.1.2.3' is not a loopback address",
        '[admin]\nadmin_users = "ops"\n': "admin.admin_users: needs security.password_file",
        '[admin]\ntoken_file = "/nonexistent/token"\n': "admin.token_file: file not found",
        'log_format = "xml"\n': 'log_format: expected "text" or "json"',
        "[admin]\ncolour = 1\n": "admin.colour: unknown key",
    }
    for text, error in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        result = check_config(bad)
        assert result.returncode == 2, (text, result)
        assert f"{bad}: {error}" in result.stderr, result.stderr


def test_json_logs_are_one_object_per_line(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    config = tmp_path / "json.toml"
    config.write_text('log_format = "json"\n')
    broker = start_broker(extra_args=("--config", str(config), "--memory"))
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet("evil\nINFO forged line"))
        raw.read_packet()
    broker.stop()
    lines = [line for line in broker.log_lines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(set(e) >= {"time", "level", "logger", "message"} for e in entries)
    assert any(e["level"] == "info" and "listening on" in e["message"] for e in entries)
    assert not any(line.startswith("INFO forged") for line in lines)
