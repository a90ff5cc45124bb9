"""The benchmark scenarios, one coroutine each, run inside the generator process.

Each takes a :class:`Ctx` (where the broker is, the MQTT version, warm-up and measuring time,
the sizes) and returns ``{"metrics": {...}, "delivered": N, ...}``. Throughput is counted at the
receiving side over the measuring window, after a warm-up; the generator's own CPU use over the
same window is reported beside it, and the broker's when its pid is known.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import devices, procfs, tls_fleet, windowed, wire
from .client import (
    Client,
    LatencyProbe,
    Opened,
    RawClient,
    close_clients,
    close_raw,
    open_client,
    open_many,
)

BLOCK_BYTES = 65536  # a flood publisher's write: as many PUBLISH packets as fit
STALL_SAMPLE = 0.05  # seconds between samples of the delivery counter


@dataclass
class Sizes:
    fanin_publishers: int = 8
    fanout_subscribers: int = 100
    qos_pairs: int = 4
    window: int = 32
    latency_rate: float = 1000.0
    idle_connections: int = 5000
    spray_topics: int = 10000
    spray_wildcards: int = 10
    connect_concurrency: int = 64
    storm_concurrency: int = 1000  # scenario 6's second wave: connections set up at once
    # scenario 7: each subscriber writes its SUBSCRIBE only once its CONNACK has come
    subscribe_after_connack: bool = False
    persist_publishers: int = 4
    session_expiry: int = 3600
    devices: int = 1000
    device_rate_q1: float = 50.0  # messages/s per device, QoS 1
    device_rate_q0: float = 100.0  # messages/s per device, QoS 0

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            fanout_subscribers=10,
            idle_connections=50,
            spray_topics=200,
            spray_wildcards=3,
            devices=20,
        )


@dataclass
class Ctx:
    host: str
    port: int
    version: int = wire.MQTT_5
    warmup: float = 1.0
    duration: float = 5.0
    broker_pid: int | None = None
    run_id: str = "0"
    sizes: Sizes = field(default_factory=Sizes)
    # A cluster (benchmarks/cluster.py): the subscribers of scenarios 1 to 4 connect to this
    # node's port instead, so every message crosses nodes. None: all on ``port``.
    sub_port: int | None = None
    # Scenario 8: the C publisher built by the runner (benchmarks/c/windowed_pub.c); None: the
    # Python publishers (benchmarks/windowed.py).
    c_publisher: str | None = None
    # Scenarios 6 and 7 (and every set-up of raw connections): the C opener built by the
    # runner (benchmarks/c/open_many.c); None: an epoll loop in Python (benchmarks/client.py).
    c_opener: str | None = None
    # Scenario 1w: its publishers in C (benchmarks/c/one_per_write.c), built by the runner;
    # None: in Python (benchmarks/devices.py, OnePerWrite).
    c_one_per_write: str | None = None
    # --tls: {"ca", "version", "resumption"}; scenario 6 then connects over TLS, by the C TLS
    # opener built by the runner (benchmarks/c/open_many_tls.c), else the asyncio clients.
    tls: dict[str, str] | None = None
    c_tls_opener: str | None = None
    clients: list[Client] = field(default_factory=list)
    raw: list[RawClient] = field(default_factory=list)
    retired: list[Client] = field(default_factory=list)  # closed by the scenario itself
    lost_before_retiring: int = 0
    unexpected: dict[str, int] = field(default_factory=dict)  # seen by other processes

    def cid(self, name: str) -> str:
        return f"bm{self.run_id}-{name}"

    async def client(
        self,
        name: str,
        clean_start: bool = True,
        session_expiry: int = 0,
        port: int | None = None,
    ) -> Client:
        client = await open_client(
            self.host,
            port or self.port,
            self.cid(name),
            self.version,
            clean_start=clean_start,
            session_expiry=session_expiry,
        )
        self.clients.append(client)
        return client

    async def retire(self, clients: Sequence[Client]) -> None:
        """Close ``clients`` now (DISCONNECT, the broker closes); what they saw still counts."""
        self.lost_before_retiring += sum(1 for c in clients if c.lost.done())
        await close_clients(clients)
        self.clients = [c for c in self.clients if c not in clients]
        self.retired.extend(clients)

    def publish_len(self, topic: str, qos: int = 0) -> int:
        return len(wire.publish(topic, wire.payload(), qos, 1 if qos else 0, self.version))

    def flood_blocks(self, topics: Sequence[str]) -> tuple[list[bytes], list[int]]:
        """Pre-encoded QoS 0 PUBLISHes to ``topics`` (round robin), cut into ~64 KiB blocks."""
        packets = [
            wire.publish(t, wire.payload(i), 0, 0, self.version) for i, t in enumerate(topics)
        ]
        per = max(1, BLOCK_BYTES // len(packets[0]))
        if len(packets) < per:  # one topic (or a few): repeat them to fill a block
            packets = packets * math.ceil(per / len(packets))
        blocks, counts = [], []
        for start in range(0, len(packets), per):
            chunk = packets[start : start + per]
            blocks.append(b"".join(chunk))
            counts.append(len(chunk))
        return blocks, counts

    def snapshot(self) -> tuple[float, float, float | None]:
        """Now, the generator's CPU seconds and the broker's. The broker's come from the
        scheduler (procfs.broker_cpu_seconds), exact where /proc/PID/stat samples clock ticks:
        a broker busy for a moment every few milliseconds, in step with the tick or not, is
        charged far more or far less than it ran by the ticks."""
        return (
            time.perf_counter(),
            procfs.own_cpu_seconds(),
            procfs.broker_cpu_seconds(self.broker_pid),
        )

    async def measure(
        self,
        read: Callable[[], dict[str, float]],
        before_read: Callable[[], Any] | None = None,
        progress: Callable[[], float] | None = None,
    ) -> dict[str, Any]:
        """Warm up, then read the counters at the start and end of the measuring window.

        With ``progress`` (a delivery counter), the window is also sampled every 50 ms and the
        longest stretch without any delivery is reported as ``stall_max_s``: a broker that
        delivers in bursts shows here even when its average looks fine."""
        await asyncio.sleep(self.warmup)
        if before_read:
            before_read()
        c0, s0 = read(), self.snapshot()
        stall = 0.0
        if progress is None:
            await asyncio.sleep(self.duration)
        else:
            loop = asyncio.get_running_loop()
            end = loop.time() + self.duration
            last, since = progress(), loop.time()
            while (now := loop.time()) < end:
                await asyncio.sleep(min(STALL_SAMPLE, end - now))
                count, now = progress(), loop.time()
                if count != last:
                    last, since = count, now
                stall = max(stall, now - since)
        if before_read:
            before_read()
        c1, s1 = read(), self.snapshot()
        result = window(c0, c1, s0, s1)
        if progress is not None:
            result["stall_max_s"] = round(stall, 3)
        return result

    def open_many(
        self,
        names: Sequence[str],
        filters: Callable[[int], Sequence[tuple[str, int]]] | None = None,
        frame_len: int = 0,
        concurrency: int | None = None,
    ) -> Opened:
        """Open (and subscribe) one raw connection per name, ``concurrency`` (default
        ``connect_concurrency``) at a time, by the C opener when the runner built it."""
        opened = open_many(
            self.host,
            self.port,
            [self.cid(name) for name in names],
            self.version,
            filters,
            frame_len,
            concurrency or self.sizes.connect_concurrency,
            timeout=60 + len(names) / 100,
            opener=self.c_opener,
            split=self.sizes.subscribe_after_connack,
        )
        self.raw.extend(opened.clients)
        return opened

    def tls_fleet(
        self, names: Sequence[str], concurrency: int
    ) -> tls_fleet.CFleet | tls_fleet.AsyncioFleet:
        """One idle connection per name over TLS, set up by the fleet's ``storm()``; with
        resumption, the C opener's priming round runs here."""
        assert self.tls is not None
        resumption = self.tls.get("resumption", "off")
        if self.c_tls_opener is None:
            if resumption != "off":
                raise RuntimeError("session resumption needs the C TLS opener")
            ids = [self.cid(name) for name in names]
            return tls_fleet.AsyncioFleet(self.host, self.port, ids, self.version, concurrency)
        requests = [(wire.connect(self.cid(name), self.version), False) for name in names]
        return tls_fleet.CFleet(
            self.c_tls_opener,
            self.host,
            self.port,
            requests,
            self.tls["ca"],
            self.tls["version"],
            resumption,
            concurrency,
            timeout=60 + len(names) / 100,
            version=self.version,
        )

    async def close(self) -> None:
        clients, self.clients = self.clients, []
        self.retired = []
        raw, self.raw = self.raw, []
        await close_clients(clients)
        await close_raw(raw)


