"""A pytest plugin of check_transport_memory.sh: loads ``mqttbroker.server._streams`` (the C
transport) from the shared object that ``MQTTBROKER_STREAMS_SO`` names (a build with
AddressSanitizer, say, or the installed one) and says so in the header of the run, which stops
at once if the C transport would not run (the compiled form stale, say). Loaded with
``-p streams_override`` (``scripts/`` on PYTHONPATH), before any test module imports the
package; the rest of the compiled package is the one installed."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

import pytest

MODULE = "mqttbroker.server._streams"
PATH = os.environ.get("MQTTBROKER_STREAMS_SO", "")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, PATH)
        return importlib.util.spec_from_file_location(fullname, PATH, loader=loader)


if not PATH or not os.path.exists(PATH):
    raise SystemExit(f"streams_override: MQTTBROKER_STREAMS_SO={PATH!r} is not a file")
if MODULE in sys.modules:
    raise SystemExit(f"streams_override: {MODULE} was imported before the plugin")
sys.meta_path.insert(0, _Finder())


def pytest_configure(config: pytest.Config) -> None:
    """Stop before any test when the C transport would not run (its tests would be skipped,
    and the run would prove nothing): the compiled form not current, say."""
    from mqttbroker import compiled
    from mqttbroker.server import _streams, streams

    if _streams.__file__ != PATH:
        pytest.exit(f"streams_override: {MODULE} came from {_streams.__file__}", returncode=2)
    if not streams.available():
        pytest.exit(f"streams_override: the C transport would not run: {compiled.reason}", 2)


def pytest_report_header() -> str:
    return f"C transport: {PATH}"
