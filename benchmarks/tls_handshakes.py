"""TLS handshakes per second per core: ``python -m benchmarks.tls_handshakes`` (``--runs``,
``--seconds``, ``--keys ec,rsa``, ``--versions 1.3,1.2``, ``--no-mosquitto``, ``--out``).

For each server key (ECDSA P-256, RSA 2048; benchmarks/tlscerts.py) it starts our broker with one
TLS listener and Mosquitto with the same certificate (brokers.py, both pinned to core 0, the
one not measured idle), and runs ``openssl s_time`` (pinned to core 1) against each in turn, run
by run (a drift of the machine's speed over the suite falls on both alike), for every TLS
version, with session resumption off (``-new``: a full handshake per connection) and on (``-reuse``: the session of the
first connection offered again each time; ``resumed`` is the share the server did resume, from
s_time's ``r``/``*`` marks: with TLS 1.3 a server whose session ticket is not sent with its last
handshake flight resumes nothing, as s_time closes right after the handshake). s_time connects,
completes the handshake, and closes: no MQTT is spoken. It waits for each handshake before the next, so the
client, not the broker, sets the pace: the figure is the broker's CPU per handshake (the schedstat
of its threads over the run, divided by the handshakes s_time counted), and
handshakes per second per core is one second over it. Medians of the runs; one JSON line per run
in ``benchmarks/results/tls-handshakes-<time>.jsonl``."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import brokers as br
from . import procfs, tlscerts

RESULTS = Path(__file__).resolve().parent / "results"


def s_time(
    port: int, version: str, reuse: bool, seconds: float, pin: bool
) -> tuple[int, float, float | None]:
    """Handshakes s_time completed, the seconds it took, and with ``reuse`` the share of them
    resumed."""
    cmd = ["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-time", f"{seconds:g}"]
    cmd += ["-tls1_3" if version == "1.3" else "-tls1_2", "-reuse" if reuse else "-new"]
    out = subprocess.run(
        br.pinned(br.GENERATOR_CORE, cmd, pin),
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    ).stdout
    found = re.findall(r"(\d+) connections in (\d+) real seconds", out)
    if not found:
        raise RuntimeError(f"openssl s_time printed no count: {out[-300:]!r}")
    resumed = None
    if reuse:
        marks = out.rpartition("session id reuse")[2]
        new, again = marks.count("*"), marks.count("r")
        resumed = round(again / (new + again), 3) if new + again else None
    return int(found[-1][0]), float(found[-1][1]), resumed


def measure(
    handle: br.BrokerHandle, version: str, reuse: bool, seconds: float, pin: bool
) -> dict[str, Any]:
    handle.wait_idle(10.0)
    ns0 = procfs.threads_cpu_ns(handle.pid)
    count, real, resumed = s_time(handle.port, version, reuse, seconds, pin)
    ns1 = procfs.threads_cpu_ns(handle.pid)
    cpu = None if ns0 is None or ns1 is None else (ns1 - ns0) / 1e9
    return {
        "handshakes": count,
        "per_s": round(count / real, 1),
        "resumed": resumed,
        "broker_cpu_s": cpu,
        "cpu_us_per_handshake": round(cpu / count * 1e6, 1) if cpu and count else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tls_handshakes")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="s_time's run (default 4)")
    p.add_argument("--keys", default="ec,rsa")
    p.add_argument("--versions", default="1.3,1.2")
    p.add_argument("--no-mosquitto", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out")
    args = p.parse_args(argv)
    pin = br.pinning_available() and not args.no_pin
    suite = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / f"tls-handshakes-{suite}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[str, str, bool, str], list[dict[str, Any]]] = {}
    names = ["ours"] + ([] if args.no_mosquitto else ["mosquitto"])
    print(f"tls handshakes {suite}: openssl s_time, " + ("pinned" if pin else "no pinning"))
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tls_dir, out.open("a") as sink:
        for key in args.keys.split(","):
            br.TLS = tlscerts.make(tls_dir, key)
            handles: dict[str, br.BrokerHandle] = {}
            try:
                for name in names:
                    handles[name] = (
                        br.start_ours(pin) if name == "ours" else br.start_mosquitto(pin)
                    )
                for version in args.versions.split(","):
                    for reuse in (False, True):
                        for run in range(args.runs):
                            for name in names:  # run by run: a drift of the machine falls on both
                                m = measure(handles[name], version, reuse, args.seconds, pin)
                                record = {"key": key, "tls": version, "resumption": reuse}
                                record |= {"broker": name, "run": run + 1, **m}
                                sink.write(json.dumps(record) + "\n")
                                rows.setdefault((key, version, reuse, name), []).append(m)
                                print(f"  {json.dumps(record)}", flush=True)
            finally:
                for handle in handles.values():
                    handle.stop()
    print(table(rows, names))
    print(f"  results: {out}")
    return 0


def _median(ms: list[dict[str, Any]], field: str) -> float | None:
    values = [m[field] for m in ms if m.get(field) is not None]
    return statistics.median(values) if values else None


def table(rows: dict[tuple[str, str, bool, str], list[dict[str, Any]]], names: list[str]) -> str:
    head = (
        "key  TLS  res."
        + "".join(f"{n[:4] + ' resumed':>13}" for n in names)
        + "".join(f"{n + ' us/hs':>18}{'hs/s/core':>11}" for n in names)
    )
    if len(names) == 2:
        head += "  ours/mosquitto (CPU per handshake)"
    lines = [head]
    for key, version, reuse in dict.fromkeys((k[0], k[1], k[2]) for k in rows):
        label = "on" if reuse else "off"
        cells = f"{key:<4} {version:<4} {label:<4}"
        for n in names:
            share = _median(rows.get((key, version, reuse, n), []), "resumed")
            cells += f"{'' if share is None else f'{share:.0%}':>13}"
        cpu = [
            _median(rows.get((key, version, reuse, n), []), "cpu_us_per_handshake") for n in names
        ]
        for us in cpu:
            cells += f"{us or 0:>18,.0f}{(1e6 / us) if us else 0:>11,.0f}"
        if len(cpu) == 2 and cpu[0] and cpu[1]:
            cells += f"  {cpu[0] / cpu[1]:.2f}x"
        lines.append(cells)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
