"""``python -m benchmarks.cluster`` keeps working: a short run of the QoS 1 scenario with every
message crossing nodes delivers, and Redis's command count per message is reported. No speed is
asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.launcher import read_jsonl, run_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.needs_redis
def test_cluster_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "cluster.jsonl"
    args = ("--smoke", "--scenarios", "3", "--setups", "cross-node", "--out", str(out))
    proc = run_module("benchmarks.cluster", *args, timeout=180)
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    (record,) = read_jsonl(out)
    assert record["setup"] == "cross-node" and not record.get("error"), report
    assert record["delivered"] > 0, report
    assert record["redis_ops_per_msg"] is not None and record["redis_ops"] > 0, report
