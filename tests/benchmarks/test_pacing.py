"""The generator parts of scenarios 8, 9 and 1w, without a broker: PUBACK parsing (4-byte and
Mosquitto's 5-byte acks), scenario 8's windowed publisher against its per-frame walk and its
latency percentiles, the fsync-bound ceiling's arithmetic, the devices' pacing, and one PUBLISH
per TCP segment. No timed assertions."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import ceiling, devices, procfs, windowed, wire
from benchmarks.client import RawClient

TOPIC = "bench/persist"


def puback(pid: int, reason: int | None = None) -> bytes:
    if reason is None:
        return b"\x40\x02" + pid.to_bytes(2, "big")
    return b"\x40\x03" + pid.to_bytes(2, "big") + bytes([reason])


# -- PUBACK parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", [None, 0x00, 0x10])
@pytest.mark.parametrize("count", [1, 3, 9])  # one frame, a short run, a strided run
def test_puback_keys_give_one_4_byte_key_per_successful_puback(
    reason: int | None, count: int
) -> None:
    pids = [1, 7, 300, 65535, 2, 3, 4, 5, 6][:count]
    chunk = b"".join(puback(pid, reason) for pid in pids)
    found = wire.puback_keys(chunk + b"\x40")  # and the first byte of the next one
    assert found is not None
    keys, whole = found
    assert whole == len(chunk)
    assert bytes(keys) == b"".join(puback(pid) for pid in pids)


def test_puback_keys_refuse_a_failed_ack_or_another_packet() -> None:
    assert wire.puback_keys(puback(1, 0) + puback(2, 0x87)) is None  # Not authorized
    assert wire.puback_keys(b"\xd0\x00" + puback(1)) is None
    assert wire.puback_keys(puback(1, 0) + b"\xd0\x00\x00\x00\x00") is None
    assert wire.puback_keys(b"\x40\x03\x00") is None  # not one whole frame yet
    assert wire.puback_keys(puback(1, 0x80)) is None
    long_run = b"".join(puback(pid, 0) for pid in range(1, 9))
    assert wire.puback_keys(long_run + puback(9, 0x80)) is None
    assert wire.puback_keys(long_run[:-5] + b"\x50\x03\x00\x08\x00" + puback(9, 0)) is None


def test_count_pubacks_counts_failures_others_and_keeps_an_incomplete_frame() -> None:
    others: list[tuple[int, bytes]] = []
    chunk = puback(1) + puback(2) + puback(3, 0x80) + b"\xd0\x00" + puback(4, 0) + b"\x40\x03\x00"
    acks, failed, pos = wire.count_pubacks(chunk, others)
    assert (acks, failed) == (4, 1)
    assert pos == len(chunk) - 3
    assert others == [(0xD0, b"")]
    fast: list[tuple[int, bytes]] = []
    assert wire.count_pubacks(b"".join(puback(i, 0) for i in range(1, 9)), fast) == (8, 0, 40)
    assert not fast


# -- scenario 8: the windowed publisher --------------------------------------------------------


def acks_for(pids: list[int], reason: int | None) -> bytes:
    return b"".join(puback(pid, reason) for pid in pids)


def split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 6)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("reason", [None, 0x00])
def test_windowed_fast_path_answers_as_the_walk(reason: int | None) -> None:
    rng = random.Random(8)
    fast = windowed.Windowed(TOPIC, 32, wire.MQTT_5, wire.payload())
    walk = windowed.Windowed(TOPIC, 32, wire.MQTT_5, wire.payload())
    assert fast.start(0.0) == walk.start(0.0)
    fast.recording = walk.recording = True
    pids = list(range(1, 33))
    stream = acks_for(pids, reason) + acks_for(pids[:10], reason)
    fast_out = []
    chunks = split(stream, rng)
    for i, chunk in enumerate(chunks):
        fast_out.append(fast.on_chunk(chunk, 1.0 + i))
    assert fast.counters()["reads"] == len(chunks)
    walk_out = walk.walk(stream, 1.0)
    assert b"".join(fast_out) == walk_out
    packets = walk.packets
    expected = b"".join(packets[pid.to_bytes(2, "big")] for pid in pids + pids[:10])
    assert walk_out == expected  # each PUBACK released the PUBLISH of its identifier
    for pub in (fast, walk):
        assert (pub.acked, pub.failed, pub.sent, pub.rest) == (42, 0, 74, b"")
        hist, worst = pub.latencies()
        assert sum(hist.values()) == 42 and worst is not None and worst > 0


def test_mosquitto_s_5_byte_pubacks_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    pub = windowed.Windowed(TOPIC, 32, wire.MQTT_5, wire.payload())
    pub.start(0.0)

    def no_walk(data: bytes, now: float) -> bytes:
        raise AssertionError(f"walked {data.hex()}")

    monkeypatch.setattr(pub, "walk", no_walk)
    reply = pub.on_chunk(acks_for(list(range(1, 33)), 0x00), 0.001)
    assert (pub.acked, pub.sent) == (32, 64)
    assert reply == b"".join(pub.packets.values())


def test_windowed_counts_a_failed_ack_and_stops_releasing_when_stopping() -> None:
    pub = windowed.Windowed(TOPIC, 4, wire.MQTT_5, wire.payload())
    pub.start(0.0)
    reply = pub.on_chunk(puback(1) + puback(2, 0x97), 0.5)  # Quota exceeded
    assert (pub.acked, pub.failed) == (2, 1)
    assert reply.count(b"\x32") >= 2 and pub.sent == 6
    pub.stopping = True
    assert pub.on_chunk(puback(3) + puback(4), 0.6) == b""
    assert (pub.acked, pub.sent) == (4, 6)
    assert pub.on_chunk(b"\xd0\x00", 0.7) == b"" and pub.others[0xD0] == 1


def test_latency_histogram_percentiles() -> None:
    pub = windowed.Windowed(TOPIC, 2, wire.MQTT_5, wire.payload())
    pub.start(0.0)
    pub.recording = True
    pub.on_chunk(puback(1), 0.000250)  # 250 us
    pub.on_chunk(puback(2), 0.123456)  # 123,456 us -> 123,000 (3 significant digits)
    hist, worst = pub.latencies()
    assert hist == {250: 1, 123000: 1}
    assert worst == pytest.approx(123.456)
    merged = windowed.merge_histograms([hist, {"250": 97, "5000": 1}])
    assert merged == {250: 98, 5000: 1, 123000: 1}
    assert windowed.hist_percentile(merged, 0.5) == 250
    assert windowed.hist_percentile(merged, 0.99) == 5000
    assert windowed.hist_percentile(merged, 1.0) == 123000
    assert windowed.hist_percentile({}, 0.99) is None


# -- the fsync-bound ceiling ---------------------------------------------------------------------


def test_ceiling_arithmetic() -> None:
    assert ceiling.ceiling(4, 32, 0.002, 0.0005) == pytest.approx(51_200)
    assert ceiling.commit_work(4, 32, 256_000) == pytest.approx(0.0005)
    assert ceiling.commit_work(4, 32, None) == 0.0


def record(broker: str, rate: float, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": "8",
        "broker": broker,
        "metrics": {"msgs_per_s": rate},
        "window": 32,
        **extra,
    }


def test_ceiling_lines_from_the_medians_of_the_runs() -> None:
    records = [
        record("ours-memory", 256_000),
        record("ours-memory", 250_000),
        record("ours-memory", 300_000),
        record("ours-full", 40_960, fsync_ms=2.0, fsync_cpu_ms=0.2, fsync_fs="ext4"),
        record("ours-full", 30_000, fsync_ms=3.0, fsync_cpu_ms=0.1, fsync_fs="ext4"),
        record("ours-full", 50_000, fsync_ms=1.5, fsync_cpu_ms=0.3, fsync_fs="ext4"),
        record("mosquitto", 272_000),
    ]
    text = "\n".join(ceiling.lines(records, 4))
    # median fsync 2.0 ms, commit work 128 / 256,000 = 0.5 ms: 128 / 2.5 ms = 51,200 msg/s
    assert "fsync 2.000 ms, 0.200 ms of it processor time" in text and "on ext4" in text
    assert "commit work 0.500 ms = 4 x 32 / ours-memory's 256,000 msg/s" in text
    assert "= 51,200 msg/s" in text
    assert "ours-full 40,960 msg/s = 0.80x of the ceiling" in text
    assert ceiling.lines([record("ours-full", 1000)], 4) == []  # no fsync measured


def test_ceiling_with_the_store_work_from_ours_normal() -> None:
    records = [
        record("ours-memory", 256_000),
        record("ours-normal", 64_000),
        record("ours-full", 40_000, fsync_ms=2.0),
    ]
    text = "\n".join(ceiling.lines(records, 4))
    # commit work with the store 128 / 64,000 = 2 ms: 128 / (2 + 2) ms = 32,000 msg/s
    assert "commit work 2.000 ms = 4 x 32 / ours-normal's 64,000 msg/s" in text
    assert "ceiling 32,000 msg/s, ours-full at 1.25x of it" in text
    assert "ours-normal" not in "\n".join(ceiling.lines(records[::2], 4))


def test_ceiling_without_ours_memory_counts_no_commit_work() -> None:
    text = "\n".join(ceiling.lines([record("ours-full", 32_000, fsync_ms=2.0)], 4))
    assert "0 (ours-memory not measured)" in text and "= 64,000 msg/s" in text
    assert "processor time" not in text  # a record from before the probe measured it


def test_threads_cpu_counts_the_work_of_every_thread() -> None:
    """threads_cpu_ns sums the threads of a process, to the nanosecond: the CPU a thread other
    than the caller spun shows in it whole (a tick-counted figure could miss up to 10 ms)."""
    pid = os.getpid()
    spun = threading.Event()
    done = threading.Event()
    spent: list[float] = []

    def spin() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:
            pass
        spent.append(time.thread_time() - t0)
        spun.set()
        done.wait()  # still alive when the second reading is taken

    ns0 = procfs.threads_cpu_ns(pid)
    worker = threading.Thread(target=spin)
    worker.start()
    assert spun.wait(10)
    ns1 = procfs.threads_cpu_ns(pid)
    done.set()
    worker.join()
    assert ns0 is not None and ns1 is not None
    assert (ns1 - ns0) / 1e9 >= spent[0]
    assert procfs.per_item_us(ns0, ns1, 1000) == round((ns1 - ns0) / 1000 / 1000, 2)
    assert procfs.per_item_us(None, ns1, 1000) is None
    assert procfs.threads_cpu_ns(None) is None


def test_kernel_cpu_seconds_is_the_system_part_of_cpu_seconds() -> None:
    """Scenario 9's "in the kernel %": /proc's system time of a process, which the kernel also
    gives the process itself (os.times); its user time is the rest of ``cpu_seconds``."""
    read, write = os.pipe()
    try:
        for _ in range(20_000):  # some time in the kernel, beside the user time already spent
            os.write(write, b"x")
            os.read(read, 1)
    finally:
        os.close(read)
        os.close(write)
    pid = os.getpid()
    kernel, total, own = procfs.kernel_cpu_seconds(pid), procfs.cpu_seconds(pid), os.times()
    assert kernel is not None and total is not None
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert abs(kernel - own.system) <= 2 * tick
    assert abs((total - kernel) - own.user) <= 2 * tick
    assert procfs.kernel_cpu_seconds(None) is None


def test_broker_cpu_seconds_are_the_schedulers_and_steal_is_the_machines() -> None:
    """The CPU figures of the measuring windows: a process's from the scheduler (what its
    threads ran, not clock ticks), which grows by what a thread spins; its wake-ups, one per
    sleep; and /proc/stat's steal, a machine-wide count that never goes back."""
    pid = os.getpid()
    before = procfs.broker_cpu_seconds(pid)
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:
        pass
    spent = time.thread_time() - t0
    after = procfs.broker_cpu_seconds(pid)
    assert before is not None and after is not None
    assert after - before >= spent
    assert procfs.broker_cpu_seconds(None) is None
    woken = procfs.wakeups(pid)
    for _ in range(20):
        time.sleep(0.001)  # each a sleep and a wake-up of this thread
    assert woken is not None and procfs.wakeups(pid) - woken >= 20  # type: ignore[operator]
    assert procfs.wakeups(None) is None
    steal0 = procfs.steal_seconds()
    steal1 = procfs.steal_seconds()
    assert steal0 is not None and steal1 is not None and 0 <= steal0 <= steal1
    # as a share of all the cores over the window: 2 CPU seconds over 1 s is 200% / cores
    cores = os.cpu_count() or 1
    assert procfs.steal_pct(1.0, 3.0, 1.0) == round(200 / cores, 1)
    assert procfs.steal_pct(None, 3.0, 1.0) is None and procfs.steal_pct(1.0, 3.0, 0) is None


