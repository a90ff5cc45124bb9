"""The generator's MQTT clients: one asyncio Protocol per connection, no per-packet objects.

A :class:`Client` connects, waits for CONNACK, subscribes, and is then switched into one mode:

* counting subscriber: counts PUBLISH frames by walking fixed headers (wire.count_publishes);
* QoS 1/2 subscriber: acknowledges every PUBLISH (PUBACK, or PUBREC then PUBCOMP on PUBREL);
* QoS 0 flood publisher: writes pre-encoded blocks of many PUBLISH packets, as fast as the
  socket takes them (flow control through pause_writing/resume_writing);
* QoS 1/2 windowed publisher: keeps ``window`` PUBLISHes unacknowledged, each acknowledgement
  releasing a pre-encoded packet with the same packet identifier.

Every handler works on whole received chunks and answers with one write per chunk; the ack
handlers answer the usual chunk shapes with C-level slicing and lookups (``_on_sub_ack``,
``_on_pub_ack``), their per-frame walks (``_sub_ack_walk``, ``_pub_ack_walk``) being the
reference and the fallback.

:class:`RawClient` is a plain non-blocking socket that the event loop never watches: for
thousands of idle or nearly idle connections (scenarios 6 and 7), set up by :func:`open_many`
and read by an explicit sweep instead of one event-loop callback per message.

:class:`LatencyProbe` (scenario 5) is a publisher and a subscriber on two such sockets, driven by
one busy-polling loop in a worker thread: it sends one timestamped PUBLISH at a time and spins on
``recv`` until it is back, so the generator never sleeps in epoll and its wake-up is not
counted as the broker's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import select
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import procfs, wire
from .wire import CONNACK, DISCONNECT, PUBLISH, SUBACK

# --tls: the context of every connection open_client makes (None: plain TCP)
TLS_CONTEXT: ssl.SSLContext | None = None

SETUP_TIMEOUT = 30.0
# Below this many frames a chunk of PUBLISHes goes through the loop: the strided checks cost
# about as much as the loop does for a few frames.
STRIDE_MIN = 4
_PUBACK = bytearray(b"\x40\x02\x00\x00")  # templates: the identifiers are filled in
_PUBREC = bytearray(b"\x50\x02\x00\x00")
_NATIVE = sys.byteorder  # memoryview.cast("I") reads native-endian
if struct.calcsize("I") != 4:  # pragma: no cover - every platform CPython runs on today
    raise ImportError("benchmarks.client needs a 4-byte C unsigned int")
FLOOD_SNDBUF = 128 * 1024  # the kernel doubles it


class BrokerRefused(Exception):
    """The broker answered CONNECT or SUBSCRIBE with a failure."""


def _nodelay(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _reply_table(packets: dict[bytes, bytes], stopping: bool) -> dict[int, bytes]:
    """A windowed publisher's answer to each 4-byte ack frame of its window, keyed by the frame
    read as one native-endian uint32 (what ``memoryview(chunk).cast("I")`` yields): PUBACK or
    PUBCOMP of an identifier -> the pre-encoded PUBLISH with that identifier (nothing once
    stopping), PUBREC -> PUBREL."""
    table: dict[int, bytes] = {}
    for pid, packet in packets.items():
        for first in (b"\x40\x02", b"\x70\x02"):  # PUBACK, PUBCOMP
            table[int.from_bytes(first + pid, _NATIVE)] = b"" if stopping else packet
        table[int.from_bytes(b"\x50\x02" + pid, _NATIVE)] = b"\x62\x02" + pid  # PUBREC
    return table


class Client(asyncio.Protocol):
    def __init__(self, version: int) -> None:
        self.version = version
        self.transport: asyncio.Transport | None = None
        self.buf = b""  # setup phase: bytes not yet consumed
        self.rest = b""  # run phase: an incomplete frame carried to the next chunk
        self.handler = self._on_setup
        self.waiter: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.receive_max = 65535
        self.session_present = False  # from CONNACK
        self.end_session = False  # MQTT 5: DISCONNECT with Session Expiry Interval 0
        self.granted_expiry: int | None = None  # Session Expiry Interval the CONNACK set
        self.count = 0  # PUBLISH packets received
        self.sent = 0  # PUBLISH packets written
        self.acked = 0  # QoS 1/2 flows completed (publisher)
        self.failed_acks = 0  # acks carrying a failure reason code
        self.others: list[tuple[int, bytes]] = []  # unexpected packets (first byte, body)
        self.stopping = False
        self.task: asyncio.Task[None] | None = None
        # counting mode
        self._frame = (0, 0, 0)
        # QoS publisher mode: packet identifier bytes -> pre-encoded PUBLISH
        self._packets: dict[bytes, bytes] = {}
        # ... and a 4-byte ack frame read as a native uint32 -> the reply (see _reply_table)
        self._replies: dict[int, bytes] = {}
        self._replies_stopping: dict[int, bytes] = {}

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        self.handler(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed by the broker"))
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    # -- setup ----------------------------------------------------------------------------

    def _on_setup(self, data: bytes) -> None:
        self.buf += data
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def expect(self, ptype: int, timeout: float = SETUP_TIMEOUT) -> bytes:
        """Wait for the next packet of type ``ptype``; returns its body."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            frame = wire.next_frame(self.buf)
            if frame is None:
                if self.lost.done():
                    raise ConnectionError("connection closed by the broker during setup")
                self.waiter = loop.create_future()
                await asyncio.wait_for(self.waiter, max(0.001, deadline - loop.time()))
                continue
            first, body, end = frame
            payload = self.buf[body:end]
            self.buf = self.buf[end:]
            if first >> 4 == ptype:
                return payload
            if first >> 4 == DISCONNECT:
                raise BrokerRefused(f"broker sent DISCONNECT {payload.hex()}")
            if first >> 4 == PUBLISH:
                self.count += 1
            else:
                self.others.append((first, payload))

    async def subscribe(self, filters: Sequence[tuple[str, int]], packet_id: int = 1) -> None:
        assert self.transport is not None
        self.transport.write(wire.subscribe(packet_id, list(filters), self.version))
        codes = wire.suback_codes(await self.expect(SUBACK), self.version)
        if len(codes) != len(filters) or any(code >= 0x80 for code in codes):
            raise BrokerRefused(f"SUBACK refused {list(filters)}: codes {codes}")

    def _switch(self, handler) -> None:  # type: ignore[no-untyped-def]
        self.handler = handler
        if self.buf:
            data, self.buf = self.buf, b""
            handler(data)

    def _walk(self, data: bytes):  # type: ignore[no-untyped-def]
        """Join the carried-over bytes with ``data``; yields (first byte, body, end) per frame."""
        if self.rest:
            data = self.rest + data
            self.rest = b""
        end = len(data)
        pos = 0
        read_rl = wire.read_remaining_length
        while pos + 2 <= end:
            length = data[pos + 1]
            if length & 0x80:
                header = read_rl(data, pos, end)
                if header is None:
                    break
                length, body = header
            else:
                body = pos + 2
            stop = body + length
            if stop > end:
                break
            yield data[pos], data, body, stop
            pos = stop
        if pos < end:
            self.rest = data[pos:]

    # -- counting subscriber ------------------------------------------------------------------

    def start_counting(self, frame_len: int) -> None:
        """Count PUBLISH frames expected to be ``frame_len`` bytes each (any size is counted)."""
        second = frame_len - 2 if 0 < frame_len - 2 < 128 else -1  # one-byte Remaining Length
        self._frame = (frame_len, 0x30, second)
        self._switch(self._on_count)

    def _on_count(self, data: bytes) -> None:
        if self.rest:
            data = self.rest + data
        frame_len, first, second = self._frame
        n, pos = wire.count_publishes(data, frame_len, first, second, self.others)
        self.count += n
        self.rest = data[pos:] if pos < len(data) else b""

    # -- QoS 1/2 subscriber ------------------------------------------------------------------

    def start_acking(self) -> None:
        self._switch(self._on_sub_ack)

    def _on_sub_ack(self, data: bytes) -> None:
        """Acknowledge a chunk: PUBACK or PUBREC per PUBLISH, PUBCOMP per PUBREL.

        The common shapes are answered without a Python step per frame, or with a short one:
        a run of same-sized PUBLISH frames of one QoS (a QoS 1 flow) is verified and answered
        with strided slices; a few PUBLISH frames, or PUBLISH frames mixed with PUBRELs (a QoS 2
        flow), go through a tight loop over the fixed headers. Whatever does not fit (and the
        bytes after it) is walked frame by frame by :meth:`_sub_ack_walk`, which is the
        reference for what the answer must be."""
        if self.rest:
            data = self.rest + data
            self.rest = b""
        end = len(data)
        out: list[bytes | bytearray] = []
        n = 0
        pos = 0
        first = data[0] if end >= 4 else 0
        if (first == 0x32 or first == 0x34) and data[1] < 0x80:
            size = data[1] + 2
            if size == end:  # one PUBLISH: the most common chunk of a QoS 1 flow under load
                p = 4 + ((data[2] << 8) | data[3])  # after the topic: the packet identifier
                self.count += 1
                if self.transport is not None:
                    self.transport.write(
                        (b"\x40\x02" if first == 0x32 else b"\x50\x02") + data[p : p + 2]
                    )
                return
            # A run of PUBLISH frames with the same fixed header (one-byte Remaining Length)
            # and topic length: frame 0 is a real frame, so if every L-th byte matches its
            # header, every frame is L bytes with its packet identifier at the same offset.
            k = end // size
            o = 4 + ((data[2] << 8) | data[3])
            if k >= STRIDE_MIN and o + 2 <= size:
                stop = k * size
                if (
                    data[0:stop:size].count(first) == k
                    and data[1:stop:size].count(data[1]) == k
                    and data[2:stop:size].count(data[2]) == k
                    and data[3:stop:size].count(data[3]) == k
                ):
                    acks = (_PUBACK if first == 0x32 else _PUBREC) * k
                    acks[2::4] = data[o:stop:size]
                    acks[3::4] = data[o + 1 : stop : size]
                    out.append(acks)
                    n = k
                    pos = stop
        # PUBLISH (QoS 1/2, one-byte Remaining Length) and PUBREL without a reason code.
        while pos + 4 <= end:
            b0 = data[pos]
            if b0 == 0x62 and data[pos + 1] == 2:  # PUBREL -> PUBCOMP
                out.append(b"\x70\x02" + data[pos + 2 : pos + 4])
                pos += 4
                continue
            if (b0 != 0x34 and b0 != 0x32) or data[pos + 1] & 0x80:
                break
            stop = pos + 2 + data[pos + 1]
            if stop > end:  # an incomplete PUBLISH: carried to the next chunk
                self.rest = data[pos:]
                pos = end
                break
            p = pos + 4 + ((data[pos + 2] << 8) | data[pos + 3])  # after the topic
            out.append((b"\x50\x02" if b0 == 0x34 else b"\x40\x02") + data[p : p + 2])
            n += 1
            pos = stop
        self.count += n
        if pos < end:
            self._sub_ack_walk(data[pos:] if pos else data, out)
        self._send_all(out)

    def _send_all(self, out: Sequence[bytes | bytearray]) -> None:
        """Answer a chunk with one write."""
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _sub_ack_walk(self, data: bytes, out: list[bytes | bytearray]) -> None:
        n = 0
        for first, buf, body, stop in self._walk(data):
            kind = first >> 4
            if kind == 3:
                n += 1
                qos = (first >> 1) & 3
                if qos:
                    p = body + 2 + ((buf[body] << 8) | buf[body + 1])
                    out.append((b"\x40\x02" if qos == 1 else b"\x50\x02") + buf[p : p + 2])
            elif kind == 6:  # PUBREL -> PUBCOMP
                out.append(b"\x70\x02" + buf[body : body + 2])
            else:
                self.others.append((first, buf[body:stop]))
        self.count += n

    # -- publishers ------------------------------------------------------------------------

    def start_flood(self, blocks: Sequence[bytes], per_block: Sequence[int]) -> None:
        """Write ``blocks`` round and round (QoS 0) until :meth:`stop`."""
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=4 * len(blocks[0]), low=len(blocks[0]))
        # A small kernel send buffer bounds the backlog a flood leaves behind in the broker
        # (which the next run would otherwise pay for) without limiting loopback throughput.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FLOOD_SNDBUF)
        self._switch(self._on_ignore)
        self.task = asyncio.get_running_loop().create_task(self._flood(blocks, per_block))

    async def _flood(self, blocks: Sequence[bytes], per_block: Sequence[int]) -> None:
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        nblocks = len(blocks)
        i = 0
        while not self.stopping and not self.lost.done():
            transport.write(blocks[i])
            self.sent += per_block[i]
            i += 1
            if i == nblocks:
                i = 0
            if self.paused:
                self._resumed = loop.create_future()
                await self._resumed
            else:
                await asyncio.sleep(0)

    def _on_ignore(self, data: bytes) -> None:
        for first, buf, body, stop in self._walk(data):
            self.others.append((first, buf[body:stop]))

    def start_windowed(self, topic: str, qos: int, window: int, body: bytes) -> None:
        """QoS 1 or 2: keep ``window`` PUBLISHes in flight, one new per completed flow."""
        assert self.transport is not None
        window = max(1, min(window, self.receive_max))
        self._packets = {
            pid.to_bytes(2, "big"): wire.publish(topic, body, qos, pid, self.version)
            for pid in range(1, window + 1)
        }
        self._replies = _reply_table(self._packets, stopping=False)
        self._replies_stopping = _reply_table(self._packets, stopping=True)
        self._switch(self._on_pub_ack)
        self.sent += window
        self.transport.write(b"".join(self._packets.values()))

    def _on_pub_ack(self, data: bytes) -> None:
        """Answer a chunk of acks: a new PUBLISH per PUBACK/PUBCOMP, PUBREL per PUBREC.

        Every ack of a successful flow is 4 bytes, ``40|50|70 02 hi lo`` (MQTT 5 leaves out
        reason code 0 when there are no properties). A chunk made only of those is answered at
        C speed: its 4-byte groups, read as native uint32s, are looked up in a table of replies
        (:func:`_reply_table`). Every key has Remaining Length 2 in its second byte, so when
        every group is found, group 0 is a 4-byte frame, hence group 1 starts a frame, and so
        on: the chunk is exactly those frames. Anything else (a failed ack, an identifier
        outside the window, another packet: a KeyError) is walked by :meth:`_pub_ack_walk`;
        so are the bytes after the last whole group (an incomplete frame, or a short one).
        PUBACKs with reason code 0 (5 bytes, as Mosquitto sends them) are first turned into
        the same 4-byte keys by :func:`wire.puback_keys`."""
        if self.rest:
            data = self.rest + data
            self.rest = b""
        size = len(data)
        found = wire.puback_keys(data) if size > 4 and data[1] == 3 else None
        if found is not None:
            head, whole = found
        else:
            whole = size & -4
            head = data if whole == size else data[:whole]
        if whole:
            n = len(head) >> 2
            stopping = self.stopping
            table = self._replies_stopping if stopping else self._replies
            try:
                if n == 1:
                    reply = table[int.from_bytes(head, _NATIVE)]
                else:
                    reply = b"".join(map(table.__getitem__, memoryview(head).cast("I")))
            except KeyError:
                pass
            else:
                # PUBACK and PUBCOMP complete a flow (the keys start with 0x40, 0x50 or 0x70)
                done = (head[0] != 0x50) if n == 1 else n - head[0::4].count(0x50)
                self.acked += done
                if not stopping:
                    self.sent += done
                if whole == size:
                    if reply and self.transport is not None:
                        self.transport.write(reply)
                    return
                out = [reply] if reply else []
                self._pub_ack_walk(data[whole:], out)
                self._send_all(out)
                return
        out = []
        self._pub_ack_walk(data, out)
        self._send_all(out)

    def _pub_ack_walk(self, data: bytes, out: list[bytes]) -> None:
        packets = self._packets
        stopping = self.stopping
        done = 0
        fresh = 0
        for first, buf, body, stop in self._walk(data):
            kind = first >> 4
            pid = buf[body : body + 2]
            if stop - body > 2 and buf[body + 2] >= 0x80:
                self.failed_acks += 1
                if kind == 5:  # a failed PUBREC ends the flow: the identifier is free again
                    kind = 7
            if kind == 4 or kind == 7:  # PUBACK or PUBCOMP: the flow is complete
                done += 1
                if not stopping:
                    packet = packets.get(pid)
                    if packet is not None:
                        out.append(packet)
                        fresh += 1
            elif kind == 5:  # PUBREC -> PUBREL
                out.append(b"\x62\x02" + pid)
            else:
                self.others.append((first, buf[body:stop]))
        self.acked += done
        self.sent += fresh

    # -- teardown --------------------------------------------------------------------------

    async def stop(self) -> None:
        self.stopping = True
        if self.task is not None:
            if self._resumed is not None and not self._resumed.done():
                self._resumed.set_result(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 5)

    def send_disconnect(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire.disconnect(self.version, self.end_session))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def open_client(
    host: str,
    port: int,
    client_id: str,
    version: int,
    timeout: float = SETUP_TIMEOUT,
    clean_start: bool = True,
    session_expiry: int = 0,
) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(lambda: Client(version), host, port, ssl=TLS_CONTEXT), timeout
    )
    assert client.transport is not None
    client.transport.write(
        wire.connect(client_id, version, clean_start=clean_start, session_expiry=session_expiry)
    )
    body = await client.expect(CONNACK, timeout)
    code, props = wire.connack_result(body, version)
    if code != 0:
        client.abort()
        raise BrokerRefused(f"CONNACK refused {client_id}: reason 0x{code:02X}")
    client.receive_max = props.get(wire.PROP_RECEIVE_MAXIMUM, 65535)
    client.session_present = bool(body and body[0] & 1)
    client.granted_expiry = props.get(wire.PROP_SESSION_EXPIRY)
    return client


