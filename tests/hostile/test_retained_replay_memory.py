"""Clients that subscribe to "#" over a large retained set and never read: a real broker holds
each of them at most its transport's high-water mark, one message and ``REPLAY_WRITE`` (its
resident memory per client says so); on the broker's own transport, which keeps large writes by
reference, the retained messages' encodings are shared and each such client costs little more
than one message. A client that then reads gets every retained message."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from support.clients import MQTT_5, binary, connect_packet, packet
from support.launcher import BrokerProcess, rss_bytes

from mqttbroker.broker.subscribe import REPLAY_WRITE
from mqttbroker.server import streams
from mqttbroker.server.tcp import WRITE_HIGH_WATER

MB = 1_048_576
SIZE = 1_000_000  # payload bytes of each retained message (max_packet_size is 1 MB)
COUNT = 16  # retained messages: 16 MB, far more than the high-water mark
CLIENTS = 40
# What the broker may hold per client on the loop's transports (their buffer), and room for the
# allocator and for uvloop's transport, which keeps some writes by reference and copies others:
# measured 0 to 5.3 MB per client on uvloop's. Unbounded by the mark (a replay that goes on
# while the transport is paused) it would be about 12; before the replay wrote as it went, a
# whole pass's share went past the mark: 7.6-7.8 MB on uvloop's (the precise bound is
# tests/broker/test_subscribe.py's).
HELD = WRITE_HIGH_WATER + SIZE + REPLAY_WRITE
# On the broker's own transport (_streams.c), which keeps a large bytes object it cannot send
# by reference: the retained messages' one encoding each is shared by every client, and a
# client's own bytes are at most one message (its first write joins the SUBACK to the first
# message) and small buffers; half a megabyte more for the allocator. Measured 0.04 MB per
# client; 4.9 to 5.6 when that transport copied what it could not send into its own buffer, up
# to the mark (5.9-6.2 before the replay wrote as it went).
SHARED = SIZE + MB // 2


def _read_packet(sock: socket.socket) -> tuple[int, bytes]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    first = exactly(1)[0]
    length, shift = 0, 0
    while True:
        byte = exactly(1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, exactly(length)


def _settled_rss(pid: int, timeout: float = 60.0) -> int:
    """The resident size once it stops moving (eight samples a quarter second apart within
    2 MB): the replays went as far as they go."""
    samples: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.append(rss_bytes(pid))
        last = samples[-8:]
        if len(last) == 8 and max(last) - min(last) <= 2 * MB:
            return last[-1]
        time.sleep(0.25)
    raise AssertionError(f"the broker's memory did not settle: {samples[-8:]}")


def test_clients_that_do_not_read_hold_the_mark_and_a_message_each(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker(extra_args=("--memory", "--allow-anonymous"))
    assert broker.proc is not None
    pid = broker.proc.pid
    address = (broker.host, broker.port)
    with socket.create_connection(address, timeout=30) as pub:
        pub.sendall(connect_packet("pub", MQTT_5, keep_alive=0))
        assert _read_packet(pub)[0] == 0x20
        for i in range(COUNT):  # QoS 1: the PUBACK says it is stored
            body = binary(f"r/{i:02d}".encode()) + (i + 1).to_bytes(2, "big") + b"\x00"
            pub.sendall(packet(0x33, body + bytes([i]) * SIZE))
        acks = [_read_packet(pub) for _ in range(COUNT)]
        assert all(first == 0x40 for first, _ in acks), acks
    base = _settled_rss(pid)
    bound = SHARED if streams.available() else HELD + MB * 5 // 4

    clients: list[socket.socket] = []
    try:
        for n in range(CLIENTS):
            sock = socket.create_connection(address, timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            clients.append(sock)
            sock.sendall(connect_packet(f"slow-{n}", MQTT_5, keep_alive=0))
            assert _read_packet(sock)[0] == 0x20
            sock.sendall(packet(0x82, b"\x00\x01\x00" + binary(b"#") + b"\x00"))
        peak = _settled_rss(pid)
        per_client = (peak - base) / CLIENTS
        assert per_client <= bound, (
            f"{per_client / MB:.2f} MB per client that does not read "
            f"(bound {bound / MB:.2f} MB; RSS {base / MB:.0f} -> {peak / MB:.0f} MB)"
        )
        # One of them reads now: every retained message, once.
        reader = clients[0]
        suback, _ = _read_packet(reader)
        assert suback == 0x90
        topics = []
        for _ in range(COUNT):
            first, body = _read_packet(reader)
            assert first == 0x31  # PUBLISH, QoS 0, RETAIN
            topics.append(body[2 : 2 + int.from_bytes(body[:2], "big")].decode())
        assert sorted(topics) == [f"r/{i:02d}" for i in range(COUNT)]
    finally:
        for sock in clients:
            sock.close()
