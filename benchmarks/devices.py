"""Paced publishers on plain sockets: scenario 9's thousand devices and scenario 1w's
one-message-per-write fan-in.

Scenario 9's devices each send ``rate`` messages per second on a connection of their own. The
generator does not keep a timer per device: a :class:`Pacer` splits them into groups, one
group due every ~2 ms (so each device's messages stay 1/rate apart), and one coroutine sends
each group as it falls due, one pre-encoded PUBLISH per device (:meth:`Device.send`). Between
two groups it does not sleep but yields to the loop (which reads the subscriber meanwhile) and
looks at the clock again: see :func:`pace`. A QoS 1 device's PUBACKs are not read one event at
a time either: every 100 ms a sweep reads what has arrived on all of them
(:meth:`Device.sweep`), and a device with a full ring of packet identifiers in flight (the
broker is not acknowledging) skips its turn, which is counted.

Scenario 1w's publishers write one PUBLISH per ``send`` with TCP_NODELAY, and only when the
previous one has left the socket (:func:`unsent_bytes` is 0): a message written while another
is still queued would be merged with it into one segment. The kernel's own count of data
segments sent (:func:`data_segments_out`, from TCP_INFO) shows the result: one per message.
:class:`OnePerWriteC` does the same in C (benchmarks/c/one_per_write.c) where the runner built
it, so that the generator's own loop is less of the limit for a fast broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import mmap
import os
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Sequence

from . import procfs, wire
from .client import RawClient

STEP = 0.002  # seconds between two groups of paced devices
CATCH_UP = 0.1  # seconds: a pacer later than this skips the rounds it missed
SWEEP_EVERY = 0.1  # seconds between two reads of every QoS 1 device's PUBACKs
RING = 64  # pre-encoded QoS 1 PUBLISHes (packet identifiers) per device
SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent
_TCP_INFO_DATA_SEGS_OUT = 156  # struct tcp_info: tcpi_data_segs_out (Linux 4.6+)


class Pacer:
    """When each group of ``n`` devices sending ``rate`` messages/s each is due.

    Device ``i`` is in group ``i % groups``; group ``k % groups`` is due at
    ``start + k * gap``, ``gap = 1 / (rate * groups)``, so every device is due once per
    ``1 / rate`` seconds and the groups are spread evenly over that interval. A caller late by
    up to ``catch_up`` seconds (or one interval, if longer) gets the groups it missed at once;
    later than that, the missed ones are not sent in a burst but counted in ``missed``
    (messages), and the schedule moves on."""

    def __init__(
        self,
        n: int,
        rate: float,
        start: float = 0.0,
        step: float = STEP,
        catch_up: float = CATCH_UP,
    ) -> None:
        interval = 1.0 / rate
        self.groups = max(1, min(n, round(interval / step)))
        self.gap = interval / self.groups
        self.members = [range(g, n, self.groups) for g in range(self.groups)]
        self.window = max(self.groups, round(catch_up / self.gap))  # groups it may catch up
        self.start = start
        self.next = 0  # the sequence number of the next group to send
        self.missed = 0

    def due(self, k: int | None = None) -> float:
        return self.start + (self.next if k is None else k) * self.gap

    def ready(self, now: float) -> list[range]:
        """The groups due by ``now``, in order (device indices, one range per group)."""
        out = []
        late = int((now - self.due()) / self.gap) + 1 - self.window
        if late > 0:  # too far behind: skip to the last catch_up seconds
            for k in range(self.next, self.next + late):
                self.missed += len(self.members[k % self.groups])
            self.next += late
        while self.due() <= now:
            out.append(self.members[self.next % self.groups])
            self.next += 1
        return out


class Device:
    """One paced publisher on a :class:`RawClient`'s non-blocking socket."""

    __slots__ = ("conn", "packets", "i", "sent", "acked", "failed", "pending", "held", "limit")

    def __init__(self, conn: RawClient, packets: Sequence[bytes], limit: int) -> None:
        self.conn = conn
        self.packets = packets  # QoS 0: one; QoS 1: one per packet identifier of the ring
        self.i = 0
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.pending = b""  # the rest of a PUBLISH the socket took only in part
        self.held = 0  # turns skipped: the socket was full, or the ring was in flight
        self.limit = limit  # most PUBLISHes unacknowledged (0: QoS 0)

    def send(self) -> None:
        if self.pending and not self.flush():
            self.held += 1
            return
        if self.limit and self.sent - self.acked >= self.limit:
            self.held += 1
            return
        packet = self.packets[self.i]
        try:
            n = self.conn.sock.send(packet)
        except (BlockingIOError, InterruptedError):
            self.held += 1
            return
        except OSError:
            self.conn.eof = True
            return
        if n < len(packet):
            self.pending = packet[n:]
        self.sent += 1
        self.i += 1
        if self.i == len(self.packets):
            self.i = 0

    def flush(self) -> bool:
        """Send the rest of a partly written PUBLISH; True when nothing is left."""
        try:
            n = self.conn.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.conn.eof = True
            return False
        self.pending = self.pending[n:]
        return not self.pending

    def sweep(self) -> None:
        """Read and count the PUBACKs that have arrived (QoS 1)."""
        conn = self.conn
        if conn.eof:
            return
        data = conn.read_available()
        if data:
            acks, failed, pos = wire.count_pubacks(data, conn.others)
            self.acked += acks
            self.failed += failed
            conn.rest = data[pos:]


