"""The broker's own TCP transport (``_streams``, C on epoll; streams.py) with real sockets, on
asyncio's loop and uvloop: what a protocol sees (connection_made, data_received, eof_received,
connection_lost, pause_writing and resume_writing), what a client sees (the bytes written,
EOF after write_eof or close, nothing more after abort), and the listener around it (accepting
again after running out of descriptors, the epoll instance released after the last
connection). The broker's TCP listeners use it whenever it is built (the rest of the suite runs
over it); the last tests check that, and the loop's server in its place otherwise."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import os
import resource
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.clients import CONNACK_OK, MQTT_311, connect_packet, unique
from support.listeners import LOOPS, memory_config, run_on

from mqttbroker import compiled
from mqttbroker.config import ListenerConfig
from mqttbroker.server import streams
from mqttbroker.server.app import Server
from mqttbroker.server.proxy import bind
from mqttbroker.server.streams import StreamServer

pytestmark = pytest.mark.needs_compiled  # the C transport

GUARD = 10.0  # seconds: a failure guard, never a measured time


class Recorder(asyncio.Protocol):
    """Records every callback; ``echo`` writes back what it reads; ``keep_open`` is what
    eof_received answers."""

    def __init__(self, echo: bool = False, keep_open: bool = False) -> None:
        self.echo = echo
        self.keep_open = keep_open
        self.transport: Any = None
        self.events: list[str] = []
        self.data = bytearray()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.changed = asyncio.Event()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.changed.set()
        if self.echo:
            self.transport.write(data)

    def eof_received(self) -> bool:
        self.events.append("eof")
        self.changed.set()
        return self.keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.events.append("pause")
        self.changed.set()

    def resume_writing(self) -> None:
        self.events.append("resume")
        self.changed.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


class Listening:
    """A StreamServer on a free loopback port, and plain blocking-free client sockets. Without
    TCP_DEFER_ACCEPT unless ``defer``: a client that has sent nothing is accepted at once."""

    def __init__(
        self, factory: Callable[[], asyncio.Protocol], defer: bool = False, gather: float = 0.0
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.protocols: list[Any] = []

        def make() -> asyncio.Protocol:
            protocol = factory()
            self.protocols.append(protocol)
            return protocol

        self.server = StreamServer(
            self.loop,
            bind("127.0.0.1", 0, False, 16),
            make,  # type: ignore[arg-type]
            None if defer else 0,
            gather=gather,
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def client(self, rcvbuf: int = 0) -> tuple[socket.socket, Any]:
        """A connected client socket (its receive buffer ``rcvbuf`` bytes, when given) and its
        connection's protocol."""
        count = len(self.protocols)
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await self.loop.sock_connect(sock, ("127.0.0.1", self.port))
        async with asyncio.timeout(GUARD):
            while len(self.protocols) == count:
                await asyncio.sleep(0.005)
        return sock, self.protocols[count]

    async def read_exactly(self, sock: socket.socket, size: int, piece: int = 1 << 20) -> bytes:
        """``size`` bytes from ``sock``, read ``piece`` bytes at most at a time."""
        data = bytearray()
        async with asyncio.timeout(GUARD):
            while len(data) < size:
                chunk = await self.loop.sock_recv(sock, min(piece, size - len(data)))
                assert chunk, f"EOF after {len(data)} of {size} bytes"
                data += chunk
        return bytes(data)

    async def read_until_eof(self, sock: socket.socket) -> bytes:
        data = bytearray()
        async with asyncio.timeout(GUARD):
            while chunk := await self.loop.sock_recv(sock, 65536):
                data += chunk
        return bytes(data)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_reads_writes_and_closes_as_asyncio_s_transports(loop: str) -> None:
    async def scenario() -> tuple[Any, ...]:
        listening = Listening(lambda: Recorder(echo=True))
        sock, protocol = await listening.client()
        stream = protocol.transport
        names = stream.get_extra_info("peername"), stream.get_extra_info("sockname")
        missing = stream.get_extra_info("ssl_object", "none")
        await listening.loop.sock_sendall(sock, b"hello ")
        await listening.loop.sock_sendall(sock, b"world")
        await protocol.until(lambda: len(protocol.data) == 11)
        sock.shutdown(socket.SHUT_WR)  # EOF: eof_received answers False, the stream closes
        echoed = await listening.read_until_eof(sock)
        lost = await asyncio.wait_for(protocol.lost, GUARD)
        closing = stream.is_closing()
        client_name = sock.getsockname()
        sock.close()
        listening.server.close()
        return names, client_name, missing, echoed, lost, protocol.events, closing

    names, client_name, missing, echoed, lost, events, closing = run_on(loop, scenario)
    assert names[0] == client_name and names[1][0] == "127.0.0.1"
    assert missing == "none"
    assert echoed == b"hello world"
    assert lost is None and events == ["made", "eof", "lost"] and closing


def test_a_connection_s_transport_is_small_and_outside_the_cycle_collector() -> None:
    """What an idle connection costs here: 64 bytes, and nothing the collector walks."""

    async def scenario() -> tuple[int, bool, int]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        stream = protocol.transport
        size, tracked = sys.getsizeof(stream), gc.is_tracked(stream)
        sock.close()
        await asyncio.wait_for(protocol.lost, GUARD)
        listening.server.close()
        return size, tracked, stream.get_write_buffer_size()

    assert asyncio.run(scenario()) == (64, False, 0)