def test_unread_bytes_counts_what_a_ports_connections_have_not_read() -> None:
    """Scenario 9's "unread bytes/conn": the receive queue of each established connection on
    the listening port's side (its rx_queue), which the client's side and other ports do not
    add to; it empties once read."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            server, _ = listener.accept()
            with server:
                client.sendall(b"x" * 300)
                server.sendall(b"y" * 50)  # unread by the client: not on ``port``'s side
                got = procfs.unread_bytes(port)
                for _ in range(100):  # the bytes cross loopback in a moment
                    if got == [300]:
                        break
                    time.sleep(0.01)
                    got = procfs.unread_bytes(port)
                assert got == [300]
                received = b""
                while len(received) < 300:
                    received += server.recv(1000)
                assert procfs.unread_bytes(port) == [0]
                client.recv(1000)


def test_listening_ports_are_a_process_s_listeners_over_ipv4_and_ipv6() -> None:
    """How the runner finds a broker's port (brokers.py): the LISTEN sockets among the
    process's descriptors, from /proc/<pid>/net/tcp and tcp6; not a connected socket's port."""
    with (
        socket.create_server(("127.0.0.1", 0)) as v4,
        socket.create_server(("::1", 0), family=socket.AF_INET6) as v6,
        socket.create_connection(v4.getsockname()) as client,
    ):
        ports = procfs.listening_ports(os.getpid())
        assert v4.getsockname()[1] in ports
        assert v6.getsockname()[1] in ports
        assert client.getsockname()[1] not in ports


def test_fsync_probe_measures_in_the_directory_and_leaves_nothing(tmp_path: Path) -> None:
    seconds, cpu = ceiling.fsync_cost(str(tmp_path), samples=5)
    assert seconds > 0 and 0 < cpu <= seconds
    assert list(tmp_path.iterdir()) == []
    assert procfs.filesystem("/proc") == "proc"


# -- scenario 9: pacing ----------------------------------------------------------------------------


def test_pacer_sends_each_device_at_its_rate() -> None:
    rng = random.Random(9)
    n, rate, seconds = 1000, 50.0, 2.0
    pacer = devices.Pacer(n, rate, start=10.0)
    assert pacer.groups == 10 and pacer.gap == pytest.approx(0.002)
    sends = [0] * n
    now = 10.0
    while now < 10.0 + seconds:
        for group in pacer.ready(now):
            for i in group:
                sends[i] += 1
        now += rng.uniform(0.0001, 0.004)  # a late or early wake-up now and then
    assert pacer.missed == 0
    assert set(sends) <= {round(rate * seconds), round(rate * seconds) + 1}


def test_pacer_spreads_groups_and_skips_what_is_too_late() -> None:
    pacer = devices.Pacer(100, 100.0, start=0.0, catch_up=0.05)  # 10 ms apart: 5 groups
    assert [len(g) for g in pacer.members] == [20] * 5
    assert pacer.ready(0.0) == [pacer.members[0]]
    assert pacer.ready(0.0039) == [pacer.members[1]]  # 2 ms later
    # one second late: not 500 groups at once, only the last 50 ms (25 groups)
    burst = pacer.ready(1.0039)
    assert len(burst) == 25
    assert pacer.missed == (500 - 25) * 20
    assert pacer.due() > 1.0039


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    return client, peer


def test_device_keeps_its_ring_in_flight_and_sweeps_its_acks() -> None:
    client, peer = loopback_pair()
    try:
        client.setblocking(False)
        conn = RawClient(client, b"", 0)
        packets = devices.device_packets("dev/0001/q1", 1, wire.MQTT_5, ring=3)
        device = devices.Device(conn, packets, limit=3)
        for _ in range(5):
            device.send()
        assert (device.sent, device.held) == (3, 2)  # no ack yet: the ring is in flight
        peer.sendall(puback(1) + puback(2, 0) + puback(3, 0x80) + b"\x40")
        peer.setblocking(True)
        received = b""
        while len(received) < sum(map(len, packets)):
            received += peer.recv(4096)
        assert received == b"".join(packets)
        while device.acked < 3:
            device.sweep()
        assert (device.acked, device.failed, conn.rest) == (3, 1, b"\x40")
        device.send()
        assert device.sent == 4 and device.i == 1
    finally:
        client.close()
        peer.close()


# -- scenario 1w: one PUBLISH per segment -----------------------------------------------------------


def test_one_per_write_sends_one_segment_per_message_and_holds_a_queued_one() -> None:
    client, peer = loopback_pair()
    try:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setblocking(False)
        conn = RawClient(client, b"", 0)
        packet = wire.publish("bench/0/data", wire.payload(), 0, 0, wire.MQTT_5)
        pubs = devices.OnePerWrite([conn], [packet])
        before = devices.data_segments_out(client)
        if before is None:
            pytest.skip("this kernel's TCP_INFO has no tcpi_data_segs_out")
        peer.setblocking(True)
        for _ in range(20):
            pubs.round()
            assert peer.recv(len(packet), socket.MSG_WAITALL) == packet
        assert pubs.sent == 20 and pubs.held == 0
        assert devices.data_segments_out(client) == before + 20
        # The peer stops reading: once the kernel holds data back, the next round waits.
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        chunk = b"\x00" * 65536
        while devices.unsent_bytes(client) == 0:
            try:
                client.send(chunk)
            except BlockingIOError:
                break
        assert devices.unsent_bytes(client) > 0
        sent = pubs.sent
        pubs.round()
        assert pubs.sent == sent and pubs.held == 1
    finally:
        client.close()
        peer.close()