async def close_clients(clients: Sequence[Client], timeout: float = 3.0) -> None:
    """DISCONNECT every client and wait for the broker to close (so TIME_WAIT stays on the
    broker's side); abort the ones still open after ``timeout``."""
    for client in clients:
        client.stopping = True
    await asyncio.gather(*(c.stop() for c in clients if c.task is not None))
    for client in clients:
        client.send_disconnect()
    waiting = [c.lost for c in clients if not c.lost.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=timeout)
    for client in clients:
        if not client.lost.done():
            client.abort()


# -- raw sockets for many connections ---------------------------------------------------------


class RawClient:
    """A connected, set-up MQTT connection on a plain non-blocking socket, read by sweeps."""

    __slots__ = ("sock", "rest", "count", "eof", "others", "frame", "receive_max")

    def __init__(self, sock: socket.socket, rest: bytes, frame_len: int) -> None:
        self.sock = sock
        self.rest = rest
        self.count = 0
        self.eof = False
        self.others: list[tuple[int, bytes]] = []
        self.receive_max = 65535  # from CONNACK (open_blocking)
        second = frame_len - 2 if 0 < frame_len - 2 < 128 else -1
        self.frame = (frame_len, 0x30, second)

    def read_available(self) -> bytes:
        """What was left over plus all that has arrived (the socket does not block); sets
        ``eof`` when the broker closed the connection or it failed."""
        sock = self.sock
        data = self.rest
        while True:
            try:
                chunk = sock.recv(1 << 18)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            data += chunk
        return data

    def sweep(self) -> None:
        """Read whatever has arrived and count the PUBLISH frames in it."""
        if self.eof:
            return
        data = self.read_available()
        if data:
            n, pos = wire.count_publishes(data, *self.frame, self.others)
            self.count += n
            self.rest = data[pos:]