def test_a_connection_is_accepted_with_its_first_bytes_and_they_are_read_at_once() -> None:
    """The listening socket defers accepting until the client's first bytes arrive
    (TCP_DEFER_ACCEPT), and the poller reads them right after connection_made, before the
    loop runs anything else: one wake-up of the broker per new client, not two."""

    class Ordered(Recorder):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            asyncio.get_running_loop().call_soon(self.events.append, "next callback")

        def data_received(self, data: bytes) -> None:
            self.events.append("data")
            super().data_received(data)

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Ordered, defer=True)
        deferred = listening.server.sockets[0].getsockopt(
            socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT
        )
        sock = socket.socket()
        sock.setblocking(False)
        await listening.loop.sock_connect(sock, ("127.0.0.1", listening.port))
        await asyncio.sleep(0.05)  # connected, nothing sent: not handed over yet
        before_bytes = len(listening.protocols)
        await listening.loop.sock_sendall(sock, b"CONNECT")
        async with asyncio.timeout(GUARD):
            while not listening.protocols or "next callback" not in listening.protocols[0].events:
                await asyncio.sleep(0.005)
        sock.close()
        listening.server.close()
        return deferred, before_bytes, listening.protocols[0].events[:3]

    deferred, before_bytes, events = asyncio.run(scenario())
    assert deferred > 0 and before_bytes == 0
    assert events == ["made", "data", "next callback"]


def test_a_socket_with_more_than_one_buffer_of_input_is_read_again_in_the_same_pass() -> None:
    """As libuv does: while a read fills the whole buffer (256 KiB) the socket is read again
    before the loop goes on, so a fast publisher's input is handled in large passes."""

    class Counting(Recorder):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            transport.pause_reading()

        def data_received(self, data: bytes) -> None:
            if not self.events.count("data"):  # the loop's next callback marks the pass's end
                asyncio.get_running_loop().call_soon(self.events.append, "mark")
            if "mark" not in self.events:
                self.events.append("data")
            super().data_received(data)

    async def scenario() -> tuple[int, int]:
        listening = Listening(Counting)
        listening.server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 << 20)
        sock, protocol = await listening.client()
        payload = b"p" * (700 * 1024)  # more than two reads' worth, buffered while paused
        await listening.loop.sock_sendall(sock, payload)
        await asyncio.sleep(0.05)  # all of it in the broker's socket
        protocol.transport.resume_reading()
        await protocol.until(lambda: len(protocol.data) == len(payload))
        sock.close()
        listening.server.close()
        return protocol.events.count("data"), len(protocol.data)

    reads_in_one_pass, received = asyncio.run(scenario())
    assert received == 700 * 1024
    assert reads_in_one_pass >= 3


def _accepted_side(client: socket.socket) -> socket.socket:
    """This process's socket at the other end of ``client`` (a duplicate of its descriptor)."""
    wanted = client.getsockname()
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            copy = os.dup(fd)
        except OSError:
            continue  # gone meanwhile (the listing's own descriptor)
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)  # not a socket
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == wanted:
                return sock
        except OSError:
            pass
        sock.close()
    raise AssertionError("no accepted socket for the client")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_lone_read_after_a_quiet_spell_holds_its_ack_until_handled(loop: str) -> None:
    """When one socket is ready after a quiet spell, its TCP acknowledgement is held while the
    protocol handles the read (TCP_QUICKACK off: what data_received writes goes out first, not
    after the ACK that recv() would send) and released right after (TCP_QUICKACK on again,
    which sends it). A pass with two sockets ready leaves the kernel acknowledging as it does
    by itself. Checked through the mode the kernel reports for the accepted socket."""

    modes: dict[socket.socket, list[str]] = {}

    class Acknowledging(Recorder):
        accepted: socket.socket

        def data_received(self, data: bytes) -> None:
            sock = self.accepted

            def mode(when: str) -> None:
                quick = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)
                modes.setdefault(sock, []).append(f"{when}: {'quick' if quick else 'held'}")

            mode("reading")
            super().data_received(data)
            asyncio.get_running_loop().call_soon(mode, "after the pass")

    async def scenario() -> tuple[list[str], list[str], list[str], bytes]:
        listening = Listening(lambda: Acknowledging(echo=True))
        (one, first), (two, second) = await listening.client(), await listening.client()
        first.accepted, second.accepted = _accepted_side(one), _accepted_side(two)
        await asyncio.sleep(0.05)  # quiet: nothing for the poller meanwhile
        await listening.loop.sock_sendall(one, b"alone")
        await first.until(lambda: len(first.data) == 5)
        echoed = await listening.loop.sock_recv(one, 16)
        await asyncio.sleep(0.05)
        alone = list(modes[first.accepted])
        modes.clear()
        # No replies now: a reply soon after a receipt puts the socket in the kernel's own
        # "held" mode (Linux 6.0 on), which is not what is checked here.
        first.echo = second.echo = False
        one.send(b"crowd")
        two.send(b"crowd")
        accepted = [first.accepted, second.accepted]
        deadline = time.monotonic() + GUARD
        while len(select.select(accepted, [], [], GUARD)[0]) < 2:
            # both in before the loop polls again: one pass, two sockets
            assert time.monotonic() < deadline, "the second segment never arrived"
        await first.until(lambda: len(first.data) == 10)
        await second.until(lambda: len(second.data) == 5)
        await asyncio.sleep(0.01)
        crowd = modes[first.accepted], modes[second.accepted]
        for sock in (one, two, *accepted):
            sock.close()
        listening.server.close()
        return alone, *crowd, echoed

    alone, crowd_one, crowd_two, echoed = run_on(loop, scenario)
    assert echoed == b"alone"
    assert alone == ["reading: held", "after the pass: quick"]
    assert crowd_one == crowd_two == ["reading: quick", "after the pass: quick"]


