"""The broker's log format: one event, one line.

Log messages carry client-supplied strings (client ids, user names, topics). A newline in one of
them could forge a whole log line, and an escape sequence could rewrite the terminal, so the
formatter writes every control character of a message the way Python's repr does (``\\n``,
``\\r``, ``\\x1b``, ``\\u2028``...): C0 and C1 controls, DEL, and the Unicode line and paragraph
separators. It applies to every log line, present and future, whatever its arguments; a
traceback appended to a message is left as it is (it comes from the broker, not a client).
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _escapes() -> dict[int, str]:
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
    table.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})
    return table


_ESCAPES = _escapes()


def escape(text: str) -> str:
    """``text`` with its control characters written out (``"a\\nb"`` -> ``"a\\\\nb"``)."""
    if text.isprintable():  # the usual case: nothing to do
        return text
    return text.translate(_ESCAPES)


class EscapingFormatter(logging.Formatter):
    """A Formatter whose message part (``%(message)s`` and what surrounds it) shows control
    characters escaped; see the module's docstring."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return escape(super().formatMessage(record))


def setup(level: str) -> None:
    """Log to stderr at ``level`` ("info"...), one escaped line per event."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # Neither format (this one, ops/logjson.py's) names the thread or the process: records need
    # not look them up: a sizeable share of an info line's cost, which a connection storm pays
    # once per client connected and once per client gone.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
