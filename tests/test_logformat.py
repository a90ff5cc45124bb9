"""The log's setup: records skip the thread and process look-ups its formats never show, and a
line reads as before; ``escape`` writes a client's control characters out."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from mqttbroker import logformat


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    root.handlers = []
    try:
        yield
    finally:
        root.handlers, root.level = saved[0], saved[1]
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags


def test_records_skip_thread_and_process(restored: None) -> None:
    logformat.setup("info")
    record = logging.getLogger("mqttbroker.test").makeRecord(
        "mqttbroker.test", logging.INFO, __file__, 1, "client %s connected", ("c1",), None
    )
    assert record.thread is None and record.threadName is None
    assert record.process is None and record.processName is None


def test_a_line_reads_as_before(restored: None) -> None:
    logformat.setup("info")  # (the formats need none of what records no longer carry)
    record = logging.getLogger("mqttbroker.test").makeRecord(
        "mqttbroker.test", logging.INFO, __file__, 1, "client %s connected\nforged", ("c1",), None
    )
    line = logformat.EscapingFormatter(logformat.FORMAT).format(record)
    assert line.endswith(" INFO mqttbroker.test: client c1 connected\\nforged")
    assert "\n" not in line


def test_escape_writes_control_characters_out() -> None:
    assert logformat.escape("plain é") == "plain é"
    assert logformat.escape("a\nb\rc\td\x1b[31m\x00\x7f\x85\u2028") == (
        "a\\nb\\rc\\td\\x1b[31m\\x00\\x7f\\x85\\u2028"
    )
