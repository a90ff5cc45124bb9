"""The benchmark suite keeps working: ``python -m benchmarks --smoke`` runs every scenario once,
briefly, against our broker (scenario 8 once per storage variant; scenario 5 also with busy
polling, and on the floor), and each delivers something.
No speed is asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.launcher import read_jsonl, run_module

REPO = Path(__file__).resolve().parents[2]

TIMEOUT = 300


def scenario_keys() -> set[str]:
    from benchmarks.scenarios import SCENARIOS

    return set(SCENARIOS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the generator reads /proc")
def test_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "smoke.jsonl"
    args = ("--smoke", "--no-mosquitto", "--device-rates", "20,40", "--out", str(out))
    try:
        proc = run_module("benchmarks", *args, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"benchmark smoke run took over {TIMEOUT} s: {exc.stdout!r} {exc.stderr!r}")
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report

    records = read_jsonl(out)
    assert {r["scenario"] for r in records} == scenario_keys(), report
    for record in records:
        key = f"scenario {record['scenario']} on {record['broker']}"
        assert record["broker"] in ("ours", "floor") or record["broker"].startswith("ours-"), report
        assert not record.get("error"), f"{key}: {record.get('error')}\n{report}"
        assert record.get("delivered", 0) > 0, f"{key} delivered nothing\n{report}"
    # Scenario 5 also runs on our broker with busy polling and on the floor, and only scenario
    # 5 does, each with its ratio to the floor.
    variants = {"ours-busy-poll", "floor"}
    tuned = {(r["scenario"], r["broker"]) for r in records if r["broker"] in variants}
    assert tuned == {("5", "ours-busy-poll"), ("5", "floor")}, report
    assert "ours/floor" in proc.stdout and "ours-busy-poll/floor" in proc.stdout, report
    # Scenario 8 runs on a fresh broker per storage variant, and the resumed subscriber gets
    # every message the broker accepted into its offline session.
    persistent = {r["broker"]: r for r in records if r["scenario"] == "8"}
    from benchmarks.cprograms import compiler

    publishers = "c" if compiler() else "python"
    header = "C publishers (" if publishers == "c" else "Python publishers ("
    assert f"scenario 8 generator: {header}" in proc.stdout, report
    # the thousands of connections of scenarios 6 and 7 are set up by the C opener likewise
    opener = "C opener (" if publishers == "c" else "Python epoll loop ("
    assert f"connections set up by: {opener}" in proc.stdout, report
    assert set(persistent) == {"ours-memory", "ours-normal", "ours-full"}, report
    for record in persistent.values():
        metrics = record["metrics"]
        assert metrics["accepted"] > 0 and metrics["resumed"] >= metrics["accepted"], report
        # its publishers run in processes of their own and time every PUBACK: the C program
        # wherever a C compiler is (tests/test_benchmark_c_publisher.py), and the header says so
        assert record["gen_processes"] == 4, report
        assert record["gen_publishers"] == publishers, report
        assert 0 < metrics["ack_p99_ms"] <= metrics["ack_max_ms"], report
    # ours-full measured its disk's fsync time, and the ceiling is printed under the table
    assert persistent["ours-full"]["fsync_ms"] > 0, report
    assert "fsync-bound ceiling 4 x 32" in proc.stdout, report
    # Scenario 9: both phases delivered, with the broker's CPU per 10,000 messages, at the
    # rates --device-rates asked for (the smoke run's 20 devices at 20 and 40 msg/s each).
    paced = next(r for r in records if r["scenario"] == "9")
    devices = paced["metrics"]
    assert "QoS1 @20/s + QoS0 @40/s" in paced["title"], report
    assert (devices["q1_offered_per_s"], devices["q0_offered_per_s"]) == (400, 800), report
    for phase in ("q1", "q0"):
        assert devices[f"{phase}_msgs_per_s"] > 0, report
        assert devices[f"{phase}_cpu_per_10k"] is not None, report  # 0 when under one tick
        # /proc found the broker's connections (its unread bytes may well be 0)
        assert devices[f"{phase}_unread"] is not None and devices[f"{phase}_unread"] >= 0, report
    # and what the devices cost it in memory, on a broker started for the scenario
    assert devices["rss_kb_per_device"] is not None and devices["rss_kb_per_device"] >= 0, report
    # Scenario 1w: one data segment per message (no two merged by the kernel).
    per_write_run = next(r for r in records if r["scenario"] == "1w")
    assert per_write_run["gen_publishers"] == publishers, report  # C where it builds
    header = "C publishers (" if publishers == "c" else "Python publishers ("
    assert f"scenario 1w publishers: {header}" in proc.stdout, report
    per_write = per_write_run["metrics"]
    assert per_write["segs_per_msg"] is None or 0.95 <= per_write["segs_per_msg"] <= 1.05, report
    assert "ours" in proc.stdout and "msg/s" in proc.stdout  # the table was printed
