"""Durable stores behind the broker's Store interface (broker/store.py), and the data directory's
lock (lock.py)."""

from __future__ import annotations

import errno
import os
import sqlite3


class StoreError(Exception):
    """The store cannot be used; the message names the file and what to do."""


def describe(exc: BaseException) -> str:
    """The cause of an I/O or SQLite error, for a log line that also names the path or the
    address: ``permission denied (EACCES)``, ``attempt to write a readonly database
    (SQLITE_READONLY_DIRECTORY)``."""
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", None)
        return f"{exc} ({name})" if name else str(exc)
    code = exc.errno if isinstance(exc, OSError) else None
    if code is not None and code in errno.errorcode:
        return f"{os.strerror(code).lower()} ({errno.errorcode[code]})"
    return str(exc) or type(exc).__name__