_CONNECTING, _AWAIT_CONNACK, _AWAIT_SUBACK = range(3)


class _Opening:
    __slots__ = ("sock", "index", "phase", "buf", "out", "later", "subscribing", "receive_max")

    def __init__(
        self, sock: socket.socket, index: int, out: bytes, subscribing: bool, split: bool = False
    ) -> None:
        self.sock = sock
        self.index = index
        self.phase = _CONNECTING
        self.buf = b""
        self.out = out  # what is still to be written: the CONNECT, and the SUBSCRIBE if any
        self.later = b""  # split: the SUBSCRIBE, written once the CONNACK has come
        if split and subscribing:
            frame = wire.next_frame(out)
            assert frame is not None
            self.out, self.later = out[: frame[2]], out[frame[2] :]
        self.subscribing = subscribing
        self.receive_max = 65535

    def send(self) -> bool:
        """Write what is left of the request; whether all of it is written."""
        try:
            n = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:  # (still connecting: wait for it)
                raise
            return False
        self.out = self.out[n:]
        return not self.out


class Opened(NamedTuple):
    """What :func:`open_many` set up, and what setting it up took: from the first connect to
    the last CONNACK (or SUBACK), in seconds of the clock and of the generator's CPU (the C
    opener's own when it did the work)."""

    clients: list[RawClient]
    elapsed_s: float
    cpu_s: float


