"""The chaos run: a cluster of three broker nodes on one Redis, behind HAProxy, devices that
connect through HAProxy only, a nemesis that kills, stops and disconnects things every few
seconds, and a checker that reads what every device got (benchmarks/README.md, "Chaos").

    python -m benchmarks.chaos                       # ours, the long form: 50 devices, 10 min
    python -m benchmarks.chaos --short               # 20 devices, 80 s of nemesis (the test's)
    python -m benchmarks.chaos --broker aedes        # Aedes nodes (npm install in benchmarks/aedes)
    python -m benchmarks.chaos --devices 50 --duration 600 --tick 4 --seed 7

What it starts, on free loopback ports, and stops at the end: a redis-server with
``appendonly yes``, ``appendfsync always`` in a directory of its own; three nodes, ``n1``-``n3``:
for ours ``python -m mqttbroker --cluster redis://127.0.0.1:<port>/0 --node-id nX --port <p>
--data-dir <dir> --admin-port 0`` with the default settings (``node_ttl`` 10 s), for Aedes
``node benchmarks/aedes/node.mjs <p> <redis port> nX`` (aedes-persistence-redis and
mqemitter-redis); HAProxy in TCP mode, round robin over the three with a TCP health check
every 0.5 s, its runtime API on a Unix socket (to drop a node's connections), and a log line
per connection (client port and server) sent over UDP to the run, so the checker knows which
node each device connection went to.

The devices (chaos_device.py) connect, subscribe to both topics of every other device and,
once all have, publish a QoS 1 and a QoS 2 message every ``--tick`` seconds each, for
``--duration`` seconds. Meanwhile the nemesis waits 2 to 5 s, does one action, waits for it to
end, and so on, going through the kinds in a shuffled order so that each comes once in every
five actions:

- ``kill_node``: SIGKILL a node, then start it again on its data directory (a node of ours
  killed holds its id for ``node_ttl`` seconds: its start is retried every second until then);
- ``pause_node``: SIGSTOP a node for ``--pause`` seconds (default 15, longer than the lease
  ``node_ttl``, 10 s), then SIGCONT;
- ``restart_redis``: SIGTERM Redis and start it again;
- ``kill_redis``: SIGKILL Redis and start it again, on its AOF;
- ``drop_node``: HAProxy's ``shutdown sessions server`` for one node: all its connections cut.

Then every process is made whole (running, not stopped) and the run drains: until every
device is connected with nothing left to acknowledge and nothing delivered for 10 s, at most
``--drain`` seconds. The checker (chaos_check.py) then reports; the figures go to
``benchmarks/results/chaos-<time>-<broker>.json`` and a table, the exit status is 1 when a
goal was missed (lost, QoS 2 duplicates, order violations, double owners) or a nemesis kind
never acted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import chaos_check
from .brokers import REPO, free_port, port_open
from .chaos_device import MQTT_5, MQTT_311, Device, Recorder
from .runner import RESULTS

NEMESIS_KINDS = ("kill_node", "pause_node", "restart_redis", "kill_redis", "drop_node")
NODES = ("n1", "n2", "n3")
START_TIMEOUT = 60.0  # a node's start, retried while its old lease holds its id
QUIET = 10.0  # the drain ends once nothing was delivered for this long (and all is acknowledged)
AEDES_DIR = REPO / "benchmarks" / "aedes"


def _program(name: str) -> str:
    for path in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if path and os.path.exists(path):
            return path
    raise RuntimeError(f"{name} not found")


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat): R, S, T (stopped), Z..."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Cluster:
    """Redis, the three nodes and HAProxy: everything the run starts, and stops."""

    broker: str  # "ours" or "aedes"
    workdir: Path
    redis_port: int = 0
    node_ports: dict[str, int] = field(default_factory=dict)
    port: int = 0  # HAProxy's
    redis: subprocess.Popen[bytes] | None = None
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    haproxy: subprocess.Popen[bytes] | None = None
    log_port: int = 0
    starts: dict[str, int] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)  # nodes the nemesis or supervisor is handling

    # -- Redis --------------------------------------------------------------------------------

    async def start_redis(self) -> None:
        directory = self.workdir / "redis"
        directory.mkdir(exist_ok=True)
        log = open(directory / "redis.log", "ab")  # noqa: SIM115
        self.redis = subprocess.Popen(
            [_program("redis-server"), "--port", str(self.redis_port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
            + ["--dir", str(directory)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        await self._wait_listening(self.redis_port, self.redis, "redis-server")

    async def _wait_listening(
        self, port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0
    ) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if port_open("127.0.0.1", port, 0.2):
                return True
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f} s")

    # -- nodes --------------------------------------------------------------------------------

    def _node_command(self, name: str) -> list[str]:
        port = str(self.node_ports[name])
        if self.broker == "aedes":
            return ["node", str(AEDES_DIR / "node.mjs"), port, str(self.redis_port), name]
        url = f"redis://127.0.0.1:{self.redis_port}/0"
        return [sys.executable, "-m", "mqttbroker", "--cluster", url, "--node-id", name] + [
            "--port",
            port,
            "--data-dir",
            str(self.workdir / name),
            "--admin-port",
            "0",
        ]

    async def start_node(self, name: str) -> float:
        """Start node ``name`` (on its data, if it ran before); retried while it exits at once
        (its id still held by the lease of its killed predecessor). Returns when it listens."""
        (self.workdir / name).mkdir(exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self.starts[name] = self.starts.get(name, 0) + 1
            log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                self._node_command(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir / name,
                env=env,
            )
            log.close()
            self.nodes[name] = proc
            if await self._wait_listening(self.node_ports[name], proc, name, 30.0):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name} did not start within {START_TIMEOUT:.0f} s")
            await asyncio.sleep(1.0)

    # -- HAProxy ------------------------------------------------------------------------------

    async def start_haproxy(self) -> None:
        servers = "\n".join(
            f"  server {name} 127.0.0.1:{port} check inter 500ms fall 2 rise 2"
            for name, port in self.node_ports.items()
        )
        config = self.workdir / "haproxy.cfg"
        config.write_text(
            f"""global
  stats socket {self.workdir}/haproxy.sock mode 600 level admin
  log 127.0.0.1:{self.log_port} local0 info
  maxconn 4000
