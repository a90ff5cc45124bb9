"""Mutation testing of ``mqttbroker/protocol`` and ``mqttbroker/broker`` with mutmut, sampled so
that it runs in under an hour on two cores; see conformance/README.md ("Tests proven to fail").

    python -m conformance.mutation sample [--fraction 0.2] [--seed 15] > sample.txt
    mutmut run $(cat sample.txt)
    python -m conformance.mutation report

``sample`` reads ``mutmut results --all true`` (after ``mutmut run`` has generated the mutants and
been stopped, or for the mutants not yet checked) and prints a random, per-module share of the
unchecked ones. ``report`` prints, per module, the mutants checked, killed (a test failed, or it
timed out), survived and without tests, and the score: killed / checked.
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys

KILLED = ("killed", "timeout")


def _results() -> list[tuple[str, str]]:
    out = subprocess.run(
        ["mutmut", "results", "--all", "true"], capture_output=True, text=True, check=True
    ).stdout
    rows = []
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            rows.append((name, status))
    return rows


def module(name: str) -> str:
    """``mqttbroker.broker.session.xǁSessionǁdeliver__mutmut_3`` -> ``mqttbroker.broker.session``
    (functions of a package's ``__init__`` come out as ``mqttbroker.protocol``)."""
    parts = name.split(".")
    return ".".join(parts[:2] if parts[2].startswith("x") else parts[:3])


def sample(fraction: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    pending: dict[str, list[str]] = collections.defaultdict(list)
    for name, status in _results():
        if status == "not checked":
            pending[module(name)].append(name)
    chosen: list[str] = []
    for names in pending.values():
        count = len(names) if len(names) <= 40 else max(1, int(len(names) * fraction))
        chosen += rng.sample(names, count)
    return chosen


def report() -> None:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, status in _results():
        counts[module(name)][status] += 1
    total: collections.Counter[str] = collections.Counter()
    print(
        f"{'module':36} {'mutants':>7} {'checked':>7} {'killed':>6} {'survived':>8} "
        f"{'no tests':>8} {'score':>6}"
    )
    for mod in sorted(counts):
        c = counts[mod]
        total.update(c)
        _line(mod, c)
    _line("all", total)


def _line(name: str, c: collections.Counter[str]) -> None:
    killed = sum(c[k] for k in KILLED)
    checked = killed + c["survived"] + c["no tests"]
    score = f"{100 * killed / checked:.0f}%" if checked else "-"
    print(
        f"{name:36} {sum(c.values()):7} {checked:7} {killed:6} {c['survived']:8} "
        f"{c['no tests']:8} {score:>6}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.mutation")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="print a per-module random share of unchecked mutants")
    s.add_argument("--fraction", type=float, default=0.2)
    s.add_argument("--seed", type=int, default=15)
    sub.add_parser("report", help="the score per module")
    args = parser.parse_args(argv)
    if args.command == "sample":
        print("\n".join(sample(args.fraction, args.seed)))
    else:
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