def _requests(
    client_ids: Sequence[str],
    version: int,
    filters: Callable[[int], Sequence[tuple[str, int]]] | None,
) -> list[tuple[bytes, bool]]:
    """Each connection's first write, and whether it subscribes: the CONNECT, and the
    SUBSCRIBE to ``filters(i)`` if any in the same write, as a client may (it need not wait
    for the CONNACK)."""
    out = []
    for i, client_id in enumerate(client_ids):
        wanted = filters(i) if filters else ()
        request = wire.connect(client_id, version)
        if wanted:
            request += wire.subscribe(1, list(wanted), version)
        out.append((request, bool(wanted)))
    return out


def open_many(
    host: str,
    port: int,
    client_ids: Sequence[str],
    version: int,
    filters: Callable[[int], Sequence[tuple[str, int]]] | None = None,
    frame_len: int = 0,
    concurrency: int = 64,
    timeout: float = 120.0,
    opener: str | None = None,
    split: bool = False,
    given: Sequence[tuple[bytes, bool]] | None = None,
) -> Opened:
    """Open one connection per client id (CONNECT, then SUBSCRIBE to ``filters(i)`` if given),
    at most ``concurrency`` being set up at once: one write and one or two reads per connection
    (with ``split``, the SUBSCRIBE is written only once the CONNACK has come: two writes).

    With ``opener`` (the C program benchmarks/c/open_many.c, built by the runner) that program
    does the setting up, on sockets made here and inherited, so that setting up thousands of
    connections measures the broker rather than the generator; without it, an epoll loop in
    Python does the same. Either blocks the event loop while it works: it is only called before
    the load starts. Raises on the first refusal, timeout or connection failure, closing what
    it opened. ``given``: each connection's request itself (see :func:`open_many_requests`)."""
    requests = _requests(client_ids, version, filters) if given is None else given
    if opener is not None:
        return _open_many_c(
            opener, host, port, requests, version, frame_len, concurrency, timeout, split
        )
    t0, c0 = time.perf_counter(), procfs.own_cpu_seconds()
    n = len(client_ids)
    ep = select.epoll()
    pending: dict[int, _Opening] = {}
    done: list[RawClient] = []
    next_index = 0
    deadline = time.monotonic() + timeout
    addr = (host, port)

    def fail(message: str) -> None:
        for state in pending.values():
            state.sock.close()
        for client in done:
            client.sock.close()
        raise ConnectionError(message)

    def received(state: _Opening, buf: bytes) -> bool:
        """Handle the frames in ``buf``; whether the connection is set up."""
        while (frame := wire.next_frame(buf)) is not None:
            first, body, end = frame
            kind = first >> 4
            name = client_ids[state.index]
            if state.phase == _AWAIT_CONNACK and kind == CONNACK:
                code, props = wire.connack_result(buf[body:end], version)
                if code != 0:
                    fail(f"CONNACK refused {name}: reason 0x{code:02X}")
                state.receive_max = props.get(wire.PROP_RECEIVE_MAXIMUM, 65535)
                if state.subscribing:
                    state.phase = _AWAIT_SUBACK
                    buf = buf[end:]
                    if state.later:  # split: the SUBSCRIBE goes now
                        state.out, state.later = state.later, b""
                        if not state.send():
                            fail(f"{name}: the SUBSCRIBE did not fit the socket")
                    continue
            elif state.phase == _AWAIT_SUBACK and kind == SUBACK:
                codes = wire.suback_codes(buf[body:end], version)
                if not codes or any(code >= 0x80 for code in codes):
                    fail(f"SUBACK refused for {name}: codes {codes}")
            else:
                fail(f"{name}: unexpected packet 0x{first:02X} during setup")
            state.buf = buf[end:]
            return True
        state.buf = buf
        return False

    try:
        while next_index < n or pending:
            while len(pending) < concurrency and next_index < n:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                err = sock.connect_ex(addr)
                if err not in (0, errno.EINPROGRESS):
                    sock.close()
                    fail(f"connect to {host}:{port} failed: {os.strerror(err)}")
                _nodelay(sock)
                state = _Opening(sock, next_index, *requests[next_index], split)
                pending[sock.fileno()] = state
                if state.send():  # on loopback the connection is usually made already
                    state.phase = _AWAIT_CONNACK
                    ep.register(sock.fileno(), select.EPOLLIN)
                else:
                    ep.register(sock.fileno(), select.EPOLLOUT)
                next_index += 1
            if time.monotonic() > deadline:
                fail(f"{len(pending)} connection(s) not set up after {timeout:.0f} s")
            for fd, _events in ep.poll(1.0):
                state = pending[fd]
                sock = state.sock
                if state.phase == _CONNECTING:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(f"connect to {host}:{port} failed: {os.strerror(err)}")
                    if state.send():
                        state.phase = _AWAIT_CONNACK
                        ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    fail(f"broker closed connection {client_ids[state.index]} during setup")
                if not received(state, state.buf + chunk):
                    continue
                ep.unregister(fd)
                del pending[fd]
                opened = RawClient(sock, state.buf, frame_len)
                opened.receive_max = state.receive_max
                done.append(opened)
    finally:
        ep.close()
    return Opened(done, time.perf_counter() - t0, procfs.own_cpu_seconds() - c0)


