"""The error a bad password or ACL file raises: it names the file and, when it can, the line."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError


class SecurityFileError(ConfigError):
    """``path:line: message`` (or ``path: message`` for problems of the whole file)."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.detail = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


def read_file(path: str | Path) -> bytes:
    """The bytes of a password or ACL file, or a SecurityFileError naming it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise SecurityFileError(str(path), "file not found") from None
    except OSError as exc:
        raise SecurityFileError(str(path), f"cannot read: {exc.strerror}") from None
