"""Statement coverage of the conformance suite.

    python -m conformance.coverage [--junit results.xml [--compare other.xml]] [--list]
                                   [pytest options...]

For MQTT 5.0 (``spec/mqtt5-normative.tsv``, tags ``[MQTT-x.y.z-n]``) and MQTT 3.1.1
(``spec/mqtt311-normative.tsv``, tags ``[MQTT311-x.y.z-n]``) it counts the statements of role
``server`` or ``both`` named in the docstring of at least one PASSING test and of no FAILING test,
three ways: covered (every test), spec-only (without the ``feature`` tests) and checkable here
(spec-only, leaving out what a test marked with the ``unchecked`` fixture: statements this broker
gave it nothing to check). With ``--compare`` it also reports the statements both brokers can be
held to, and each one's score. Skipped tests count for nothing; statements listed in
``conformance/UNTESTED.md`` are reported separately and never counted.

With ``--junit FILE`` it reads a JUnit XML file written by ``pytest conformance --junitxml=FILE``
(the suite records each test's statements, and whether it is a feature test or left statements
unchecked, as testcase properties). Without it, it runs the suite itself (any other options,
e.g. ``--mosquitto`` or ``--broker HOST:PORT``, go to pytest) and records each test's outcome.
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
UNTESTED_311_ROW = re.compile(r"^\|\s*MQTT311-(\d+(?:\.\d+)*-\d+)\s*\|", re.M)
#: The statement lists (copies of the OASIS standards' Appendix B, see spec/README.md).
SPEC = HERE / "spec" / "mqtt5-normative.tsv"
SPEC_311 = HERE / "spec" / "mqtt311-normative.tsv"
SPECS = {"5.0": SPEC, "3.1.1": SPEC_311}


def load_statements(path: Path = SPEC) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return {row["id"]: row for row in csv.DictReader(fh, delimiter="\t")}


def untested_ids(version: str = "5.0") -> list[str]:
    """The IDs UNTESTED.md lists for ``version``: MQTT 5.0 rows ``| MQTT-... |``, 3.1.1 rows
    ``| MQTT311-... |``."""
    text = (HERE / "UNTESTED.md").read_text(encoding="utf-8")
    if version == "3.1.1":
        return ["MQTT-" + sid for sid in UNTESTED_311_ROW.findall(text)]
    return UNTESTED_ROW.findall(text)


@dataclass
class Result:
    outcome: str  # "passed", "failed" or "skipped"
    statements: list[str] = field(default_factory=list)  # MQTT 5.0 IDs
    statements311: list[str] = field(default_factory=list)  # MQTT 3.1.1 IDs
    unchecked: set[str] = field(default_factory=set)  # named, but nothing to check here
    feature: bool = False  # an optional capability (marker "feature"), not the spec

    def take(self, properties: list[tuple[str, Any]]) -> None:
        for name, value in properties:
            words = str(value or "").split()
            if name == "statements":
                self.statements = words
            elif name == "statements311":
                self.statements311 = words
            elif name == "unchecked":
                self.unchecked.update(words)
            elif name == "feature":
                self.feature = True

    def named(self, version: str) -> list[str]:
        return self.statements311 if version == "3.1.1" else self.statements


def from_junit(path: Path) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        result = Result(outcome)
        result.take([(p.get("name", ""), p.get("value")) for p in case.iter("property")])
        results[name] = result
    return results


class Recorder:
    """A pytest plugin keeping each test's outcome and statements."""

    def __init__(self) -> None:
        self.results: dict[str, Result] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        result = self.results.setdefault(report.nodeid, Result("passed"))
        result.take(report.user_properties)
        if report.failed or hasattr(report, "wasxfail"):
            result.outcome = "failed"
        elif report.skipped and result.outcome != "failed":
            result.outcome = "skipped"


def run_suite(pytest_args: list[str]) -> dict[str, Result]:
    import pytest

    recorder = Recorder()
    pytest.main([str(HERE), "-p", "no:cacheprovider", *pytest_args], plugins=[recorder])
    return recorder.results


@dataclass
class Figures:
    """One broker's figures for one statement list (all sets are of in-scope IDs)."""

    scope: set[str]
    covered: set[str]  # named by a passing test and by no failing test
    spec_only: set[str]  # the same, counting only tests that are not "feature" tests
    checkable: set[str]  # spec_only, counting only tests that did check them here
    checked: set[str]  # named by a non-feature test that ran and checked it (passed or failed)
    failing: dict[str, list[str]]
    only_skipped: set[str]
    unchecked: set[str]  # spec_only statements that no test could check on this broker
    gap: set[str]
    untested: set[str]