def setup_window(
    opened: Opened,
    count: int,
    s0: tuple[float, float, float | None],
    s1: tuple[float, float, float | None],
) -> dict[str, Any]:
    """:func:`window` over setting up ``count`` connections, timed by the opener's own clock
    and CPU (from the first connect to the last CONNACK or SUBACK, without preparing the
    requests, starting the C opener or reading its result); the broker's CPU from ``s0`` to
    ``s1``, around all of that (the broker has nothing to do before the first connect or
    after the last acknowledgement, so its CPU per connection is the same, and its CPU % may
    read a little high)."""
    return window(
        {"connected": 0},
        {"connected": count},
        (0.0, 0.0, s0[2]),
        (opened.elapsed_s, opened.cpu_s, s1[2]),
    )


def window(
    c0: dict[str, float],
    c1: dict[str, float],
    s0: tuple[float, float, float | None],
    s1: tuple[float, float, float | None],
) -> dict[str, Any]:
    elapsed = s1[0] - s0[0]
    out: dict[str, Any] = {
        "elapsed": elapsed,
        "delta": {k: c1[k] - c0[k] for k in c0},
        "gen_cpu_pct": round(100 * (s1[1] - s0[1]) / elapsed, 1),
        "broker_cpu_pct": None,
    }
    if s0[2] is not None and s1[2] is not None:
        out["broker_cpu_s"] = s1[2] - s0[2]
        out["broker_cpu_pct"] = round(100 * (s1[2] - s0[2]) / elapsed, 1)
    return out


def rate(n: float, elapsed: float) -> float:
    return round(n / elapsed, 1) if elapsed > 0 else 0.0


# -- 1 / 1b / 2: QoS 0 throughput --------------------------------------------------------------


async def _qos0_flow(
    ctx: Ctx, publishers: int, subscribers: int, sub_filter: str, topics: list[str]
) -> dict[str, Any]:
    frame = ctx.publish_len(topics[0])
    subs = []
    for i in range(subscribers):
        sub = await ctx.client(f"sub{i}", port=ctx.sub_port)
        await sub.subscribe([(sub_filter, 0)])
        sub.start_counting(frame)
        subs.append(sub)
    pubs = []
    for i in range(publishers):
        pub = await ctx.client(f"pub{i}")
        pubs.append(pub)
    for i, pub in enumerate(pubs):
        pub.start_flood(*ctx.flood_blocks([topics[i % len(topics)]]))
    w = await ctx.measure(
        lambda: {
            "received": sum(s.count for s in subs),
            "sent": sum(p.sent for p in pubs),
        },
        progress=lambda: sum(s.count for s in subs),
    )
    received = w["delta"]["received"]
    w["metrics"] = {
        "deliveries_per_s": rate(received, w["elapsed"]),
        "msgs_per_s": rate(received / subscribers, w["elapsed"]),
        "sent_per_s": rate(w["delta"]["sent"], w["elapsed"]),
    }
    w["delivered"] = sum(s.count for s in subs)  # over the whole run, warm-up included
    return w