def open_many_requests(
    host: str,
    port: int,
    requests: Sequence[tuple[bytes, bool]],
    concurrency: int,
    opener: str | None,
    version: int = wire.MQTT_5,
    timeout: float = 120.0,
) -> Opened:
    """:func:`open_many` with each connection's request given (its bytes, and whether it ends
    with a SUBSCRIBE), e.g. a CONNECT with Clean Start 0; by the C opener when given."""
    if opener is not None:
        return _open_many_c(opener, host, port, requests, version, 0, concurrency, timeout)
    names = [f"r{i}" for i in range(len(requests))]
    return open_many(
        host, port, names, version, None, 0, concurrency, timeout, None, False, requests
    )


def _open_many_c(
    opener: str,
    host: str,
    port: int,
    requests: Sequence[tuple[bytes, bool]],
    version: int,
    frame_len: int,
    concurrency: int,
    timeout: float,
    split: bool = False,
) -> Opened:
    """:func:`open_many` by the C opener: the sockets are made here and inherited by it; it
    reads their requests from stdin (descriptor, whether it subscribes, length, bytes) and
    prints its result as one JSON line."""
    socks: list[socket.socket] = []
    try:
        records = []
        for request, subscribing in requests:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setblocking(False)
            _nodelay(sock)
            records.append(struct.pack("=iBI", sock.fileno(), subscribing, len(request)))
            records.append(request)
        # (the program takes an IPv4 address: a name such as --broker localhost:1883 is
        # resolved here, as connect_ex resolves it for the Python loop)
        address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        cmd = [opener, str(address), str(port), str(version), str(concurrency), str(timeout)]
        if split:
            cmd.append("split")
        proc = subprocess.run(
            cmd,
            input=b"".join(records),
            capture_output=True,
            pass_fds=[s.fileno() for s in socks],
            timeout=timeout + 30,
            check=False,
        )
        lines = proc.stdout.decode(errors="replace").strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            result = {}
        if "error" in result or "elapsed_s" not in result:
            cause = result.get("error") or proc.stderr.decode(errors="replace").strip()
            raise ConnectionError(cause or f"{opener} ended with exit status {proc.returncode}")
        clients = []
        for i, sock in enumerate(socks):
            client = RawClient(sock, bytes.fromhex(result["rest"].get(str(i), "")), frame_len)
            client.receive_max = result["receive_max"][i]
            clients.append(client)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return Opened(clients, result["elapsed_s"], result["cpu_s"])


