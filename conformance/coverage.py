"""Statement coverage of the conformance suite.

    python -m conformance.coverage [--junit results.xml] [--list] [pytest options...]

Counts the distinct statement IDs of role ``server`` or ``both`` in
``conformance/spec/mqtt5-normative.tsv`` (238 of them) that are named (``[MQTT-x.y.z-n]``) in the
docstring of at least one PASSING test and of no FAILING test. Skipped tests count for nothing;
statements listed in ``conformance/UNTESTED.md`` are reported separately and never counted.

With ``--junit FILE`` it reads a JUnit XML file written by ``pytest conformance --junitxml=FILE``
(the suite records each test's statements as the testcase property ``statements``). Without it,
it runs the suite itself (any other options, e.g. ``--mosquitto`` or ``--broker HOST:PORT``, go to
pytest) and records each test's outcome.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ID = re.compile(r"MQTT-\d+(?:\.\d+)*-\d+")
UNTESTED_ROW = re.compile(r"^\|\s*(MQTT-\d+(?:\.\d+)*-\d+)\s*\|", re.M)
#: The MQTT 5.0 statement list (a copy of the OASIS standard's Appendix B, see spec/README.md).
SPEC = HERE / "spec" / "mqtt5-normative.tsv"


def load_statements(path: Path = SPEC) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return {row["id"]: row for row in csv.DictReader(fh, delimiter="\t")}


def untested_ids(path: Path = HERE / "UNTESTED.md") -> list[str]:
    return UNTESTED_ROW.findall(path.read_text(encoding="utf-8")) if path.exists() else []


@dataclass
class Result:
    outcome: str  # "passed", "failed" or "skipped"
    statements: list[str] = field(default_factory=list)


def from_junit(path: Path) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        ids: list[str] = []
        for prop in case.iter("property"):
            if prop.get("name") == "statements":
                ids = (prop.get("value") or "").split()
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        results[name] = Result(outcome, ids)
    return results


class Recorder:
    """A pytest plugin keeping each test's outcome and statements."""

    def __init__(self) -> None:
        self.results: dict[str, Result] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        result = self.results.setdefault(report.nodeid, Result("passed"))
        ids = dict(report.user_properties).get("statements")
        if ids:
            result.statements = ids.split()
        if report.failed or hasattr(report, "wasxfail"):
            result.outcome = "failed"
        elif report.skipped and result.outcome != "failed":
            result.outcome = "skipped"


def run_suite(pytest_args: list[str]) -> dict[str, Result]:
    import pytest

    recorder = Recorder()
    pytest.main([str(HERE), "-p", "no:cacheprovider", *pytest_args], plugins=[recorder])
    return recorder.results


def report(results: dict[str, Result], statements: dict[str, dict[str, str]], listing: bool) -> int:
    scope = {sid for sid, row in statements.items() if row["role"] in ("server", "both")}
    passing: dict[str, list[str]] = {}
    failing: dict[str, list[str]] = {}
    skipped: dict[str, list[str]] = {}
    unknown: set[str] = set()
    for name, result in results.items():
        for sid in result.statements:
            if sid not in statements:
                unknown.add(sid)
            target = {"passed": passing, "failed": failing, "skipped": skipped}[result.outcome]
            target.setdefault(sid, []).append(name)
    covered = sorted((set(passing) - set(failing)) & scope, key=_order)
    untested = set(untested_ids())
    counts = {
        k: sum(r.outcome == k for r in results.values()) for k in ("passed", "failed", "skipped")
    }
    print()
    print("MQTT 5.0 conformance coverage (statements of role server or both)")
    print(
        f"  tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    )
    print(
        f"  covered: {len(covered)} / {len(scope)} = {100 * len(covered) / len(scope):.1f}%"
        "  (named by a passing test and by no failing test)"
    )
    failing_ids = sorted(set(failing) & scope, key=_order)
    if failing_ids:
        print(f"  not counted, a test naming them fails ({len(failing_ids)}):")
        for sid in failing_ids:
            names = ", ".join(n.split("::")[-1] for n in failing[sid])
            print(f"    {sid}: {names}")
    only_skipped = sorted((set(skipped) - set(passing) - set(failing)) & scope, key=_order)
    if only_skipped:
        print(f"  only in skipped tests ({len(only_skipped)}): {' '.join(only_skipped)}")
    listed = sorted(untested & scope, key=_order)
    print(f"  listed in conformance/UNTESTED.md ({len(listed)}): {' '.join(listed)}")
    named = set(passing) | set(failing) | set(skipped)
    gap = sorted(scope - named - untested, key=_order)
    if gap:
        print(f"  neither named by a test nor in UNTESTED.md ({len(gap)}): {' '.join(gap)}")
    both = sorted(untested & named, key=_order)
    if both:
        print(f"  WARNING: in UNTESTED.md and named by tests: {' '.join(both)}")
    if unknown:
        print(f"  WARNING: IDs not in the spec list: {' '.join(sorted(unknown))}")
    if listing:
        print("  covered statements:")
        for sid in covered:
            print(f"    {sid}\t{statements[sid]['summary']}")
    return 0


def _order(sid: str) -> list[int]:
    return [int(part) for part in re.findall(r"\d+", sid)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.coverage",
        description="Statement coverage of the conformance suite; other options go to pytest.",
    )
    parser.add_argument("--junit", metavar="FILE", help="read outcomes from a JUnit XML file")
    parser.add_argument("--list", action="store_true", help="also list the covered statements")
    parser.add_argument(
        "--spec", metavar="TSV", help=f"the statement list (default: {SPEC.relative_to(REPO)})"
    )
    args, rest = parser.parse_known_args(argv)
    statements = load_statements(Path(args.spec) if args.spec else SPEC)
    results = from_junit(Path(args.junit)) if args.junit else run_suite(rest)
    return report(results, statements, args.list)


if __name__ == "__main__":
    sys.exit(main())
