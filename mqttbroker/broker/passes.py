"""When buffered output is written: once per event-loop pass, for every connection that has any.

A connection appends its packets to its own buffer and marks itself dirty; the scheduler writes
every dirty connection's buffer in one call per pass (:meth:`PassScheduler.flush`), then resumes
the connections whose input ran past its budget (:meth:`PassScheduler.defer`). Sans-I/O: the
transport edge hands each read to :meth:`PassScheduler.handle_read` and either sets
:attr:`PassScheduler.wake` (a callback that schedules :meth:`~PassScheduler.flush` for the end
of the loop pass) or frames its own passes with :meth:`~PassScheduler.pass_begin` and
:meth:`~PassScheduler.pass_end`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import Connection


class PassScheduler:
    def __init__(self) -> None:
        # Called when the first connection of a loop pass has output (or deferred input); the
        # edge schedules flush() for the end of the pass. None: the caller flushes (tests do).
        self.wake: Callable[[], object] | None = None
        # The edge's own transport (server/streams.py) calls pass_begin and pass_end around
        # each pass over its ready sockets when this is set (by the edge, unless it busy-polls,
        # which needs every flush asked for through wake): that pass's output is flushed at its
        # end, without a loop callback.
        self.hook_passes = False
        self.passes = 0  # flushes so far: one per event-loop pass with output
        self._dirty: list[Connection] = []
        self._deferred: list[Connection] = []  # input left for the next pass
        self._flush_due = False  # the pass has output or deferred input: flush() will run
        self._crowded = False  # a read came after the pass's first output (see handle_read)
        self._busy = False  # the last pass that flushed was crowded
        self._in_pass = False  # between pass_begin and pass_end

    def handle_read(self, conn: Connection, data: bytes) -> None:
        """A read from ``conn``'s transport. While the loop is not under load, the output of
        the pass's first read that has any (the PUBLISH it forwards, its acknowledgement) is
        written at once, not at the end of the pass: the loop would otherwise poll its sockets
        once more before writing it, and a forwarded message would wait for that. Later reads
        of the pass leave their output for the flush at its end, and so does every read once a
        pass has had more than one (under load): one write per connection per pass then, as
        when nothing is written early.

        The flush at the pass's end is scheduled after that early write, not when the read
        marks its first output: a forwarded message does not wait for the loop's callback."""
        if self._flush_due:  # an earlier read of this pass had output
            conn.data_received(data)
            self._crowded = True
            return
        self._flush_due = True  # what the read marks is written below: no wake meanwhile
        try:
            conn.data_received(data)
        finally:
            if self._dirty or self._deferred:
                try:
                    if not self._busy:
                        self._write_output()
                finally:  # a write that raised still leaves a flush due: it must come
                    self._schedule_flush()
            else:
                self._flush_due = False  # no output: the pass's next read is no crowd

    def mark_dirty(self, conn: Connection) -> None:
        """``conn`` has buffered output: write it at the end of the pass."""
        if not self._flush_due:
            self._schedule_flush()
        self._dirty.append(conn)

    def defer(self, conn: Connection) -> None:
        """``conn`` has input left over after its budget: resume it after the next flush."""
        if not self._flush_due:
            self._schedule_flush()
        self._deferred.append(conn)

    def _schedule_flush(self) -> None:
        self._flush_due = True
        if not self._in_pass and self.wake is not None:
            self.wake()

    def pass_begin(self) -> None:
        """A transport's pass over its ready sockets begins: the output of its reads is flushed
        by :meth:`pass_end`, without the loop callback that ``wake`` would schedule (one
        callback less per pass)."""
        self._in_pass = True

    def pass_end(self) -> None:
        """The pass :meth:`pass_begin` announced is over: flush what it left due."""
        self._in_pass = False
        if self._flush_due:
            self.flush()

    def flush(self) -> None:
        """Write each connection's buffered output in one call, then go on with deferred input
        (whose output is flushed on the next pass)."""
        self.passes += 1
        self._flush_due = False
        self._busy = self._crowded
        self._crowded = False
        self._write_output()
        if self._deferred:
            deferred = self._deferred
            self._deferred = []
            for conn in deferred:
                conn.resume_input()

    def _write_output(self) -> None:
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for conn in dirty:
                conn.flush()