def _fanin_topics(n: int) -> list[str]:
    if n > 10:  # keep every topic the same length, so every frame is the same size
        return [f"bench/{i:03d}/data" for i in range(n)]
    return [f"bench/{i}/data" for i in range(n)]


async def fan_in(ctx: Ctx) -> dict[str, Any]:
    n = ctx.sizes.fanin_publishers
    return await _qos0_flow(ctx, n, 1, "bench/+/data", _fanin_topics(n))


async def fan_in_per_write(ctx: Ctx) -> dict[str, Any]:
    """Scenario 1's shape, but every PUBLISH is its own write and its own TCP segment
    (devices.OnePerWrite): the broker reads one message per segment instead of ~750 per block."""
    n = ctx.sizes.fanin_publishers
    topics = _fanin_topics(n)
    frame = ctx.publish_len(topics[0])
    sub = await ctx.client("sub")
    await sub.subscribe([("bench/+/data", 0)])
    sub.start_counting(frame)
    conns = ctx.open_many([f"pub{i}" for i in range(n)]).clients  # TCP_NODELAY
    packets = [wire.publish(t, wire.payload(i), 0, 0, ctx.version) for i, t in enumerate(topics)]
    pubs: devices.OnePerWrite | devices.OnePerWriteC
    if ctx.c_one_per_write:
        pubs = devices.OnePerWriteC(conns, packets, ctx.c_one_per_write)
    else:
        pubs = devices.OnePerWrite(conns, packets)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(pubs.run(stop))
    try:
        w = await ctx.measure(
            lambda: {
                "received": sub.count,
                "sent": pubs.sent,
                "segments": pubs.segments() or 0,
                "attempts": pubs.attempts,
                "held": pubs.held,
                "publisher_cpu": pubs.cpu_s(),
            },
            progress=lambda: sub.count,
        )
    finally:
        stop.set()
        await task
    ctx.lost_before_retiring += sum(1 for c in conns if c.eof)  # the broker closed a publisher
    d = w["delta"]
    # the C publishers' process runs on the generator's core too
    w["gen_cpu_pct"] = round(w["gen_cpu_pct"] + 100 * d["publisher_cpu"] / w["elapsed"], 1)
    w["gen_publishers"] = "c" if ctx.c_one_per_write else "python"
    w["metrics"] = {
        "msgs_per_s": rate(d["received"], w["elapsed"]),
        "sent_per_s": rate(d["sent"], w["elapsed"]),
        # data segments the publishers' sockets sent per message: 1.0 when none was merged
        "segs_per_msg": round(d["segments"] / d["sent"], 3)
        if d["sent"] and d["segments"]
        else None,
        # attempts that found the previous message still queued (the broker was behind)
        "held_pct": round(100 * d["held"] / d["attempts"], 1) if d["attempts"] else None,
    }
    w["delivered"] = sub.count
    return w


async def one_to_one(ctx: Ctx) -> dict[str, Any]:
    return await _qos0_flow(ctx, 1, 1, "bench/one", ["bench/one"])


async def fan_out(ctx: Ctx) -> dict[str, Any]:
    return await _qos0_flow(ctx, 1, ctx.sizes.fanout_subscribers, "bench/fanout", ["bench/fanout"])


# -- 3 / 4: QoS 1 and 2 end to end -------------------------------------------------------------


async def _qos_flow(ctx: Ctx, qos: int) -> dict[str, Any]:
    n = ctx.sizes.qos_pairs
    topics = [f"bench/q{qos}/{i:02d}" for i in range(n)]
    subs = []
    for i, topic in enumerate(topics):
        sub = await ctx.client(f"sub{i}", port=ctx.sub_port)
        await sub.subscribe([(topic, qos)])
        sub.start_acking()
        subs.append(sub)
    pubs = [await ctx.client(f"pub{i}") for i in range(n)]
    for pub, topic in zip(pubs, topics, strict=True):
        pub.start_windowed(topic, qos, ctx.sizes.window, wire.payload())
    w = await ctx.measure(
        lambda: {
            "received": sum(s.count for s in subs),
            "acked": sum(p.acked for p in pubs),
        },
        progress=lambda: sum(s.count for s in subs),
    )
    received = w["delta"]["received"]
    w["metrics"] = {
        "msgs_per_s": rate(received, w["elapsed"]),
        "acked_per_s": rate(w["delta"]["acked"], w["elapsed"]),
    }
    w["delivered"] = sum(s.count for s in subs)
    w["failed_acks"] = sum(p.failed_acks for p in pubs)
    w["window"] = min([ctx.sizes.window] + [p.receive_max for p in pubs])
    return w


async def qos1(ctx: Ctx) -> dict[str, Any]:
    return await _qos_flow(ctx, 1)


async def qos2(ctx: Ctx) -> dict[str, Any]:
    return await _qos_flow(ctx, 2)


# -- 5: latency at a fixed rate ----------------------------------------------------------------


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of an ascending sequence."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[min(index, len(sorted_values) - 1)]


