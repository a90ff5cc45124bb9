"""A connection's output buffer: the packets for its client, kept until the broker flushes every
buffer once per event-loop pass (one write per connection and pass, not one per packet), held
back while they wait for the store to commit (so that an acknowledgement means "on disk"), and
paused while the transport holds more than its high-water mark.

Output is written in the order it was buffered. What the store's batch must commit first is
marked by :meth:`Output.hold` (the position in the output, counted from the connection's
first packet) and freed by :meth:`Output.release` once committed; the batches commit in order,
so the oldest mark is always the one freed.
"""

from __future__ import annotations

from typing import Protocol, final

from mypy_extensions import mypyc_attr


class Writer(Protocol):
    """What the output needs from the transport."""

    def write(self, data: bytes) -> None: ...

    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        ...


# Compiled, not tracked by the cycle collector: it refers only to the packets waiting to be
# written and to numbers, so it can never be part of a cycle. One per connection: 16 bytes and
# one object fewer for the collector to walk.
@final
@mypyc_attr(acyclic=True)
class Output:
    __slots__ = (
        "chunks",
        "marks",
        "base",
        "free_upto",
        "writes_seen",
        "sent",
        "publishes",
        "paused",
        "overflowed",
    )

    def __init__(self) -> None:
        self.chunks: list[bytes] | None = None  # packets to write, oldest first (None: none)
        # Positions in the output (counted from the first packet) that wait for a commit each:
        # few at a time, a list is smaller than a deque; made when first needed, as most
        # connections never change the store.
        self.marks: list[int] | None = None
        self.base = 0  # packets written so far: the position of chunks[0]
        self.free_upto = 0  # output before this position is committed (when marks wait)
        self.writes_seen = 0  # the store's write count when the current input began
        self.sent = 0  # bytes written, counted per write
        self.publishes = 0  # PUBLISH packets buffered ($SYS: delivered)
        self.paused = False  # the transport asked for no more output for now
        self.overflowed = False  # closed for output past max_output_buffer

    def append(self, data: bytes) -> bool:
        """Buffer one packet; True when it is the first since the last flush (the connection
        then needs flushing at the pass's end)."""
        chunks = self.chunks
        if chunks is None:
            self.chunks = [data]
            return True
        chunks.append(data)
        return False

    def hold(self) -> None:
        """What is buffered so far waits for the store's current batch to commit (the caller
        asks the store to call :meth:`release` then); later output waits behind it."""
        marks = self.marks
        if marks is None:
            marks = self.marks = []
        chunks = self.chunks
        marks.append(self.base + (len(chunks) if chunks is not None else 0))

    def release(self) -> bool:
        """The oldest held batch committed: its output may go. True when output is waiting
        (the connection then needs flushing)."""
        marks = self.marks
        if not marks:  # closed and flushed meanwhile
            return False
        self.free_upto = marks.pop(0)
        return bool(self.chunks)

    def held(self) -> bool:
        """Whether output waits for a commit."""
        return bool(self.marks)

    def flush(self, writer: Writer) -> int:
        """Write what is buffered, up to what still waits for a commit, in one call to
        ``writer``; the bytes written (0: nothing could go)."""
        chunks = self.chunks
        if not chunks:
            return 0
        count = len(chunks)
        if self.marks:
            count = min(count, self.free_upto - self.base)
            if count <= 0:
                return 0
        data = chunks[0] if count == 1 else b"".join(chunks[:count])
        if count == len(chunks):
            self.chunks = None  # an idle connection keeps no list
        else:
            del chunks[:count]
        self.base += count
        size = len(data)
        self.sent += size
        writer.write(data)
        return size

    def flush_all(self, writer: Writer) -> None:
        """Write everything, held or not: the last flush before the transport closes, once
        the store has committed what was held."""
        self.marks = None
        self.flush(writer)

    def drop(self) -> None:
        """The transport is gone: nothing buffered can be written any more."""
        self.chunks = None

    def over(self, writer: Writer, bound: int) -> bool:
        """Whether more than ``bound`` bytes (0: no bound) wait in ``writer`` for a client that
        does not read (checked while paused: the transport is past its high-water mark)."""
        return self.paused and bound > 0 and writer.buffered() > bound
