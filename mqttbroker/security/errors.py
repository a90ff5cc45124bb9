"""The error a bad password or ACL file raises: it names the file and, when it can, the line."""

from __future__ import annotations

from ..config import ConfigError


class SecurityFileError(ConfigError):
    """``path:line: message`` (or ``path: message`` for problems of the whole file)."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.detail = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
