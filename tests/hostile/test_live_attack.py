"""A live attack on a real broker: many connections sending garbage, truncated packets,
oversized lengths, SUBSCRIBE floods, and CONNECTs that never come, while a control client keeps
publishing and receiving. The control client loses nothing, the attackers are closed, and the
broker's memory stays bounded. Every loop is bounded in count and time; traffic stays on
loopback."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from support.clients import PahoClient, closed_by_peer, unique
from support.codec import encoded_connect
from support.launcher import rss_bytes

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk

CONFIG = """
[broker]
connect_timeout = 1.0
max_packet_size = 65536
max_subscriptions_per_client = 50
max_keepalive = 5
"""
ATTACKERS_PER_KIND = 12
DEADLINE = 20.0  # failure guard: each attacker gives up after this


def garbage(sock: socket.socket) -> None:
    rng = random.Random(os.getpid())
    for _ in range(20):
        sock.sendall(bytes(rng.randrange(256) for _ in range(200)))


def oversized(sock: socket.socket) -> None:
    sock.sendall(encoded_connect(unique("big"), keep_alive=5))
    sock.sendall(b"\x30\xff\xff\xff\x7f")  # a PUBLISH announcing 256 MB


def truncated_then_garbage(sock: socket.socket) -> None:
    sock.sendall(encoded_connect(unique("trunc"), keep_alive=5))
    sock.sendall(grammar.encode(pk.Publish("a/b", b"x" * 100, 1, packet_id=1), 5)[:20])
    sock.sendall(b"\x62\x05\x00")  # ...and then something that cannot continue it well


def subscribe_flood(sock: socket.socket) -> None:
    sock.sendall(encoded_connect(unique("flood"), keep_alive=5))
    filters = [pk.SubscriptionRequest(f"flood/{i}/#", 1) for i in range(20)]
    for packet_id in range(1, 11):  # 200 filters, past the limit of 50
        sock.sendall(grammar.encode(pk.Subscribe(packet_id, filters), 5))
    sock.sendall(b"\xff\xff\xff\xff\xff")  # then garbage: must be closed


def hold(sock: socket.socket) -> None:
    """Connect and send nothing: the CONNECT timeout closes it."""


ATTACKS: list[Callable[[socket.socket], None]] = [
    garbage,
    oversized,
    truncated_then_garbage,
    subscribe_flood,
    hold,
]


def test_attackers_are_closed_and_the_control_client_loses_nothing(
    start_broker: Callable[..., object], tmp_path: Path
) -> None:
    config = tmp_path / "hostile.toml"
    config.write_text(CONFIG)
    server = start_broker(extra_args=("--config", str(config)))
    host, port, proc = server.host, server.port, server.proc  # type: ignore[attr-defined]
    pid = proc.pid

    topic = f"control/{unique()}"
    receiver = PahoClient(host, port)
    receiver.connect()
    receiver.subscribe(topic, 1)
    sender = PahoClient(host, port)
    sender.connect()
    sender.publish(topic, b"warm-up", 1)
    receiver.wait_messages(1)
    baseline = rss_bytes(pid)

    results: dict[str, list[bool]] = {attack.__name__: [] for attack in ATTACKS}
    lock = threading.Lock()

    def run(attack: Callable[[socket.socket], None]) -> None:
        until = time.monotonic() + DEADLINE
        with socket.create_connection((host, port), timeout=5) as sock:
            try:
                attack(sock)
            except OSError:
                pass  # the broker may close it while we are still writing: that is the point
            closed = closed_by_peer(sock, until)
        with lock:
            results[attack.__name__].append(closed)

    threads = [
        threading.Thread(target=run, args=(attack,), daemon=True)
        for attack in ATTACKS
        for _ in range(ATTACKERS_PER_KIND)
    ]
    for thread in threads:
        thread.start()
    # The control client keeps publishing while the attack goes on.
    for index in range(300):
        sender.publish(topic, f"m{index}".encode(), 1, wait=False)
    for thread in threads:
        thread.join(DEADLINE + 5)
    got = receiver.wait_messages(301, timeout=30)
    payloads = [m.payload for m in got[1:]]
    assert payloads == [f"m{i}".encode() for i in range(300)], "control messages lost or reordered"
    for name, closed in results.items():
        assert len(closed) == ATTACKERS_PER_KIND, name
        assert all(closed), f"{name}: {closed.count(False)} attackers were never closed"
    growth = rss_bytes(pid) - baseline
    assert growth < 64 << 20, f"broker memory grew by {growth >> 10} KiB under attack"
    assert "Traceback" not in server.log_text()  # type: ignore[attr-defined]
    sender.close()
    receiver.close()
