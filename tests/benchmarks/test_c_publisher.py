"""Scenario 8's C publisher (benchmarks/c/windowed_pub.c): the program,
driven by the generator's own code (``windowed.run_publishers``), keeps its window in flight and
parses every PUBACK form: against a stand-in broker on a loopback socket that answers with 3.1.1's
and MQTT 5's 4-byte form, 5 bytes with a reason code, reason code and properties (one with a
2-byte remaining length), a failed ack and an unexpected packet, some split across writes; and
against a real broker started by the test. A few seconds; no timed assertions."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import cprograms, windowed, wire

TOPIC = "bench/persist"
RECEIVE_MAXIMUM = 8  # the stand-in's CONNACK limits the publisher's window of 32 to this


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    if cprograms.compiler() is None:
        pytest.skip("no C compiler (cc, gcc): apt-get install gcc")
    path, description = windowed.build_c(tmp_path_factory.mktemp("cpub"))
    assert path is not None, description
    assert description.startswith("C publishers (benchmarks/c/windowed_pub.c, ")
    return path


def test_without_a_working_compiler_the_python_publishers_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cprograms, "compiler", lambda: None)
    path, description = windowed.build_c(tmp_path)
    assert path is None
    assert description.startswith("Python publishers (benchmarks/windowed.py)")
    assert "no C compiler" in description
    monkeypatch.setattr(cprograms, "compiler", lambda: "/bin/false")
    path, description = windowed.build_c(tmp_path)
    assert path is None and "Python publishers" in description and "false failed" in description


# -- a stand-in broker ---------------------------------------------------------------------------


def _puback_forms(pid: int) -> list[bytes]:
    """Every PUBACK form a broker may send for ``pid``, all successful."""
    p = pid.to_bytes(2, "big")
    reason_string = b"\x1f" + wire.s16(b"r" * 200)  # the properties make the frame 211 bytes
    return [
        b"\x40\x02" + p,  # 3.1.1, and MQTT 5 with reason code 0 left out (this broker)
        b"\x40\x03" + p + b"\x00",  # reason code 0 (Mosquitto)
        b"\x40\x04" + p + b"\x00\x00",  # reason code and an empty property length
        b"\x40\x07" + p + b"\x10\x03\x1f\x00\x00",  # No matching subscribers, a reason string
        b"\x40"
        + wire.vbi(3 + 2 + len(reason_string))
        + p
        + b"\x00"
        + wire.vbi(len(reason_string))
        + reason_string,  # a 2-byte remaining length
    ]


class StandIn:
    """Accepts one publisher: checks its CONNECT, answers CONNACK with a Receive Maximum, then
    answers each PUBLISH (checked against the one the generator encodes for its identifier; an
    identifier out of the window, or twice in one read, is a problem) with a PUBACK, cycling through the forms; the 10th ack fails (0x97),
    a PINGRESP comes after the 20th, and every 7th ack reaches the publisher in two writes."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.forms: Counter[int] = Counter()
        self.acks = self.failed = self.publishes = 0
        self.pids: set[int] = set()
        self.problems: list[str] = []
        self.disconnected = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            try:
                self.run(conn, data)
            except (OSError, AssertionError) as exc:
                self.problems.append(repr(exc))

    def run(self, conn: socket.socket, data: bytes) -> None:
        expected_connect = wire.connect(self.client_id, wire.MQTT_5)
        while len(data) < len(expected_connect):
            data += conn.recv(65536)
        assert data[: len(expected_connect)] == expected_connect, data.hex()
        data = data[len(expected_connect) :]
        props = bytes([wire.PROP_RECEIVE_MAXIMUM]) + RECEIVE_MAXIMUM.to_bytes(2, "big")
        conn.sendall(
            b"\x20" + wire.vbi(3 + len(props)) + b"\x00\x00" + wire.vbi(len(props)) + props
        )
        while True:
            pos = 0
            out: list[bytes] = []
            in_flight: set[int] = set()  # PUBLISHes of this read, acknowledged after it
            while (frame := wire.next_frame(data, pos)) is not None:
                first, body, stop = frame
                packet = data[pos:stop]
                pos = stop
                if first == 0xE0:
                    self.disconnected = True
                    return  # close: the publisher waits for that
                pid = int.from_bytes(data[body + 2 + len(TOPIC) : body + 4 + len(TOPIC)], "big")
                assert packet == wire.publish(TOPIC, wire.payload(), 1, pid, wire.MQTT_5), packet
                assert 1 <= pid <= RECEIVE_MAXIMUM and pid not in in_flight, (pid, in_flight)
                in_flight.add(pid)
                self.pids.add(pid)
                self.publishes += 1
                out.append(self.ack(pid))
            data = data[pos:]
            self.write(conn, out)
            chunk = conn.recv(65536)
            if not chunk:
                self.problems.append("the publisher closed without DISCONNECT")
                return
            data += chunk

    def ack(self, pid: int) -> bytes:
        self.acks += 1
        if self.acks == 10:
            self.failed += 1
            return b"\x40\x03" + pid.to_bytes(2, "big") + b"\x97"  # Quota exceeded
        forms = _puback_forms(pid)
        form = self.acks % len(forms)
        self.forms[form] += 1
        ack = forms[form]
        return ack + b"\xd0\x00" if self.acks == 20 else ack

    def write(self, conn: socket.socket, out: list[bytes]) -> None:
        for i, ack in enumerate(out):
            if (self.acks - len(out) + i + 1) % 7 == 0:  # this one in two writes
                conn.sendall(ack[:3])
                time.sleep(0.002)  # lets the publisher read the first part alone
                conn.sendall(ack[3:])
            else:
                conn.sendall(ack)


