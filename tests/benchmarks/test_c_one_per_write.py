"""Scenario 1w's C publishers (benchmarks/c/one_per_write.c), driven by the generator's own code
(``devices.OnePerWriteC``) over loopback connections to plain sockets: every message is its own
send and its own TCP segment, the counters shared with the generator add up, and a publisher
whose peer has gone is reported and left out while the others go on. A few seconds; no timed
assertions."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from support import c_programs

from benchmarks import devices, wire
from benchmarks.client import RawClient


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> str:
    return c_programs.build("one_per_write", tmp_path_factory)


def _pairs(n: int) -> tuple[list[RawClient], list[socket.socket]]:
    conns, peers = [], []
    with socket.create_server(("127.0.0.1", 0)) as server:
        for _ in range(n):
            client = socket.create_connection(server.getsockname())
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.setblocking(False)
            peer, _ = server.accept()
            conns.append(RawClient(client, b"", 0))
            peers.append(peer)
    return conns, peers


def _drive(pubs: devices.OnePerWriteC, until: int) -> None:
    """Run the publishers until ``until`` messages are sent (or 30 s), then stop them."""

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(pubs.run(stop))
        deadline = time.monotonic() + 30
        while pubs.sent < until and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(main())


def _drain(peer: socket.socket, into: bytearray, stop: threading.Event) -> None:
    peer.settimeout(0.05)
    while not stop.is_set():
        try:
            chunk = peer.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return
        into += chunk


def test_one_segment_per_message_and_the_counters_add_up(program: str) -> None:
    conns, peers = _pairs(3)
    packets = [wire.publish(f"bench/{i}/data", wire.payload(i), 0, 0) for i in range(3)]
    received = [bytearray() for _ in peers]
    stop = threading.Event()
    readers = [
        threading.Thread(target=_drain, args=(p, r, stop), daemon=True)
        for p, r in zip(peers, received, strict=True)
    ]
    for t in readers:
        t.start()
    try:
        before = devices.segments_out(conns)
        if before is None:
            pytest.skip("this kernel's TCP_INFO has no tcpi_data_segs_out")
        pubs = devices.OnePerWriteC(conns, packets, program)
        _drive(pubs, 3000)
        sent = pubs.sent
        assert sent >= 3000 and pubs.failed == []
        assert pubs.attempts == sent + pubs.held
        assert devices.segments_out(conns) == before + sent  # one segment per message
        deadline = time.monotonic() + 10
        while (
            sum(len(r) for r in received) < sum(len(p) for p in packets) * sent // 3
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
    finally:
        stop.set()
        for t in readers:
            t.join(5)
        for c in conns:
            c.sock.close()
        for p in peers:
            p.close()
    # each peer got whole PUBLISHes, its own and nothing else, adding up to what was sent
    counts = []
    for packet, data in zip(packets, received, strict=True):
        assert len(data) % len(packet) == 0 and bytes(data) == packet * (len(data) // len(packet))
        counts.append(len(data) // len(packet))
    assert sum(counts) == sent and min(counts) > 0


def test_a_publisher_whose_peer_is_gone_is_left_out(program: str) -> None:
    conns, peers = _pairs(2)
    packets = [wire.publish(f"bench/{i}/data", wire.payload(i), 0, 0) for i in range(2)]
    # the first peer resets its connection: sends to it fail once the reset has arrived
    peers[0].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peers[0].close()
    received = bytearray()
    stop = threading.Event()
    reader = threading.Thread(target=_drain, args=(peers[1], received, stop), daemon=True)
    reader.start()
    try:
        pubs = devices.OnePerWriteC(conns, packets, program)
        _drive(pubs, 1000)
        assert pubs.failed == [0]
        assert conns[0].eof and not conns[1].eof
        assert pubs.sent >= 1000
    finally:
        stop.set()
        reader.join(5)
        for c in conns:
            c.sock.close()
        peers[1].close()
    assert len(received) > 0 and len(received) % len(packets[1]) == 0
