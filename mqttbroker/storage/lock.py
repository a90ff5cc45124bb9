"""One broker per data directory: an exclusive ``flock`` on ``<data_dir>/mqttbroker.lock``, held
from the start to the end of the process.

The file records the holder's pid, so a second broker names it when it refuses to start. The
operating system releases the lock when the process ends in any way (``kill -9`` included), so a
lock is never stale; the file itself stays (removing it would let two brokers each lock a
different file of the same name).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from . import StoreError, describe

LOCK_NAME = "mqttbroker.lock"


class DataDirLock:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.path = self.directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Create the directory if need be and lock it; StoreError names the path and the cause
        (another broker's pid when it holds the lock)."""
        if self.directory.exists() and not self.directory.is_dir():
            raise StoreError(f"data directory {self.directory}: not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"data directory {self.directory}: {describe(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"data directory {self.directory} is in use by another mqttbroker (pid {holder}, "
                f"lock {self.path}); stop it, or give this one another --data-dir"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"{self.path}: cannot lock: {describe(exc)}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no pid of a process that no longer holds it
            os.close(fd)
