"""A client that half-closes (sends its FIN) while the broker still has output for it that it
does not read: the transport closes once that output is written, which without a reader is
never, so the socket sat in CLOSE-WAIT for ever, keep alive could not close it (the transport
was closing already) and only took it out of the count of ``max_connections``. The EOF arms
the close grace (``tcp.CLOSE_GRACE``): the broker lets go of the socket and of the connection.

Real sockets and a real Server in this process, on the broker's own transport (C) and on the
loop's (the one TLS, WebSocket, PROXY listeners and the pure form use), on both loops. Whether
the broker still holds the socket is read from /proc/self/fd (the accepted socket's inode)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from support.clients import (
    CONNACK_OK,
    MQTT_311,
    connect_packet,
    publish_packet,
    subscribe_packet,
    unique,
)
from support.listeners import LOOPS, SUBACK_QOS0, memory_config, open_311, run_on

from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.config import ListenerConfig
from mqttbroker.server import streams, tcp
from mqttbroker.server.app import Server

GUARD = 10.0  # seconds: a failure guard, never a measured time
GRACE = 0.5  # tcp.CLOSE_GRACE for these tests (10 s otherwise)
PAYLOAD = b"q" * 32_768


def _socket_inodes() -> dict[int, int]:
    """This process's socket descriptors: inode -> descriptor."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # gone meanwhile (the listing's own descriptor)
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


def _accepted_inode(client: socket.socket) -> int:
    """The inode of this process's socket at the other end of ``client``."""
    wanted = client.getsockname()
    for inode, fd in _socket_inodes().items():
        sock = socket.socket(fileno=fd)
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == wanted:
                return inode
        except OSError:
            pass
        finally:
            sock.detach()  # not ours to close
    raise AssertionError("no accepted socket for the client")


async def _read(loop: asyncio.AbstractEventLoop, sock: socket.socket, count: int) -> bytes:
    data = b""
    async with asyncio.timeout(GUARD):
        while len(data) < count:
            chunk = await loop.sock_recv(sock, count - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
    return data


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "transport", [pytest.param("streams", marks=pytest.mark.needs_compiled), "loop"]
)
def test_a_half_closed_client_that_does_not_read_is_let_go_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str, transport: str
) -> None:
    monkeypatch.setattr(tcp, "CLOSE_GRACE", GRACE)
    if transport == "loop":
        monkeypatch.setattr(streams, "available", lambda: False)
    config = memory_config(
        tmp_path,
        ListenerConfig(host="127.0.0.1", port=0),
    )

    async def scenario() -> tuple[str, int, int, bool, bool]:
        running = asyncio.get_running_loop()
        server = Server(config)
        await server.start()
        sub = socket.socket()
        try:
            listener_kind = type(server.listeners[0].server).__name__
            port = server.addresses[0][1]
            # A subscriber that reads nothing more after its SUBACK: a small receive buffer,
            # so that the broker's transport soon holds what the socket does not take.
            sub.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sub.setblocking(False)
            await running.sock_connect(sub, ("127.0.0.1", port))
            name = unique("half-closed")
            await running.sock_sendall(sub, connect_packet(name, MQTT_311, keep_alive=0))
            assert await _read(running, sub, 4) == CONNACK_OK
            await running.sock_sendall(sub, subscribe_packet(1, [("half/#", 0)], MQTT_311))
            assert await _read(running, sub, 5) == SUBACK_QOS0
            (conn,) = [each for each in server.broker.connections if each.client_id == name]
            link = conn.link
            pub_reader, pub = await open_311(port, "half-closed-pub")
            # QoS 1: each PUBACK comes from the pass whose flush wrote the subscriber's copy.
            for packet_id in range(1, 2001):
                pub.write(publish_packet("half/x", PAYLOAD, 1, packet_id, MQTT_311))
                puback = await asyncio.wait_for(pub_reader.readexactly(4), GUARD)
                assert puback == b"\x40\x02" + packet_id.to_bytes(2, "big")
                if link.buffered():
                    break
            queued = link.buffered()
            # Below the high-water mark: the connection writes on, nothing pauses it.
            assert 0 < queued < tcp.WRITE_HIGH_WATER and not conn.output.paused
            inode = _accepted_inode(sub)
            sub.shutdown(socket.SHUT_WR)  # the client's FIN, with output still unread
            # The socket closes first, connection_lost follows in a callback of the loop.
            try:
                async with asyncio.timeout(GRACE + GUARD):  # a failure guard
                    while inode in _socket_inodes() or conn in server.broker.connections:
                        await asyncio.sleep(0.02)
            except TimeoutError:
                held, counted = inode in _socket_inodes(), conn in server.broker.connections
                raise AssertionError(
                    f"socket held: {held}, connection counted: {counted}"
                ) from None
            counted = conn in server.broker.connections
            open_streams = 0
            if listener_kind == "StreamServer":
                open_streams = server.listeners[0].server.poller.streams  # type: ignore[union-attr]
            # The client sees the end: what the socket held, then EOF (or a reset).
            ended = False
            async with asyncio.timeout(GUARD):
                try:
                    while await running.sock_recv(sub, 1 << 20):
                        pass
                    ended = True
                except ConnectionResetError:
                    ended = True
            pub.close()
            return listener_kind, queued, open_streams, counted, ended
        finally:
            sub.close()
            await server.stop()

    kind, queued, open_streams, counted, ended = run_on(loop, scenario)
    assert kind == ("StreamServer" if transport == "streams" else "Server")
    assert queued > 0
    assert not counted  # the connection is gone from the broker as its socket is
    assert open_streams <= 1  # the publisher's at most (the C transport's own count)
    assert ended


