"""What may import what: the import-linter contracts of pyproject.toml ([tool.importlinter]) hold
for this tree. Each layer of the package imports only the layers below it (cli over server over
the cluster, ops and integrations, over security and storage, over config, over the broker's
core, over the protocol), packages of one layer do not import each other, and the modules of a
package do not import each other in a circle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree, not an installed copy
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            "--no-logo",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert " broken" in report and "0 broken" in report, report