async def latency(ctx: Ctx) -> dict[str, Any]:
    """One QoS 0 message at a time, ``latency_rate`` per second, timed from the publisher's send
    to the subscriber's read by a busy-polling probe in a worker thread (see LatencyProbe)."""
    topic = "bench/latency"
    probe = await asyncio.to_thread(
        LatencyProbe.open,
        ctx.host,
        ctx.port,
        ctx.cid("pub"),
        ctx.cid("sub"),
        topic,
        ctx.version,
        ctx.sizes.latency_rate,
    )
    ctx.raw.extend([probe.sub, probe.pub])  # closed with DISCONNECT by ctx.close()
    c0, c1, s0, s1 = await asyncio.to_thread(probe.run, ctx.warmup, ctx.duration, ctx.snapshot)
    w = window(c0, c1, s0, s1)
    samples = sorted(probe.samples)

    def us(q: float) -> float | None:
        return round(percentile(samples, q) / 1000, 1) if samples else None

    w["metrics"] = {
        "p50_us": us(0.50),
        "p90_us": us(0.90),
        "p99_us": us(0.99),
        "p999_us": us(0.999),
        "max_us": round(samples[-1] / 1000, 1) if samples else None,
        "msgs_per_s": rate(w["delta"]["received"], w["elapsed"]),
        "samples": len(samples),
        "lost": int(w["delta"]["lost"]),
    }
    w["delivered"] = probe.sub.count
    w["samples"] = len(samples)
    if probe.late:
        w["late"] = probe.late  # arrived after being counted as lost
    lost = sum(1 for c in (probe.pub, probe.sub) if c.eof)
    if lost:
        w["lost_connections"] = lost
    return w


# -- 6: idle connections -----------------------------------------------------------------------


async def idle_connections(ctx: Ctx) -> dict[str, Any]:
    if ctx.tls:
        return await idle_tls_connections(ctx)
    n = ctx.sizes.idle_connections
    rss0 = procfs.rss_kb(ctx.broker_pid)
    s0, ns0 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
    opened = ctx.open_many([f"idle{i}" for i in range(n)])
    s1, ns1 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
    clients = opened.clients
    w = setup_window(opened, len(clients), s0, s1)
    await asyncio.sleep(min(ctx.warmup, 1.0))  # let the broker settle before reading its RSS
    rss1 = procfs.rss_kb(ctx.broker_pid)
    await asyncio.sleep(ctx.duration)  # idle: nothing is sent (keep alive 0)
    for client in clients:
        client.sweep()
    dropped = sum(1 for c in clients if c.eof)
    per_conn = None
    if rss0 is not None and rss1 is not None:
        per_conn = round((rss1 - rss0) / n, 2)
    # A second wave as a storm: as many clients again, storm_concurrency at once (devices
    # reconnecting together); past the listener's backlog the kernel drops SYNs, retried a
    # second later.
    storm = ctx.open_many([f"storm{i}" for i in range(n)], concurrency=ctx.sizes.storm_concurrency)
    storm_s = storm.elapsed_s
    connect_s = round(w["elapsed"], 3)
    w["metrics"] = {
        "connect_s": connect_s,
        "storm_connect_s": round(storm_s, 3),
        "conns_per_s": rate(n, w["elapsed"]),
        "cpu_us_per_conn": procfs.per_item_us(ns0, ns1, len(clients)),
        "rss_kb_per_conn": per_conn,
        "rss_before_kb": rss0,
        "rss_after_kb": rss1,
        "dropped": dropped,
    }
    w["delivered"] = len(clients) - dropped
    return w


async def _settle(pid: int | None, limit: float = 10.0) -> None:
    """Wait until the broker uses under a tenth of a core (two readings 0.1 s apart)."""
    quiet, last, end = 0, procfs.threads_cpu_ns(pid), time.monotonic() + limit
    while last is not None and quiet < 2 and time.monotonic() < end:
        await asyncio.sleep(0.1)
        now = procfs.threads_cpu_ns(pid)
        if now is None:
            return
        quiet = quiet + 1 if now - last < 10_000_000 else 0
        last = now


