"""The generator's MQTT clients: one asyncio Protocol per connection, no per-packet objects.

A :class:`Client` connects, waits for CONNACK, subscribes, and is then switched into one mode:

* counting subscriber: counts PUBLISH frames by walking fixed headers (wire.count_publishes);
* QoS 1/2 subscriber: acknowledges every PUBLISH (PUBACK, or PUBREC then PUBCOMP on PUBREL);
* latency subscriber: reads the send timestamp in each payload;
* QoS 0 flood publisher: writes pre-encoded blocks of many PUBLISH packets, as fast as the
  socket takes them (flow control through pause_writing/resume_writing);
* QoS 1/2 windowed publisher: keeps ``window`` PUBLISHes unacknowledged, each acknowledgement
  releasing a pre-encoded packet with the same packet identifier;
* rate publisher: one timestamped PUBLISH at a fixed rate.

Every handler works on whole received chunks and answers with one write per chunk.

:class:`RawClient` is a plain non-blocking socket that the event loop never watches: for
thousands of idle or nearly idle connections (scenarios 6 and 7), set up by :func:`open_many`
and read by an explicit sweep instead of one event-loop callback per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import time
from collections.abc import Callable, Sequence

from . import wire
from .wire import CONNACK, DISCONNECT, PUBLISH, SUBACK

SETUP_TIMEOUT = 30.0
FLOOD_SNDBUF = 128 * 1024  # the kernel doubles it


class BrokerRefused(Exception):
    """The broker answered CONNECT or SUBSCRIBE with a failure."""


def _nodelay(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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
        # latency mode
        self.recording = False
        self.samples: list[int] = []

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
        out = []
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
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    # -- latency subscriber ------------------------------------------------------------------

    def start_latency(self) -> None:
        self._switch(self._on_latency)

    def _on_latency(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        v5 = self.version == wire.MQTT_5
        for first, buf, body, stop in self._walk(data):
            if first >> 4 != 3:
                self.others.append((first, buf[body:stop]))
                continue
            self.count += 1
            p = body + 2 + ((buf[body] << 8) | buf[body + 1])
            if (first >> 1) & 3:
                p += 2
            if v5:
                header = wire.read_remaining_length(buf, p - 1, stop)  # property length
                if header is None:
                    continue
                plen, p = header
                p += plen
            if self.recording and p + 8 <= stop:
                self.samples.append(now - int.from_bytes(buf[p : p + 8], "big"))

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
        self._switch(self._on_pub_ack)
        self.sent += window
        self.transport.write(b"".join(self._packets.values()))

    def _on_pub_ack(self, data: bytes) -> None:
        out = []
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
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def start_rate(self, topic: str, rate: float) -> None:
        """QoS 0 at ``rate`` messages per second, each stamped with perf_counter_ns()."""
        self._switch(self._on_ignore)
        self.task = asyncio.get_running_loop().create_task(self._rate(topic, rate))

    async def _rate(self, topic: str, rate: float) -> None:
        transport = self.transport
        assert transport is not None
        sample = wire.publish(topic, wire.payload(0), 0, 0, self.version)
        head, tail = sample[: -wire.PAYLOAD_SIZE], sample[-wire.PAYLOAD_SIZE + 8 :]
        loop = asyncio.get_running_loop()
        start = loop.time()
        interval = 1.0 / rate
        n = 0
        while not self.stopping and not self.lost.done():
            transport.write(head + time.perf_counter_ns().to_bytes(8, "big") + tail)
            n += 1
            self.sent += 1
            delay = start + n * interval - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)

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
        loop.create_connection(lambda: Client(version), host, port), timeout
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

    __slots__ = ("sock", "rest", "count", "eof", "others", "frame")

    def __init__(self, sock: socket.socket, rest: bytes, frame_len: int) -> None:
        self.sock = sock
        self.rest = rest
        self.count = 0
        self.eof = False
        self.others: list[tuple[int, bytes]] = []
        second = frame_len - 2 if 0 < frame_len - 2 < 128 else -1
        self.frame = (frame_len, 0x30, second)

    def sweep(self) -> None:
        """Read whatever has arrived and count the PUBLISH frames in it."""
        if self.eof:
            return
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
        if data:
            n, pos = wire.count_publishes(data, *self.frame, self.others)
            self.count += n
            self.rest = data[pos:]


_CONNECTING, _AWAIT_CONNACK, _AWAIT_SUBACK = range(3)


class _Opening:
    __slots__ = ("sock", "index", "phase", "buf")

    def __init__(self, sock: socket.socket, index: int) -> None:
        self.sock = sock
        self.index = index
        self.phase = _CONNECTING
        self.buf = b""


def open_many(
    host: str,
    port: int,
    client_ids: Sequence[str],
    version: int,
    filters: Callable[[int], Sequence[tuple[str, int]]] | None = None,
    frame_len: int = 0,
    concurrency: int = 64,
    timeout: float = 120.0,
) -> list[RawClient]:
    """Open one connection per client id (CONNECT, then SUBSCRIBE to ``filters(i)`` if given),
    at most ``concurrency`` being set up at once.

    This runs its own epoll loop and blocks the event loop while it works: it is only called
    before the load starts, and it costs a fraction of what the event loop's sock_* calls do
    per connection (which would make the generator, not the broker, the measured side).
    Raises on the first refusal, timeout or connection failure, closing what it opened."""
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
                pending[sock.fileno()] = _Opening(sock, next_index)
                ep.register(sock.fileno(), select.EPOLLOUT)
                next_index += 1
            if time.monotonic() > deadline:
                fail(f"{len(pending)} connection(s) not set up after {timeout:.0f} s")
            for fd, _events in ep.poll(1.0):
                state = pending[fd]
                sock, index, phase, buf = state.sock, state.index, state.phase, state.buf
                if phase == _CONNECTING:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(f"connect to {host}:{port} failed: {os.strerror(err)}")
                    sock.send(wire.connect(client_ids[index], version))
                    state.phase = _AWAIT_CONNACK
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    fail(f"broker closed connection {client_ids[index]} during setup")
                buf += chunk
                frame = wire.next_frame(buf)
                if frame is None:
                    state.buf = buf
                    continue
                first, body, end = frame
                kind = first >> 4
                if phase == _AWAIT_CONNACK and kind == CONNACK:
                    code, _ = wire.connack_result(buf[body:end], version)
                    if code != 0:
                        fail(f"CONNACK refused {client_ids[index]}: reason 0x{code:02X}")
                    wanted = filters(index) if filters else ()
                    if wanted:
                        sock.send(wire.subscribe(1, list(wanted), version))
                        state.phase = _AWAIT_SUBACK
                        state.buf = buf[end:]
                        continue
                elif phase == _AWAIT_SUBACK and kind == SUBACK:
                    codes = wire.suback_codes(buf[body:end], version)
                    if not codes or any(code >= 0x80 for code in codes):
                        fail(f"SUBACK refused for {client_ids[index]}: codes {codes}")
                else:
                    fail(f"{client_ids[index]}: unexpected packet 0x{first:02X} during setup")
                ep.unregister(fd)
                del pending[fd]
                done.append(RawClient(sock, buf[end:], frame_len))
    finally:
        ep.close()
    return done


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
