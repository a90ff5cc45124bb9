"""``python signalled_while_loading.py SIGNAL ARGS``: ``mqttbroker ARGS``, sent SIGNAL (``TERM``
or ``INT``) by itself while it reads its configuration, before its event loop runs: the moment a
supervisor's stop can fall on, made certain."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import mqttbroker.cli as cli

_load = cli.load
_signal = signal.Signals[f"SIG{sys.argv.pop(1)}"]


def _load_and_be_signalled(path: str | Path | None) -> Any:
    os.kill(os.getpid(), _signal)
    return _load(path)


cli.load = _load_and_be_signalled

if __name__ == "__main__":
    sys.exit(cli.main())
