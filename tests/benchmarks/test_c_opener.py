"""The benchmark's C opener (benchmarks/c/open_many.c), which sets up scenarios 6 and 7's
thousands of connections so that the broker, not the generator, is the limit: against the broker
it sets up connections and subscriptions that the generator then goes on using; and against a
stand-in broker on a loopback socket it reads what the Python loop reads (a CONNACK with
properties, bytes after it) and refuses what that loop refuses (a refused CONNACK or SUBACK, a
closed connection, an unexpected packet), closing every socket. A few seconds; no timed
assertions."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks import wire
from benchmarks.client import close_raw, open_many


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311])
def test_connections_set_up_in_c_serve_the_generator(
    opener: str, broker: Any, version: int
) -> None:
    n = 300
    names = [f"opener-{version}-{i}" for i in range(n)]
    topics = [f"opener/{version}/{i}" for i in range(n)]
    frame = len(wire.publish(topics[0], wire.payload(), 0, 0, version))
    opened = open_many(
        broker.host,
        broker.port,
        names,
        version,
        lambda i: [(topics[i], 0)],
        frame,
        concurrency=64,
        opener=opener,
    )
    clients = opened.clients
    try:
        assert len(clients) == n and opened.elapsed_s > 0 and opened.cpu_s >= 0
        assert all(c.rest == b"" and not c.eof for c in clients)
        # the broker's Receive Maximum (its default, MQTT 5), or none (3.1.1: 65535)
        expected = 1024 if version == wire.MQTT_5 else 65535
        assert {c.receive_max for c in clients} == {expected}
        # the sockets outlive the C process: one publishes, the subscriber of that topic gets it
        clients[0].sock.send(wire.publish(topics[7], wire.payload(), 0, 0, version))
        deadline = time.monotonic() + 10
        while clients[7].count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
            clients[7].sweep()
        assert clients[7].count == 1
        for c in clients[8:20]:
            c.sweep()
        assert all(c.count == 0 for c in clients[8:20])
    finally:
        asyncio.run(close_raw(clients))


# -- a stand-in broker ---------------------------------------------------------------------------

CONNACK_PROPS = (
    b"\x1f"
    + wire.s16(b"welcome")  # a reason string before it
    + b"\x26"
    + wire.s16(b"k")
    + wire.s16(b"v")  # a user property
    + b"\x21\x00\x0a"  # Receive Maximum 10
)
CONNACK_5 = b"\x20" + wire.vbi(2 + 1 + len(CONNACK_PROPS)) + b"\x00\x00"
CONNACK_5 += wire.vbi(len(CONNACK_PROPS)) + CONNACK_PROPS
SUBACK_OK = b"\x90\x04\x00\x01\x00\x00"
PINGRESP = b"\xd0\x00"


class StandIn:
    """Accepts connections one at a time; for the i-th, reads its request (``requests[i]``,
    checked byte for byte), writes ``answer(i)`` (the CONNACK in two writes) and keeps the
    connection open until the test ends, or closes it when the answer is None."""

    def __init__(self, requests: list[bytes], answer: Callable[[int], bytes | None]) -> None:
        self.requests = requests
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.problems: list[str] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        for i, request in enumerate(self.requests):
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.settimeout(10)
            data = b""
            try:
                while len(data) < len(request):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if data != request:
                    self.problems.append(f"request {i}: {data.hex()}")
                answer = self.answer(i)
                if answer is None:
                    conn.close()
                    continue
                conn.sendall(answer[:3])
                time.sleep(0.002)  # the rest of the CONNACK reaches the opener in a later read
                conn.sendall(answer[3:])
            except OSError as exc:
                self.problems.append(repr(exc))

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.close()


def _open(
    opener: str | None,
    answer: Callable[[int], bytes | None],
    n: int = 5,
    subscribing: bool = True,
    created: list[socket.socket] | None = None,
) -> Any:
    names = [f"standin-{i}" for i in range(n)]
    filters = (lambda i: [(f"s/{i}", 0)]) if subscribing else None
    requests = [
        wire.connect(name) + (wire.subscribe(1, [(f"s/{i}", 0)]) if subscribing else b"")
        for i, name in enumerate(names)
    ]
    standin = StandIn(requests, answer)
    try:
        opened = open_many(
            "127.0.0.1",
            standin.port,
            names,
            wire.MQTT_5,
            filters,
            concurrency=1,
            timeout=10,
            opener=opener,
        )
        assert not standin.problems, standin.problems
        for client in opened.clients:
            client.sock.close()
        return opened
    finally:
        standin.close()


def test_properties_and_what_follows_the_awaited_packets(which: str | None) -> None:
    def answer(i: int) -> bytes:
        suback = SUBACK_OK if i != 2 else b"\x90\x05\x00\x01\x00\x00\x01"  # two codes, QoS 1
        return CONNACK_5 + suback + (PINGRESP if i == 3 else b"")

    opened = _open(which, answer)
    assert [c.receive_max for c in opened.clients] == [10] * 5
    assert [c.rest for c in opened.clients] == [b"", b"", b"", PINGRESP, b""]


def test_without_subscriptions_the_connack_is_enough(which: str | None) -> None:
    opened = _open(which, lambda i: CONNACK_5 + (PINGRESP if i == 1 else b""), subscribing=False)
    assert [c.rest for c in opened.clients] == [b"", PINGRESP, b"", b"", b""]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            lambda i: CONNACK_5 + SUBACK_OK if i < 3 else b"\x20\x03\x00\x87\x00",
            "CONNACK refused .*0x87",
        ),
        (lambda i: CONNACK_5 + (SUBACK_OK if i else b"\x90\x04\x00\x01\x00\x80"), "SUBACK ref"),
        (lambda i: None if i == 4 else CONNACK_5 + SUBACK_OK, "closed connection"),
        (lambda i: CONNACK_5 + PINGRESP + SUBACK_OK, "unexpected packet 0xD0"),
    ],
    ids=["connack-refused", "suback-refused", "closed", "unexpected"],
)
def test_refusals_raise_and_close_every_socket(
    which: str | None, answer: Callable[[int], bytes | None], error: str
) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ConnectionError, match=error):
        _open(which, answer)
    assert len(os.listdir("/proc/self/fd")) == before  # the stand-in's and every client's


def test_records_split_across_writes(opener: str) -> None:
    """A pipe may hand over a record in pieces: the opener reads on until it has it all."""
    request = wire.connect("standin-0")
    standin = StandIn([request], lambda i: CONNACK_5)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        record = struct.pack("=iBI", sock.fileno(), 0, len(request)) + request
        proc = subprocess.Popen(
            [opener, "127.0.0.1", str(standin.port), "5", "1", "10"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=[sock.fileno()],
        )
        assert proc.stdin is not None
        for i in range(len(record)):  # a byte at a time, the fd field included
            proc.stdin.write(record[i : i + 1])
            proc.stdin.flush()
            time.sleep(0.001)
        proc.stdin.close()
        proc.wait(timeout=20)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        result = json.loads(out)
        assert proc.returncode == 0 and result["receive_max"] == [10], out
        assert not standin.problems, standin.problems
    finally:
        sock.close()
        standin.close()
