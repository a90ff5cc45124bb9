"""The chaos run's short form against our cluster (benchmarks/chaos.py --short): three nodes on
a Redis with ``appendfsync always``, behind HAProxy, 20 devices with persistent sessions
publishing QoS 1 and QoS 2 to each other for 80 s while the nemesis kills, stops and
disconnects nodes and Redis. Nothing acknowledged may be lost, no QoS 2 message delivered
twice, no message of a publisher delivered out of order, no client id served by two nodes at
once, and every kind of nemesis must really have acted. Durations (the longest time a device
could not connect) are reported, not asserted. About 2 minutes.

Part of the default run; marked ``chaos`` so that ``pytest -m 'not chaos'`` can leave it out
for a quick run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
TIMEOUT = 300
KINDS = ("kill_node", "pause_node", "restart_redis", "kill_redis", "drop_node")


@pytest.mark.chaos
@pytest.mark.needs_redis
@pytest.mark.needs_haproxy
def test_chaos_short_form_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.chaos", "--short", "--seed", "1"]
            + ["--out", str(out), "--workdir", str(tmp_path / "work")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the chaos run took over {TIMEOUT} s: {exc.stdout!r} {exc.stderr!r}")
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())

    # The run did something: messages acknowledged and delivered, and each nemesis acted.
    assert result["acknowledged_qos1"] > 0 and result["acknowledged_qos2"] > 0, report
    assert result["deliveries"] > 0, report
    for kind in KINDS:
        assert result["nemesis"].get(kind, {}).get("done", 0) >= 1, f"{kind} never acted\n{report}"

    # The goals.
    assert result["lost"] == 0, report
    assert result["qos2_duplicates"] == 0, report
    assert result["order_violations"] == 0, report
    assert result["double_owners"] == 0, report
    assert proc.returncode == 0, report
