"""Fixtures of the security tests. The broker state-machine harness (tests/broker) and the
end-to-end helpers (tests/e2e) are shared with those suites, so their folders go on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent / "broker", HERE.parent / "e2e"):
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
