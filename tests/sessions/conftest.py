"""Fixtures of the session tests: ``secure``, a broker with users (alice, bob, admin) and an ACL
file, started as a real process by the test (``support.secure_broker.SecureBroker``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.secure_broker import SecureBroker


@pytest.fixture
def secure(tmp_path: Path, start_broker: Callable[..., Any]) -> SecureBroker:
    return SecureBroker(tmp_path, start_broker)