def figures(
    results: dict[str, Result], statements: dict[str, dict[str, str]], version: str
) -> Figures:
    scope = {sid for sid, row in statements.items() if row["role"] in ("server", "both")}
    untested = set(untested_ids(version))
    passing: dict[str, list[str]] = {}
    failing: dict[str, list[str]] = {}
    skipped: set[str] = set()
    spec_passing: set[str] = set()
    spec_failing: set[str] = set()
    checked_passing: set[str] = set()
    checked: set[str] = set()
    for name, result in results.items():
        for sid in result.named(version):
            if result.outcome == "skipped":
                skipped.add(sid)
                continue
            target = passing if result.outcome == "passed" else failing
            target.setdefault(sid, []).append(name)
            if result.feature:
                continue
            (spec_passing if result.outcome == "passed" else spec_failing).add(sid)
            if sid not in result.unchecked:
                checked.add(sid)
                if result.outcome == "passed":
                    checked_passing.add(sid)
    covered = (set(passing) - set(failing)) & scope - untested
    spec_only = (spec_passing - spec_failing) & scope - untested
    checkable = (checked_passing - spec_failing) & scope - untested
    named = set(passing) | set(failing) | skipped
    return Figures(
        scope=scope,
        covered=covered,
        spec_only=spec_only,
        checkable=checkable,
        checked=checked & scope - untested,
        failing={sid: names for sid, names in failing.items() if sid in scope},
        only_skipped=(skipped - set(passing) - set(failing)) & scope,
        unchecked=spec_only - checkable,
        gap=scope - named - untested,
        untested=untested & scope,
    )


def _ids(ids: set[str] | list[str]) -> str:
    return " ".join(sorted(ids, key=_order))


def _pct(part: int, whole: int) -> str:
    return f"{part} / {whole} = {100 * part / whole:.1f}%" if whole else "0 / 0"


def report(
    results: dict[str, Result],
    statements: dict[str, dict[str, str]],
    listing: bool,
    version: str = "5.0",
) -> int:
    f = figures(results, statements, version)
    counts = {
        k: sum(r.outcome == k for r in results.values()) for k in ("passed", "failed", "skipped")
    }
    total = len(f.scope)
    print()
    print(f"MQTT {version} conformance coverage (statements of role server or both)")
    print(
        f"  tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    )
    print(
        f"  covered: {_pct(len(f.covered), total)}"
        "  (named by a passing test and by no failing test, optional features included)"
    )
    print(f"  spec-only: {_pct(len(f.spec_only), total)}  (the same without the feature tests)")
    print(
        f"  checkable here: {_pct(len(f.checkable), total)}  (spec-only, counting a test only "
        "for the statements it could fail on with this broker)"
    )
    if f.unchecked:
        print(f"    spec-only but not checkable here ({len(f.unchecked)}): {_ids(f.unchecked)}")
    failing_ids = sorted(set(f.failing) - f.untested, key=_order)
    if failing_ids:
        print(f"  not counted, a test naming them fails ({len(failing_ids)}):")
        for sid in failing_ids:
            names = ", ".join(n.split("::")[-1] for n in f.failing[sid])
            print(f"    {sid}: {names}")
    if f.only_skipped:
        print(f"  only in skipped tests ({len(f.only_skipped)}): {_ids(f.only_skipped)}")
    print(f"  listed as untested ({len(f.untested)}): {_ids(f.untested)}")
    if f.gap:
        print(f"  neither named by a test nor listed as untested ({len(f.gap)}): {_ids(f.gap)}")
    if listing:
        for title, ids in (("spec-only", f.spec_only), ("checkable here", f.checkable)):
            print(f"  {title}:")
            for sid in sorted(ids, key=_order):
                print(f"    {sid}\t{statements[sid]['summary']}")
    return 0


def compare(
    ours: dict[str, Result],
    theirs: dict[str, Result],
    statements: dict[str, dict[str, str]],
    listing: bool,
    version: str = "5.0",
) -> int:
    """The statements both brokers can be held to (a non-feature test checked them on each),
    and how many of those each passes."""
    a = figures(ours, statements, version)
    b = figures(theirs, statements, version)
    both = a.checked & b.checked
    print()
    print(f"MQTT {version}, compared: {len(both)} statements checkable on both brokers")
    print(f"  first  (--junit):   {_pct(len(a.checkable & both), len(both))}")
    print(f"  second (--compare): {_pct(len(b.checkable & both), len(both))}")
    print(f"  failed by the first only: {_ids((both & b.checkable) - a.checkable) or '-'}")
    print(f"  failed by the second only: {_ids((both & a.checkable) - b.checkable) or '-'}")
    if listing:
        print(f"  compared statements: {_ids(both)}")
    return 0


def _order(sid: str) -> list[int]:
    return [int(part) for part in re.findall(r"\d+", sid)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.coverage",
        description="Statement coverage of the conformance suite; other options go to pytest.",
    )
    parser.add_argument("--junit", metavar="FILE", help="read outcomes from a JUnit XML file")
    parser.add_argument(
        "--compare",
        metavar="FILE",
        help="another broker's JUnit XML file (e.g. Mosquitto's): also report the statements "
        "both can be held to, with both scores",
    )
    parser.add_argument("--list", action="store_true", help="also list the covered statements")
    args, rest = parser.parse_known_args(argv)
    results = from_junit(Path(args.junit)) if args.junit else run_suite(rest)
    other = from_junit(Path(args.compare)) if args.compare else None
    for version, path in SPECS.items():
        statements = load_statements(path)
        report(results, statements, args.list, version)
        if other is not None:
            report(other, statements, args.list, version)
            compare(results, other, statements, args.list, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
