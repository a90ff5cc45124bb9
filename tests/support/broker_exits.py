"""The broker as a real process that may not start: its exit, its error lines, files it may not
write.

- ``exits(process)``: wait (bounded) for a broker that must end by itself; its exit status and
  log, and the log has no traceback.
- ``as_another_user``: a ``preexec_fn`` for a broker that must meet files it may not write. Run as
  root (as the tests and CI are), root's power to ignore file permissions (CAP_DAC_OVERRIDE,
  CAP_DAC_READ_SEARCH, CAP_FOWNER) is dropped from the child's bounding set, so the broker is a
  user like any other; ``foreign(path, mode)`` then gives a file or directory to another user
  (nobody) with ``mode``. Run as another user, permissions apply anyway and ``foreign`` gives
  the owner only what ``mode`` gives others.
- ``error_lines(log)``: the ERROR lines of a log; ``refused_to_start(process)``: the one ERROR
  line of a broker that must exit with status 2, and its log.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any

EXIT_TIMEOUT = 15.0  # a guard: a broker that cannot start exits at once (a locked database: 5 s)
NOBODY = 65534

_PR_CAPBSET_DROP = 24
_DAC_CAPABILITIES = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def exits(process: Any, timeout: float = EXIT_TIMEOUT) -> tuple[int, str]:
    try:
        code = process.wait_exit(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the broker still runs {timeout}s after it should have exited; its log:\n"
            f"{process.log_text()}"
        ) from None
    log = process.log_text()
    assert "Traceback" not in log, log
    return code, log


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line]


def refused_to_start(process: Any) -> tuple[str, str]:
    """A broker that must exit with status 2 saying why in exactly one ERROR line: that line and
    the whole log."""
    code, log = exits(process)
    assert code == 2, log
    errors = error_lines(log)
    assert len(errors) == 1, log
    return errors[0], log


def as_another_user() -> None:
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in _DAC_CAPABILITIES:
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def foreign(path: Path, mode: int) -> None:
    """``path`` as if another user owned it with ``mode``: to us, only its "other" bits apply."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
        path.chmod(mode)
    else:
        path.chmod((mode & 0o7) * 0o111)