@pytest.mark.parametrize("loop", LOOPS)
def test_the_pass_hooks_frame_each_pass_that_finds_sockets_ready(loop: str) -> None:
    """``hooks(begin, end)``: begin() before and end() after each poll() that finds sockets
    ready, none for a poll that finds nothing, and end() after a callback that raised too
    (what the broker's flush at the end of a pass relies on); both or neither. The test runs
    the passes."""
    calls: list[str] = []

    class Reading(Recorder):
        def data_received(self, data: bytes) -> None:
            calls.append(data.decode())
            if data == b"stop":
                raise KeyboardInterrupt  # not an Exception: poll() itself raises it

    async def scenario() -> list[list[str]]:
        listening = Listening(Reading)
        poller = listening.server.poller
        poller.hooks(lambda: calls.append("begin"), lambda: calls.append("end"))
        (one, _), (two, _) = await listening.client(), await listening.client()
        accepted = [_accepted_side(one), _accepted_side(two)]
        listening.loop.remove_reader(poller.fileno())
        calls.clear()
        passes: list[list[str]] = []

        def ready(count: int) -> None:
            deadline = time.monotonic() + GUARD
            while len(select.select(accepted, [], [], GUARD)[0]) < count:
                assert time.monotonic() < deadline, "the segments never arrived"

        poller.poll()  # nothing ready
        passes.append(list(calls))
        one.send(b"a")
        two.send(b"b")
        ready(2)
        poller.poll()
        passes.append(list(calls))
        calls.clear()
        one.send(b"stop")
        ready(1)
        with pytest.raises(KeyboardInterrupt):
            poller.poll()
        passes.append(list(calls))
        with pytest.raises(TypeError):  # both or neither
            poller.hooks(None, lambda: None)  # type: ignore[call-overload]
        poller.hooks(None, None)
        calls.clear()
        two.send(b"c")
        ready(1)
        poller.poll()
        passes.append(list(calls))
        for sock in (one, two, *accepted):
            sock.close()
        listening.server.close()
        return passes

    idle, both, raised, unhooked = run_on(loop, scenario)
    assert idle == []
    assert both[0] == "begin" and both[-1] == "end" and sorted(both[1:-1]) == ["a", "b"]
    assert raised == ["begin", "stop", "end"]
    assert unhooked == ["c"]


def test_a_poller_its_loop_lets_go_of_after_shutdown_closes_what_is_left_once() -> None:
    """A listener shut down while connections are open keeps its epoll instance until the last
    one closes; if the loop lets go of the poller first (the loop closing), the poller closes
    them as it goes, and is freed once (its release with the last connection used to free it
    a second time, from within its own deallocation)."""

    async def scenario() -> bytes:
        listening = Listening(Recorder)
        sock, _ = await listening.client()
        poller = listening.server.poller
        listening.server.close()
        listening.loop.remove_reader(poller.fileno())
        del poller, listening
        gc.collect()
        sock.setblocking(True)
        sock.settimeout(GUARD)
        try:
            return sock.recv(16)  # EOF: the poller closed the connection as it went
        finally:
            sock.close()

    assert asyncio.run(scenario()) == b""


