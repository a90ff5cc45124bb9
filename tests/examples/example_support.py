"""What the tests of examples/ share: where the examples are, how to start one (as a user
would, ``python examples/NAME.py ...``), and the paho client of the end-to-end tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
E2E = ROOT / "tests" / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))

from helpers import PahoClient, unique  # noqa: E402

__all__ = ["EXAMPLES", "PahoClient", "example", "unique"]


def example(
    start_program: Callable[..., Any], script: str, *args: str, ready: str
) -> Any:
    """Start ``examples/<script>`` with ``args``; waits until it logs ``ready``."""
    return start_program([sys.executable, str(EXAMPLES / script), *args], ready)
