"""``python -m benchmarks``: run the scenarios against our broker and its peers, side by side.

Each (scenario, run, broker) is one generator process (benchmarks/generator.py) pinned to core 1
while the brokers sit on core 0. Every run is written as one JSON line to
benchmarks/results/<timestamp>.jsonl; at the end a table shows, per scenario, the median of the
runs for each broker and the ratio ours/peer.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import brokers as br
from . import ceiling, cprograms, procfs, tls_fleet, tlscerts, windowed
from .scenarios import SCENARIOS, Scenario, Sizes, pick, resume_limit, titled
from .wire import MQTT_5, MQTT_311

# --tls: the scenarios whose clients are the generator's asyncio ones (open_client), which speak
# TLS, and scenario 6, whose connections the C TLS opener sets up (benchmarks/tls_fleet.py); the
# others set up raw sockets (the C programs, the latency probe) that do not
TLS_SCENARIOS = frozenset({"1", "1b", "2", "3", "4", "6"})

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE_DURATION = 0.3
SMOKE_WARMUP = 0.1
IDLE_LIMIT = 30.0  # seconds a broker may stay busy before a run; then it is restarted


def device_rates(text: str) -> tuple[float, float]:
    """``--device-rates Q1,Q0``: messages/s per device in scenario 9's two phases."""
    parts = text.split(",")
    try:
        rates = tuple(float(part) for part in parts)
    except ValueError:
        rates = ()
    if len(rates) != 2 or not all(0 < rate <= 1000 for rate in rates):
        raise argparse.ArgumentTypeError(
            f"{text!r}: two rates from above 0 to 1000 messages/s, QoS 1's then QoS 0's (50,100)"
        )
    return rates[0], rates[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="MQTT broker benchmarks: our broker beside Mosquitto (and amqtt if installed).",
    )
    p.add_argument(
        "--scenarios",
        metavar="LIST",
        help=f"comma-separated scenarios to run (default all: {','.join(SCENARIOS)})",
    )
    p.add_argument("--duration", type=float, help="measuring seconds per run (default 5)")
    p.add_argument("--warmup", type=float, help="seconds of load before measuring (default 1)")
    p.add_argument("--runs", type=int, help="runs per scenario and broker (default 3)")
    p.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="measure this already-running broker as 'ours' instead of starting mqttbroker",
    )
    p.add_argument("--broker-pid", type=int, metavar="PID", help="its pid, for CPU and RSS figures")
    p.add_argument("--no-mosquitto", action="store_true", help="do not start Mosquitto")
    p.add_argument("--no-amqtt", action="store_true", help="do not start amqtt even if installed")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny runs of every scenario against our broker only; exit 1 if one delivers nothing",
    )
    p.add_argument(
        "--mqtt", choices=("5", "3.1.1"), default="5", help="protocol version (default 5)"
    )
    p.add_argument("--connections", type=int, help="idle connections, scenario 6 (default 5000)")
    p.add_argument("--topics", type=int, help="own-topic subscribers, scenario 7 (default 10000)")
    p.add_argument(
        "--connect-concurrency",
        type=int,
        help="connections being set up at once, scenarios 6, 7 and 9 (default 64)",
    )
    tlscerts.add_options(p, "serve scenarios 1-4 and 6 over TLS", "the generator speaks")
    p.add_argument(
        "--tls-resumption",
        choices=tls_fleet.RESUMPTION,
        default="off",
        help="scenario 6 with --tls: every handshake a full one (off, the default), or each "
        "connection offering the session its slot got in a priming round (slot), or all the "
        "session of one priming connection (shared); needs the C TLS opener",
    )
    p.add_argument(
        "--subscribe-after-connack",
        action="store_true",
        help="scenario 7: write each SUBSCRIBE once its CONNACK has come (default: with it)",
    )
    p.add_argument("--subscribers", type=int, help="fan-out subscribers, scenario 2 (default 100)")
    p.add_argument("--devices", type=int, help="paced devices, scenario 9 (default 1000)")
    p.add_argument(
        "--device-rates",
        type=device_rates,
        metavar="Q1,Q0",
        help="messages/s per device in scenario 9's QoS 1 and QoS 0 phases (default 50,100)",
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    p.add_argument(
        "--python-publishers",
        action="store_true",
        help="scenario 8: the Python publishers even when the C one can be built",
    )
    p.add_argument(
        "--scrape-metrics",
        action="store_true",
        help="run our brokers with the admin server on and /metrics scraped every second "
        "(its cost: compare with a run without)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="our brokers' log level (default warning; info, the broker's own default, "
        "writes a line per client connected or gone up to connection_log_rate a second)",
    )
    p.add_argument(
        "--out", metavar="PATH", help="JSON lines file (default benchmarks/results/<time>.jsonl)"
    )
    return p


# -- formatting ------------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) < 0.1:
            return f"{value:.3g}" if value else "0"  # 0.0523 s/10k msgs, not 0.05
        return f"{value:.2f}"
    return str(value)


def median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None


def is_ours(name: str) -> bool:
    return name == "ours" or name.startswith("ours-")


def table(records: list[dict[str, Any]], sizes: Sizes) -> str:
    """One table per set of brokers: scenarios 1-7 share ours and the peers, scenario 8 has its
    own (ours-memory, ours-normal, ours-full, mosquitto)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for key in dict.fromkeys(r["scenario"] for r in records):
        names = tuple(dict.fromkeys(r["broker"] for r in records if r["scenario"] == key))
        groups.setdefault(names, []).append(key)
    return "\n\n".join(_table(records, list(names), keys, sizes) for names, keys in groups.items())


def _table(records: list[dict[str, Any]], names: list[str], keys: list[str], sizes: Sizes) -> str:
    ours = [n for n in names if is_ours(n)]
    peers = [n for n in names if not is_ours(n)]
    pairs = [(o, p) for o in ours for p in peers]
    head = ["scenario", "metric", *names, *(f"{o}/{p}" for o, p in pairs)]
    rows: list[list[str]] = []
    for key in keys:
        scenario = SCENARIOS[key]
        mine = [r for r in records if r["scenario"] == key]
        metric_rows: list[tuple[str, str, bool]] = [
            (m.key, m.label + ("" if m.higher_is_better else " *"), m.ratio)
            for m in scenario.metrics
        ]
        if scenario.cpu_rows:
            metric_rows += [
                ("gen_cpu_pct", "gen CPU %", False),
                ("broker_cpu_pct", "broker CPU %", False),
            ]
        first = True
        for mkey, label, ratio in metric_rows:
            medians = {}
            for name in names:
                values = [
                    (r.get("metrics") or {}).get(mkey, r.get(mkey))
                    for r in mine
                    if r["broker"] == name and not r.get("error")
                ]
                medians[name] = median(values)
            cells = [f"{key:<2} {titled(scenario, sizes)}" if first else "", label]
            cells += [fmt(medians[n]) for n in names]
            for mine_name, peer in pairs:
                a, b = medians.get(mine_name), medians.get(peer)
                cells.append(f"{a / b:.2f}x" if ratio and a is not None and b else "")
            rows.append(cells)
            first = False
        failed = [r for r in mine if r.get("error")]
        if failed:
            rows.append(
                ["", f"({len(failed)} failed run(s): see the JSON lines)"] + [""] * (len(head) - 2)
            )
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = []
    for n, row in enumerate([head, *rows]):
        cells = [
            str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i]) for i, c in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def floor_lines(records: list[dict[str, Any]]) -> list[str]:
    """For each scenario the floor was measured in: its ratio to each broker that is not ours,
    which is about the best ratio to that broker a broker in Python could show in this run."""
    lines = []
    for key in dict.fromkeys(r["scenario"] for r in records if r["broker"] == br.FLOOR):
        mine = [r for r in records if r["scenario"] == key and not r.get("error")]
        peers = [n for n in dict.fromkeys(r["broker"] for r in mine) if not is_ours(n)]
        for peer in (p for p in peers if p != br.FLOOR):
            cells = []
            for metric in SCENARIOS[key].metrics:
                values = {}
                for name in (br.FLOOR, peer):
                    values[name] = median(
                        [
                            (r.get("metrics") or {}).get(metric.key)
                            for r in mine
                            if r["broker"] == name
                        ]
                    )
                a, b = values[br.FLOOR], values[peer]
                if a is not None and b:
                    cells.append(f"{metric.label} {a / b:.2f}x")
            if cells:
                lines.append(f"  {key}: floor/{peer}: " + ", ".join(cells))
    if lines:
        lines.insert(
            0,
            "  The floor is a bare forwarder (benchmarks/floor.py), not a broker: its ratio to a "
            "peer is about the best\n  ratio to that peer any broker in Python could show in this run.",
        )
    return lines


# -- running -------------------------------------------------------------------------------------


def run_one(
    scenario: Scenario,
    broker: br.BrokerHandle,
    run: int,
    args: argparse.Namespace,
    sizes: Sizes,
    pin: bool,
    suite: str,
) -> dict[str, Any]:
    idle_wait, _ = broker.wait_idle(IDLE_LIMIT)
    tag = "".join(word[0] for word in broker.name.split("-"))  # ours-full -> of
    spec = {
        "scenario": scenario.key,
        "host": broker.host,
        "port": broker.port,
        "version": broker.version,
        "warmup": args.warmup,
        "duration": args.duration,
        "broker_pid": broker.pid,
        "run_id": f"{suite[-6:]}{scenario.key}{tag}{run}",
        "sizes": asdict(sizes),
        "c_publisher": args.c_publisher,
        "c_opener": args.c_opener,
        "c_one_per_write": args.c_one_per_write,
        "tls": args.tls_spec,
        "c_tls_opener": args.c_tls_opener,
    }
    cmd = br.pinned(
        br.GENERATOR_CORE, [sys.executable, "-m", "benchmarks.generator", json.dumps(spec)], pin
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(br.REPO), env.get("PYTHONPATH")) if p)
    many = sizes.idle_connections + sizes.spray_topics + sizes.devices if scenario.many_fds else 0
    timeout = scenario.phases * (args.warmup + args.duration) + 60 + many / 100
    if scenario.own_brokers:  # scenario 8 waits for the resumed subscriber too
        timeout += resume_limit(args.warmup, args.duration) + 10
    record: dict[str, Any] = {
        "suite": suite,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "scenario": scenario.key,
        "title": titled(scenario, sizes),
        "broker": broker.name,
        "broker_description": broker.description,
        "run": run + 1,
        "mqtt_version": "5" if broker.version == MQTT_5 else "3.1.1",
        "warmup": args.warmup,
        "duration": args.duration,
        "pinned": pin,
        "idle_wait_s": round(idle_wait, 2),
    }
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=br.REPO, env=env
        )
    except subprocess.TimeoutExpired as exc:
        record["error"] = f"generator timed out after {timeout:.0f} s"
        stderr = (
            exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        )
        record["generator_stderr"] = (stderr or "")[-2000:]
    else:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        try:
            record.update(json.loads(lines[-1]))
        except (IndexError, json.JSONDecodeError):
            record["error"] = f"generator exited with {proc.returncode} and no result"
        if proc.returncode != 0 or record.get("error"):
            record["generator_stderr"] = proc.stderr[-2000:]
    if not broker.alive():
        record["broker_crashed"] = True
        record["broker_log_tail"] = broker.log_tail(30)
        record.setdefault("error", f"{broker.name} died during the run")
    return record


def settle(handles: list[br.BrokerHandle], pin: bool) -> list[str]:
    """Every broker shares the core of the one about to be measured, so all of them must be
    idle first, the measured one included. One still busy after IDLE_LIMIT s is working off what
    its own run left it, for clients long gone (amqtt, which stalls under these loads, does that
    for minutes): it is restarted. Returns the names of those restarted; one that does not start
    again is left down (the next run on it restarts it, or reports it)."""
    restarted = []
    for j, other in enumerate(handles):
        if not other.managed or not other.alive():
            continue
        _, idle = other.wait_idle(IDLE_LIMIT)
        if idle:
            continue
        print(f"  {other.name} still busy: restarting it", file=sys.stderr)
        other.stop()
        restarted.append(other.name)
        try:
            handles[j] = br.restart(other, pin)
        except (RuntimeError, OSError) as exc:
            print(f"  {other.name} did not start again: {exc}", file=sys.stderr)
    return restarted


def ready(handles: list[br.BrokerHandle], i: int, scenario: Scenario, pin: bool) -> br.BrokerHandle:
    """The broker to measure next, ``handles[i]``: a managed one that is down is started
    again, and so is every managed one before each run of a ``fresh`` scenario."""
    handle = handles[i]
    if handle.managed and not handle.alive():
        print(f"  {handle.name} is down: restarting it", file=sys.stderr)
    elif not (handle.managed and scenario.fresh):
        return handle
    handle.stop()
    handles[i] = handle = br.restart(handle, pin)
    return handle


def run_fresh(
    scenario: Scenario,
    name: str,
    run: int,
    args: argparse.Namespace,
    sizes: Sizes,
    pin: bool,
    suite: str,
    version: int,
) -> dict[str, Any]:
    """One run of a scenario on a broker started for it alone (scenario 8), stopped after."""
    try:
        handle = br.start_for_own(name, pin, version)
    except (RuntimeError, OSError) as exc:
        return {
            "suite": suite,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "scenario": scenario.key,
            "title": titled(scenario, sizes),
            "broker": name,
            "run": run + 1,
            "error": f"{name} did not start: {exc}",
        }
    try:
        fsync = {}
        if name == "ours-full" and handle.workdir:  # its disk, before its run (see ceiling.py)
            fsync = ceiling.probe(handle.workdir)
        record = run_one(scenario, handle, run, args, sizes, pin, suite)
        record.update(fsync)
        if record.get("broker_crashed"):
            print(f"  !! {name} crashed; log tail:\n{record['broker_log_tail']}", file=sys.stderr)
        elif record.get("error"):
            tail = handle.log_tail(10)
            if tail:
                record["broker_log_tail"] = tail
        return record
    finally:
        handle.stop()


def summary_line(record: dict[str, Any]) -> str:
    scenario = SCENARIOS[record["scenario"]]
    metrics = record.get("metrics") or {}
    parts = [f"{m.label} {fmt(metrics.get(m.key))}" for m in scenario.metrics]
    parts.append(f"gen CPU {fmt(record.get('gen_cpu_pct'))}%")
    parts.append(f"broker CPU {fmt(record.get('broker_cpu_pct'))}%")
    text = f"{record['scenario']:<2} {record['broker']:<14} run {record['run']}: "
    text += ", ".join(parts)
    if "resumed" in metrics:
        text += f"; resumed {fmt(metrics['resumed'])} of {fmt(metrics.get('accepted'))} accepted"
    if metrics.get("tls_resumed") is not None:  # scenario 6 over TLS, by the C TLS opener
        text += (
            f"; TLS sessions resumed {metrics['tls_resumed']} and {metrics['storm_tls_resumed']}"
        )
    if metrics.get("dropped"):
        text += f"  [dropped while idle: {metrics['dropped']}]"
    if "fsync_ms" in record:
        text += f"; fsync {record['fsync_ms']:.3f} ms"
    if metrics.get("lost"):  # scenario 5: messages not back within 1 s
        text += f"  [lost: {metrics['lost']}]"
    if (record.get("stall_max_s") or 0) >= 0.25:
        text += f"  [longest stretch without a delivery: {record['stall_max_s']:.2f} s]"
    for key in (
        "lost_connections",
        "unexpected_packets",
        "failed_acks",
        "unacked_at_end",
        "resumed_extra",
        "resume_incomplete",
        "stale_session",
        "error",
    ):
        if record.get(key):
            text += f"  [{key}: {record[key]}]"
    return text


def problems(record: dict[str, Any]) -> list[str]:
    out = []
    if record.get("error"):
        out.append(str(record["error"]))
    if not record.get("delivered"):
        out.append("delivered nothing")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.smoke:
        args.no_mosquitto = args.no_amqtt = True
        args.duration = SMOKE_DURATION if args.duration is None else args.duration
        args.warmup = SMOKE_WARMUP if args.warmup is None else args.warmup
        args.runs = 1 if args.runs is None else args.runs
    args.duration = 5.0 if args.duration is None else args.duration
    args.warmup = 1.0 if args.warmup is None else args.warmup
    args.runs = 3 if args.runs is None else args.runs
    try:
        scenarios = pick(args.scenarios)
    except KeyError as exc:
        parser().error(str(exc.args[0]))
    sizes = Sizes.smoke() if args.smoke else Sizes()
    if args.connections:
        sizes.idle_connections = args.connections
    if args.topics:
        sizes.spray_topics = args.topics
    if args.connect_concurrency:
        sizes.connect_concurrency = args.connect_concurrency
    sizes.subscribe_after_connack = args.subscribe_after_connack
    if args.subscribers:
        sizes.fanout_subscribers = args.subscribers
    if args.devices:
        sizes.devices = args.devices
    if args.device_rates:
        sizes.device_rate_q1, sizes.device_rate_q0 = args.device_rates
    version = MQTT_5 if args.mqtt == "5" else MQTT_311
    pin = br.pinning_available() and not args.no_pin
    br.SCRAPE_METRICS = args.scrape_metrics
    br.LOG_LEVEL = args.log_level
    args.tls_spec = None
    if args.tls:
        plain = [s.key for s in scenarios if s.key not in TLS_SCENARIOS]
        if plain or args.broker:
            parser().error(
                f"--tls serves scenarios {','.join(sorted(TLS_SCENARIOS))} on brokers it starts"
                + (f", not {','.join(plain)}" if plain else ", not with --broker")
            )
        tls_dir = tempfile.mkdtemp(prefix="bench-tls-")
        atexit.register(shutil.rmtree, tls_dir, True)
        br.TLS = tlscerts.make(tls_dir, args.tls)
        args.tls_spec = {
            "ca": br.TLS[0],
            "version": args.tls_version,
            "resumption": args.tls_resumption,
        }
    fds = procfs.raise_fd_limit()  # inherited by the brokers and the generators
    suite = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / f"{suite}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)

    shared = [s for s in scenarios if not s.own_brokers]
    own = [s for s in scenarios if s.own_brokers]
    handles: list[br.BrokerHandle] = []
    records: list[dict[str, Any]] = []
    build_dir = tempfile.mkdtemp(prefix="bench-c-")
    args.c_opener, how = cprograms.build("open_many", build_dir)
    opener = f"C opener ({how})" if args.c_opener else f"Python epoll loop (client.py): {how}"
    args.c_tls_opener = None
    if args.tls and any(s.key == "6" for s in scenarios):
        args.c_tls_opener, how = cprograms.build("open_many_tls", build_dir)
        if args.c_tls_opener:
            opener = f"C TLS opener ({how})"
        elif args.tls_resumption != "off":
            print(f"benchmarks: --tls-resumption needs the C TLS opener: {how}", file=sys.stderr)
            shutil.rmtree(build_dir, ignore_errors=True)
            return 2
        else:
            opener = f"asyncio clients (tls_fleet.py, no resumption): {how}"
    args.c_one_per_write, how = cprograms.build("one_per_write", build_dir)
    per_write = (
        f"C publishers ({how}), one process"
        if args.c_one_per_write
        else f"Python publishers (devices.py), in the generator: {how}"
    )
    args.c_publisher, publishers = None, ""
    if own and args.python_publishers:
        publishers = (
            "Python publishers (benchmarks/windowed.py), one process each: --python-publishers"
        )
    elif own:
        args.c_publisher, publishers = windowed.build_c(build_dir)
    try:
        try:
            if args.broker:
                handles.append(br.external(args.broker, args.broker_pid, version))
            elif shared:
                handles.append(br.start_ours(pin, version))
        except (RuntimeError, ValueError, OSError) as exc:
            print(f"benchmarks: cannot start our broker: {exc}", file=sys.stderr)
            return 2
        for name in dict.fromkeys(v for s in shared for v in s.variants):
            if args.broker and name in br.TUNED_VARIANTS:
                continue  # our broker in another configuration: not with --broker
            try:
                handles.append(br.start_variant(name, pin, version))
            except (RuntimeError, OSError) as exc:
                print(f"benchmarks: {name} did not start: {exc}", file=sys.stderr)
        mosquitto = not args.no_mosquitto and br.mosquitto_path() is not None
        if not args.no_mosquitto and not mosquitto:
            print("benchmarks: mosquitto not found: measuring without it", file=sys.stderr)
        if mosquitto and shared:
            try:
                handles.append(br.start_mosquitto(pin, version))
            except (RuntimeError, OSError) as exc:
                print(f"benchmarks: mosquitto did not start: {exc}", file=sys.stderr)
        if shared and not args.no_amqtt and br.amqtt_available():
            try:
                handles.append(br.start_amqtt(pin))
            except (RuntimeError, OSError) as exc:
                print(f"benchmarks: amqtt did not start: {exc}", file=sys.stderr)
        # Scenario 8: a fresh broker per variant and run (an external broker is measured as is).
        own_names = ["ours"] if args.broker else list(br.OURS_VARIANTS)
        if mosquitto:
            own_names.append("mosquitto")

        print(
            f"benchmarks {suite}: {platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} cores, "
            + ("brokers pinned to core 0, generator to core 1" if pin else "no pinning")
            + f", fd limit {fds}"
        )
        if args.tls:
            key = "ECDSA P-256" if args.tls == "ec" else "RSA 2048"
            print(
                f"  TLS {args.tls_version}, {key} server key, certificate verified by the clients"
                + (
                    f"; scenario 6: session resumption {args.tls_resumption}"
                    if any(s.key == "6" for s in scenarios)
                    else ""
                )
            )
        for h in handles:
            pid = f"pid {h.pid}" if h.pid else "pid unknown"
            print(f"  {h.name:<14} {h.host}:{h.port} ({pid}) {h.description}")
        if own:
            print(
                f"  scenario {','.join(s.key for s in own)}: "
                + (
                    "the external broker as is"
                    if args.broker
                    else "a fresh broker and data directory per run for each of "
                    + ", ".join(own_names)
                )
                + " (see benchmarks/README.md)"
            )
            print(f"  scenario 8 generator: {publishers}")
            if "ours-full" in own_names:
                print(f"  scenario 8: {ceiling.DEFINITION}")
        print(f"  connections set up by: {opener}")
        if any(s.key == "1w" for s in scenarios):
            print(f"  scenario 1w publishers: {per_write}")
        print(
            f"  {len(scenarios)} scenario(s) x {args.runs} run(s): warm-up {args.warmup:g} s, "
            f"measuring {args.duration:g} s; JSON lines -> {out}"
        )
        with out.open("a") as sink:

            def keep(record: dict[str, Any], restarted: list[str]) -> None:
                if restarted:
                    record["restarted_before"] = restarted
                records.append(record)
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                print("  " + summary_line(record), flush=True)

            for scenario in scenarios:
                for run in range(args.runs):
                    if scenario.own_brokers and not args.broker:
                        for name in own_names:
                            restarted = settle(handles, pin)
                            record = run_fresh(
                                scenario, name, run, args, sizes, pin, suite, version
                            )
                            keep(record, restarted)
                        continue
                    for i, handle in enumerate(handles):
                        if scenario.own_brokers and handle.name != "ours":
                            continue  # with --broker, scenario 8 gets a fresh Mosquitto below
                        if br.is_variant(handle.name) and handle.name not in scenario.variants:
                            continue  # measured in other scenarios only
                        restarted = settle(handles, pin)
                        handle = ready(handles, i, scenario, pin)
                        record = run_one(scenario, handle, run, args, sizes, pin, suite)
                        if record.get("broker_crashed"):
                            handle.crashes += 1
                            print(
                                f"  !! {handle.name} crashed; log tail:\n{record['broker_log_tail']}",
                                file=sys.stderr,
                            )
                        keep(record, restarted)
                    if scenario.own_brokers and mosquitto:
                        restarted = settle(handles, pin)
                        record = run_fresh(
                            scenario, "mosquitto", run, args, sizes, pin, suite, version
                        )
                        keep(record, restarted)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        for h in handles:
            h.stop()
        shutil.rmtree(build_dir, ignore_errors=True)

    print()
    print(table(records, sizes))
    print("  * lower is better; ratios are ours/peer of the medians; CPU % is of one core.")
    for line in floor_lines(records):
        print(line)
    for line in ceiling.lines(records, sizes.persist_publishers):
        print(line)
    print(f"  results: {out}")
    bad = [(r, p) for r in records for p in problems(r)]
    missing = {s.key for s in scenarios} - {r["scenario"] for r in records}
    for record, problem in bad:
        print(
            f"  FAILED {record['scenario']} {record['broker']} run {record['run']}: {problem}",
            file=sys.stderr,
        )
    if missing:
        print(f"  not run: {', '.join(sorted(missing))}", file=sys.stderr)
    return 1 if bad or missing else 0