defaults
  mode tcp
  log global
  option logasap
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
frontend mqtt
  bind 127.0.0.1:{self.port}
  log-format "chaos %cp %s"
  default_backend nodes
backend nodes
  balance roundrobin
{servers}
"""
        )
        log = open(self.workdir / "haproxy.log", "ab")  # noqa: SIM115
        self.haproxy = subprocess.Popen(
            [_program("haproxy"), "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        await self._wait_listening(self.port, self.haproxy, "haproxy")

    def haproxy_command(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.workdir / "haproxy.sock"))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def server_sessions(self, name: str) -> int | None:
        """HAProxy's current session count for a node (``show stat``'s scur)."""
        lines = self.haproxy_command("show stat").splitlines()
        if not lines:
            return None
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            cells = line.split(",")
            if len(cells) == len(header) and cells[0] == "nodes" and cells[1] == name:
                return int(cells[header.index("scur")] or 0)
        return None

    # -- the whole ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.redis_port = free_port()
        self.port = free_port()
        self.node_ports = {name: free_port() for name in NODES}
        await self.start_redis()
        for name in NODES:
            await self.start_node(name)
        await self.start_haproxy()

    async def heal(self) -> None:
        """Every process running and not stopped."""
        for proc in self.nodes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
        if self.redis is None or self.redis.poll() is not None:
            await self.start_redis()
        for name, proc in list(self.nodes.items()):
            if proc.poll() is not None:
                await self.start_node(name)

    def stop(self) -> None:
        _stop(self.haproxy)
        for proc in self.nodes.values():
            _stop(proc)
        _stop(self.redis)


class HaproxyLog(asyncio.DatagramProtocol):
    """HAProxy's log lines (``chaos <client port> <server>``), each with the time it came."""

    def __init__(self, clock: Any) -> None:
        self.lines: list[tuple[float, int, str]] = []
        self.clock = clock

    def datagram_received(self, data: bytes, addr: Any) -> None:
        text = data.decode(errors="replace")
        if "chaos " not in text:
            return
        parts = text.split("chaos ", 1)[1].split()
        if len(parts) >= 2 and parts[0].isdigit():
            self.lines.append((self.clock(), int(parts[0]), parts[1]))