async def close_raw(clients: Sequence[RawClient], timeout: float = 3.0) -> None:
    """DISCONNECT every connection, wait (sweeping) for the broker to close them, then close;
    connections still open after ``timeout`` are reset rather than left in TIME_WAIT."""
    packet = wire.disconnect()
    for client in clients:
        try:
            client.sock.send(packet)
        except OSError:
            client.eof = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = [c for c in clients if not c.eof]
    while pending and loop.time() < deadline:
        await asyncio.sleep(0.05)
        for client in pending:
            client.sweep()
        pending = [c for c in pending if not c.eof]
    for client in clients:
        if not client.eof:
            with contextlib.suppress(OSError):
                client.sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
        client.sock.close()


# -- scenario 5: the busy-polling latency probe ---------------------------------------------------

LOST_AFTER = 1.0  # seconds: a message not back by then is counted as lost and the probe goes on


def _expect_blocking(
    sock: socket.socket, ptype: int, buf: bytes, deadline: float, others: list[tuple[int, bytes]]
) -> tuple[bytes, bytes]:
    """Read from a blocking socket until a packet of type ``ptype``: (its body, bytes after)."""
    while True:
        frame = wire.next_frame(buf)
        if frame is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no packet of type {ptype} from the broker")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by the broker during setup")
            buf += chunk
            continue
        first, body, end = frame
        payload, buf = buf[body:end], buf[end:]
        if first >> 4 == ptype:
            return payload, buf
        if first >> 4 == DISCONNECT:
            raise BrokerRefused(f"broker sent DISCONNECT {payload.hex()}")
        if first >> 4 != PUBLISH:
            others.append((first, payload))


