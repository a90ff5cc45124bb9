"""deploy/: the systemd unit passes ``systemd-analyze verify`` and has its hardening; the
container's health check (the command its HEALTHCHECK runs) tells a serving broker from a
stopped one; the container's configuration refuses to start without its password file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.external_tools import program
from support.password_files import password_file

from mqttbroker.config import ConfigError, load

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def unit_settings() -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in (DEPLOY / "mqttbroker.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_systemd_unit_runs_confined_as_its_own_user() -> None:
    unit = unit_settings()
    assert unit["User"] == "mqttbroker" and unit["StateDirectory"] == "mqttbroker"
    assert "--data-dir /var/lib/mqttbroker" in unit["ExecStart"]
    assert unit["Restart"] == "on-failure"
    assert unit["NoNewPrivileges"] == "yes" and unit["ProtectSystem"] == "strict"
    assert unit["ReadWritePaths"] == "/var/lib/mqttbroker"


@pytest.mark.needs_systemd
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` finds nothing to say about the unit (with ExecStart pointing at
    a program that exists here, since the broker is not installed in /usr/local/bin)."""
    text = (DEPLOY / "mqttbroker.service").read_text()
    unit = tmp_path / "mqttbroker.service"
    unit.write_text(text.replace("/usr/local/bin/mqttbroker", sys.executable))
    result = subprocess.run(
        [program("systemd-analyze"), "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def healthcheck_command(port: int) -> list[str]:
    """The Containerfile's HEALTHCHECK command, with the script's path in the image mapped back
    to the repository, and the port replaced by ``port``."""
    text = (DEPLOY / "Containerfile").read_text()
    copied = dict(
        (target, source) for source, target in re.findall(r"^COPY (deploy/\S+) (\S+)$", text, re.M)
    )
    found = re.search(r"^HEALTHCHECK .*?CMD (\[.*?\])$", text, re.M | re.S)
    assert found is not None, "deploy/Containerfile has no HEALTHCHECK CMD [...]"
    command = json.loads(found.group(1))
    assert command[0] == "python" and command[-1] == "1883", command
    args = [str(ROOT / copied[arg]) if arg in copied else arg for arg in command[1:-1]]
    return [sys.executable, *args, str(port)]


def container_config(tmp_path: Path) -> Path:
    """deploy/mqttbroker.container.toml with a password file in place of the mounted secret, the
    data in tmp_path and any free port."""
    passwd = password_file(tmp_path / "passwd", {"dashboard": b"secret"})
    text = (DEPLOY / "mqttbroker.container.toml").read_text()
    for old, new in [
        ('"/run/secrets/mqttbroker-passwd"', f'"{passwd}"'),
        ('"/data"', f'"{tmp_path / "data"}"'),
        ("port = 1883\n", "port = 0\n"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "container.toml"
    config.write_text(text)
    return config


def test_container_healthcheck_against_a_running_broker(start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker(extra_args=("--config", str(container_config(tmp_path))))
    check = subprocess.run(
        healthcheck_command(broker.port), capture_output=True, text=True, timeout=30
    )
    # the container requires a password: the anonymous check is refused, and that is an answer
    assert check.returncode == 0, check.stdout + check.stderr
    assert "healthy" in check.stdout and "return code 5" in check.stdout
    broker.stop()
    down = subprocess.run(
        healthcheck_command(broker.port), capture_output=True, text=True, timeout=30
    )
    assert down.returncode == 1 and "unhealthy" in down.stdout, down.stdout


def test_container_healthcheck_connects_where_anonymous_is_allowed(fresh_broker: Any) -> None:
    check = subprocess.run(
        healthcheck_command(fresh_broker.port), capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0 and "healthy" in check.stdout and "connected" in check.stdout


def test_container_config_needs_its_password_file() -> None:
    """Without the secret mounted the broker does not start, and says which file is missing."""
    with pytest.raises(ConfigError, match="security.password_file: file not found: /run/secrets"):
        load(DEPLOY / "mqttbroker.container.toml")