def _run(binary: str, host: str, port: int, client_id: str, version: int = wire.MQTT_5) -> Any:
    spec = {
        "host": host,
        "port": port,
        "version": version,
        "client_id": client_id,
        "topic": TOPIC,
        "window": 32,
    }
    results, s0, s1 = asyncio.run(
        windowed.run_publishers([spec], 0.2, 0.5, 5.0, time.monotonic, binary)
    )
    assert s0 < s1
    return results[0]


def test_the_c_publisher_reads_every_puback_form(binary: str) -> None:
    broker = StandIn("cpub-forms")
    result = _run(binary, "127.0.0.1", broker.port, "cpub-forms")
    broker.thread.join(10)
    assert not broker.problems, broker.problems
    assert broker.disconnected
    # the window is the CONNACK's Receive Maximum, every identifier of it used, none twice at once
    assert result["window"] == RECEIVE_MAXIMUM
    assert broker.pids == set(range(1, RECEIVE_MAXIMUM + 1))
    assert all(broker.forms[form] >= 5 for form in range(5)), broker.forms
    # every PUBACK was counted (one failed), each released its PUBLISH, and the last ones came
    assert result["acked"] == broker.acks == broker.publishes == result["sent"]
    assert result["failed"] == broker.failed == 1
    assert result["settled"] is True and result["lost"] is False
    assert result["others"] == {"0xD0": 1}
    # the measuring window: its counters, CPU time (getrusage) and the PUBACK latencies
    (t0, cpu0, c0), (t1, cpu1, c1) = result["marks"]
    assert t1 > t0 and cpu1 >= cpu0 >= 0 and result["cpu_s"] >= cpu1
    assert 0 < c1["acked"] - c0["acked"] == result["window_acked"] <= result["acked"]
    assert 0 < c1["reads"] - c0["reads"] <= 2 * (c1["acked"] - c0["acked"])  # reads, counted
    hist = {int(k): n for k, n in result["latency_hist_us"].items()}
    assert sum(hist.values()) == c1["acked"] - c0["acked"]
    p99 = windowed.hist_percentile(hist, 0.99)
    assert p99 is not None and result["latency_p99_ms"] == pytest.approx(p99 / 1000)
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_max_ms"]


def test_a_refused_connack_is_reported(binary: str) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"\x20\x03\x00\x87\x00")  # Not authorized
            conn.recv(65536)

    threading.Thread(target=refuse, daemon=True).start()
    with pytest.raises(ConnectionError, match="CONNACK refused: reason 0x87"):
        _run(binary, "127.0.0.1", listener.getsockname()[1], "cpub-refused")
    listener.close()


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311])
def test_the_c_publisher_against_the_broker(binary: str, broker: Any, version: int) -> None:
    result = _run(binary, broker.host, broker.port, f"cpub-real-{version}", version)
    assert result["window"] == 32 and result["settled"] and not result["lost"]
    assert result["failed"] == 0 and result["others"] == {}
    assert result["acked"] == result["sent"] > 0
    (_, cpu0, c0), (_, cpu1, c1) = result["marks"]
    assert c1["acked"] > c0["acked"] and cpu1 >= cpu0
    assert 0 < result["latency_p99_ms"] <= result["latency_max_ms"]