def open_blocking(
    host: str,
    port: int,
    client_id: str,
    version: int,
    filters: Sequence[tuple[str, int]] = (),
    timeout: float = SETUP_TIMEOUT,
) -> RawClient:
    """One connection set up on a plain blocking socket (CONNECT, then SUBSCRIBE to ``filters``
    if any), TCP_NODELAY, returned non-blocking as a :class:`RawClient`."""
    deadline = time.monotonic() + timeout
    sock = socket.create_connection((host, port), timeout)
    others: list[tuple[int, bytes]] = []
    try:
        _nodelay(sock)
        sock.sendall(wire.connect(client_id, version))
        body, buf = _expect_blocking(sock, CONNACK, b"", deadline, others)
        code, props = wire.connack_result(body, version)
        if code != 0:
            raise BrokerRefused(f"CONNACK refused {client_id}: reason 0x{code:02X}")
        if filters:
            sock.sendall(wire.subscribe(1, list(filters), version))
            body, buf = _expect_blocking(sock, SUBACK, buf, deadline, others)
            codes = wire.suback_codes(body, version)
            if len(codes) != len(filters) or any(code >= 0x80 for code in codes):
                raise BrokerRefused(f"SUBACK refused {list(filters)}: codes {codes}")
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    client = RawClient(sock, buf, 0)
    client.others = others
    client.receive_max = props.get(wire.PROP_RECEIVE_MAXIMUM, 65535)
    return client


def stamp_offset(frame: bytes, version: int) -> int:
    """Where the payload starts in a PUBLISH ``frame`` (after the properties in MQTT 5)."""
    rl = wire.read_remaining_length(frame, 0, len(frame))
    if rl is None:
        raise ValueError("incomplete PUBLISH")
    p = rl[1] + 2 + int.from_bytes(frame[rl[1] : rl[1] + 2], "big")
    if (frame[0] >> 1) & 3:
        p += 2
    if version == wire.MQTT_5:
        props = wire.read_remaining_length(frame, p - 1, len(frame))  # Property Length
        if props is None:
            raise ValueError("incomplete PUBLISH")
        p = props[1] + props[0]
    return p


