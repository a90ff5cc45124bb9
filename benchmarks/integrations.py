"""Integration figures: bridge forwarding throughput (QoS 0 and QoS 1, 64-byte payloads) of our
broker beside Mosquitto's own bridge, and webhook deliveries per second to a local endpoint.

    python -m benchmarks.integrations                 # 3 runs of 5 s each
    python -m benchmarks.integrations --duration 10 --runs 5 --mqtt 3.1.1
    python -m benchmarks.integrations --smoke         # once, briefly: does it still work

The bridging broker (ours, or a Mosquitto with a ``connection`` section) is pinned to core 0;
the remote broker (a plain Mosquitto), the load generator and the webhook endpoint share core 1.
A publisher sends to the bridging broker on ``bench/b``; a subscriber on the remote counts what
arrives on ``site/bench/b`` (QoS 0: a flood; QoS 1: 32 in flight, acknowledged both ways). The
webhook scenario publishes QoS 1 (32 in flight) to our broker, whose ``[[webhook]]`` posts each
message to an aiohttp endpoint in the generator that answers 200; the figure is requests/s.
Every result is a line in ``benchmarks/results/integrations-<timestamp>.jsonl`` and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from . import brokers as br
from . import procfs, wire
from .client import Client, close_clients, open_client

RESULTS = Path(__file__).resolve().parent / "results"
WINDOW = 32

MOSQUITTO_BRIDGE = """\
connection bench
address 127.0.0.1:{port}
remote_clientid bench-mosquitto-bridge
bridge_protocol_version {protocol}
cleansession false
topic bench/# out {qos} "" site/
"""
OURS_BRIDGE = """\
[broker]
max_inflight = 65535

[[bridge]]
name = "bench"
address = "127.0.0.1:{port}"
protocol = "{protocol}"
[[bridge.topic]]
filter = "bench/#"
direction = "out"
qos = {qos}
remote_prefix = "site/"
"""
OURS_WEBHOOK = """\
[[webhook]]
name = "bench"
url = "http://127.0.0.1:{port}/hook"
topics = ["bench/#"]
concurrency = {concurrency}
"""


def start_bridging(
    name: str, remote_port: int, qos: int, version: int, pin: bool
) -> br.BrokerHandle:
    """Our broker or Mosquitto, bridging bench/# out to the remote."""
    if name == "ours":
        protocol = "5" if version == wire.MQTT_5 else "3.1.1"
        config = OURS_BRIDGE.format(port=remote_port, protocol=protocol, qos=qos)
        return br.start_ours(pin, version, "ours", config, "mqttbroker [[bridge]]")
    binary = br.mosquitto_path()
    if binary is None:
        raise RuntimeError("mosquitto is not installed")
    import tempfile

    workdir = tempfile.mkdtemp(prefix="bench-mosquitto-bridge-")
    port = br.free_port()
    conf = os.path.join(workdir, "mosquitto.conf")
    protocol = "mqttv50" if version == wire.MQTT_5 else "mqttv311"
    # Without "max_inflight_messages 0" (no limit): Mosquitto 2.0.11's bridge then announces a
    # Receive Maximum of 0, which the remote refuses, and forwards nothing.
    local = br.MOSQUITTO_CONF.format(port=port, persistence=br.MOSQUITTO_VOLATILE)
    local = local.replace("max_inflight_messages 0\n", "")
    Path(conf).write_text(
        local + MOSQUITTO_BRIDGE.format(port=remote_port, protocol=protocol, qos=qos)
    )
    os.chmod(workdir, 0o755)
    os.chmod(conf, 0o644)
    proc, log_path = br._spawn(
        "mosquitto", br.pinned(br.BROKER_CORE, [binary, "-c", conf], pin), workdir
    )
    handle = br.BrokerHandle(
        "mosquitto", "127.0.0.1", port, proc.pid, version, proc, workdir, log_path,
        description="mosquitto bridge",
    )  # fmt: skip
    br._wait_port(handle, find_port=False)
    return handle


async def measure(
    warmup: float, duration: float, pid: int | None, count: Callable[[], int]
) -> dict[str, Any]:
    await asyncio.sleep(warmup)
    t0, n0, c0 = time.perf_counter(), count(), procfs.cpu_seconds(pid)
    await asyncio.sleep(duration)
    t1, n1, c1 = time.perf_counter(), count(), procfs.cpu_seconds(pid)
    elapsed = t1 - t0
    cpu = None if c0 is None or c1 is None else round(100 * (c1 - c0) / elapsed, 1)
    return {"msgs_per_s": round((n1 - n0) / elapsed, 1), "broker_cpu_pct": cpu, "count": n1}


