"""The conformance chapters that cross nodes most (publish/subscribe, QoS flows, sessions and
takeover, shared subscriptions) against a two-node cluster, every test's clients spread over
both nodes (``--cluster auto``; the whole suite: ``pytest conformance --cluster auto``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.external_tools import program

ROOT = Path(__file__).resolve().parent.parent.parent
CHAPTERS = ("test_02_subpub.py", "test_03_qos.py", "test_06_session.py", "test_11_shared.py")


@pytest.mark.needs_redis
def test_conformance_chapters_pass_against_a_two_node_cluster() -> None:
    program("redis-server")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--cluster", "auto"]
        + [f"conformance/{name}" for name in CHAPTERS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
