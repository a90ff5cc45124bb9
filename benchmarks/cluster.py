"""Cluster figures: scenarios 1 to 4 on one node and on ``--workers 2``, the same with every
message crossing nodes, and Redis operations per message.

    python -m benchmarks.cluster [--scenarios 1,2,3,4] [--runs 3] [--duration 5] [--warmup 1]

It starts a redis-server of its own (a free loopback port, nothing on disk) and, per
configuration, our broker (``--memory``, log level warning, ``input_budget = 1000``: see CONFIG):

- ``one node``: a single broker, no cluster (Redis-free);
- ``workers 2``: ``--workers 2 --cluster URL``, both processes on one port (SO_REUSEPORT): the
  kernel spreads the clients, so some messages cross between the two workers through Redis;
- ``cross-node``: two nodes on two ports, the publishers on the first and the subscribers on the
  second, so every message crosses (scenario 2 then gives the cross-node fan-out deliveries/s).

Nothing is pinned: brokers, Redis and the load generator share the machine's cores (on a 2-core
machine the generator takes a good part of them, so the figures understate what the brokers do
alone). Each run reads Redis's command counters (INFO commandstats) before and after and reports
the operations per message. Results go to benchmarks/results/cluster-<time>.jsonl and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import brokers as br
from .runner import RESULTS, median
from .scenarios import Sizes, pick, titled

CLUSTER_SCENARIOS = "1,2,3,4"


@dataclass
class Setup:
    """One configuration under test: its processes, where publishers and subscribers go."""

    name: str
    port: int
    sub_port: int | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workdir: str = ""

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(br.REPO), env.get("PYTHONPATH")) if p)
    return env


def _wait_port(port: int, procs: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + br.START_TIMEOUT
    while not br.port_open("127.0.0.1", port):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{what} did not start on port {port}")
        time.sleep(0.05)


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    port = br.free_port()
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_port(port, [proc], "redis-server")
    return proc, port


# Every setup, the single node too (like for like): a node's Redis writer runs between event-loop
# passes, and with the default input budget (10,000 packets per connection per pass) a flood of
# publishers makes passes so long that it falls behind (README "Cluster figures and sizing").
CONFIG = "[broker]\ninput_budget = 1000\n"


def _broker(workdir: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    log = open(os.path.join(workdir, f"broker-{port}-{len(os.listdir(workdir))}.log"), "wb")  # noqa: SIM115
    config = os.path.join(workdir, "broker.toml")
    with open(config, "w") as fh:
        fh.write(CONFIG)
    return subprocess.Popen(
        [sys.executable, "-m", "mqttbroker", "--port", str(port), "--memory", "--config", config]
        + ["--log-level", "warning", "--data-dir", workdir, "--admin-port", "0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=log,
        cwd=workdir,
        env=_env(),
    )


def start_setup(name: str, redis_url: str) -> Setup:
    workdir = tempfile.mkdtemp(prefix=f"bench-cluster-{name.replace(' ', '-')}-")
    port = br.free_port()
    setup = Setup(name, port, workdir=workdir)
    if name == "one node":
        setup.procs.append(_broker(workdir, port))
    elif name == "workers 2":
        setup.procs.append(
            _broker(workdir, port, "--workers", "2", "--cluster", redis_url, "--node-id", "w")
        )
    else:  # cross-node
        setup.sub_port = br.free_port()
        setup.procs.append(_broker(workdir, port, "--cluster", redis_url, "--node-id", "pub"))
        setup.procs.append(
            _broker(workdir, setup.sub_port, "--cluster", redis_url, "--node-id", "sub")
        )
    try:
        _wait_port(port, setup.procs, name)
        if setup.sub_port:
            _wait_port(setup.sub_port, setup.procs, name)
        time.sleep(1.0 if name == "workers 2" else 0.2)  # the second worker binds too
    except RuntimeError as exc:  # a node did not start: say what its log says, then clean up
        logs = _log_tails(workdir)
        setup.stop()
        raise RuntimeError(f"{exc}\n{logs}" if logs else str(exc)) from None
    except BaseException:
        setup.stop()
        raise
    return setup


def _log_tails(workdir: str, lines: int = 20) -> str:
    """The last ``lines`` lines of each broker log in ``workdir``, for an error message."""
    tails = []
    for name in sorted(os.listdir(workdir)):
        if name.startswith("broker-") and name.endswith(".log"):
            with open(os.path.join(workdir, name), errors="replace") as fh:
                tail = fh.read().splitlines()[-lines:]
            if tail:
                tails.append(f"--- {name}:\n" + "\n".join(tail))
    return "\n".join(tails)


def redis_calls(port: int) -> int:
    """Commands Redis has run so far (every command, pub/sub and streams included)."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def run_once(
    key: str, setup: Setup, redis_port: int, args: argparse.Namespace, sizes: Sizes, run: int
) -> dict[str, Any]:
    spec = {
        "scenario": key,
        "host": "127.0.0.1",
        "port": setup.port,
        "sub_port": setup.sub_port,
        "warmup": args.warmup,
        "duration": args.duration,
        "run_id": f"c{key}{setup.name[0]}{run}",
        "sizes": asdict(sizes),
    }
    before = redis_calls(redis_port)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.generator", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=args.warmup + args.duration + 120,
        cwd=br.REPO,
        env=_env(),
    )
    calls = redis_calls(redis_port) - before - 1  # (the INFO before counts itself)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    record: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    delivered = record.get("delivered", 0)
    per_message = sizes.fanout_subscribers if key == "2" else 1  # deliveries per message
    messages = delivered / per_message if delivered else 0
    record.update(
        {
            "scenario": key,
            "setup": setup.name,
            "run": run + 1,
            "redis_ops": calls,
            "redis_ops_per_msg": round(calls / messages, 2) if messages else None,
        }
    )
    return record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__)
    p.add_argument("--scenarios", default=CLUSTER_SCENARIOS, help="default 1,2,3,4")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument(
        "--setups",
        default="one node,workers 2,cross-node",
        help="comma-separated, of: one node, workers 2, cross-node",
    )
    p.add_argument("--smoke", action="store_true", help="one short run each, small sizes")
    p.add_argument("--out", metavar="PATH", help="JSON lines (default benchmarks/results/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = Sizes.smoke() if args.smoke else Sizes()
    if args.smoke:
        args.runs, args.duration, args.warmup = 1, 1.0, 0.5
    scenarios = pick(args.scenarios)
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    out = (
        Path(args.out) if args.out else RESULTS / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    redis_proc, redis_port = start_redis(workdir)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    records: list[dict[str, Any]] = []
    try:
        with out.open("w") as sink:
            for name in setups:
                setup = start_setup(name, redis_url)
                try:
                    for scenario in scenarios:
                        for run in range(args.runs):
                            record = run_once(scenario.key, setup, redis_port, args, sizes, run)
                            record["title"] = titled(scenario, sizes)
                            records.append(record)
                            sink.write(json.dumps(record) + "\n")
                            sink.flush()
                            print(
                                f"{name:10} {scenario.key:2} run {run + 1}: "
                                f"{record.get('metrics', {})} redis ops/msg "
                                f"{record['redis_ops_per_msg']} {record.get('error', '')}",
                                flush=True,
                            )
                finally:
                    setup.stop()
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(f"{'scenario':40} {'setup':11} {'msg/s (deliveries/s)':>22} {'Redis ops/msg':>14}")
    for scenario in scenarios:
        for name in setups:
            mine = [r for r in records if r["scenario"] == scenario.key and r["setup"] == name]
            key = "deliveries_per_s" if scenario.key == "2" else "msgs_per_s"
            value = median([r.get("metrics", {}).get(key) for r in mine if r.get("metrics")])
            ops = median([r["redis_ops_per_msg"] for r in mine])
            print(
                f"{titled(scenario, sizes):40} {name:11} "
                f"{'-' if value is None else f'{value:,.0f}':>22} "
                f"{'-' if ops is None else f'{ops:.2f}':>14}"
            )
    print(f"  results: {out}")
    return 1 if any(r.get("error") for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