def device_packets(topic: str, qos: int, version: int, ring: int = RING) -> list[bytes]:
    if not qos:
        return [wire.publish(topic, wire.payload(), 0, 0, version)]
    return [wire.publish(topic, wire.payload(), qos, pid, version) for pid in range(1, ring + 1)]


async def pace(devices: Sequence[Device], rate: float, stop: asyncio.Event, acks: bool) -> Pacer:
    """Send from ``devices`` at ``rate`` messages/s each until ``stop``; with ``acks``, sweep
    their PUBACKs every SWEEP_EVERY seconds. Returns the pacer (``missed``).

    It polls the clock between groups (``sleep(0)``: the loop runs its other callbacks and
    polls its sockets, without waiting) rather than sleep until the next is due, so the
    generator's core is as busy whichever broker it drives, as scenario 5's generator is. The
    loop's timers count whole milliseconds, so sleeping left part of each gap slept and part
    spun, and the generator's load (and with it the broker's CPU per message) to chance: the
    measurements are in benchmarks/README.md, "How the generator stays out of the way"."""
    clock = time.monotonic
    pacer = Pacer(len(devices), rate, clock())
    next_sweep = pacer.start + SWEEP_EVERY
    while not stop.is_set():
        now = clock()
        for group in pacer.ready(now):
            for i in group:
                devices[i].send()
        if acks and now >= next_sweep:
            for device in devices:
                device.sweep()
            next_sweep = now + SWEEP_EVERY
        await asyncio.sleep(0)  # poll: see above
    for device in devices:  # no half PUBLISH left before the next phase or DISCONNECT
        if device.pending:
            device.flush()
    return pacer


# -- one PUBLISH per segment --------------------------------------------------------------------


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes written to ``sock`` that the kernel has not sent yet."""
    raw = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    return int(struct.unpack("i", raw)[0])


def data_segments_out(sock: socket.socket) -> int | None:
    """Segments carrying data that ``sock`` has sent (None where TCP_INFO lacks the count)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < _TCP_INFO_DATA_SEGS_OUT + 4:
        return None
    return int(struct.unpack_from("I", info, _TCP_INFO_DATA_SEGS_OUT)[0])