def attribute_nodes(
    events: list[tuple[Any, ...]], lines: list[tuple[float, int, str]]
) -> dict[tuple[str, int], str]:
    """(client, conn) -> node: the HAProxy log line of the connection's local port that came
    last before its CONNACK (ports are reused, so the nearest earlier one)."""
    by_port: dict[int, list[tuple[float, str]]] = {}
    for t, port, server in lines:
        by_port.setdefault(port, []).append((t, server))
    nodes: dict[tuple[str, int], str] = {}
    for event in events:
        if event[1] != "connack":
            continue
        t, _, client, conn, _sp, _exp, port = event
        best = None
        for t_line, server in by_port.get(port, ()):
            if t_line <= t + 0.5:
                best = server
        if best is not None:
            nodes[(client, conn)] = best
    return nodes


@dataclass
class Options:
    broker: str = "ours"
    devices: int = 50
    duration: float = 600.0
    tick: float = 4.0
    fanout: int = 0  # 0: every other device
    pause: float = 15.0
    gap: tuple[float, float] = (2.0, 5.0)
    drain: float = 90.0
    seed: int = 0
    workdir: str | None = None
    out: str | None = None
    history: bool = True


async def supervise(cluster: Cluster, recorder: Recorder) -> None:
    """A node that ended on its own (not by the nemesis) is recorded as a crash and started
    again, as a service manager would."""
    while True:
        await asyncio.sleep(0.5)
        for name, proc in list(cluster.nodes.items()):
            if name in cluster.busy or proc.poll() is None:
                continue
            recorder.add("crash", name, proc.returncode)
            print(f"  {recorder.clock():7.1f} s node {name} ended by itself ({proc.returncode})")
            cluster.busy.add(name)
            try:
                await cluster.start_node(name)
            finally:
                cluster.busy.discard(name)


async def nemesis(
    cluster: Cluster,
    recorder: Recorder,
    until: float,
    opts: Options,
    rng: random.Random,
) -> None:
    kinds: list[str] = []
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(*opts.gap))
        if time.monotonic() >= until:
            break
        if not kinds:
            kinds = list(NEMESIS_KINDS)
            rng.shuffle(kinds)
        kind = kinds.pop()
        node = rng.choice([n for n in NODES if n not in cluster.busy] or list(NODES))
        cluster.busy.add(node)
        target = "redis" if "redis" in kind else node
        started = recorder.clock()
        ok = False
        detail: dict[str, Any] = {}
        try:
            if kind == "kill_node":
                proc = cluster.nodes[node]
                proc.send_signal(signal.SIGKILL)
                ok = (await asyncio.to_thread(proc.wait, 10)) == -signal.SIGKILL
                tries = cluster.starts[node]
                await cluster.start_node(node)
                detail["start_attempts"] = cluster.starts[node] - tries
            elif kind == "pause_node":
                proc = cluster.nodes[node]
                proc.send_signal(signal.SIGSTOP)
                await asyncio.sleep(0.2)
                ok = _state(proc.pid) == "T"
                await asyncio.sleep(opts.pause - 0.2)
                proc.send_signal(signal.SIGCONT)
                detail["seconds"] = opts.pause
            elif kind in ("restart_redis", "kill_redis"):
                assert cluster.redis is not None
                proc = cluster.redis
                sig = signal.SIGKILL if kind == "kill_redis" else signal.SIGTERM
                proc.send_signal(sig)
                code = await asyncio.to_thread(proc.wait, 20)
                ok = code == (-signal.SIGKILL if kind == "kill_redis" else 0)
                detail["exit"] = code
                await cluster.start_redis()
            elif kind == "drop_node":
                detail["sessions"] = cluster.server_sessions(node)
                answer = cluster.haproxy_command(f"shutdown sessions server nodes/{node}").strip()
                ok = answer == ""
                if answer:
                    detail["answer"] = answer
        except Exception as exc:  # recorded, and the run goes on
            detail["error"] = repr(exc)
        finally:
            cluster.busy.discard(node)
        recorder.events.append((started, "nemesis", kind, target, recorder.clock(), ok, detail))
        print(
            f"  {started:7.1f} s nemesis {kind} {target}: {'ok' if ok else 'FAILED'} {detail}",
            flush=True,
        )