def test_past_the_high_water_mark_the_protocol_pauses_and_resumes_below_the_low() -> None:
    """A client that does not read: writes are buffered, pause_writing once past ``high``,
    resume_writing once the client has read it down to ``low``; every byte arrives in order."""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        stream = protocol.transport
        stream.set_write_buffer_limits(high=256 * 1024, low=64 * 1024)
        limits = stream.get_write_buffer_limits()
        chunk = bytes(range(256)) * 256  # 64 KiB
        written = 0
        while "pause" not in protocol.events:
            stream.write(chunk)
            written += len(chunk)
        paused_at = stream.get_write_buffer_size()
        received = bytearray()
        async with asyncio.timeout(GUARD):
            while len(received) < written:
                received += await listening.loop.sock_recv(sock, 1 << 20)
        await protocol.until(lambda: "resume" in protocol.events)
        left = stream.get_write_buffer_size()
        sock.close()
        listening.server.close()
        return limits, paused_at, written, bytes(received), chunk, protocol.events, left

    limits, paused_at, written, received, chunk, events, left = asyncio.run(scenario())
    assert limits == (64 * 1024, 256 * 1024)
    assert paused_at > 256 * 1024
    assert received == chunk * (written // len(chunk))
    assert events[:3] == ["made", "pause", "resume"] and left == 0


@pytest.mark.parametrize("loop", LOOPS)
def test_close_sends_what_is_buffered_first_and_abort_drops_it(loop: str) -> None:
    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        closing_sock, closing = await listening.client()
        aborting_sock, aborting = await listening.client()
        payload = b"x" * (8 << 20)  # more than the sockets take at once: some is buffered
        closing.transport.write(payload)
        aborting.transport.write(payload)
        buffered = closing.transport.get_write_buffer_size()
        closing.transport.close()
        aborting.transport.abort()
        closing.transport.write(b"after close")  # sent still, as by asyncio's transports
        aborting.transport.write(b"after abort")  # dropped
        lost_on_abort = await asyncio.wait_for(aborting.lost, GUARD)
        received = await listening.read_until_eof(closing_sock)
        lost_on_close = await asyncio.wait_for(closing.lost, GUARD)
        try:
            cut = len(await listening.read_until_eof(aborting_sock))
        except ConnectionResetError:
            cut = 0
        for sock in (closing_sock, aborting_sock):
            sock.close()
        listening.server.close()
        return buffered, received == payload + b"after close", cut, lost_on_close, lost_on_abort

    buffered, complete, cut, lost_on_close, lost_on_abort = run_on(loop, scenario)
    assert buffered > 0
    assert complete and lost_on_close is None
    assert cut < 8 << 20 and lost_on_abort is None


# More than a loopback socket takes at once (tcp_wmem's 4 MiB at most, and the client's small
# receive buffer): a write this large leaves most of itself unsent.
BEYOND_SOCKET = 16 << 20


def _pattern(size: int, seed: int) -> bytes:
    """``size`` bytes that differ from any other seed's and shift every 251 bytes: a byte out
    of place or order shows."""
    return bytes((seed + i) % 251 for i in range(251)) * (size // 251) + bytes(size % 251)


def test_unsent_large_bytes_are_kept_by_reference_in_order_with_copied_writes() -> None:
    """Behind a full socket, a bytes object of 16 KiB or more is kept by reference (its reference
    count says so: no copy, whoever else holds it), smaller writes and mutable ones (bytearray,
    memoryview) are copied (changed after write(), they are sent as they were), the buffer's
    size counts them all, and the client reads every byte in the order written; each reference
    goes once its bytes are sent. (A bytes object nobody else holds, made for the write, is
    copied: it is last here.)"""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client(rcvbuf=16384)
        stream = protocol.transport
        stream.set_write_buffer_limits(high=1 << 30)  # no pause: not what this test is about
        filler = _pattern(BEYOND_SOCKET, 1)
        large, other = _pattern(1 << 20, 2), _pattern(64 << 10, 3)
        mutable, viewed = bytearray(_pattern(256 << 10, 4)), bytearray(_pattern(128 << 10, 5))
        view = memoryview(viewed)
        writes = [b"small 1", large, b"small 2", mutable, other, view, b"x" * 100, large, b"end"]
        expected = filler + b"".join(bytes(data) for data in writes) + _pattern(32 << 10, 6)
        objects = (filler, large, other, mutable, view)
        base = [sys.getrefcount(obj) for obj in objects]
        stream.write(filler)
        filled = stream.get_write_buffer_size()
        for data in writes:  # all behind the filler: none is sent at once
            stream.write(data)
        stream.write(_pattern(32 << 10, 6))
        held = [sys.getrefcount(obj) for obj in objects]
        size = stream.get_write_buffer_size()
        mutable[:] = bytes(len(mutable))  # changed after write(): what was written is sent
        viewed[:] = bytes(len(viewed))
        received = await listening.read_exactly(sock, len(expected))
        after = [sys.getrefcount(obj) for obj in objects]
        left = stream.get_write_buffer_size()
        sock.close()
        listening.server.close()
        held = [count - before for count, before in zip(held, base, strict=True)]
        after = [count - before for count, before in zip(after, base, strict=True)]
        return filled, held, size, len(expected), received == expected, after, left

    filled, held, size, total, in_order, after, left = asyncio.run(scenario())
    assert 0 < filled < BEYOND_SOCKET  # the socket took part of the filler, not all
    assert held == [1, 2, 1, 0, 0]  # filler, large (written twice), other; not the mutable
    assert size == filled + total - BEYOND_SOCKET  # every write counted, kept or copied
    assert in_order
    assert after == [0, 0, 0, 0, 0] and left == 0


def test_a_bytes_object_partly_sent_is_kept_from_where_the_socket_stopped() -> None:
    """One large write the socket takes part of: the rest is kept by reference from there, and
    sent as the client reads, a little at a time (many partial sends), every byte once and in
    order; the reference goes with the last byte."""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client(rcvbuf=16384)
        stream = protocol.transport
        stream.set_write_buffer_limits(high=1 << 30)
        data = _pattern(BEYOND_SOCKET, 7)
        base = sys.getrefcount(data)
        stream.write(data)
        unsent = stream.get_write_buffer_size()
        held = sys.getrefcount(data) - base
        # What the socket took, and 1 MiB more, which the transport sent since, in parts.
        taken = len(data) - unsent
        received = bytearray(await listening.read_exactly(sock, taken + (1 << 20), 16384))
        partly = stream.get_write_buffer_size()  # less now, still some
        held_partly = sys.getrefcount(data) - base
        received += await listening.read_exactly(sock, len(data) - len(received), 65536)
        after = sys.getrefcount(data) - base
        sock.close()
        listening.server.close()
        return unsent, held, partly, held_partly, bytes(received) == data, after

    unsent, held, partly, held_partly, complete, after = asyncio.run(scenario())
    assert 0 < unsent < BEYOND_SOCKET and held == 1
    assert 0 < partly < unsent and held_partly == 1
    assert complete and after == 0


def refcounts(*objects: object) -> list[int]:
    return [sys.getrefcount(o) for o in objects]


def held_since(base: list[int], now: list[int]) -> tuple[int, ...]:
    """The references held now beyond ``base`` (``refcounts`` of the same objects, earlier)."""
    return tuple(n - b for n, b in zip(now, base, strict=True))


async def _unbounded(factory: Callable[[], Any]) -> tuple[Listening, socket.socket, Any, Any]:
    """A client that reads slowly (small receive buffer) of a stream whose write buffer has no
    limit worth the name: the listening server, the client's socket, the protocol and its
    stream."""
    listening = Listening(factory)
    sock, protocol = await listening.client(rcvbuf=16384)
    stream = protocol.transport
    stream.set_write_buffer_limits(high=1 << 30)
    return listening, sock, protocol, stream


@pytest.mark.parametrize("end", ["close", "write_eof"])
def test_close_and_write_eof_send_the_bytes_kept_by_reference_first(end: str) -> None:
    """close() or write_eof() while all that is left to send is kept by reference (nothing
    copied): the client reads it all, then EOF; the references go once sent."""

    async def scenario() -> tuple[Any, ...]:
        listening, sock, protocol, stream = await _unbounded(lambda: Recorder(keep_open=True))
        first, second = _pattern(BEYOND_SOCKET, 11), _pattern(1 << 20, 12)
        base = refcounts(first, second)
        stream.write(first)
        stream.write(second)
        held = held_since(base, refcounts(first, second))
        getattr(stream, end)()
        received = await listening.read_until_eof(sock)
        after = held_since(base, refcounts(first, second))
        if end == "write_eof":  # still open: the client ends it
            sock.shutdown(socket.SHUT_WR)
            protocol.keep_open = False
        lost = await asyncio.wait_for(protocol.lost, GUARD)
        sock.close()
        listening.server.close()
        return held, received == first + second, after, lost

    held, complete, after, lost = asyncio.run(scenario())
    assert held == (1, 1)
    assert complete and after == (0, 0) and lost is None


def test_abort_drops_the_bytes_kept_by_reference_and_lets_them_go_at_once() -> None:
    async def scenario() -> tuple[Any, ...]:
        listening, sock, protocol, stream = await _unbounded(Recorder)
        first, second = _pattern(BEYOND_SOCKET, 13), _pattern(1 << 20, 14)
        base = refcounts(first, second)
        stream.write(first)
        stream.write(b"between")
        stream.write(second)
        held = held_since(base, refcounts(first, second))
        stream.abort()
        after = held_since(base, refcounts(first, second))
        left = stream.get_write_buffer_size()
        lost = await asyncio.wait_for(protocol.lost, GUARD)
        try:
            cut = len(await listening.read_until_eof(sock))
        except ConnectionResetError:
            cut = 0
        sock.close()
        listening.server.close()
        return held, after, left, lost, cut

    held, after, left, lost, cut = asyncio.run(scenario())
    assert held == (1, 1)
    assert after == (0, 0) and left == 0  # released by abort() itself, not later
    assert lost is None and cut < BEYOND_SOCKET


def test_write_eof_ends_the_output_and_reading_goes_on() -> None:
    """write_eof: the client reads what was written, then EOF, and can still send; its EOF
    then closes the stream (eof_received answers False)."""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        stream = protocol.transport
        stream.write(b"last words")
        stream.write_eof()
        try:
            stream.write(b"more")
        except RuntimeError as exc:
            refused = str(exc)
        received = await listening.read_until_eof(sock)
        await listening.loop.sock_sendall(sock, b"still heard")
        await protocol.until(lambda: protocol.data == b"still heard")
        sock.shutdown(socket.SHUT_WR)
        lost = await asyncio.wait_for(protocol.lost, GUARD)
        sock.close()
        listening.server.close()
        return received, refused, lost, protocol.events

    received, refused, lost, events = asyncio.run(scenario())
    assert received == b"last words" and "write_eof" in refused
    assert lost is None and events == ["made", "eof", "lost"]


def test_a_half_closed_stream_kept_open_still_writes() -> None:
    async def scenario() -> tuple[Any, ...]:
        listening = Listening(lambda: Recorder(keep_open=True))
        sock, protocol = await listening.client()
        sock.shutdown(socket.SHUT_WR)
        await protocol.until(lambda: "eof" in protocol.events)
        open_after_eof = not protocol.transport.is_closing()
        protocol.transport.write(b"answer")
        protocol.transport.close()
        received = await listening.read_until_eof(sock)
        await asyncio.wait_for(protocol.lost, GUARD)
        sock.close()
        listening.server.close()
        return open_after_eof, received

    assert asyncio.run(scenario()) == (True, b"answer")


def test_paused_reading_holds_the_bytes_until_resumed() -> None:
    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        stream = protocol.transport
        stream.pause_reading()
        reading = stream.is_reading()
        await listening.loop.sock_sendall(sock, b"held")
        # A round trip through a second connection: the poller has served its events since.
        other, echo = await listening.client()
        echo.transport.write(b"ping")
        await listening.loop.sock_recv(other, 4)
        held = bytes(protocol.data)
        stream.resume_reading()
        await protocol.until(lambda: protocol.data == b"held")
        for each in (sock, other):
            each.close()
        listening.server.close()
        return reading, held

    assert asyncio.run(scenario()) == (False, b"")


def test_a_reset_reaches_connection_lost_as_the_error() -> None:
    """Each reset its own ConnectionResetError, with errno and message as the OS gives them
    (the message is made once per errno and kept)."""

    async def scenario() -> list[Any]:
        listening = Listening(Recorder)
        errors = []
        for _ in range(2):
            sock, protocol = await listening.client()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # with linger 0: a reset
            errors.append(await asyncio.wait_for(protocol.lost, GUARD))
        listening.server.close()
        return errors

    first, second = asyncio.run(scenario())
    for lost in (first, second):
        assert type(lost) is ConnectionResetError
        assert lost.errno == errno.ECONNRESET
        assert lost.strerror == os.strerror(errno.ECONNRESET)
        assert lost.args == (errno.ECONNRESET, os.strerror(errno.ECONNRESET))
    assert first is not second


def test_set_write_buffer_limits_and_get_extra_info_take_arguments_as_asyncio_s() -> None:
    """By position or by name (as asyncio's ``set_write_buffer_limits(high=None, low=None)``
    and ``get_extra_info(name, default=None)``), the defaults as asyncio's: low a quarter of
    high, high four times low."""

    async def scenario() -> tuple[list[Any], list[str]]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        stream = protocol.transport
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((), {}),
            ((4000,), {}),
            ((4000, 100), {}),
            ((), {"high": 8000}),
            ((), {"low": 300}),
            ((), {"low": 10, "high": 20}),
            ((5000,), {"low": 200}),
        ]
        limits = []
        for args, kwargs in calls:
            stream.set_write_buffer_limits(*args, **kwargs)
            limits.append(stream.get_write_buffer_limits())
        wrong: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((1, 2, 3), {}),
            ((), {"hi": 1}),
            ((4000,), {"high": 1}),
            ((10, 20), {}),
            (("x",), {}),
        ]
        errors = []
        for args, kwargs in wrong:
            try:
                stream.set_write_buffer_limits(*args, **kwargs)
            except (TypeError, ValueError) as exc:
                errors.append(type(exc).__name__)
        peer = sock.getsockname()
        infos = [
            stream.get_extra_info("peername"),
            stream.get_extra_info(name="peername"),
            stream.get_extra_info("nothing"),
            stream.get_extra_info("nothing", 7),
            stream.get_extra_info("nothing", default=8),
            stream.get_extra_info(default=9, name="nothing"),
        ]
        assert infos == [peer, peer, None, 7, 8, 9]
        wrong = [
            ((), {}),
            (("a", 1, 2), {}),
            (("a",), {"name": "b"}),
            ((), {"x": 1}),
        ]
        for args, kwargs in wrong:
            try:
                stream.get_extra_info(*args, **kwargs)
            except TypeError as exc:
                errors.append(type(exc).__name__)
        sock.close()
        listening.server.close()
        return limits, errors

    limits, errors = asyncio.run(scenario())
    assert limits == [
        (16384, 65536),
        (1000, 4000),
        (100, 4000),
        (2000, 8000),
        (300, 1200),
        (10, 20),
        (200, 5000),
    ]
    assert (
        errors
        == ["TypeError", "TypeError", "TypeError", "ValueError", "TypeError"] + ["TypeError"] * 4
    )


