"""Mutation testing of ``mqttbroker/protocol`` and ``mqttbroker/broker`` with mutmut, sampled so
that it runs in under an hour on two cores; see conformance/README.md ("Tests proven to fail").

    python -m conformance.mutation sample [--fraction 0.2] [--seed 15] > sample.txt
    mutmut run $(cat sample.txt)
    python -m conformance.mutation report [--only sample.txt]
    python -m conformance.mutation survivors [MODULE]

``sample`` reads ``mutmut results --all true`` (after ``mutmut run`` has generated the mutants and
been stopped, or for the mutants not yet checked) and prints a random, per-module share of the
unchecked ones. ``report`` prints, per module, the mutants checked, killed (a test failed, or it
timed out), survived and without tests, and the score: killed / (checked - equivalent).
``survivors`` lists the surviving and untested mutants that are not known to be equivalent.

Equivalent mutants (a change no test can see, because the code behaves the same) are listed in
``conformance/mutants-equivalent.txt``, one a line: the mutant's name, then after `` # `` the
reason. They are left out of the score and counted apart; a listed mutant that was killed is
reported as a stale entry (its function changed: review it again).
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys
from pathlib import Path

KILLED = ("killed", "timeout")
EQUIVALENT_FILE = Path(__file__).with_name("mutants-equivalent.txt")


def equivalent(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """The reviewed equivalent mutants: name -> reason."""
    listed: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(" # ")
        if not sep or not reason.strip():
            raise ValueError(f"{path}:{number}: expected 'NAME # reason', got {line!r}")
        listed[name.strip()] = reason.strip()
    return listed


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


def report(only: set[str] | None = None) -> None:
    """The score per module; ``only``: of these mutants alone (a sample's names)."""
    listed = equivalent()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stale = []
    for name, status in _results():
        if only is not None and name not in only:
            continue
        if name in listed and status in ("survived", "no tests"):
            status = "equivalent"
        elif name in listed and status != "not checked":
            stale.append(f"{name}: {status}")
        counts[module(name)][status] += 1
    total: collections.Counter[str] = collections.Counter()
    print(
        f"{'module':36} {'mutants':>7} {'checked':>7} {'killed':>6} {'survived':>8} "
        f"{'no tests':>8} {'equiv.':>6} {'score':>6}"
    )
    for mod in sorted(counts):
        c = counts[mod]
        total.update(c)
        _line(mod, c)
    _line("all", total)
    if stale:
        print("\nlisted as equivalent, yet killed (review again):\n  " + "\n  ".join(stale))


def _line(name: str, c: collections.Counter[str]) -> None:
    killed = sum(c[k] for k in KILLED)
    checked = killed + c["survived"] + c["no tests"] + c["equivalent"]
    scored = checked - c["equivalent"]
    score = f"{100 * killed / scored:.0f}%" if scored else "-"
    print(
        f"{name:36} {sum(c.values()):7} {checked:7} {killed:6} {c['survived']:8} "
        f"{c['no tests']:8} {c['equivalent']:6} {score:>6}"
    )


def survivors(prefix: str) -> list[str]:
    """The surviving and untested mutants (of modules starting with ``prefix``) not listed as
    equivalent."""
    listed = equivalent()
    return [
        f"{name}: {status}"
        for name, status in _results()
        if status in ("survived", "no tests") and name not in listed and name.startswith(prefix)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.mutation")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="print a per-module random share of unchecked mutants")
    s.add_argument("--fraction", type=float, default=0.2)
    s.add_argument("--seed", type=int, default=15)
    r = sub.add_parser("report", help="the score per module")
    r.add_argument("--only", metavar="FILE", help="of the mutants named in FILE (e.g. a sample)")
    v = sub.add_parser("survivors", help="surviving mutants not listed as equivalent")
    v.add_argument("module", nargs="?", default="", help="e.g. mqttbroker.broker.session")
    args = parser.parse_args(argv)
    if args.command == "sample":
        print("\n".join(sample(args.fraction, args.seed)))
    elif args.command == "survivors":
        print("\n".join(survivors(args.module)))
    else:
        only = None
        if args.only:
            with open(args.only, encoding="utf-8") as fh:
                only = set(fh.read().split())
        report(only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