async def _done(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def idle_tls_connections(ctx: Ctx) -> dict[str, Any]:
    """Scenario 6 over TLS: as over TCP, the connections held by the C TLS opener's process
    (or the asyncio clients); with session resumption, each wave's priming round (its
    connections set up once and closed, their sessions kept) runs before the broker's figures
    are read, so its RSS per connection is not a fresh broker's."""
    n = ctx.sizes.idle_connections
    first = ctx.tls_fleet([f"idle{i}" for i in range(n)], ctx.sizes.connect_concurrency)
    fleets = [first]
    try:
        await _settle(ctx.broker_pid)
        rss0 = procfs.rss_kb(ctx.broker_pid)
        s0, ns0 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
        opened = await _done(first.storm())
        s1, ns1 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
        w = setup_window(opened, n, s0, s1)  # type: ignore[arg-type]
        await asyncio.sleep(min(ctx.warmup, 1.0))  # let the broker settle before reading its RSS
        rss1 = procfs.rss_kb(ctx.broker_pid)
        await asyncio.sleep(ctx.duration)  # idle: nothing is sent (keep alive 0)
        second = ctx.tls_fleet([f"storm{i}" for i in range(n)], ctx.sizes.storm_concurrency)
        fleets.append(second)
        await _settle(ctx.broker_pid)
        storm = await _done(second.storm())
        dropped = await _done(first.close())
        fleets.remove(first)
    finally:
        for fleet in fleets:
            await _done(fleet.close())
    per_conn = None
    if rss0 is not None and rss1 is not None:
        per_conn = round((rss1 - rss0) / n, 2)
    w["metrics"] = {
        "connect_s": round(w["elapsed"], 3),
        "storm_connect_s": round(storm.elapsed_s, 3),
        "conns_per_s": rate(n, w["elapsed"]),
        "cpu_us_per_conn": procfs.per_item_us(ns0, ns1, n),
        "rss_kb_per_conn": per_conn,
        "rss_before_kb": rss0,
        "rss_after_kb": rss1,
        "dropped": dropped,
        "tls_sessions": first.sessions,
        "tls_resumed": opened.resumed,
        "storm_tls_resumed": storm.resumed,
    }
    w["delivered"] = n - dropped
    return w


# -- 7: many topics, a publisher spraying all of them ------------------------------------------


async def topic_spray(ctx: Ctx) -> dict[str, Any]:
    n = ctx.sizes.spray_topics
    width = max(5, len(str(n - 1)))
    topics = [f"spray/{i:0{width}d}" for i in range(n)]
    frame = ctx.publish_len(topics[0])
    s0, ns0 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
    opened = ctx.open_many([f"t{i}" for i in range(n)], lambda i: [(topics[i], 0)], frame)
    own = opened.clients
    t0, c0 = time.perf_counter(), procfs.own_cpu_seconds()
    wild = []
    for i in range(ctx.sizes.spray_wildcards):
        sub = await ctx.client(f"wild{i}")
        await sub.subscribe([("spray/+", 0)])
        sub.start_counting(frame)
        wild.append(sub)
    s1, ns1 = ctx.snapshot(), procfs.threads_cpu_ns(ctx.broker_pid)
    opened = opened._replace(
        elapsed_s=opened.elapsed_s + time.perf_counter() - t0,
        cpu_s=opened.cpu_s + procfs.own_cpu_seconds() - c0,
    )
    setup = setup_window(opened, len(own) + len(wild), s0, s1)

    # The 10,000 own-topic subscribers each get 1/10,000 of the traffic: reading each of them on
    # every message would cost the generator one event-loop callback per message, so they are
    # read by a sweep twice a second (and at both ends of the window).
    stop = asyncio.Event()

    async def sweeper() -> None:
        while not stop.is_set():
            for client in own:
                client.sweep()
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass

    sweeping = asyncio.get_running_loop().create_task(sweeper())
    pub = await ctx.client("pub")
    pub.start_flood(*ctx.flood_blocks(topics))

    def sweep_all() -> None:
        for client in own:
            client.sweep()

    w = await ctx.measure(
        lambda: {
            "wild": sum(s.count for s in wild),
            "own": sum(c.count for c in own),
            "sent": pub.sent,
        },
        before_read=sweep_all,
        progress=lambda: sum(s.count for s in wild),
    )
    stop.set()
    await sweeping
    sweep_all()
    routed = w["delta"]["wild"] / max(1, len(wild))
    w["metrics"] = {
        "msgs_per_s": rate(routed, w["elapsed"]),
        "deliveries_per_s": rate(w["delta"]["wild"] + w["delta"]["own"], w["elapsed"]),
        "own_topic_per_s": rate(w["delta"]["own"], w["elapsed"]),
        "setup_s": round(setup["elapsed"], 3),
        "setup_cpu_us_per_client": procfs.per_item_us(ns0, ns1, len(own) + len(wild)),
        "setup_gen_cpu_pct": setup["gen_cpu_pct"],
        "setup_broker_cpu_pct": setup["broker_cpu_pct"],
    }
    w["delivered"] = sum(s.count for s in wild) + sum(c.count for c in own)
    w["own_topic_subscribers_dropped"] = sum(1 for c in own if c.eof)
    return w


# -- 8: QoS 1 into an offline persistent session ---------------------------------------------

PERSIST_TOPIC = "bench/persist"
ACK_SETTLE_LIMIT = 10.0  # seconds the publishers wait for their last acks after the window
RESUME_STALL = 10.0  # the resumed subscriber gives up after this long without a message


def resume_limit(warmup: float, duration: float) -> float:
    """Longest the resumed subscriber of scenario 8 waits for everything accepted."""
    return 30.0 + 3 * (warmup + duration)


def _window_rate(pub: dict[str, Any], key: str) -> float:
    """A publisher process's rate of ``key`` over its own measuring window."""
    (t0, _, c0), (t1, _, c1) = pub["marks"]
    return (c1[key] - c0[key]) / (t1 - t0) if t1 > t0 else 0.0


async def persistent(ctx: Ctx) -> dict[str, Any]:
    """A subscriber makes a persistent session (Clean Start 0, Session Expiry Interval), subscribes
    at QoS 1 and leaves with a normal DISCONNECT; publishers then send QoS 1 into that offline
    session, each keeping ``window`` PUBLISHes unacknowledged. The figure is PUBACKs per second:
    messages the broker accepted into the session (a durable broker commits them first). Then
    the subscriber comes back with Clean Start 0 and must receive every accepted message."""
    topic = PERSIST_TOPIC
    expiry = ctx.sizes.session_expiry
    sub = await ctx.client("sub", clean_start=False, session_expiry=expiry)
    stale_session = sub.session_present  # a leftover of an earlier run on an external broker
    granted = sub.granted_expiry
    await sub.subscribe([(topic, 1)])
    await ctx.retire([sub])

    # The publishers: one process each (the C program, or benchmarks/windowed.py), so the
    # generator's side keeps up with a broker acknowledging from memory.
    specs = [
        {
            "host": ctx.host,
            "port": ctx.port,
            "version": ctx.version,
            "client_id": ctx.cid(f"pub{i}"),
            "topic": topic,
            "window": ctx.sizes.window,
        }
        for i in range(ctx.sizes.persist_publishers)
    ]
    pubs, s0, s1 = await windowed.run_publishers(
        specs, ctx.warmup, ctx.duration, ACK_SETTLE_LIMIT, ctx.snapshot, ctx.c_publisher
    )
    w = window(
        {k: sum(p["marks"][0][2][k] for p in pubs) for k in ("acked", "failed", "sent")},
        {k: sum(p["marks"][1][2][k] for p in pubs) for k in ("acked", "failed", "sent")},
        s0,
        s1,
    )
    worker_cpu = sum(p["marks"][1][1] - p["marks"][0][1] for p in pubs)
    w["gen_cpu_pct"] = round(w["gen_cpu_pct"] + 100 * worker_cpu / w["elapsed"], 1)
    w["gen_processes"] = len(pubs)
    w["gen_publishers"] = "c" if ctx.c_publisher else "python"
    settled = all(p["settled"] for p in pubs)
    sent = sum(p["sent"] for p in pubs)
    failed = sum(p["failed"] for p in pubs)
    accepted = sum(p["acked"] for p in pubs) - failed
    rss_queued = procfs.rss_kb(ctx.broker_pid)
    ctx.lost_before_retiring += sum(1 for p in pubs if p["lost"])
    for p in pubs:
        for key, n in p["others"].items():
            ctx.unexpected[key] = ctx.unexpected.get(key, 0) + n
    hist = windowed.merge_histograms([p["latency_hist_us"] for p in pubs])
    worst = [p["latency_max_ms"] for p in pubs if p["latency_max_ms"] is not None]
    p99 = windowed.hist_percentile(hist, 0.99)

    # The subscriber comes back: every accepted message must reach it.
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    back = await ctx.client("sub", clean_start=False, session_expiry=expiry)
    back.end_session = True  # leave nothing behind on an external broker (MQTT 5)
    back.start_acking()
    limit = resume_limit(ctx.warmup, ctx.duration)
    last, last_at, why = 0, t0, "time limit"
    while (now := loop.time()) - t0 < limit:
        if back.count >= accepted > 0 or back.lost.done():
            why = "all" if back.count >= accepted else "connection lost"
            break
        if back.count != last:
            last, last_at = back.count, now
        elif now - last_at >= RESUME_STALL:
            why = "stalled"
            break
        await asyncio.sleep(0.02)
    if back.count != last:
        last_at = loop.time()
    resumed = back.count
    resume_s = max(last_at - t0, 1e-9)

    accepted_rate = sum(_window_rate(p, "acked") - _window_rate(p, "failed") for p in pubs)
    reads = sum(_window_rate(p, "reads") for p in pubs)
    w["metrics"] = {
        # each publisher's own window (they start and end within a few ms of the broker's)
        "msgs_per_s": round(accepted_rate, 1),
        "sent_per_s": round(sum(_window_rate(p, "sent") for p in pubs), 1),
        # PUBACKs per read at the publishers: the fewer, the more system calls per message
        "acks_per_read": round(sum(_window_rate(p, "acked") for p in pubs) / reads, 2)
        if reads
        else None,
        "ack_p99_ms": round(p99 / 1000, 2) if p99 is not None else None,
        "ack_max_ms": max(worst) if worst else None,
        "resume_msgs_per_s": rate(resumed, resume_s),
        "resume_s": round(resume_s, 3),
        "accepted": accepted,
        "resumed": resumed,
        "rss_queued_kb": rss_queued,
    }
    w["delivered"] = resumed
    w["failed_acks"] = failed
    w["window"] = min([ctx.sizes.window] + [p["window"] for p in pubs])
    w["resume"] = why
    w["session_present_on_resume"] = back.session_present
    w["granted_session_expiry"] = granted
    if not settled:
        w["unacked_at_end"] = sent - failed - accepted
    if stale_session:
        w["stale_session"] = True
    if resumed > accepted:
        w["resumed_extra"] = resumed - accepted  # duplicates, or unacked ones that got through
    if not back.session_present:
        w["error"] = "the subscriber's session was not resumed (CONNACK Session Present 0)"
    elif resumed < accepted and why != "time limit":
        w["error"] = (
            f"{accepted - resumed} of {accepted} acknowledged messages not delivered on resume "
            f"({why})"
        )
    elif resumed < accepted:
        w["resume_incomplete"] = f"{resumed} of {accepted} after {limit:.0f} s"
    return w


# -- 9: many devices, each publishing a few messages per second ---------------------------------


UNREAD_SAMPLES = 10  # readings of the broker's unread bytes just after each phase's window
UNREAD_EVERY = 0.02  # seconds between two


async def unread_per_connection(port: int) -> float | None:
    """Bytes the broker's connections on ``port`` (its devices and its subscriber) hold received
    and not yet read, per connection, averaged over UNREAD_SAMPLES readings
    (procfs.unread_bytes) taken just after the window while the devices go on sending. About 0
    for a broker that reads each message as it arrives; a broker behind by k messages on each
    device holds about k messages' bytes. A lower bound: each reading holds the generator's
    loop (and so the devices) for a few milliseconds, while the broker goes on reading. None
    where /proc does not show the broker's connections."""
    means = []
    for i in range(UNREAD_SAMPLES):
        if i:
            await asyncio.sleep(UNREAD_EVERY)
        unread = procfs.unread_bytes(port)
        if unread:
            means.append(sum(unread) / len(unread))
    return round(sum(means) / len(means), 1) if means else None


async def many_devices(ctx: Ctx) -> dict[str, Any]:
    """``devices`` publishers, each on its own connection and topic ``dev/<i>/q1`` or
    ``dev/<i>/q0``, paced (devices.pace): first QoS 1 at ``device_rate_q1`` messages/s each into
    a wildcard subscriber at QoS 1, then QoS 0 at ``device_rate_q0`` each into another. Each
    phase has its warm-up and window; the figures are the delivered rate and the broker's CPU
    seconds per 10,000 delivered messages."""
    n = ctx.sizes.devices
    width = max(4, len(str(n - 1)))
    sub1 = await ctx.client("sub1")
    await sub1.subscribe([("dev/+/q1", 1)])
    sub1.start_acking()
    sub0 = await ctx.client("sub0")
    await sub0.subscribe([("dev/+/q0", 0)])
    sub0.start_counting(ctx.publish_len(f"dev/{0:0{width}d}/q0"))
    rss0 = procfs.rss_kb(ctx.broker_pid)
    conns = ctx.open_many([f"dev{i}" for i in range(n)]).clients
    limit = min([devices.RING] + [c.receive_max for c in conns])
    metrics: dict[str, Any] = {}
    gen_cpu, broker_cpu, failed = [], [], 0
    phases = (("q1", 1, ctx.sizes.device_rate_q1, sub1), ("q0", 0, ctx.sizes.device_rate_q0, sub0))
    for name, qos, per_device, sub in phases:
        devs = [
            devices.Device(
                conn,
                devices.device_packets(f"dev/{i:0{width}d}/{name}", qos, ctx.version, limit),
                limit if qos else 0,
            )
            for i, conn in enumerate(conns)
        ]

        def received(sub: Client = sub) -> float:
            return sub.count

        def sweep(devs: list[devices.Device] = devs) -> None:
            for device in devs:
                device.sweep()

        def read(devs: list[devices.Device] = devs, sub: Client = sub) -> dict[str, float]:
            return {
                "received": sub.count,
                "sent": sum(d.sent for d in devs),
                "held": sum(d.held for d in devs),
                "kernel_s": procfs.kernel_cpu_seconds(ctx.broker_pid) or 0.0,
                "ticks_s": procfs.cpu_seconds(ctx.broker_pid) or 0.0,
                "steal_s": procfs.steal_seconds() or 0.0,
                "wakeups": procfs.wakeups(ctx.broker_pid) or 0,
            }

        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            devices.pace(devs, per_device, stop, bool(qos))
        )
        try:
            w = await ctx.measure(read, before_read=sweep if qos else None, progress=received)
            metrics[f"{name}_unread"] = (  # on this machine (a pid): /proc shows them
                await unread_per_connection(ctx.port) if ctx.broker_pid is not None else None
            )
        finally:
            stop.set()
            pacer = await task
        if qos:  # the last acks come back before the next phase
            await asyncio.sleep(0.3)
            sweep()
            failed += sum(d.failed for d in devs)
        d = w["delta"]
        cpu_s = w.get("broker_cpu_s")
        metrics[f"{name}_msgs_per_s"] = rate(d["received"], w["elapsed"])
        metrics[f"{name}_offered_per_s"] = round(n * per_device, 1)
        metrics[f"{name}_sent_per_s"] = rate(d["sent"], w["elapsed"])
        metrics[f"{name}_cpu_per_10k"] = (
            round(cpu_s / d["received"] * 10_000, 4)
            if cpu_s is not None and d["received"]
            else None
        )
        metrics[f"{name}_gen_cpu_pct"] = w["gen_cpu_pct"]
        metrics[f"{name}_broker_cpu_pct"] = w["broker_cpu_pct"]
        # the share of the broker's CPU spent in the kernel, which its own code does not set:
        # of the clock ticks that found it running (sampled, so rough at a few % of a core)
        metrics[f"{name}_kernel_pct"] = (
            round(100 * d["kernel_s"] / d["ticks_s"], 1) if d["ticks_s"] else None
        )
        metrics[f"{name}_steal_pct"] = procfs.steal_pct(0.0, d["steal_s"], w["elapsed"])
        metrics[f"{name}_wakeups_per_msg"] = (
            round(d["wakeups"] / d["received"], 3) if d["received"] else None
        )
        metrics[f"{name}_held"] = int(d["held"])  # turns skipped: socket full or ring in flight
        metrics[f"{name}_missed"] = pacer.missed  # turns skipped: the generator was late
        gen_cpu.append(w["gen_cpu_pct"])
        broker_cpu.append(w["broker_cpu_pct"])
    # What the devices cost the broker in memory once each has sent in both phases: its RSS
    # now minus before they connected (a fresh broker: see the registry), per device.
    rss1 = procfs.rss_kb(ctx.broker_pid)
    if rss0 is not None and rss1 is not None:
        metrics["rss_kb_per_device"] = round((rss1 - rss0) / n, 2)
    ctx.lost_before_retiring += sum(1 for c in conns if c.eof)  # the broker closed a device
    out: dict[str, Any] = {
        "metrics": metrics,
        "delivered": sub1.count + sub0.count,
        "gen_cpu_pct": max(gen_cpu),  # the busier phase: near 100, the generator was the limit
        "broker_cpu_pct": max((c for c in broker_cpu if c is not None), default=None),
    }
    if failed:
        out["failed_acks"] = failed
    return out


