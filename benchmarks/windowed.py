"""Scenario 8's publishers: one process each, a plain blocking socket, pre-encoded PUBLISHes.

    python -m benchmarks.windowed '{"host": ..., "port": ..., "client_id": ..., ...}'

A :class:`Windowed` publisher keeps ``window`` QoS 1 PUBLISHes unacknowledged: each successful
PUBACK releases the pre-encoded PUBLISH with the same packet identifier, and every PUBACK's
delay since its PUBLISH was written is kept (publish-to-PUBACK latency). A chunk of PUBACKs,
4 bytes each (this broker) or 5 (Mosquitto sends reason code 0), is answered without a Python
step per frame: :func:`wire.puback_keys` turns it into 4-byte keys, which are looked up, as
native uint32s, in a table of replies and in the table of send times.

Each publisher runs in a process of its own (the runner pins the generator to its core, and
the processes inherit that), with nothing between ``recv`` and ``send`` but that lookup: no
event loop, no callbacks. The generator process of scenario 8 starts them with
:func:`run_publishers`; they connect, say they are ready, get a common start time on stdin
(``time.monotonic()``, the same clock in every process), send for warm-up + duration, take
their counters and CPU time at both ends of the window, then stop sending, wait for the last
acks, DISCONNECT, and print one JSON object.

When a C compiler is there, the runner builds ``c/windowed_pub.c`` once per suite
(:func:`build_c`) and :func:`run_publishers` starts that program instead: the same steps and the
same JSON object, at a fraction of the CPU per message, so that a broker acknowledging from
memory, not the generator, is the limit. The bytes it sends are still encoded here
(:func:`c_command`): the CONNECT, one PUBLISH and where its packet identifier is, DISCONNECT.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

from . import cprograms, wire
from .client import _NATIVE, _reply_table, open_blocking

RECV_TIMEOUT = 0.01  # seconds: how late a publisher may notice the end of a phase
READY_TIMEOUT = 60.0
START_DELAY = 0.1  # seconds between the last "ready" and the common start


def _latency_key(us: int) -> int:
    """A latency in µs, kept to 3 significant digits (bounds the histogram's size)."""
    if us < 1000:
        return us
    step: int = 10 ** (len(str(us)) - 3)
    return us - us % step


def merge_histograms(histograms: Sequence[dict[Any, int]]) -> dict[int, int]:
    total: Counter[int] = Counter()
    for hist in histograms:
        for key, n in hist.items():
            total[int(key)] += n
    return dict(total)


def hist_percentile(hist: dict[int, int], q: float) -> int | None:
    """Nearest-rank percentile of the values counted in ``hist`` (value -> count)."""
    n = sum(hist.values())
    if not n:
        return None
    rank = max(1, -(-int(q * n * 1_000_000) // 1_000_000))  # ceil(q * n) without float noise
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= rank:
            return value
    return max(hist)


class Windowed:
    """One QoS 1 publisher's state: answers chunks of acks with the PUBLISHes they release."""

    def __init__(self, topic: str, window: int, version: int, body: bytes) -> None:
        self.packets = {
            pid.to_bytes(2, "big"): wire.publish(topic, body, 1, pid, version)
            for pid in range(1, window + 1)
        }
        self.replies = _reply_table(self.packets, stopping=False)
        self.replies_stopping = _reply_table(self.packets, stopping=True)
        self.sent_at: dict[int, float] = {}  # PUBACK key -> when its PUBLISH was written
        self.rest = b""
        self.stopping = False
        self.recording = False  # keep latencies (the measuring window)
        self.log: list[tuple[float, list[float]]] = []  # (ack time, send times of its PUBLISHes)
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.reads = 0  # chunks read (on_chunk calls)
        self.others: Counter[int] = Counter()  # unexpected packets: first byte -> count

    @staticmethod
    def key(pid: bytes) -> int:
        return int.from_bytes(b"\x40\x02" + pid, _NATIVE)

    def start(self, now: float) -> bytes:
        """The whole window, to be written at ``now``."""
        self.sent_at = {self.key(pid): now for pid in self.packets}
        self.sent += len(self.packets)
        return b"".join(self.packets.values())

    def on_chunk(self, data: bytes, now: float) -> bytes:
        """Count the acks in ``data`` (read at ``now``) and return what to write back."""
        self.reads += 1
        if self.rest:
            data = self.rest + data
            self.rest = b""
        found = wire.puback_keys(data)
        if found is not None:
            keys, whole = found
            view = memoryview(keys).cast("I")
            table = self.replies_stopping if self.stopping else self.replies
            try:
                times = list(map(self.sent_at.__getitem__, view))
                reply = b"".join(map(table.__getitem__, view))
            except KeyError:  # not only PUBACKs of our window: frame by frame
                return self.walk(data, now)
            n = len(times)
            self.acked += n
            if self.recording:
                self.log.append((now, times))
            if not self.stopping:
                self.sent += n
                self.sent_at.update(zip(view, repeat(now)))
            if whole < len(data):
                reply += self.walk(data[whole:], now)
            return reply
        return self.walk(data, now)

    def walk(self, data: bytes, now: float) -> bytes:
        """The per-frame reference: every PUBACK releases its PUBLISH (a failed one is counted
        in ``failed``); anything else is counted in ``others``; an incomplete frame is kept."""
        out = []
        pos = 0
        while (frame := wire.next_frame(data, pos)) is not None:
            first, body, stop = frame
            pos = stop
            if first >> 4 != wire.PUBACK or stop - body < 2:
                self.others[first] += 1
                continue
            pid = data[body : body + 2]
            key = self.key(pid)
            self.acked += 1
            if stop - body > 2 and data[body + 2] >= 0x80:
                self.failed += 1
            sent_at = self.sent_at.get(key)
            if sent_at is not None and self.recording:
                self.log.append((now, [sent_at]))
            packet = self.packets.get(pid)
            if not self.stopping and packet is not None:
                out.append(packet)
                self.sent += 1
                self.sent_at[key] = now
        self.rest = data[pos:]
        return b"".join(out)

    def latencies(self) -> tuple[dict[int, int], float | None]:
        """The latencies kept (µs, 3 significant digits -> count) and the largest, in ms."""
        hist: Counter[int] = Counter()
        worst = 0.0
        for now, times in self.log:
            oldest = now - min(times)
            if oldest > worst:
                worst = oldest
            for t in times:
                hist[_latency_key(int((now - t) * 1e6))] += 1
        return dict(hist), (round(worst * 1000, 3) if self.log else None)

    def counters(self) -> dict[str, float]:
        return {"acked": self.acked, "failed": self.failed, "sent": self.sent, "reads": self.reads}


# -- the worker process --------------------------------------------------------------------------


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def work(spec: dict[str, Any]) -> dict[str, Any]:
    """One publisher, from connect to DISCONNECT (see the module's docstring)."""
    version = int(spec["version"])
    conn = open_blocking(spec["host"], int(spec["port"]), spec["client_id"], version)
    sock = conn.sock
    window = max(1, min(int(spec["window"]), conn.receive_max))
    pub = Windowed(spec["topic"], window, version, wire.payload())
    print(json.dumps({"ready": window}), flush=True)
    start = float(sys.stdin.readline())
    sock.setblocking(True)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(RECV_TIMEOUT * 1e6))
    )
    w0 = start + float(spec["warmup"])
    w1 = w0 + float(spec["duration"])
    settle_until = w1 + float(spec["settle"])
    clock = time.monotonic
    recv = sock.recv
    send = sock.sendall
    marks: list[tuple[float, float, dict[str, float]]] = []  # (time, cpu, counters) at w0, w1
    lost = False
    if conn.rest:
        pub.rest = conn.rest
    time.sleep(max(0.0, start - clock()))
    send(pub.start(clock()))
    while True:
        try:
            data = recv(65536)
        except (BlockingIOError, InterruptedError):  # SO_RCVTIMEO: check the clock
            data = None
        except OSError:
            lost = True
            break
        now = clock()
        if len(marks) < 2 and now >= (w1 if marks else w0):
            marks.append((now, _cpu(), pub.counters()))
            pub.recording = len(marks) == 1
            pub.stopping = len(marks) == 2
        if data is not None:
            if not data:
                lost = True
                break
            reply = pub.on_chunk(data, now)
            if reply:
                try:
                    send(reply)
                except OSError:
                    lost = True
                    break
        if pub.stopping and (pub.acked >= pub.sent or now >= settle_until):
            break
    while len(marks) < 2:  # the connection ended early: the window ends here
        marks.append((clock(), _cpu(), pub.counters()))
    hist, worst = pub.latencies()
    result = {
        "window": window,
        "marks": marks,
        "acked": pub.acked,
        "failed": pub.failed,
        "sent": pub.sent,
        "settled": pub.acked >= pub.sent,
        "lost": lost,
        "others": {f"0x{k:02X}": n for k, n in pub.others.items()},
        "latency_hist_us": hist,
        "latency_max_ms": worst,
    }
    if not lost:
        _disconnect(sock)
    sock.close()
    return result


def _disconnect(sock: socket.socket, timeout: float = 3.0) -> None:
    """DISCONNECT and wait for the broker to close first (TIME_WAIT stays on its side)."""
    with contextlib.suppress(OSError):
        sock.sendall(wire.disconnect())
        sock.settimeout(timeout)
        while sock.recv(65536):
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        result = work(json.loads(argv[0]))
    except BaseException as exc:  # report, do not hang the generator
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


# -- the C publisher ---------------------------------------------------------------------------------


def build_c(directory: str | Path) -> tuple[str | None, str]:
    """Build the C publisher into ``directory``: (the program or None, which publishers
    scenario 8 runs and why, for the runner's header)."""
    binary, how = cprograms.build("windowed_pub", directory)
    if binary is None:
        return None, f"Python publishers (benchmarks/windowed.py), one process each: {how}"
    return binary, f"C publishers ({how}), one process each"


def c_command(binary: str, spec: dict[str, Any]) -> list[str]:
    """The C publisher's command line for ``spec`` (what :func:`work` reads from its JSON)."""
    version = int(spec["version"])
    packet = wire.publish(spec["topic"], wire.payload(), 1, 1, version)
    header = wire.read_remaining_length(packet, 0, len(packet))
    assert header is not None
    offset = header[1] + 2 + int.from_bytes(packet[header[1] : header[1] + 2], "big")
    assert packet[offset : offset + 2] == b"\x00\x01"
    return [
        binary,
        str(spec["host"]),
        str(spec["port"]),
        wire.connect(spec["client_id"], version).hex(),
        packet.hex(),
        str(offset),
        wire.disconnect(version).hex(),
        repr(float(spec["warmup"])),
        repr(float(spec["duration"])),
        repr(float(spec["settle"])),
    ]


def c_window(ready: dict[str, Any], spec: dict[str, Any]) -> int:
    """The window of a C publisher: ``spec``'s, within the broker's Receive Maximum, which is
    read from the CONNACK the program reports in its ready line."""
    connack = bytes.fromhex(ready["connack"])
    frame = wire.next_frame(connack)
    if frame is None:
        raise ConnectionError(f"a publisher process reported a bad CONNACK: {ready['connack']}")
    _, props = wire.connack_result(connack[frame[1] : frame[2]], int(spec["version"]))
    return max(1, min(int(spec["window"]), props.get(wire.PROP_RECEIVE_MAXIMUM, 65535)))


# -- the generator's side --------------------------------------------------------------------------


async def _line(stream: asyncio.StreamReader | None, timeout: float) -> dict[str, Any]:
    assert stream is not None
    raw = await asyncio.wait_for(stream.readline(), timeout)
    if not raw:
        raise ConnectionError("a publisher process exited before reporting")
    result: dict[str, Any] = json.loads(raw)
    if "error" in result:
        raise ConnectionError(f"a publisher process failed: {result['error']}")
    return result


async def run_publishers(
    specs: Sequence[dict[str, Any]],
    warmup: float,
    duration: float,
    settle: float,
    snapshot: Any,
    binary: str | None = None,
) -> tuple[list[dict[str, Any]], Any, Any]:
    """Start one process per spec (the C publisher ``binary`` when given, else :func:`main`),
    start them together, and take ``snapshot()`` (Ctx.snapshot) at both ends of their measuring
    window; returns their results and the two snapshots."""
    timing = {"warmup": warmup, "duration": duration, "settle": settle}
    commands = [
        c_command(binary, {**spec, **timing})
        if binary
        else [sys.executable, "-m", "benchmarks.windowed", json.dumps({**spec, **timing})]
        for spec in specs
    ]
    procs = [
        await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        for cmd in commands
    ]
    try:
        windows = []  # the C publisher gets its window with the start time
        for proc, spec in zip(procs, specs, strict=True):
            ready = await _line(proc.stdout, READY_TIMEOUT)
            windows.append(f" {c_window(ready, spec)}" if binary else "")
        start = time.monotonic() + START_DELAY
        for proc, window in zip(procs, windows, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(f"{start!r}{window}\n".encode())
            await proc.stdin.drain()
        snaps = []
        for at in (start + warmup, start + warmup + duration):
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            snaps.append(snapshot())
        limit = settle + 10.0
        results = [await _line(proc.stdout, limit) for proc in procs]
        return results, snaps[0], snaps[1]
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
