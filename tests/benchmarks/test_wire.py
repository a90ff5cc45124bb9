"""The load generator's ack handlers and latency probe, without a broker.

The fast paths of ``Client._on_sub_ack`` / ``Client._on_pub_ack`` (strided slices, uint32 table
lookups, a tight header loop) must answer exactly as the per-frame walks they replace: the same
writes, chunk by chunk, and the same counters. Each test feeds the same chunks to a client on
the fast path and to one on the walk alone and compares them; some also check the answer itself.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from typing import Any

import pytest

from benchmarks import client as bc
from benchmarks import wire

MQTT_5, MQTT_311 = wire.MQTT_5, wire.MQTT_311
PINGRESP = b"\xd0\x00"
DISCONNECT = b"\xe0\x00"


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def new_client(version: int = MQTT_5) -> bc.Client:
    async def make() -> bc.Client:
        return bc.Client(version)

    client = asyncio.run(make())
    client.transport = FakeTransport()  # type: ignore[assignment]
    return client


def writes(client: bc.Client) -> list[bytes]:
    transport = client.transport
    assert isinstance(transport, FakeTransport)
    return transport.writes


def state(client: bc.Client) -> dict[str, object]:
    return {
        "writes": writes(client),
        "count": client.count,
        "sent": client.sent,
        "acked": client.acked,
        "failed_acks": client.failed_acks,
        "others": client.others,
        "rest": client.rest,
    }


def by_walk(client: bc.Client, walk: Any) -> Any:
    """The reference handler: ``walk`` (the per-frame walk the fast paths fall back on) over
    the whole chunk, answered with one write."""

    def handler(data: bytes) -> None:
        out: list[Any] = []
        walk(data, out)
        client._send_all(out)

    return handler


def subscribers(version: int = MQTT_5) -> tuple[bc.Client, bc.Client]:
    fast, slow = new_client(version), new_client(version)
    fast.start_acking()
    slow._switch(by_walk(slow, slow._sub_ack_walk))
    return fast, slow


def publishers(qos: int, window: int = 32, version: int = MQTT_5) -> tuple[bc.Client, bc.Client]:
    fast, slow = new_client(version), new_client(version)
    for c in (fast, slow):
        c.start_windowed(f"bench/q{qos}/00", qos, window, wire.payload())
    slow._switch(by_walk(slow, slow._pub_ack_walk))
    return fast, slow


def feed(chunks: list[bytes], *clients: bc.Client) -> None:
    for chunk in chunks:
        for c in clients:
            c.handler(chunk)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def random_chunks(rng: random.Random, frames: list[bytes], max_frames: int = 40) -> list[bytes]:
    """Group frames into chunks of 1..max_frames, then cut some chunks mid-frame."""
    chunks, i = [], 0
    while i < len(frames):
        k = rng.randint(1, max_frames)
        chunks.append(b"".join(frames[i : i + k]))
        i += k
    data = b"".join(chunks)
    cuts = {sum(len(c) for c in chunks[:j]) for j in range(1, len(chunks))}
    cuts |= {rng.randrange(1, len(data)) for _ in range(len(chunks) // 3)}
    return split(data, sorted(cuts))


def publish(pid: int, qos: int = 1, topic: str = "bench/q1/00", version: int = MQTT_5) -> bytes:
    return wire.publish(topic, wire.payload(pid), qos, pid, version)


def pubrel(pid: int) -> bytes:
    return b"\x62\x02" + pid.to_bytes(2, "big")


def ack(first: int, pid: int, code: int | None = None) -> bytes:
    if code is None:
        return bytes([first, 2]) + pid.to_bytes(2, "big")
    return bytes([first, 3]) + pid.to_bytes(2, "big") + bytes([code])


def walk_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of the per-frame walk ``name`` (on every Client)."""
    calls: list[int] = []
    original = getattr(bc.Client, name)

    def counting(self, data, out):  # type: ignore[no-untyped-def]
        calls.append(len(data))
        return original(self, data, out)

    monkeypatch.setattr(bc.Client, name, counting)
    return calls


# -- subscribers ------------------------------------------------------------------------------