async def bridge_run(
    bridging: br.BrokerHandle, remote: br.BrokerHandle, qos: int, args: argparse.Namespace
) -> dict[str, Any]:
    version = bridging.version
    sub = await open_client(remote.host, remote.port, "bench-remote-sub", version)
    await sub.subscribe([("site/bench/#", qos)])
    clients: list[Client] = [sub]
    try:
        pub = await open_client(bridging.host, bridging.port, "bench-pub", version)
        clients.append(pub)
        await wait_bridged(pub, sub)
        sub.count = 0
        if qos:
            sub.start_acking()
            pub.start_windowed("bench/b", qos, WINDOW, wire.payload())
        else:
            sub.start_counting(0)
            packet = wire.publish("bench/b", wire.payload(), 0, 0, version)
            per = max(1, 65536 // len(packet))
            pub.start_flood([packet * per], [per])
        return await measure(args.warmup, args.duration, bridging.pid, lambda: sub.count)
    finally:
        await close_clients(clients)


async def wait_bridged(pub: Client, sub: Client) -> None:
    """A probe published on the bridging broker every 0.1 s until it reaches the remote."""
    assert pub.transport is not None
    for _ in range(100):
        pub.transport.write(wire.publish("bench/probe", b"p", 0, 0, pub.version))
        try:
            await sub.expect(wire.PUBLISH, 0.1)
            return
        except TimeoutError:
            pass
    raise RuntimeError("the bridge forwarded nothing within 10 s")


async def webhook_run(args: argparse.Namespace, pin: bool, version: int) -> dict[str, Any]:
    hits = 0

    async def hook(request: web.Request) -> web.Response:
        nonlocal hits
        await request.read()
        hits += 1
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = br.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    config = OURS_WEBHOOK.format(port=port, concurrency=args.concurrency)
    ours = br.start_ours(pin, version, "ours", config, "mqttbroker [[webhook]]")
    try:
        pub = await open_client(ours.host, ours.port, "bench-pub", version)
        pub.start_windowed("bench/w", 1, WINDOW, wire.payload())
        try:
            return await measure(args.warmup, args.duration, ours.pid, lambda: hits)
        finally:
            await close_clients([pub])
    finally:
        ours.stop()
        await runner.cleanup()


async def main_async(args: argparse.Namespace) -> int:
    version = wire.MQTT_311 if args.mqtt == "3.1.1" else wire.MQTT_5
    pin = br.pinning_available() and not args.no_pin
    if args.out:
        out = Path(args.out)
    else:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"integrations-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    records: list[dict[str, Any]] = []
    scenarios: list[tuple[str, str, Callable[[], Awaitable[dict[str, Any]]]]] = []
    for qos in (0, 1):
        for name in ("ours", "mosquitto"):

            async def one(name: str = name, qos: int = qos) -> dict[str, Any]:
                remote = br.start_mosquitto(False, version)
                bridging = start_bridging(name, remote.port, qos, version, pin)
                try:
                    return await bridge_run(bridging, remote, qos, args)
                finally:
                    bridging.stop()
                    remote.stop()

            scenarios.append((f"bridge QoS {qos}", name, one))
    scenarios.append(("webhook QoS 1", "ours", lambda: webhook_run(args, pin, version)))
    failed = 0
    for title, name, run in scenarios:
        for index in range(args.runs):
            try:
                result = await run()
            except Exception as exc:  # noqa: BLE001 - reported, the others still run
                result = {"error": f"{type(exc).__name__}: {exc}"}
            if result.get("error") or not result.get("count"):
                failed += 1
            record = {"scenario": title, "broker": name, "run": index, **result}
            records.append(record)
            print(json.dumps(record), flush=True)
            with open(out, "a") as fh:
                fh.write(json.dumps(record) + "\n")
    print(f"\n{'scenario':<16} {'broker':<10} {'msg/s (median)':>15} {'broker CPU %':>13}")
    for title, name, _ in scenarios:
        mine = [r for r in records if r["scenario"] == title and r["broker"] == name]
        rates = [r["msgs_per_s"] for r in mine if "msgs_per_s" in r]
        cpus = [r["broker_cpu_pct"] for r in mine if r.get("broker_cpu_pct") is not None]
        rate = f"{statistics.median(rates):,.0f}" if rates else "-"
        cpu = f"{statistics.median(cpus):.0f}" if cpus else "-"
        print(f"{title:<16} {name:<10} {rate:>15} {cpu:>13}")
    print(f"\nresults: {out}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.integrations", description=__doc__)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mqtt", choices=("5", "3.1.1"), default="5")
    p.add_argument("--concurrency", type=int, default=16, help="webhook requests in flight")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out", help="the JSON lines file (default: benchmarks/results/...)")
    p.add_argument("--smoke", action="store_true", help="once, 0.3 s each")
    args = p.parse_args(argv)
    if args.smoke:
        args.runs, args.duration, args.warmup = 1, 0.3, 0.2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