# -- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool = True
    ratio: bool = True  # ours/peer in the table (not for CPU % and the like)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    run: Callable[[Ctx], Awaitable[dict[str, Any]]]
    metrics: tuple[Metric, ...]
    many_fds: bool = False
    # Measured on brokers of its own, started fresh for each run (see runner.own_brokers).
    own_brokers: bool = False
    # Each run on a freshly started broker of the shared kind (scenario 6: a broker's memory
    # after earlier runs holds freed blocks the next run's connections reuse, so only a fresh
    # one's growth is the cost of the connections).
    fresh: bool = False
    # Configurations of our broker (brokers.TUNED_VARIANTS), or the floor (brokers.FLOOR),
    # measured here beside the others.
    variants: tuple[str, ...] = ()
    phases: int = 1  # warm-up + measuring windows per run
    cpu_rows: bool = True  # the table's gen CPU % and broker CPU % rows (else in ``metrics``)


MSGS = Metric("msgs_per_s", "msg/s")
SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        Scenario("1", "fan-in QoS0 8->1", fan_in, (MSGS,)),
        Scenario("1b", "1->1 QoS0", one_to_one, (MSGS,)),
        Scenario(
            "1w",
            "fan-in QoS0 8->1, one msg per write",
            fan_in_per_write,
            (MSGS, Metric("segs_per_msg", "segments/msg", ratio=False)),
        ),
        Scenario(
            "2",
            "fan-out QoS0 1->100",
            fan_out,
            (Metric("deliveries_per_s", "deliveries/s"),),
        ),
        Scenario("3", "QoS1 4->4, 32 in flight", qos1, (MSGS,)),
        Scenario("4", "QoS2 4->4, 32 in flight", qos2, (MSGS,)),
        Scenario(
            "5",
            "latency QoS0 @1000/s",
            latency,
            (
                Metric("p50_us", "p50 us", False),
                Metric("p90_us", "p90 us", False),
                Metric("p99_us", "p99 us", False),
                Metric("p999_us", "p99.9 us", False),
                Metric("max_us", "max us", False),
            ),
            variants=("ours-busy-poll", "floor"),
        ),
        Scenario(
            "6",
            "idle connections",
            idle_connections,
            (
                Metric("connect_s", "connect all, s", False),
                Metric("storm_connect_s", "as many again, storm, s", False),
                Metric("cpu_us_per_conn", "broker CPU us/conn", False),
                Metric("rss_kb_per_conn", "RSS KiB/conn", False),
            ),
            many_fds=True,
            fresh=True,
        ),
        Scenario(
            "7",
            "10k topics spray",
            topic_spray,
            (
                MSGS,
                Metric("deliveries_per_s", "deliveries/s"),
                Metric("setup_s", "subscribe all, s", False),
                Metric("setup_cpu_us_per_client", "broker CPU us/subscriber", False),
            ),
            many_fds=True,
        ),
        Scenario(
            "8",
            "QoS1 4->offline session, 32 in flight",
            persistent,
            (
                MSGS,
                Metric("ack_p99_ms", "PUBACK p99 ms", False),
                Metric("ack_max_ms", "PUBACK max ms", False),
                Metric("resume_msgs_per_s", "resume msg/s"),
            ),
            own_brokers=True,
        ),
        Scenario(
            "9",
            "1000 devices, QoS1 @50/s + QoS0 @100/s each",
            many_devices,
            (
                Metric("q1_msgs_per_s", "QoS1 msg/s"),
                Metric("q1_cpu_per_10k", "QoS1 CPU s/10k msgs", False),
                Metric("q1_broker_cpu_pct", "QoS1 broker CPU %", ratio=False),
                Metric("q1_kernel_pct", "QoS1 of it in the kernel %", ratio=False),
                Metric("q1_wakeups_per_msg", "QoS1 broker wake-ups/msg", False),
                Metric("q1_gen_cpu_pct", "QoS1 gen CPU %", ratio=False),
                Metric("q1_unread", "QoS1 unread bytes/conn", ratio=False),
                Metric("q1_steal_pct", "QoS1 steal %", False, ratio=False),
                Metric("q0_msgs_per_s", "QoS0 msg/s"),
                Metric("q0_cpu_per_10k", "QoS0 CPU s/10k msgs", False),
                Metric("q0_broker_cpu_pct", "QoS0 broker CPU %", ratio=False),
                Metric("q0_kernel_pct", "QoS0 of it in the kernel %", ratio=False),
                Metric("q0_wakeups_per_msg", "QoS0 broker wake-ups/msg", False),
                Metric("q0_gen_cpu_pct", "QoS0 gen CPU %", ratio=False),
                Metric("q0_unread", "QoS0 unread bytes/conn", ratio=False),
                Metric("q0_steal_pct", "QoS0 steal %", False, ratio=False),
                Metric("rss_kb_per_device", "RSS KiB/device", False),
            ),
            many_fds=True,
            fresh=True,
            phases=2,
            cpu_rows=False,
            variants=("ours-no-gather",),
        ),
    )
}


