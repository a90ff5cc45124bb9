"""examples/worker_pool.py: competing consumers on a $share subscription. With one worker crashing
right after a commit (before its PUBACK) and another killed mid-stream, every job is processed,
each exactly once by the handler's record, and the redelivered job is recognised as done."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import unique, wait_for
from support.example_programs import example, run_example

JOBS = 200


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=30) as connection:
        return connection.execute(sql).fetchall()


def test_killed_worker_jobs_processed_exactly_once(
    fresh_broker: Any, start_program: Callable[..., Any], tmp_path: Path
) -> None:
    db = tmp_path / "jobs.db"
    topic, group, run = unique("jobs"), unique("pool"), unique("run")
    common = (
        "--host",
        fresh_broker.host,
        "--port",
        str(fresh_broker.port),
        "--db",
        str(db),
        "--topic",
        topic,
        "--group",
        group,
    )

    def worker(name: str, *extra: str) -> Any:
        return example(
            start_program,
            "worker_pool.py",
            "worker",
            "--name",
            name,
            *common,
            "--session-expiry",
            "1",
            "--work-time",
            "0.01",
            *extra,
            ready=r"ready on (\S+):(\d+)",
        )

    crasher = worker("crasher", "--crash-after", "5")
    victim = worker("victim")
    worker("survivor")
    published = run_example(
        "worker_pool.py",
        "publish",
        *common,
        "--jobs",
        str(JOBS),
        "--run",
        run,
    )
    assert published.returncode == 0, published.stderr

    # Kill the victim mid-stream, once it has done a few jobs and the pool is far from done.
    wait_for(lambda: count(db, "worker = 'victim'") >= 5, "the victim's first jobs", 30)
    victim.proc.send_signal(signal.SIGKILL)
    assert count(db) < JOBS
    assert crasher.wait_exit() == 3, crasher.log_text()  # it crashed as told
    wait_for(lambda: count(db) >= JOBS, "every job processed", timeout=60)

    expected = {f"{run}-{n}" for n in range(JOBS)}
    processed = query(db, "SELECT job_id FROM processed")
    assert {job for (job,) in processed} == expected
    # The handler's record: every job had exactly one delivery that applied its effect.
    applied = query(
        db, "SELECT job_id, COUNT(*) FROM deliveries WHERE NOT duplicate GROUP BY job_id"
    )
    assert dict(applied) == dict.fromkeys(expected, 1)
    # The crasher's last job (committed, never acknowledged) came again to another worker,
    # which recognised it as done.
    [(crashed_job,)] = query(
        db, "SELECT job_id FROM processed WHERE worker = 'crasher' ORDER BY rowid DESC LIMIT 1"
    )
    again = query(db, f"SELECT worker, duplicate FROM deliveries WHERE job_id = '{crashed_job}'")
    assert ("crasher", 0) in again and any(
        worker != "crasher" and duplicate == 1 for worker, duplicate in again
    ), again
    assert {w for (w,) in query(db, "SELECT DISTINCT worker FROM processed")} == {
        "crasher",
        "victim",
        "survivor",
    }


def count(db: Path, where: str = "1") -> int:
    return int(query(db, f"SELECT COUNT(*) FROM processed WHERE {where}")[0][0])


def test_demo_runs_with_one_command(fresh_broker: Any) -> None:
    result = run_example(
        "worker_pool.py",
        "demo",
        "--host",
        fresh_broker.host,
        "--port",
        str(fresh_broker.port),
        "--jobs",
        "60",
        "--topic",
        unique("demo"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "60 of 60 jobs processed, each once" in result.stdout
    assert "killing worker w3 (SIGKILL) midway" in result.stderr
    assert "crashing after committing job" in result.stderr
