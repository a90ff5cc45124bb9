"""Shapes of the benchmark added for fleets: scenarios 1-4 over TLS (``--tls``: a smoke run
on our broker with each server key, the clients verifying its certificate), and connections that
write their SUBSCRIBE only once the CONNACK has come (``--subscribe-after-connack``: against a
stand-in broker that answers the CONNECT before it reads on, by the C opener and by the Python
loop, and a smoke run of scenario 7), scenario 6 over TLS (by the C TLS opener, sessions
resumed or not), the TLS handshake run (tls_handshakes.py) and the
reconnection after a restart (reconnect_storm.py, over TCP and over TLS) on our
broker. No speed is asserted here."""

from __future__ import annotations

import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest
from support import c_programs
from support.launcher import read_jsonl, run_module

from benchmarks import brokers as br
from benchmarks import wire
from benchmarks.client import open_many

REPO = Path(__file__).resolve().parents[2]

TIMEOUT = 180
CONNACK = b"\x20\x03\x00\x00\x00"
SUBACK = b"\x90\x04\x00\x01\x00\x00"

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_split_writes_the_subscribe_after_the_connack(which: str | None) -> None:
    names = [f"split-{i}" for i in range(3)]
    connects = [wire.connect(name) for name in names]
    subscribes = [wire.subscribe(1, [(f"s/{i}", 0)]) for i in range(3)]
    listener = socket.create_server(("127.0.0.1", 0))
    problems: list[str] = []
    conns: list[socket.socket] = []

    def serve() -> None:
        for i in range(3):
            conn, _ = listener.accept()
            conns.append(conn)
            conn.settimeout(10)
            if _read_exactly(conn, len(connects[i])) != connects[i]:
                problems.append(f"{i}: not the CONNECT")
            conn.settimeout(0.1)  # nothing more may come before the CONNACK
            try:
                early = conn.recv(1)
            except TimeoutError:
                early = b""
            if early:
                problems.append(f"{i}: bytes before the CONNACK")
            conn.settimeout(10)
            conn.sendall(CONNACK)
            if early + _read_exactly(conn, len(subscribes[i]) - len(early)) != subscribes[i]:
                problems.append(f"{i}: not the SUBSCRIBE")
            conn.sendall(SUBACK)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        opened = open_many(
            "127.0.0.1",
            listener.getsockname()[1],
            names,
            wire.MQTT_5,
            lambda i: [(f"s/{i}", 0)],
            concurrency=1,
            timeout=10,
            opener=which,
            split=True,
        )
        thread.join(10)
        assert not problems, problems
        assert len(opened.clients) == 3 and all(c.rest == b"" for c in opened.clients)
        for client in opened.clients:
            client.sock.close()
    finally:
        listener.close()
        for conn in conns:
            conn.close()