class _Transport:
    """What a protocol's close grace touches of its transport: abort(), recorded."""

    def __init__(self, name: str, aborted: list[tuple[str, float]]) -> None:
        self.name = name
        self.aborted = aborted

    def abort(self) -> None:
        self.aborted.append((self.name, asyncio.get_running_loop().time()))


@pytest.mark.parametrize("loop", LOOPS)
def test_close_graces_share_one_timer_and_end_in_the_order_they_were_armed(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    """Each EOF arms its connection's grace, each connection_lost disarms it; one timer of the
    loop serves them all (not one per connection): at each grace's end its transport is
    aborted, and only the ones still armed."""
    monkeypatch.setattr(tcp, "CLOSE_GRACE", GRACE)

    async def scenario() -> tuple[list[tuple[str, float]], dict[str, float], int]:
        running = asyncio.get_running_loop()
        broker = Broker(BrokerOptions())
        aborted: list[tuple[str, float]] = []
        armed: dict[str, float] = {}
        protocols = {}
        timers = set()
        for index, name in enumerate(["a", "b", "c", "d", "e"]):
            if index == 1:
                await asyncio.sleep(GRACE / 4)  # "a" ends first, alone
            protocol = tcp.MQTTProtocol(tcp.ListenerContext(broker))
            protocol.transport = _Transport(name, aborted)  # type: ignore[assignment]
            armed[name] = running.time()
            assert protocol.eof_received() is False
            protocols[name] = protocol
            grace = protocol.grace
            assert grace is not None
            timers.add(id(grace.timer))
        for name in ("b", "d"):
            protocols[name].connection_lost(None)  # closed in time: disarmed
        async with asyncio.timeout(GUARD):
            while len(aborted) < 3:
                await asyncio.sleep(0.02)
        await asyncio.sleep(GRACE)  # nothing more comes
        return aborted, armed, len(timers)

    aborted, armed, timers = run_on(loop, scenario)
    assert [name for name, _ in aborted] == ["a", "c", "e"]
    for name, at in aborted:
        assert at >= armed[name] + GRACE - 0.002  # (the loop's clock is of milliseconds)
    assert timers == 1