def _accepted_nodelay(client: tuple[str, int]) -> int:
    """TCP_NODELAY of this process's socket connected to ``client``."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue  # not a socket, or gone meanwhile
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == client:
                return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        except OSError:
            pass
        finally:
            sock.detach()  # not ours to close
    raise AssertionError("no accepted socket for the client")


def test_accepted_sockets_have_tcp_nodelay_set_on_the_listener_or_on_each() -> None:
    """Nagle's algorithm is off on every accepted socket: set on the listening socket, whose
    accepted sockets inherit it (Linux), or on each when they do not (a Unix socket has none)."""

    async def scenario() -> tuple[int, list[int]]:
        listening = Listening(Recorder)
        listener = listening.server.sockets[0]
        on_listener = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        found = []
        clients = []
        for _ in range(3):
            sock, _protocol = await listening.client()
            clients.append(sock)
            found.append(_accepted_nodelay(sock.getsockname()))
        for sock in clients:
            sock.close()
        listening.server.close()
        return on_listener, found

    on_listener, found = asyncio.run(scenario())
    assert on_listener and all(found) and len(found) == 3


@pytest.mark.parametrize("loop", LOOPS)
def test_a_protocol_error_goes_to_the_loop_s_handler_and_aborts_only_its_connection(
    loop: str,
) -> None:
    class Failing(Recorder):
        def data_received(self, data: bytes) -> None:
            if data == b"boom":
                raise ValueError("bad input")
            super().data_received(data)

    async def scenario() -> tuple[Any, ...]:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        listening = Listening(lambda: Failing(echo=True))
        bad_sock, bad = await listening.client()
        good_sock, good = await listening.client()
        await listening.loop.sock_sendall(bad_sock, b"boom")
        await asyncio.wait_for(bad.lost, GUARD)
        await listening.loop.sock_sendall(good_sock, b"fine")
        echoed = await listening.loop.sock_recv(good_sock, 4)
        for sock in (bad_sock, good_sock):
            sock.close()
        listening.server.close()
        return reported, bad, echoed

    reported, bad, echoed = run_on(loop, scenario)
    assert len(reported) == 1
    assert isinstance(reported[0]["exception"], ValueError)
    assert "data_received" in reported[0]["message"] and reported[0]["protocol"] is bad
    assert bad.transport.is_closing() and echoed == b"fine"


def test_accepting_pauses_when_descriptors_run_out_and_resumes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(streams, "ACCEPT_RETRY", 0.05)

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        sock = socket.socket()
        sock.setblocking(False)
        probe = socket.socket()
        lowest_free = probe.fileno()
        probe.close()
        # No descriptor free for the accepted socket (the client's is taken first).
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            await listening.loop.sock_connect(sock, ("127.0.0.1", listening.port))
            async with asyncio.timeout(GUARD):
                while not listening.server.accept_errors:
                    await asyncio.sleep(0.005)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        async with asyncio.timeout(GUARD):  # accepted once the retry comes
            while not listening.protocols:
                await asyncio.sleep(0.005)
        sock.close()
        listening.server.close()
        return listening.server.accept_errors, len(listening.protocols)

    errors, accepted = asyncio.run(scenario())
    assert errors >= 1 and accepted == 1
    assert "accept on 127.0.0.1" in caplog.text and "retrying" in caplog.text


def test_a_closed_listener_keeps_its_connections_and_releases_the_poller_after_them() -> None:
    async def scenario() -> tuple[Any, ...]:
        listening = Listening(lambda: Recorder(echo=True))
        sock, protocol = await listening.client()
        listening.server.close()
        refused = False
        late = socket.socket()
        late.setblocking(False)
        try:
            await listening.loop.sock_connect(late, ("127.0.0.1", listening.port))
        except ConnectionRefusedError:
            refused = True
        late.close()
        poller = listening.server.poller
        still = poller.closed, poller.streams
        await listening.loop.sock_sendall(sock, b"still served")
        await protocol.until(lambda: protocol.data == b"still served")
        protocol.transport.close()
        await asyncio.wait_for(protocol.lost, GUARD)
        sock.close()
        return refused, still, poller.closed, poller.streams

    refused, still, closed, streams_left = asyncio.run(scenario())
    assert refused and still == (False, 1)
    assert closed and streams_left == 0


def test_the_poller_outlives_its_server_until_the_last_connection_closes() -> None:
    """A stopped listener dropped while a client lingers: the poller stays until that
    connection closes (connection_lost comes), then releases its epoll instance and goes."""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(Recorder)
        sock, protocol = await listening.client()
        poller = listening.server.poller
        epfd = poller.fileno()
        listening.server.close()
        del listening, poller
        gc.collect()
        canary = os.open(os.devnull, os.O_RDONLY)
        protocol.transport.close()
        lost = await asyncio.wait_for(protocol.lost, GUARD)
        try:
            os.fstat(epfd)
            released = False
        except OSError:
            released = True
        intact = os.fstat(canary) is not None
        os.close(canary)
        sock.close()
        return lost, released, intact

    assert asyncio.run(scenario()) == (None, True, True)


def test_an_error_raised_after_the_protocol_closed_its_stream_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Aborting(Recorder):
        def data_received(self, data: bytes) -> None:
            self.transport.abort()
            raise ValueError("after the abort")

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    async def scenario() -> Any:
        listening = Listening(Aborting)
        sock, protocol = await listening.client()
        await listening.loop.sock_sendall(sock, b"x")
        await asyncio.wait_for(protocol.lost, GUARD)
        sock.close()
        listening.server.close()
        return protocol

    protocol = asyncio.run(scenario())
    assert [type(each.exc_value) for each in unraisable] == [ValueError]
    assert protocol.events == ["made", "lost"]


def _accepted_fd(client: socket.socket) -> int:
    """The descriptor (not a duplicate) of this process's socket at the other end of ``client``."""
    wanted = client.getsockname()
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:["):
                continue
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue  # gone meanwhile (the listing's own descriptor)
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == wanted:
                return int(name)
        except OSError:
            pass
        finally:
            sock.detach()  # not ours to close
    raise AssertionError("no accepted socket for the client")


def test_a_new_connection_is_not_taken_for_one_written_to_whatever_its_memory_held() -> None:
    """Each Stream keeps a bit, set by write and cleared by a read: a pass that read a socket
    written to since its previous read is not followed by the gather sleep. A new Stream must
    start with it clear, whatever the memory it is given held: here that of Streams written to
    and freed just before (the allocator hands their blocks out again, which the test checks by
    address), and a pass that reads two such new connections is followed by the sleep. (The bit
    was left uninitialised: valgrind's "conditional jump depends on uninitialised value" in
    Poller.poll.) The test runs the passes."""

    async def scenario() -> tuple[bytes, int]:
        listening = Listening(Recorder, gather=0.5)
        poller = listening.server.poller
        listening.loop.remove_reader(poller.fileno())
        address = ("127.0.0.1", listening.port)

        def accepted(count: int) -> tuple[list[socket.socket], list[Any]]:
            """``count`` clients, connected at once, and their protocols: all accepted in one
            pass (each connect returns with the connection in the listening socket's queue)."""
            first = len(listening.protocols)
            clients = [socket.create_connection(address, timeout=GUARD) for _ in range(count)]
            poller.poll()
            assert len(listening.protocols) == first + count
            return clients, listening.protocols[first:]

        async def recycled() -> tuple[list[socket.socket], list[Any]]:
            """Two new connections, the Streams of which may reuse the memory of Streams that
            were written to, closed and freed just before."""
            old_clients, old = accepted(12)  # within the listening backlog (16)
            kept = []
            for protocol in old:
                stream = protocol.transport
                stream.write(b"answer")  # written to, never read after
                stream.close()  # all sent: closed at once, connection_lost comes soon
                kept.append(stream)
                protocol.transport = None
            await asyncio.sleep(0)  # connection_lost: each Stream lets go of its protocol
            freed.clear()
            freed.update(id(stream) for stream in kept)
            for sock in old_clients:
                assert sock.recv(16) == b"answer"
                sock.close()
            old.clear()
            listening.protocols.clear()
            gc.collect()
            new_clients = [socket.create_connection(address, timeout=GUARD) for _ in range(2)]
            kept.clear()  # the last references: freed, and the next Streams made reuse them
            poller.poll()
            assert len(listening.protocols) == 2
            return new_clients, list(listening.protocols)

        # pymalloc hands freed memory out again at once. With PYTHONMALLOC=malloc (the runs of
        # scripts/check_transport_memory.sh) freed memory is held back instead, and new memory
        # is garbage that AddressSanitizer fills (0xbe: the bit set) or valgrind tracks.
        pymalloc = os.environ.get("PYTHONMALLOC", "pymalloc").startswith("pymalloc")
        freed: set[int] = set()
        for _attempt in range(100 if pymalloc else 1):  # until an old Stream's memory is reused
            new_clients, (first, second) = await recycled()
            reused = sum(id(each.transport) in freed for each in (first, second))
            if reused or not pymalloc:
                break
            for sock in new_clients:
                sock.close()
            first.transport.close()
            second.transport.close()
        else:
            raise AssertionError("no new Stream was given an old one's memory: nothing checked")
        accepted_sides = [_accepted_side(each) for each in new_clients]
        # Both read in one pass, again and again at once, neither written to: once the rate
        # is high enough, the sleep follows.
        bursts, held = 0, 0
        deadline = time.monotonic() + GUARD
        while not held:
            assert time.monotonic() < deadline, "no pass was ever followed by the sleep"
            held = _burst(poller, new_clients, accepted_sides, b"x")
            bursts += 1
        for sock in (*new_clients, *accepted_sides):
            sock.close()
        listening.server.close()
        return bytes(first.data + second.data), bursts

    read, bursts = asyncio.run(scenario())
    assert read == b"x" * 2 * bursts


def test_the_gather_sleep_comes_only_once_sockets_are_found_ready_at_a_high_rate() -> None:
    """The sleep gathers input only where it keeps coming: two sockets read in one pass after a
    quiet spell (a burst of a few devices) are not followed by it, since the rate of sockets
    found ready, measured over 10 ms, would gather fewer than 4 in one sleep; the same two read
    again and again at once soon are. The test runs the passes, with a gather of 50 ms."""

    async def scenario() -> tuple[bytes, bytes, list[int]]:
        listening = Listening(Recorder, gather=0.05)
        poller = listening.server.poller
        listening.loop.remove_reader(poller.fileno())
        address = ("127.0.0.1", listening.port)
        clients = [socket.create_connection(address, timeout=GUARD) for _ in range(2)]
        poller.poll()  # both accepted
        first, second = listening.protocols
        accepted_sides = [_accepted_side(each) for each in clients]
        await asyncio.sleep(0.3)  # quiet
        held = [_burst(poller, clients, accepted_sides, b"a")]
        deadline = time.monotonic() + GUARD
        while not held[-1]:  # bursts at once, until a sleep follows one
            assert time.monotonic() < deadline, "no pass was ever followed by the sleep"
            held.append(_burst(poller, clients, accepted_sides, b"b"))
        for sock in (*clients, *accepted_sides):
            sock.close()
        listening.server.close()
        return bytes(first.data), bytes(second.data), held

    first, second, held = asyncio.run(scenario())
    assert first == second == b"a" + b"b" * (len(held) - 1)
    assert held[0] == 0 and held[-1] == 1 and len(held) > 2


def _burst(poller: Any, clients: list[socket.socket], accepted: list[int], data: bytes) -> int:
    """``data`` from each of ``clients``, read in one pass of ``poller`` once all of it has
    arrived (``accepted``: the connections' descriptors on the poller's side): the sleeps for
    gather that pass made."""
    holds = poller.holds
    for each in clients:
        each.send(data)
    deadline = time.monotonic() + GUARD
    while len(select.select(accepted, [], [], GUARD)[0]) < len(accepted):
        assert time.monotonic() < deadline, "the segments never arrived"
    poller.poll()
    return int(poller.holds - holds)


def test_a_pass_whose_begin_hook_clears_the_hooks_ends_with_the_end_it_began_with() -> None:
    """``hooks(None, None)`` from within begin() (the broker stopping, say): the pass goes on
    and calls the end() it began with; later passes call none. It used to read the cleared
    end hook (NULL) after begin() returned, and crash: so it runs in a child process, on the
    very build of the transport this one runs."""
    from mqttbroker.server import _streams

    script = f"""
import asyncio, importlib.machinery, importlib.util, json, select, socket, sys
sys.path[:0] = {sys.path!r}
name, path = "mqttbroker.server._streams", {_streams.__file__!r}
spec = importlib.util.spec_from_file_location(
    name, path, loader=importlib.machinery.ExtensionFileLoader(name, path)
)
sys.modules[name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[name])
from mqttbroker.server.proxy import bind
from mqttbroker.server.streams import StreamServer

class Quiet(asyncio.Protocol):
    def data_received(self, data):
        calls.append(data.decode())

calls = []

async def main():
    loop = asyncio.get_running_loop()
    server = StreamServer(loop, bind("127.0.0.1", 0, False, 16), Quiet, 0)
    poller = server.poller
    loop.remove_reader(poller.fileno())

    def begin():
        calls.append("begin")
        poller.hooks(None, None)

    poller.hooks(begin, lambda: calls.append("end"))
    client = socket.create_connection(server.sockets[0].getsockname())
    select.select([poller.fileno()], [], [], {GUARD})
    poller.poll()  # accepts: begin() clears the hooks
    client.send(b"after")
    select.select([poller.fileno()], [], [], {GUARD})
    poller.poll()  # no hooks left
    client.close()
    server.close()
    print(json.dumps(calls))

asyncio.run(main())
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=2 * GUARD
    )
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr}"
    assert json.loads(result.stdout) == ["begin", "end", "after"]


def test_an_error_of_the_listening_socket_pauses_accepting_rather_than_spinning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """accept() failing for the listening socket itself, not for want of descriptors or memory
    (here EINVAL: the socket was shut down under the poller) would fail again at every poll,
    the listening socket staying ready: the loop would spin. Accepting pauses for ACCEPT_RETRY
    and the failure is logged, as when descriptors run out."""
    monkeypatch.setattr(streams, "ACCEPT_RETRY", 3600.0)  # not retried during the test

    async def scenario() -> tuple[int, bool, bool]:
        listening = Listening(Recorder)
        poller = listening.server.poller
        listening.loop.remove_reader(poller.fileno())
        listening.server.sockets[0].shutdown(socket.SHUT_RD)  # accept(): EINVAL from now on
        ready = bool(select.select([poller.fileno()], [], [], GUARD)[0])
        poller.poll()
        again = bool(select.select([poller.fileno()], [], [], 0)[0])
        errors = listening.server.accept_errors
        listening.server.close()
        return errors, ready, again

    errors, ready, again = asyncio.run(scenario())
    assert ready and errors == 1
    assert not again  # the listening socket is out of the epoll set until the retry
    assert "accept on 127.0.0.1" in caplog.text and "Invalid argument" in caplog.text


def test_a_descriptor_closed_behind_the_poller_s_back_is_let_go_when_its_number_returns() -> None:
    """A connection's descriptor closed by someone else (os.close on its number): when a new
    connection is given that number, the poller lets the old Stream go (its protocol hears
    connection_lost with EBADF, the count of open connections drops) and serves the new one.
    It used to overwrite the old entry, whose reference leaked with its protocol, and count it
    open for ever."""

    async def scenario() -> tuple[Any, ...]:
        listening = Listening(lambda: Recorder(echo=True))
        old_sock, old = await listening.client()
        number = _accepted_fd(old_sock)
        # Every lower number taken, so that the next socket accepted is given this one.
        placeholders = []
        while (fd := os.open(os.devnull, os.O_RDONLY)) < number:
            placeholders.append(fd)
        os.close(fd)
        new_sock = socket.socket()  # its own descriptor first
        new_sock.setblocking(False)
        os.close(number)  # behind the poller's back
        count = len(listening.protocols)
        await listening.loop.sock_connect(new_sock, ("127.0.0.1", listening.port))
        async with asyncio.timeout(GUARD):
            while len(listening.protocols) == count:
                await asyncio.sleep(0.005)
        new = listening.protocols[count]
        same_number = _accepted_fd(new_sock) == number
        lost = await asyncio.wait_for(old.lost, GUARD)
        streams_open = listening.server.poller.streams
        await listening.loop.sock_sendall(new_sock, b"served")
        await new.until(lambda: new.data == b"served")
        echoed = await listening.loop.sock_recv(new_sock, 16)
        for each in placeholders:
            os.close(each)
        for sock in (old_sock, new_sock):
            sock.close()
        listening.server.close()
        return same_number, lost, streams_open, echoed, old.events

    same_number, lost, streams_open, echoed, events = asyncio.run(scenario())
    assert same_number  # else this test checks nothing
    assert isinstance(lost, OSError) and lost.errno == errno.EBADF and events == ["made", "lost"]
    assert streams_open == 1 and echoed == b"served"


# -- the broker's listeners --------------------------------------------------------------------


async def _mqtt_connect(port: int) -> tuple[bytes, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect_packet(unique("streams"), MQTT_311))
    return await asyncio.wait_for(reader.readexactly(4), GUARD), writer


@pytest.mark.parametrize("built", [True, False])
def test_tcp_listeners_use_it_when_built_and_the_loop_s_server_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: bool
) -> None:
    if not built:
        monkeypatch.setattr(streams, "available", lambda: False)
    config = memory_config(
        tmp_path,
        ListenerConfig(host="127.0.0.1", port=0),
    )

    async def scenario() -> tuple[bytes, str, str]:
        server = Server(config)
        await server.start()
        try:
            answer, writer = await _mqtt_connect(server.addresses[0][1])
            (conn,) = server.broker.connections
            kind = type(conn.link.transport).__name__  # type: ignore[attr-defined]
            writer.close()
        finally:
            await server.stop()
        return answer, kind, type(server.listeners[0].server).__name__

    answer, transport, listener = asyncio.run(scenario())
    assert answer == CONNACK_OK
    if built:
        assert (transport, listener) == ("Stream", "StreamServer")
    else:
        assert transport != "Stream" and listener == "Server"


def test_the_transport_is_used_only_with_the_compiled_modules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert streams.available()
    monkeypatch.setattr(compiled, "mode", "pure")
    assert not streams.available()
