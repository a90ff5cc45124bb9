"""Support for the integration tests: our broker started from a TOML file. Mosquitto
(``support.launcher.Mosquitto``), the collecting subscriber (``support.clients.Collector``) and
the publishers (the ``paho`` fixture) come from tests/support."""

from __future__ import annotations

from pathlib import Path


def write_config(path: Path, text: str) -> tuple[str, ...]:
    """The arguments that start our broker from this TOML text."""
    path.write_text(text)
    return ("--config", str(path))