class LatencyProbe:
    """Scenario 5: a QoS 0 publisher and its subscriber on plain sockets, one busy-polling loop.

    At each send time (``1/rate`` apart) the loop sends one pre-built PUBLISH stamped with
    ``perf_counter_ns()``, then spins on the subscriber's non-blocking ``recv`` until that
    message is back and records now - stamp. Between messages it spins on the clock instead of
    sleeping: a sleeping generator would be woken by epoll when the message arrives, and that
    wake-up (tens of microseconds on a VM) would be counted as the broker's latency. A message
    not back after :data:`LOST_AFTER` seconds is counted as lost and the probe goes on.

    Run :meth:`run` in a worker thread (it holds the GIL while it spins, which is fine while
    the event loop has nothing else to do). The two connections are :class:`RawClient` objects,
    closed like the others (DISCONNECT, then the broker closes)."""

    def __init__(self, pub: RawClient, sub: RawClient, topic: str, version: int, rate: float):
        self.pub = pub
        self.sub = sub
        self.version = version
        self.interval_ns = max(1, round(1e9 / rate))
        frame = wire.publish(topic, wire.payload(0), 0, 0, version)
        self.packet = bytearray(frame)
        self.at = stamp_offset(frame, version)  # the send time goes here, 8 bytes
        self.sent = 0
        self.lost = 0
        self.late = 0  # messages that arrived after they had been counted as lost
        self.samples: list[int] = []  # ns, of messages sent within the measuring window

    @classmethod
    def open(
        cls, host: str, port: int, pub_id: str, sub_id: str, topic: str, version: int, rate: float
    ) -> LatencyProbe:
        sub = open_blocking(host, port, sub_id, version, [(topic, 0)])
        try:
            pub = open_blocking(host, port, pub_id, version)
        except BaseException:
            sub.sock.close()
            raise
        return cls(pub, sub, topic, version, rate)

    def counters(self) -> dict[str, float]:
        return {"received": self.sub.count, "sent": self.sent, "lost": self.lost}

    def run(self, warmup: float, duration: float, snapshot: Callable[[], Any]) -> tuple[Any, ...]:
        """Warm up, then measure for ``duration`` s; returns (counters, counters, snapshot,
        snapshot) at the start and end of the measuring window (``snapshot`` is Ctx.snapshot,
        taken between two messages)."""
        clock = time.perf_counter_ns
        pub, sub = self.pub, self.sub
        packet, at = self.packet, self.at
        pack_into = struct.pack_into
        interval = self.interval_ns
        lost_ns = round(LOST_AFTER * 1e9)
        v5 = self.version == wire.MQTT_5
        samples = self.samples
        t0 = clock()
        start = t0 + round(warmup * 1e9)
        end = start + round(duration * 1e9)
        recording = False
        c0, s0 = self.counters(), snapshot()
        due = t0
        while not (pub.eof or sub.eof):
            now = clock()
            if not recording and now >= start:
                c0, s0 = self.counters(), snapshot()
                recording = True
            elif recording and now >= end:
                break
            while clock() < due:
                pass
            stamp = clock()
            pack_into(">Q", packet, at, stamp)
            if not self._send(packet, stamp + lost_ns):
                break  # the connection is gone (or the broker stopped reading for 1 s)
            self.sent += 1
            arrived = self._await(stamp, stamp + lost_ns, v5)
            if arrived is not None:
                if recording:
                    samples.append(arrived - stamp)
                due += interval  # a slow message delays the next ones, which then catch up
            else:
                if recording:
                    self.lost += 1
                due = clock()  # after a second without an answer: no catching up
            self._drain_publisher()
        return c0, self.counters(), s0, snapshot()

    def _send(self, packet: bytearray, deadline: int) -> bool:
        sock = self.pub.sock
        view = memoryview(packet)
        while view:
            try:
                view = view[sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                if time.perf_counter_ns() > deadline:
                    return False  # the broker stopped reading
            except OSError:
                self.pub.eof = True
                return False
        return True

    def _await(self, stamp: int, deadline: int, v5: bool) -> int | None:
        """Spin on the subscriber until the PUBLISH stamped ``stamp`` is read: the clock then,
        or None after ``deadline`` (or when the connection ends)."""
        clock = time.perf_counter_ns
        sub = self.sub
        recv = sub.sock.recv
        buf = sub.rest
        found = None
        while found is None:
            try:
                chunk = recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                if clock() > deadline:
                    break
                continue
            except OSError:
                sub.eof = True
                break
            now = clock()
            if not chunk:
                sub.eof = True
                break
            buf = buf + chunk if buf else chunk
            pos = 0
            while (frame := wire.next_frame(buf, pos)) is not None:
                first, body, stop = frame
                pos = stop
                if first >> 4 != PUBLISH:
                    sub.others.append((first, buf[body:stop]))
                    continue
                sub.count += 1
                p = body + 2 + ((buf[body] << 8) | buf[body + 1])
                if (first >> 1) & 3:
                    p += 2
                if v5:
                    props = wire.read_remaining_length(buf, p - 1, stop)  # Property Length
                    if props is None:
                        continue
                    p = props[1] + props[0]
                if p + 8 <= stop and int.from_bytes(buf[p : p + 8], "big") == stamp:
                    found = now
                else:
                    self.late += 1
            buf = buf[pos:]
        sub.rest = buf
        return found

    def _drain_publisher(self) -> None:
        """Read what the broker sent the publisher (nothing, normally): a DISCONNECT or the
        connection closing must not go unnoticed."""
        pub = self.pub
        try:
            chunk = pub.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pub.eof = True
            return
        if not chunk:
            pub.eof = True
            return
        data = pub.rest + chunk
        _, pos = wire.count_publishes(data, 0, 0x30, -1, pub.others)
        pub.rest = data[pos:]
