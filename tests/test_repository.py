"""The repository stands on its own: a fresh clone has everything its tests and documents use."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A path to the "shared" directory beside the repository, or into it.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w$])shared/(?:spec|DESIGN|hooks)\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = []
    for name in names:
        path = ROOT / name
        if path.is_file() and "node_modules" not in path.parts:
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            files.append(path)
    return files


def test_nothing_points_outside_the_repository() -> None:
    """No document, code or test reads or cites a file beside the repository."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_statement_lists_are_in_the_repository() -> None:
    """The conformance suite's statement lists are data of the repository, with their origin."""
    from conformance.coverage import SPEC, load_statements

    assert SPEC.is_relative_to(ROOT)
    assert len(load_statements()) == 251
    assert len(load_statements(SPEC.with_name("mqtt311-normative.tsv"))) == 141
    assert "OASIS" in (SPEC.parent / "README.md").read_text(encoding="utf-8")


def test_license_is_the_one_pyproject_names() -> None:
    """LICENSE holds the full Apache License 2.0, as pyproject.toml declares, with the
    project's copyright line."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("Copyright 2026 the mqttbroker authors\n")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
    assert "9. Accepting Warranty or Additional Liability." in text


def test_no_two_test_modules_share_a_basename() -> None:
    """pytest imports the test modules under tests/ by their basename (they are not in packages):
    two of one name cannot be collected in one run, which only the whole suite shows."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, clashes