@pytest.mark.parametrize("per", [1, 2, 3, 4, 5, 31, 500])
@pytest.mark.parametrize("qos", [1, 2])
def test_sub_pure_publish_chunks_take_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, qos: int, per: int
) -> None:
    calls = walk_calls(monkeypatch, "_sub_ack_walk")
    frames = [publish(i % 65535 + 1, qos, f"bench/q{qos}/00") for i in range(1000)]
    chunks = [b"".join(frames[i : i + per]) for i in range(0, len(frames), per)]
    fast = new_client()
    fast.start_acking()
    feed(chunks, fast)
    assert calls == []  # never fell back to the walk
    kind = b"\x40\x02" if qos == 1 else b"\x50\x02"
    expected = [
        b"".join(kind + (i % 65535 + 1).to_bytes(2, "big") for i in range(j, min(j + per, 1000)))
        for j in range(0, 1000, per)
    ]
    assert writes(fast) == expected
    assert fast.count == 1000 and fast.rest == b"" and fast.others == []


@pytest.mark.parametrize("seed", range(20))
def test_sub_random_splits_match_the_walk(seed: int) -> None:
    rng = random.Random(seed)
    frames = []
    for _ in range(600):
        pid = rng.randrange(1, 65536)
        frames.append(publish(pid, 2, "bench/q2/00"))
        if rng.random() < 0.6:
            frames.append(pubrel(rng.randrange(1, 65536)))
    fast, slow = subscribers()
    feed(random_chunks(rng, frames), fast, slow)
    assert state(fast) == state(slow)
    assert fast.count == 600


def test_sub_chunk_split_mid_frame() -> None:
    frames = [publish(i + 1) for i in range(10)]
    data = b"".join(frames)
    size = len(frames[0])
    for cut in (1, 2, 3, 4, size - 1, size, size + 1, 5 * size + 17, len(data) - 1):
        fast, slow = subscribers()
        feed(split(data, [cut]), fast, slow)
        assert state(fast) == state(slow), cut
        assert fast.count == 10 and fast.rest == b""
        assert b"".join(writes(fast)) == b"".join(
            b"\x40\x02" + (i + 1).to_bytes(2, "big") for i in range(10)
        )
    fast, slow = subscribers()
    feed([data[:-3]], fast, slow)  # the last frame stays incomplete
    assert state(fast) == state(slow) and fast.rest == frames[-1][:-3] and fast.count == 9


