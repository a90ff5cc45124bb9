"""A connection's input before it means anything: packets cut out of the bytes read (the fixed
header's Remaining Length, section 2.1.4), the bytes of an incomplete packet kept until the
rest arrives, the size limits (refused from the fixed header, before anything big is held or
decoded), reading paused and resumed, and the work its input may cause in one event-loop pass.

Sans-I/O like the connection that owns it: what the bytes mean is the connection's business
(:meth:`Connection.data_received <mqttbroker.broker.connection.Connection.data_received>`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, final

from mypy_extensions import mypyc_attr

from ..protocol.errors import MalformedPacket, PacketTooLarge

if TYPE_CHECKING:
    from .options import BrokerOptions


class Reader(Protocol):
    """What framing needs from the transport: reading stopped and started again."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


# Compiled, not tracked by the cycle collector: it refers only to the bytes of an incomplete
# packet and to numbers, so it can never be part of a cycle. One per connection: 16 bytes and
# one object fewer for the collector to walk.
@final
@mypyc_attr(acyclic=True)
class Framing:
    __slots__ = (
        "pending",
        "pending_len",
        "need",
        "body",
        "work",
        "work_pass",
        "received",
        "publishes",
        "paused",
        "waiting",
    )

    def __init__(self) -> None:
        self.pending: list[bytes] | None = None  # bytes of an incomplete packet, when any
        self.pending_len = 0
        self.need = 0  # bytes the incomplete packet needs in all, when known (else 0)
        self.body = 0  # where the body of the packet :meth:`split` found begins
        self.work = 0  # packets and deliveries caused by this input in this loop pass
        self.work_pass = -1  # the pass ``work`` counts
        self.received = 0  # bytes read, counted per read
        self.publishes = 0  # PUBLISH packets read
        self.paused = False  # reading paused (the budget ran out, an answer is awaited...)
        self.waiting = False  # an answer is awaited (a password check...): input is kept

    def keep(self, data: bytes) -> None:
        """Keep ``data`` after what is kept already, to be read later as a whole: while an
        answer is awaited, or what a pass's budget left."""
        if not data:
            return
        pending = self.pending
        if pending is None:
            self.pending = [data]
        else:
            pending.append(data)
        self.pending_len += len(data)
        self.need = 0

    def take(self, data: bytes) -> bytes | None:
        """``data`` after what was kept, or None while the incomplete packet kept is still
        incomplete."""
        pending = self.pending
        if pending is None:
            return data
        pending.append(data)
        self.pending_len += len(data)
        if self.pending_len < self.need:
            return None
        self.pending = None
        self.pending_len = self.need = 0
        return b"".join(pending)

    def leave(self, rest: bytes) -> None:
        """The incomplete packet at the end of a read: kept until :attr:`need` bytes are
        there (the need is 0 when its fixed header was incomplete: any byte may complete it)."""
        if rest:
            self.pending = [rest]
            self.pending_len = len(rest)

    def whole(self) -> bool:
        """Whether what is kept can be read now: a whole packet, or bytes whose need is not
        known (kept for later, not for being incomplete)."""
        return self.pending is not None and self.pending_len >= self.need

    def split(self, data: bytes, pos: int, end: int, opts: BrokerOptions, connected: bool) -> int:
        """Where the packet at ``pos`` ends; its body begins at :attr:`body`. -1 when more
        bytes are needed (then :attr:`need` says how many in all, if the fixed header told).
        A packet past the limits of ``opts`` is refused from its fixed header (PacketTooLarge):
        past max_connect_size before the client is ``connected``, past max_packet_size always.
        MalformedPacket for an over-long or non-minimal Remaining Length."""
        p = pos + 1
        if p >= end:
            return -1
        byte = data[p]
        p += 1
        length = byte & 0x7F
        if byte & 0x80:
            shift = 7
            for index in range(1, 4):
                if p >= end:
                    return -1
                byte = data[p]
                p += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    if not byte:
                        raise MalformedPacket("Remaining Length is not minimally encoded")
                    break
                shift += 7
                if index == 3:
                    raise MalformedPacket("Remaining Length is longer than 4 bytes")
        stop = p + length
        size = stop - pos
        if size > opts.max_connect_size and not connected:
            raise PacketTooLarge(
                f"packet of {size} bytes before authentication exceeds max_connect_size "
                f"({opts.max_connect_size})"
            )
        if size > opts.max_packet_size:
            raise PacketTooLarge(
                f"packet of {size} bytes exceeds the maximum of {opts.max_packet_size}"
            )
        if stop > end:
            self.need = size
            return -1
        self.body = p
        return stop

    def begin_pass(self, passes: int) -> None:
        """The work budget counts per event-loop pass: a new pass starts it at 0."""
        if self.work_pass != passes:
            self.work_pass = passes
            self.work = 0

    def pause(self, reader: Reader) -> None:
        if not self.paused:
            self.paused = True
            reader.pause_reading()

    def resume(self, reader: Reader) -> None:
        if self.paused:
            self.paused = False
            reader.resume_reading()
