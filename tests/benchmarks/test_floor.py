"""The benchmark's floor (benchmarks/floor.py): the bare forwarder scenario 5 measures beside the
brokers answers the probe's CONNECT and SUBSCRIBE in MQTT 5 and 3.1.1, copies every PUBLISH as
received to the subscribers, however the bytes are split, and closes on DISCONNECT; the runner
prints its ratio to each peer under the table."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import brokers as br
from benchmarks import floor, runner, wire

REPO = Path(__file__).resolve().parents[2]

TIMEOUT = 10.0


def test_frames_splits_whole_packets_and_keeps_the_rest() -> None:
    one = wire.publish("a/b", b"x" * 200, 0, 0, wire.MQTT_5)  # a two-byte Remaining Length
    two = b"\xc0\x00"  # PINGREQ
    data = one + two + one[:3]
    found, rest = floor.frames(data)
    assert [data[start:end] for start, _, end in found] == [one, two]
    assert [data[start] >> 4 for start, _, _ in found] == [wire.PUBLISH, floor.PINGREQ]
    assert found[0][1] == 3  # the body starts after the two length bytes
    assert rest == len(one) + len(two)
    assert floor.frames(b"\x30") == ([], 0)
    assert floor.frames(b"\x30\x80") == ([], 0)  # the length goes on in the next chunk
    with pytest.raises(ValueError):
        floor.frames(b"\x30\xff\xff\xff\xff\x01")


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311])
def test_suback_grants_qos_0_to_every_filter(version: int) -> None:
    packet = wire.subscribe(7, [("a/+", 1), ("b/#", 2), ("c", 0)], version)
    _, body, end = wire.next_frame(packet) or (0, 0, 0)
    reply = floor.suback(packet[body:end], version)
    _, rbody, rend = wire.next_frame(reply) or (0, 0, 0)
    assert reply[0] == 0x90
    assert reply[rbody : rbody + 2] == (7).to_bytes(2, "big")
    assert wire.suback_codes(reply[rbody:rend], version) == [0, 0, 0]


@pytest.fixture
def forwarder() -> Iterator[int]:
    port = br.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.floor", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not br.port_open("127.0.0.1", port):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the floor did not start listening"
            time.sleep(0.05)
        yield port
        assert proc.poll() is None, "the floor exited during the test"
    finally:
        proc.kill()
        proc.wait(5)
        if proc.stderr:
            proc.stderr.close()


def connect(port: int, client_id: str, version: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), TIMEOUT)
    sock.settimeout(TIMEOUT)
    sock.sendall(wire.connect(client_id, version))
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def read_packet(sock: socket.socket) -> bytes:
    head = read_exactly(sock, 2)
    assert head[1] < 0x80  # every answer here is short
    return head + read_exactly(sock, head[1])


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311])
def test_the_floor_forwards_what_it_receives_to_the_subscribers(
    forwarder: int, version: int
) -> None:
    sub = connect(forwarder, "sub", version)
    pub = connect(forwarder, "pub", version)
    try:
        for sock in (sub, pub):
            connack = read_packet(sock)
            assert connack[0] >> 4 == wire.CONNACK
            assert wire.connack_result(connack[2:], version)[0] == 0
        sub.sendall(wire.subscribe(3, [("t/+", 0), ("u", 1)], version))
        suback = read_packet(sub)
        assert suback[0] >> 4 == wire.SUBACK
        assert wire.suback_codes(suback[2:], version) == [0, 0]

        first = wire.publish("t/1", wire.payload(1), 0, 0, version)
        second = wire.publish("u", b"y" * 300, 1, 5, version)  # two Remaining Length bytes
        stream = first + second + first
        for cut in (1, len(first) + 2, len(first) + 4, len(stream) - 1):  # split anywhere
            pub.sendall(stream[:cut])
            time.sleep(0.01)
            pub.sendall(stream[cut:])
            assert read_exactly(sub, len(stream)) == stream

        pub.sendall(b"\xc0\x00")  # PINGREQ
        assert read_packet(pub) == b"\xd0\x00"
        pub.sendall(wire.disconnect(version))
        assert pub.recv(16) == b""  # closed by the floor
        sub.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sub.recv(16)  # nothing but what was published, and each message once
    finally:
        sub.close()
        pub.close()


def test_the_runner_prints_the_floors_ratio_to_each_peer() -> None:
    def record(broker: str, p50: float, p99: float) -> dict[str, object]:
        return {"scenario": "5", "broker": broker, "metrics": {"p50_us": p50, "p99_us": p99}}

    records = [
        record("ours", 90, 150),
        record("floor", 40, 80),
        record("floor", 50, 120),
        record("amqtt", 450, 600),
        record("mosquitto", 75, 120),
        {"scenario": "5", "broker": "floor", "error": "boom"},
    ]
    lines = runner.floor_lines(records)
    assert "bare forwarder" in lines[0]
    amqtt = next(line for line in lines if "floor/amqtt" in line)
    mosquitto = next(line for line in lines if "floor/mosquitto" in line)
    assert "p50 us 0.10x" in amqtt and "p99 us 0.17x" in amqtt  # medians 45 and 100
    assert "p50 us 0.60x" in mosquitto
    assert not any("floor/ours" in line or "floor/floor" in line for line in lines)
    assert runner.floor_lines([r for r in records if r["broker"] != "floor"]) == []