@pytest.mark.parametrize(
    "odd",
    [
        PINGRESP,
        DISCONNECT,
        b"\x62\x03\x00\x07\x92",  # PUBREL with a reason code
        b"\xb0\x02\x00\x01",  # UNSUBACK (3.1.1 shape): 4 bytes, not an ack of ours
        publish(9, 0),  # QoS 0: counted, not acknowledged
        bytes([0x3A]) + publish(9, 1)[1:],  # QoS 1 with DUP set
        bytes([0x33]) + publish(9, 1)[1:],  # QoS 1 retained
        publish(9, 1, "bench/q1/long-topic-name"),  # another size
        wire.publish("bench/q1/000", wire.payload(9, 63), 1, 9),  # same size, another topic length
        publish(9, 1, "bench/q1/00x" * 15),  # two-byte Remaining Length
        b"\x32\x05\x00\x09abc",  # malformed: topic longer than the frame
    ],
)
@pytest.mark.parametrize("where", [0, 3, 8, 20])
def test_sub_unexpected_frames_match_the_walk(odd: bytes, where: int) -> None:
    frames = [publish(i + 1) for i in range(20)]
    frames.insert(where, odd)
    mixed = []
    for i, f in enumerate(frames):
        mixed.append(f)
        if i % 3 == 2:
            mixed.append(pubrel(i + 100))
    for seq in (frames, mixed):
        data = b"".join(seq)
        alone = [odd, b"".join(f for f in seq if f is not odd)]
        cuts = split(data, [len(data) // 2]), split(data, [5, 90, 91, 200])
        for chunks in ([data], alone, *cuts):
            fast, slow = subscribers()
            feed(chunks, fast, slow)
            assert state(fast) == state(slow)


def test_sub_payload_that_looks_like_frames() -> None:
    """A frame twice the usual size whose payload holds what looks like a frame header at the
    usual stride: only the Remaining Length byte at the frame's own start tells it apart."""
    small = [wire.publish("t", wire.payload(i, 8), 1, i + 1) for i in range(8)]
    size = len(small[0])
    body = wire.payload(99, 24)
    fake = small[0][:4]  # 32 RL 00 01: the header of a small frame
    at = size - (len(small[0]) - 8)  # where the payload reaches the next stride position
    big = wire.publish("t", body[:at] + fake + body[at + 4 :], 1, 500)
    assert len(big) == 2 * size and big[size : size + 4] == fake
    frames = small[:1] + [big] + small[1:]
    fast, slow = subscribers()
    feed([b"".join(frames)], fast, slow)
    assert state(fast) == state(slow) and fast.count == 9


def test_sub_large_frames_and_mqtt_311() -> None:
    rng = random.Random(7)
    for version in (MQTT_5, MQTT_311):
        frames = [publish(i + 1, 1 + i % 2, version=version) for i in range(300)]
        frames += [wire.publish("t", b"x" * 300, 1, i + 1, version) for i in range(50)]
        fast, slow = subscribers(version)
        feed(random_chunks(rng, frames), fast, slow)
        assert state(fast) == state(slow) and fast.count == 350


# -- publishers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("per", "code"),
    [(1, None), (2, None), (7, None), (32, None), (1, 0), (3, 0), (32, 0)],
    ids=[
        "2-byte-1",
        "2-byte-2",
        "2-byte-7",
        "2-byte-32",
        "mosquitto-1",
        "mosquitto-3",
        "mosquitto-32",
    ],
)
def test_pub_qos1_fast_path(monkeypatch: pytest.MonkeyPatch, per: int, code: int | None) -> None:
    """PUBACKs ``per`` to a read, of 2 bytes or as Mosquitto writes them (5 bytes, the reason
    code 0 written out), take the fast path and release the next PUBLISHes in order; after
    2-byte ones, those of a read go out in one write."""
    calls = walk_calls(monkeypatch, "_pub_ack_walk")
    fast = new_client()
    fast.start_windowed("bench/q1/00", 1, 32, wire.payload())
    packets = dict(fast._packets)
    initial = list(writes(fast))
    count = 320 if code is None else 96
    pids = [i % 32 + 1 for i in range(count)]
    frames = [ack(0x40, pid, code) for pid in pids]
    feed([b"".join(frames[i : i + per]) for i in range(0, len(frames), per)], fast)
    assert calls == []
    assert b"".join(writes(fast)[len(initial) :]) == b"".join(
        packets[pid.to_bytes(2, "big")] for pid in pids
    )
    if code is None:
        assert writes(fast)[len(initial) :] == [
            b"".join(packets[pid.to_bytes(2, "big")] for pid in pids[i : i + per])
            for i in range(0, len(pids), per)
        ]
    assert fast.acked == count and fast.sent == 32 + count and fast.rest == b""


def test_pub_qos2_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = walk_calls(monkeypatch, "_pub_ack_walk")
    fast, slow = publishers(2)
    frames = []
    for i in range(200):
        frames.append(ack(0x50, i % 32 + 1))
        frames.append(ack(0x70, (i + 5) % 32 + 1))
    chunks = [b"".join(frames[i : i + 9]) for i in range(0, len(frames), 9)]
    feed(chunks, fast)
    assert calls == []
    feed(chunks, slow)
    assert state(fast) == state(slow)
    assert fast.acked == 200 and fast.sent == 232
    assert writes(fast)[1].startswith(b"\x62\x02\x00\x01")  # PUBREC 1 -> PUBREL 1


@pytest.mark.parametrize("seed", range(20))
def test_pub_random_splits_match_the_walk(seed: int) -> None:
    rng = random.Random(seed)
    odd = [
        ack(0x40, 3, 0x80),  # failed PUBACK
        ack(0x50, 4, 0x87),  # failed PUBREC: the flow ends, the identifier is free
        ack(0x40, 5, 0x10),  # PUBACK "no matching subscribers": a success
        ack(0x40, 999),  # an identifier outside the window
        ack(0x41, 6),  # reserved flags set
        PINGRESP,
        DISCONNECT,
        b"\xb0\x02\x00\x01",
    ]
    frames = []
    for _ in range(800):
        r = rng.random()
        if r < 0.02:
            frames.append(rng.choice(odd))
        else:
            frames.append(ack(rng.choice((0x40, 0x50, 0x70)), rng.randrange(1, 33)))
    for qos in (1, 2):
        fast, slow = publishers(qos)
        chunks = random_chunks(rng, frames, 12)
        half = len(chunks) // 2
        feed(chunks[:half], fast, slow)
        assert state(fast) == state(slow)
        fast.stopping = slow.stopping = True  # no new PUBLISH from here
        feed(chunks[half:], fast, slow)
        assert state(fast) == state(slow)
        assert fast.failed_acks == slow.failed_acks > 0


def test_pub_failed_acks_and_tails() -> None:
    fast, slow = publishers(2)
    cases = [
        ack(0x40, 1) + ack(0x40, 2, 0x80),  # a failed PUBACK after a good one
        ack(0x50, 3, 0x87) + ack(0x70, 4),  # a failed PUBREC frees identifier 3
        ack(0x50, 5) + ack(0x70, 6) + DISCONNECT,  # a complete 2-byte frame in the tail
        ack(0x40, 7) + b"\x40\x02",  # an incomplete ack carried over ...
        b"\x00\x08" + ack(0x70, 9),  # ... and completed
        ack(0x40, 10) + b"\x40",
        b"\x03\x00\x0b\x80",  # a failed PUBACK split after its first byte
        ack(0x40, 999) + ack(0x40, 11),  # outside the window: the whole chunk is walked
    ]
    for chunk in cases:
        feed([chunk], fast, slow)
        assert state(fast) == state(slow), chunk.hex()
    assert fast.failed_acks == 3
    assert fast.others == [(0xE0, b"")]
    assert fast.rest == b""


def test_pub_stopping() -> None:
    fast, slow = publishers(2)
    fast.stopping = slow.stopping = True
    before = list(writes(fast))
    chunks = [ack(0x40, 1) + ack(0x70, 2), ack(0x50, 3) + ack(0x70, 4), ack(0x70, 5)]
    feed(chunks, fast, slow)
    assert state(fast) == state(slow)
    assert writes(fast)[len(before) :] == [pubrel(3)]  # only the PUBREL, no new PUBLISH
    assert fast.acked == 4 and fast.sent == 32


# -- the latency probe ------------------------------------------------------------------------


class Echo(threading.Thread):
    """A stand-in broker: forwards the publisher's bytes to the subscriber, dropping the
    PUBLISH frames whose index is in ``drop``."""

    def __init__(self, src: socket.socket, dst: socket.socket, drop: set[int]) -> None:
        super().__init__(daemon=True)
        self.src, self.dst, self.drop = src, dst, drop
        self.src.settimeout(0.05)

    def run(self) -> None:
        buf, index = b"", 0
        while True:
            try:
                chunk = self.src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while (frame := wire.next_frame(buf)) is not None:
                if index not in self.drop:
                    self.dst.sendall(buf[: frame[2]])
                index += 1
                buf = buf[frame[2] :]


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_latency_probe(monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    monkeypatch.setattr(bc, "LOST_AFTER", 0.05)
    pub_a, pub_b = socket.socketpair()
    sub_a, sub_b = socket.socketpair()
    for s in (pub_a, sub_a):
        s.setblocking(False)
    echo = Echo(pub_b, sub_b, drop={30})
    echo.start()
    pub, sub = bc.RawClient(pub_a, b"", 0), bc.RawClient(sub_a, b"", 0)
    probe = bc.LatencyProbe(pub, sub, "bench/latency", version, 2000.0)
    snaps: list[float] = []

    def snapshot() -> float:
        snaps.append(time.perf_counter())
        return snaps[-1]

    # 0.4 s at 2,000 msg/s: message 30 falls inside the window, and more than 50 arrive in it,
    # even on a machine running at a fifth of its speed (0.1 s was too short for that).
    c0, c1, s0, s1 = probe.run(0.005, 0.4, snapshot)
    for s in (pub_a, pub_b, sub_a, sub_b):
        s.close()
    assert len(snaps) == 3 and s1 - s0 == pytest.approx(0.4, abs=0.06)
    assert c1["lost"] - c0["lost"] == 1 and probe.lost == 1  # message 30 was dropped
    assert len(probe.samples) == c1["received"] - c0["received"] > 50
    assert all(0 < ns < 50_000_000 for ns in probe.samples)
    assert probe.late == 0 and sub.others == [] and not pub.eof and not sub.eof


def test_latency_probe_stamp_offset() -> None:
    for version in (MQTT_5, MQTT_311):
        frame = wire.publish("bench/latency", wire.payload(12345), 0, 0, version)
        at = bc.stamp_offset(frame, version)
        assert int.from_bytes(frame[at : at + 8], "big") == 12345
    frame = wire.publish("t", wire.payload(77), 1, 9, MQTT_5)
    assert int.from_bytes(frame[bc.stamp_offset(frame, MQTT_5) :][:8], "big") == 77