async def drain(devices: list[Device], recorder: Recorder, limit: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        await asyncio.sleep(1.0)
        now = recorder.clock()
        last = next(
            (e[0] for e in reversed(recorder.events) if e[1] in ("deliver", "redeliver")), 0.0
        )
        settled = all(d.connected.is_set() and not d.outgoing for d in devices)
        if settled and now - last >= QUIET:
            break
    return time.monotonic() - started


async def run(opts: Options) -> dict[str, Any]:
    rng = random.Random(opts.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    keep = opts.workdir is not None
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix=f"chaos-{opts.broker}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    recorder = Recorder()
    recorder.clock = lambda: time.monotonic() - t0
    loop = asyncio.get_running_loop()
    log = HaproxyLog(recorder.clock)
    transport, _ = await loop.create_datagram_endpoint(lambda: log, local_addr=("127.0.0.1", 0))
    cluster = Cluster(opts.broker, workdir, log_port=transport.get_extra_info("sockname")[1])
    version = MQTT_311 if opts.broker == "aedes" else MQTT_5
    devices: list[Device] = []
    tasks: list[asyncio.Task[None]] = []
    timings: dict[str, float] = {}
    try:
        await cluster.start()
        print(
            f"chaos: {opts.broker}, redis :{cluster.redis_port}, nodes {cluster.node_ports}, "
            f"haproxy :{cluster.port}, {opts.devices} devices, workdir {workdir}",
            flush=True,
        )
        names = [f"d{i:03d}" for i in range(opts.devices)]
        for i, name in enumerate(names):
            others = names[i + 1 :] + names[:i]
            peers = others[: opts.fanout] if opts.fanout else others
            device = Device(
                name,
                "127.0.0.1",
                cluster.port,
                peers,
                recorder,
                version=version,
                tick=opts.tick,
                rng=random.Random(rng.random()),
            )
            devices.append(device)
            tasks.append(asyncio.ensure_future(device.run()))
        deadline = time.monotonic() + 60
        while not all(d.subscribed for d in devices):
            if time.monotonic() > deadline:
                raise RuntimeError("devices did not all connect and subscribe within 60 s")
            await asyncio.sleep(0.2)
        timings["setup_s"] = recorder.clock()
        until = time.monotonic() + opts.duration
        publishers = [asyncio.ensure_future(d.publish_loop(until)) for d in devices]
        supervisor = asyncio.ensure_future(supervise(cluster, recorder))
        try:
            await nemesis(cluster, recorder, until, opts, rng)
            await asyncio.gather(*publishers)
        finally:
            supervisor.cancel()
        await cluster.heal()
        timings["chaos_end_s"] = recorder.clock()
        timings["drain_s"] = round(await drain(devices, recorder, opts.drain), 1)
    finally:
        for device in devices:
            await device.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cluster.stop()
        transport.close()
    end = recorder.clock()
    nodes = attribute_nodes(recorder.events, log.lines)
    recorder.events += [(0.0, "node", c, conn, node) for (c, conn), node in nodes.items()]
    result = chaos_check.check(recorder.events, end=end, nodes=nodes)
    result["broker"] = opts.broker
    result["config"] = {
        "devices": opts.devices,
        "duration_s": opts.duration,
        "tick_s": opts.tick,
        "fanout": opts.fanout or opts.devices - 1,
        "pause_s": opts.pause,
        "mqtt": "5" if version == MQTT_5 else "3.1.1",
        "seed": opts.seed,
        "node_starts": cluster.starts,
    }
    result["timings"] = timings
    result["connections_attributed"] = len(nodes)
    result["nemesis_actions"] = [
        {"t": round(e[0], 2), "kind": e[2], "target": e[3], "end": round(e[4], 2), "ok": e[5]}
        | e[6]
        for e in recorder.events
        if e[1] == "nemesis"
    ]
    out = Path(opts.out) if opts.out else RESULTS / f"chaos-{stamp}-{opts.broker}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if opts.history:
        history = out.with_suffix(".history.jsonl.gz")
        with gzip.open(history, "wt") as fh:
            for event in recorder.events:
                fh.write(json.dumps(event) + "\n")
        result["history"] = str(history)
    result["workdir"] = str(workdir) if keep else None
    out.write_text(json.dumps(result, indent=1))
    result["out"] = str(out)
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


async def _main(opts: Options) -> dict[str, Any]:
    """``run``, cancelled (so that it stops all it started) on SIGTERM or SIGINT."""
    task = asyncio.ensure_future(run(opts))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await task


GOALS = ("lost", "qos2_duplicates", "order_violations", "double_owners")


def verdict(result: dict[str, Any]) -> list[str]:
    """What the run missed: the goals (0 lost, QoS 2 duplicates, order violations, double
    owners) and every nemesis kind done at least once."""
    missed = [f"{key} = {result[key]}" for key in GOALS if result[key]]
    for kind in NEMESIS_KINDS:
        if not result["nemesis"].get(kind, {}).get("done"):
            missed.append(f"nemesis {kind} never acted")
    return missed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--broker", choices=("ours", "aedes"), default="ours")
    p.add_argument(
        "--short", action="store_true", help="20 devices, 80 s, tick 1 s, drain at most 30 s"
    )
    p.add_argument("--devices", type=int)
    p.add_argument("--duration", type=float, help="seconds of publishing and nemesis")
    p.add_argument("--tick", type=float, help="seconds between a device's publications")
    p.add_argument("--fanout", type=int, default=0, help="peers each subscribes to (0: all)")
    p.add_argument("--pause", type=float, default=15.0, help="SIGSTOP seconds (> node_ttl)")
    p.add_argument("--drain", type=float, help="at most this long to settle at the end")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--workdir", help="keep data and logs here (default: a removed temp dir)")
    p.add_argument("--out", help="the JSON result (default benchmarks/results/)")
    p.add_argument("--no-history", action="store_true", help="do not save the event history")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    short = args.short
    opts = Options(
        broker=args.broker,
        devices=args.devices or (20 if short else 50),
        duration=args.duration or (80.0 if short else 600.0),
        tick=args.tick or (1.0 if short else 4.0),
        fanout=args.fanout,
        pause=args.pause,
        drain=args.drain or (30.0 if short else 90.0),
        seed=args.seed,
        workdir=args.workdir,
        out=args.out,
        history=not args.no_history,
    )
    result = asyncio.run(_main(opts))
    print()
    print(chaos_check.table({opts.broker: result}))
    examples = result["examples"]
    for key in ("lost", "qos2_duplicates", "order_violations", "wrong_session_present"):
        for example in examples[key][:5]:
            print(f"  {key}: {example}")
    for key in ("lost_by_nemesis", "lost_by_subscriber"):
        if examples[key]:
            print(f"  {key}: {examples[key]}")
    for example in examples["double_owners"][:5]:
        print(f"  double owner: {example}")
    print(f"  results: {result['out']}")
    missed = verdict(result)
    if missed:
        print("  goals missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