def _smoke(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    out = tmp_path / "smoke.jsonl"
    proc = run_module(
        "benchmarks", "--smoke", "--no-mosquitto", "--out", str(out), *args, timeout=TIMEOUT
    )
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    records = read_jsonl(out)
    for record in records:
        assert not record.get("error"), f"{record['scenario']}: {record.get('error')}\n{report}"
        assert int(str(record.get("delivered", 0))) > 0, f"{record['scenario']}\n{report}"
    return records


@linux_only
@pytest.mark.parametrize(("key", "version"), [("ec", "1.3"), ("rsa", "1.2")])
def test_tls_smoke(tmp_path: Path, key: str, version: str) -> None:
    records = _smoke(tmp_path, "--scenarios", "1,3", "--tls", key, "--tls-version", version)
    assert {str(r["scenario"]) for r in records} == {"1", "3"}


@linux_only
def test_tls_refuses_raw_scenarios(tmp_path: Path) -> None:
    proc = run_module("benchmarks", "--smoke", "--scenarios", "7", "--tls", "ec", timeout=60)
    assert proc.returncode != 0 and "--tls" in proc.stderr


@linux_only
@pytest.mark.needs_openssl
@pytest.mark.parametrize("resumption", ["off", "slot"])
def test_idle_connections_over_tls_smoke(tmp_path: Path, resumption: str) -> None:
    """Scenario 6 over TLS, its connections set up by the C TLS opener (or, without a
    compiler and with resumption off, the asyncio clients)."""
    args = ["--scenarios", "6", "--tls", "ec", "--tls-version", "1.2"]
    [record] = _smoke(tmp_path, *args, "--tls-resumption", resumption)
    metrics = record["metrics"]
    assert isinstance(metrics, dict) and metrics["dropped"] == 0
    if resumption == "slot":  # every connection offered its slot's session; the broker took it
        assert metrics["tls_resumed"] == metrics["storm_tls_resumed"] == 50


@linux_only
def test_subscribe_after_connack_smoke(tmp_path: Path) -> None:
    records = _smoke(
        tmp_path, "--scenarios", "7", "--subscribe-after-connack", "--connect-concurrency", "100"
    )
    assert [str(r["scenario"]) for r in records] == ["7"]


@linux_only
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_handshakes_smoke(tmp_path: Path) -> None:
    out = tmp_path / "hs.jsonl"
    args = ["--runs", "1", "--seconds", "1", "--keys", "ec", "--versions", "1.3"]
    args += ["--no-mosquitto", "--out", str(out)]
    proc = run_module("benchmarks.tls_handshakes", *args, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_jsonl(out)
    assert [(r["resumption"], r["broker"]) for r in records] == [(False, "ours"), (True, "ours")]
    assert all(r["handshakes"] > 0 and r["cpu_us_per_handshake"] for r in records)
    assert records[0]["resumed"] is None and 0 <= records[1]["resumed"] <= 1


@linux_only
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
@pytest.mark.skipif(br.mosquitto_path() is None, reason="needs mosquitto")
def test_tls_handshakes_measures_ours_and_mosquitto_in_turn(tmp_path: Path) -> None:
    """Run by run, ours then Mosquitto, both started once: a drift of the machine's speed over
    the suite falls on both alike."""
    out = tmp_path / "hs.jsonl"
    args = ["--runs", "2", "--seconds", "1", "--keys", "ec", "--versions", "1.2", "--out", str(out)]
    proc = run_module("benchmarks.tls_handshakes", *args, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_jsonl(out)
    order = [(r["resumption"], r["run"], r["broker"]) for r in records]
    assert order == [
        (resumption, run, broker)
        for resumption in (False, True)
        for run in (1, 2)
        for broker in ("ours", "mosquitto")
    ]
    assert all(r["handshakes"] > 0 and r["cpu_us_per_handshake"] for r in records)


@linux_only
def test_reconnect_storm_smoke(tmp_path: Path) -> None:
    out = tmp_path / "reconnect.jsonl"
    args = ["--clients", "100", "--runs", "1", "--concurrency", "50", "--no-mosquitto"]
    proc = run_module("benchmarks.reconnect_storm", *args, "--out", str(out), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [record] = read_jsonl(out)
    assert record["broker"] == "ours" and record["reconnect_s"] > 0
    assert record["received_3s"] == record["queued"] == 300  # every queued message after it
    assert record["wakeups_per_conn"] > 0  # the broker slept and was woken meanwhile (/proc)
    assert record["steal_pct"] >= 0


@linux_only
@pytest.mark.needs_openssl
def test_reconnect_storm_over_tls_smoke(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The persistent sessions reconnect over TLS 1.3 by the C TLS opener, which counts the
    queued messages each then gets (read through its TLS connection, the session tickets that
    come after the handshake among them)."""
    c_programs.build("open_many_tls", tmp_path_factory)  # (skipped without a compiler)
    out = tmp_path / "reconnect.jsonl"
    args = ["--clients", "60", "--runs", "1", "--concurrency", "30", "--no-mosquitto"]
    args += ["--tls", "ec", "--tls-version", "1.3", "--out", str(out)]
    proc = run_module("benchmarks.reconnect_storm", *args, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TLS 1.3, ECDSA P-256 server key" in proc.stdout
    [record] = read_jsonl(out)
    assert record["broker"] == "ours" and record["reconnect_s"] > 0
    assert record["received_3s"] == record["queued"] == 180  # 3 queued per session, all came
