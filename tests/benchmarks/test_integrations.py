"""The integration benchmark keeps working: ``python -m benchmarks.integrations --smoke`` runs
each scenario once, briefly (bridges: ours and Mosquitto's, QoS 0 and 1; webhooks), and each
delivers something. No speed is asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.external_tools import find
from support.launcher import read_jsonl, run_module

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300


@pytest.mark.needs_mosquitto
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the generator reads /proc")
def test_integrations_benchmark_smoke(tmp_path: Path) -> None:
    if find("mosquitto") is None:
        pytest.skip("mosquitto not installed: apt-get install mosquitto")
    out = tmp_path / "smoke.jsonl"
    proc = run_module("benchmarks.integrations", "--smoke", "--out", str(out), timeout=TIMEOUT)
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    records = read_jsonl(out)
    seen = {(r["scenario"], r["broker"]) for r in records}
    assert seen == {
        ("bridge QoS 0", "ours"),
        ("bridge QoS 0", "mosquitto"),
        ("bridge QoS 1", "ours"),
        ("bridge QoS 1", "mosquitto"),
        ("webhook QoS 1", "ours"),
    }, report
    for record in records:
        assert not record.get("error") and record["count"] > 0, report
