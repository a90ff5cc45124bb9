"""Reconnection after a restart: ``python -m benchmarks.reconnect_storm`` (``--clients``,
``--queued``, ``--concurrency``, ``--runs``, ``--no-mosquitto``, ``--tls``, ``--tls-version``,
``--out``).

Per run and broker, on a fresh data directory: N clients (default 5,000) with persistent
sessions (MQTT 5, Clean Start 0, Session Expiry Interval 3600) each subscribe at QoS 1 to their
own topic and leave with DISCONNECT; a publisher queues Q QoS 1 messages (default 3) on every
topic, 500 unacknowledged at most; the broker is stopped (ours SIGINT, Mosquitto SIGTERM, which
saves its database) and started again on its store (ours: the default SQLite store, with
``max_queued_messages`` 100; Mosquitto: ``persistence true``); 1 s after its port opens all N
reconnect with Clean Start 0, ``--concurrency`` (default 1,000) being set up at once, by the C
opener (benchmarks/c/open_many.c; the Python loop without a compiler). Figures: seconds until
every CONNACK (the opener's clock) and the opener's CPU meanwhile, the broker's CPU per
reconnection meanwhile (the schedstat of its threads) and the times its threads slept and were
woken (each tens of µs of CPU on a virtual machine) with the host's steal beside, the queued
messages the clients have received 3 s later (each must get its Q), its RSS growth per client,
and the seconds from its start to its port opening. Brokers pinned to core 0, this process and
the opener to core 1. One JSON line per run in ``benchmarks/results/reconnect-<time>.jsonl``,
then medians.

With ``--tls ec|rsa`` both brokers serve their one listener over TLS instead, with a certificate
made for the run (benchmarks/tlscerts.py; Mosquitto's listener configured as the suite's,
brokers.mosquitto_tls), and every client, the publisher included, speaks TLS ``--tls-version``
(1.3 by default) and verifies it: the clients by the C TLS opener (benchmarks/c/open_many_tls.c,
through tls_fleet.CFleet, which needs a C compiler and OpenSSL's headers), the publisher by
Python's ``ssl``. No session is resumed: after a restart neither broker has the keys of the
tickets it gave, so every reconnection is a full handshake."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from . import brokers as br
from . import client, cprograms, procfs, tls_fleet, tlscerts, wire

RESULTS = Path(__file__).resolve().parent / "results"
OURS_TOML = "[broker]\nmax_queued_messages = 100\n"
MOSQUITTO_CONF = (
    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
    "persistence_location {dir}/\nmax_queued_messages 1000\nmax_inflight_messages 0\n"
    "max_connections -1\nlog_dest stderr\nlog_type error\nlog_type warning\n"
    "connection_messages false\n"
)


class Tls(NamedTuple):
    """``--tls``: the server's certificate (the clients' CA too) and key, and the version the
    clients speak."""

    cert: str
    key: str
    version: str


def start(
    name: str, workdir: str, port: int, pin: bool, tls: Tls | None
) -> tuple[subprocess.Popen[bytes], float]:
    """The broker on ``workdir``'s store, and the seconds until its port opened."""
    if name == "ours":
        listener = "" if tls is None else tlscerts.listener_toml(tls.cert, tls.key)
        Path(workdir, "c.toml").write_text(OURS_TOML + listener)
        cmd = [sys.executable, "-m", "mqttbroker", "--port", str(port), "--log-level", "warning"]
        cmd += ["--data-dir", workdir, "--admin-port", "0", "--config", f"{workdir}/c.toml"]
    else:
        binary = br.mosquitto_path()
        if binary is None:
            raise RuntimeError("mosquitto is not installed")
        conf = Path(workdir, "m.conf")
        text = MOSQUITTO_CONF.format(port=port, dir=workdir)
        conf.write_text(text if tls is None else br.mosquitto_tls(text, tls.cert, tls.key))
        conf.chmod(0o644)
        cmd = [binary, "-c", str(conf)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(br.REPO), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    with open(os.path.join(workdir, "log"), "ab") as log:
        proc = subprocess.Popen(br.pinned(br.BROKER_CORE, cmd, pin), stderr=log, env=env)
    deadline = t0 + br.START_TIMEOUT
    while not br.port_open("127.0.0.1", port, 0.2):
        if proc.poll() is not None or time.perf_counter() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not start: see {workdir}/log")
        time.sleep(0.01)
    return proc, time.perf_counter() - t0


def stop(name: str, proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT if name == "ours" else signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def queue(port: int, clients: int, per_topic: int, tls: Tls | None) -> None:
    """Publish ``per_topic`` QoS 1 messages on each client's topic, 500 unacknowledged at most."""
    sock = socket.create_connection(("127.0.0.1", port), 10)
    if tls is not None:
        context = tlscerts.client_context(tls.cert, tls.version)
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    with sock as pub:
        pub.sendall(wire.connect("reconnect-pub"))
        pub.recv(1024)  # the CONNACK
        total, sent, acked, packet_id, buf = clients * per_topic, 0, 0, 0, b""
        while acked < total:
            batch = []
            while sent < total and sent - acked < 500:
                packet_id = packet_id % 65535 + 1
                batch.append(wire.publish(f"rs/{sent % clients}", wire.payload(), 1, packet_id))
                sent += 1
            if batch:
                pub.sendall(b"".join(batch))
            chunk = pub.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the publisher")
            buf += chunk
            while (frame := wire.next_frame(buf)) is not None:
                acked += frame[0] >> 4 == 4  # PUBACK
                buf = buf[frame[2] :]
        pub.sendall(wire.disconnect())


def publishes(data: bytes) -> int:
    count = 0
    while (frame := wire.next_frame(data)) is not None:
        count += frame[0] >> 4 == 3
        data = data[frame[2] :]
    return count


def connect_all(
    port: int,
    requests: Sequence[tuple[bytes, bool]],
    concurrency: int,
    opener: str | None,
    tls: Tls | None,
) -> tuple[client.Opened | tls_fleet.Stormed, Callable[[], int]]:
    """Set up a connection per request, ``concurrency`` at once (the opener times it), and
    leave them open: what it took, and a function that reads what they have been sent since
    their CONNACKs, DISCONNECTs and closes them, and says how many PUBLISH packets that was.
    Over TLS by the C TLS opener (``opener``), else by the C opener or the Python loop."""
    if tls is not None:
        assert opener is not None
        fleet = tls_fleet.CFleet(
            opener, "127.0.0.1", port, requests, tls.cert, tls.version, "off", concurrency
        )

        def close_fleet() -> int:
            fleet.close()
            return fleet.publishes

        return fleet.storm(), close_fleet
    opened = client.open_many_requests("127.0.0.1", port, requests, concurrency, opener)

    def close_clients() -> int:
        received = 0
        for c in opened.clients:
            c.sock.setblocking(False)
            data = c.rest
            try:
                while chunk := c.sock.recv(65536):
                    data += chunk
            except BlockingIOError:
                pass
            received += publishes(data)
            c.sock.send(wire.disconnect())
        time.sleep(0.5)
        for c in opened.clients:
            c.sock.close()
        return received

    return opened, close_clients


def one_run(
    name: str, args: argparse.Namespace, opener: str | None, pin: bool, tls: Tls | None
) -> dict[str, Any]:
    n = args.clients
    workdir = tempfile.mkdtemp(prefix=f"bench-reconnect-{name}-")
    os.chmod(workdir, 0o777)  # Mosquitto drops root for its own user and writes its database here
    port = br.free_port()
    proc, _ = start(name, workdir, port, pin, tls)
    try:
        ids = [f"rs{i}" for i in range(n)]

        def persistent(i: int, subscribe: bool) -> tuple[bytes, bool]:
            request = wire.connect(ids[i], clean_start=False, session_expiry=3600)
            if subscribe:
                request += wire.subscribe(1, [(f"rs/{i}", 1)])
            return request, subscribe

        _, leave = connect_all(port, [persistent(i, True) for i in range(n)], 100, opener, tls)
        leave()  # (a DISCONNECT keeps the session: Session Expiry Interval 3600)
        time.sleep(1.0)
        queue(port, n, args.queued, tls)
        time.sleep(0.5)
        stop(name, proc)
        proc, start_s = start(name, workdir, port, pin, tls)
        time.sleep(1.0)
        rss0, ns0 = procfs.rss_kb(proc.pid), procfs.threads_cpu_ns(proc.pid)
        woken0, steal0, t0 = procfs.wakeups(proc.pid), procfs.steal_seconds(), time.monotonic()
        requests = [persistent(i, False) for i in range(n)]
        again, leave = connect_all(port, requests, args.concurrency, opener, tls)
        ns1 = procfs.threads_cpu_ns(proc.pid)
        woken1, steal1, t1 = procfs.wakeups(proc.pid), procfs.steal_seconds(), time.monotonic()
        time.sleep(3.0)
        rss1 = procfs.rss_kb(proc.pid)
        received = leave()
        return {
            "broker": name,
            "reconnect_s": round(again.elapsed_s, 4),
            "opener_cpu_s": round(again.cpu_s, 4),
            "cpu_us_per_conn": procfs.per_item_us(ns0, ns1, n),
            # times the broker slept and was woken, per reconnection: tens of µs of CPU each
            # on a virtual machine, paid more often by a broker that waits for its clients
            "wakeups_per_conn": None
            if woken0 is None or woken1 is None
            else round((woken1 - woken0) / n, 3),
            "steal_pct": procfs.steal_pct(steal0, steal1, t1 - t0),
            "queued": n * args.queued,
            "received_3s": received,
            "rss_kb_per_conn": None
            if rss0 is None or rss1 is None
            else round((rss1 - rss0) / n, 2),
            "start_s": round(start_s, 3),
        }
    finally:
        stop(name, proc)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reconnect_storm")
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--queued", type=int, default=3, help="QoS 1 messages queued per client")
    p.add_argument("--concurrency", type=int, default=1000, help="reconnections at once")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-mosquitto", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    tlscerts.add_options(p, "the brokers serve TLS (needs the C TLS opener)", "the clients speak")
    p.add_argument("--out")
    args = p.parse_args(argv)
    pin = br.pinning_available() and not args.no_pin
    if pin:
        os.sched_setaffinity(0, {br.GENERATOR_CORE})
    procfs.raise_fd_limit()
    suite = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / f"reconnect-{suite}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    names = ["ours"] + ([] if args.no_mosquitto else ["mosquitto"])
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-reconnect-c-") as build_dir:
        tls = None
        if args.tls:
            opener, how = cprograms.build("open_many_tls", build_dir)
            if opener is None:
                print(f"reconnect storm: --tls needs the C TLS opener: {how}", file=sys.stderr)
                return 2
            # (the directory is readable by all: Mosquitto drops root for its own user)
            tls = Tls(*tlscerts.make(build_dir, args.tls), args.tls_version)
            key = "ECDSA P-256" if args.tls == "ec" else "RSA 2048"
            how += f"; TLS {args.tls_version}, {key} server key, full handshakes"
        else:
            opener, how = cprograms.build("open_many", build_dir)
            how = how if opener else "Python loop: " + how
        print(
            f"reconnect storm {suite}: {args.clients} clients, {args.queued} queued each, "
            f"{args.concurrency} at once; opener: {how}"
        )
        records: list[dict[str, Any]] = []
        with out.open("a") as sink:
            for run in range(args.runs):
                for name in names:
                    try:
                        record = one_run(name, args, opener, pin, tls)
                    except (OSError, RuntimeError) as exc:
                        record = {"broker": name, "error": str(exc)}
                    record["run"] = run + 1
                    failed |= "error" in record or record.get("received_3s") != record.get("queued")
                    sink.write(json.dumps(record) + "\n")
                    records.append(record)
                    print(f"  {json.dumps(record)}", flush=True)
    for name in names:
        ok = [r for r in records if r["broker"] == name and "error" not in r]
        if ok:
            medians = {
                k: statistics.median(r[k] for r in ok)
                for k in (
                    "reconnect_s",
                    "opener_cpu_s",
                    "cpu_us_per_conn",
                    "wakeups_per_conn",
                    "start_s",
                )
                if all(r.get(k) is not None for r in ok)
            }
            print(f"  {name} medians: {json.dumps(medians)}")
    print(f"  results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
