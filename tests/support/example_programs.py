"""The programs in examples/: where they are and how to start one (as a user would,
``python examples/NAME.py ...``). Clients, Mosquitto and the rest come from
tests/support."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from support.launcher import ROOT

EXAMPLES = ROOT / "examples"


def example(start_program: Callable[..., Any], script: str, *args: str, ready: str) -> Any:
    """Start ``examples/<script>`` with ``args``; waits until it logs ``ready``."""
    return start_program([sys.executable, str(EXAMPLES / script), *args], ready)


def run_example(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<script>`` with ``args`` to its end (``timeout``: a guard), as a user
    would; its exit status and output."""
    command = [sys.executable, str(EXAMPLES / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


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
