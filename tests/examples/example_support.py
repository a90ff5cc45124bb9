"""What the tests of examples/ share: where the examples are, how to start one (as a user
would, ``python examples/NAME.py ...``), the paho client of the end-to-end tests, and the
Mosquitto and paho collectors of the integration tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import PahoClient, unique

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
path = str(ROOT / "tests" / "integrations")
if path not in sys.path:
    sys.path.insert(0, path)

from integration_support import (  # noqa: E402
    Collector,
    Mosquitto,
    publish_all,
    publisher,
    wait_for,
)

__all__ = [
    "EXAMPLES",
    "Collector",
    "Mosquitto",
    "PahoClient",
    "example",
    "publish_all",
    "publisher",
    "simulator",
    "unique",
    "wait_for",
]


def example(start_program: Callable[..., Any], script: str, *args: str, ready: str) -> Any:
    """Start ``examples/<script>`` with ``args``; waits until it logs ``ready``."""
    return start_program([sys.executable, str(EXAMPLES / script), *args], ready)


def simulator(start_program: Callable[..., Any], broker: Any, prefix: str, *extra: str) -> Any:
    """The device simulator on ``broker``, topics under ``prefix``, a reading every 0.1 s."""
    return example(
        start_program,
        "device_simulator.py",
        "--host",
        broker.host,
        "--port",
        str(broker.port),
        "--prefix",
        prefix,
        "--id-prefix",
        prefix.replace("/", "-"),
        "--interval",
        "0.1",
        *extra,
        ready=r"running on (\S+):(\d+)",
    )