class OnePerWrite:
    """Publishers each writing one pre-encoded PUBLISH per ``send``, never while the previous
    one is still in the socket's queue (where it would share a segment with the next)."""

    def __init__(self, conns: Sequence[RawClient], packets: Sequence[bytes]) -> None:
        self.conns = conns
        self.packets = packets
        self.sent = 0
        self.attempts = 0
        self.held = 0  # attempts skipped: the previous message had not left yet

    def round(self) -> None:
        """One attempt per publisher."""
        for conn, packet in zip(self.conns, self.packets, strict=True):
            if conn.eof:
                continue
            self.attempts += 1
            sock = conn.sock
            if unsent_bytes(sock):
                self.held += 1
                continue
            try:
                n = sock.send(packet)
            except (BlockingIOError, InterruptedError):
                self.held += 1
                continue
            except OSError:
                conn.eof = True
                continue
            if n < len(packet):  # a partial write: the rest goes out before anything else
                conn.sock.setblocking(True)
                try:
                    sock.sendall(packet[n:])
                finally:
                    sock.setblocking(False)
            self.sent += 1

    def segments(self) -> int | None:
        return segments_out(self.conns)

    def cpu_s(self) -> float:
        return 0.0  # counted as the generator's own

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.round()
            await asyncio.sleep(0)  # the subscriber's reads


def segments_out(conns: Sequence[RawClient]) -> int | None:
    """Data segments sent by all of ``conns`` (None where TCP_INFO lacks the count)."""
    counts = [data_segments_out(c.sock) for c in conns]
    return None if any(c is None for c in counts) else sum(c for c in counts if c)


class OnePerWriteC:
    """:class:`OnePerWrite` by the C program benchmarks/c/one_per_write.c (built by the runner),
    in a process of its own on the generator's core: it inherits the sockets, and its counters
    (sent, attempts, held) are read from a file both processes map."""

    _STOP, _SENT, _ATTEMPTS, _HELD = range(4)

    def __init__(self, conns: Sequence[RawClient], packets: Sequence[bytes], program: str) -> None:
        self.conns = conns
        self.packets = packets
        self.program = program
        self._file = tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self._file.truncate(32)
        self._counters = mmap.mmap(self._file.fileno(), 32)
        self.pid: int | None = None
        self.failed: list[int] = []

    def _get(self, index: int) -> int:
        return int(struct.unpack_from("Q", self._counters, 8 * index)[0])

    @property
    def sent(self) -> int:
        return self._get(self._SENT)

    @property
    def attempts(self) -> int:
        return self._get(self._ATTEMPTS)

    @property
    def held(self) -> int:
        return self._get(self._HELD)

    def segments(self) -> int | None:
        return segments_out(self.conns)

    def cpu_s(self) -> float:
        """The C process's CPU seconds so far (whole ticks: for windows of seconds)."""
        return procfs.cpu_seconds(self.pid) or 0.0

    async def run(self, stop: asyncio.Event) -> None:
        fds = [c.sock.fileno() for c in self.conns]
        records = b"".join(
            struct.pack("=iI", fd, len(packet)) + packet
            for fd, packet in zip(fds, self.packets, strict=True)
        )
        proc = subprocess.Popen(
            [self.program, str(self._file.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[*fds, self._file.fileno()],
        )
        self.pid = proc.pid
        try:
            assert proc.stdin is not None
            proc.stdin.write(records)
            proc.stdin.close()
            while not stop.is_set() and proc.poll() is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)
        finally:
            struct.pack_into("Q", self._counters, 8 * self._STOP, 1)
            proc.wait(timeout=10)  # (its output is one short line: the pipe cannot fill)
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()
            proc.stdout.close()
            proc.stderr.close()
        result = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else {}
        if "error" in result or proc.returncode != 0:
            cause = result.get("error") or err.decode(errors="replace").strip()
            raise RuntimeError(f"{self.program}: {cause or f'exit status {proc.returncode}'}")
        self.failed = result["failed"]
        for i in self.failed:
            self.conns[i].eof = True