def titled(scenario: Scenario, sizes: Sizes) -> str:
    """The scenario's title with the sizes actually used."""
    title = scenario.title
    if scenario.key in ("1", "1w"):
        title = title.replace("8->", f"{sizes.fanin_publishers}->")
    elif scenario.key == "2":
        title = title.replace("->100", f"->{sizes.fanout_subscribers}")
    elif scenario.key in ("3", "4"):
        title = title.replace("4->4", f"{sizes.qos_pairs}->{sizes.qos_pairs}").replace(
            "32 in", f"{sizes.window} in"
        )
    elif scenario.key == "5":
        title = title.replace("@1000", f"@{sizes.latency_rate:g}")
    elif scenario.key == "6":
        title = (
            f"{sizes.idle_connections} idle connections"
            f" ({sizes.connect_concurrency}, then {sizes.storm_concurrency} at once)"
        )
    elif scenario.key == "7":
        title = f"{sizes.spray_topics} topics spray +{sizes.spray_wildcards} wildcards"
        if sizes.subscribe_after_connack:
            title += f", SUBSCRIBE after CONNACK, {sizes.connect_concurrency} at a time"
    elif scenario.key == "8":
        title = title.replace("4->", f"{sizes.persist_publishers}->").replace(
            "32 in", f"{sizes.window} in"
        )
    elif scenario.key == "9":
        title = (
            f"{sizes.devices} devices, QoS1 @{sizes.device_rate_q1:g}/s"
            f" + QoS0 @{sizes.device_rate_q0:g}/s each"
        )
    return title


async def run(scenario: Scenario, ctx: Ctx) -> dict[str, Any]:
    """Run one scenario and close everything it opened; adds what went wrong on the wire."""
    try:
        result = await scenario.run(ctx)
        lost = sum(1 for c in ctx.clients if c.lost.done()) + ctx.lost_before_retiring
        unexpected: dict[str, int] = dict(ctx.unexpected)
        for client in ctx.clients + ctx.retired:
            for first, _ in client.others:
                key = f"0x{first:02X}"
                unexpected[key] = unexpected.get(key, 0) + 1
        for raw in ctx.raw:
            for first, _ in raw.others:
                key = f"0x{first:02X}"
                unexpected[key] = unexpected.get(key, 0) + 1
        if lost:
            result["lost_connections"] = lost
        if unexpected:
            result["unexpected_packets"] = unexpected
        return result
    finally:
        await ctx.close()


def pick(keys: str | Sequence[str] | None) -> list[Scenario]:
    if not keys:
        return list(SCENARIOS.values())
    if isinstance(keys, str):
        keys = [k.strip() for k in keys.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        raise KeyError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    return [SCENARIOS[k] for k in keys]
