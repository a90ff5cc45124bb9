"""Scenario 8's fsync-bound ceiling for ``sync = "full"``.

With P publishers keeping W QoS 1 messages in flight each, a broker that acknowledges only what
is on disk can commit at most P x W messages at a time, and every commit waits for one fsync.
So no such broker acknowledges more than

    P x W / (fsync time + commit work)

messages per second on this machine. The runner measures the fsync time before each
``ours-full`` run in that run's data directory (:func:`fsync_cost`: write 4 KiB and fsync,
median of many), and takes as commit work what our broker needs for one batch of P x W
messages without a store: P x W / ours-memory's msg/s in the same run (zero when ours-memory
was not measured). ``ours-full`` is then shown as a fraction of that ceiling.

That commit work leaves out the store's own work (SQLite's inserts and deletes, done in its
thread on the broker's core), so it is the ceiling of a store that cost nothing. A second line
takes the commit work as measured with the store: P x W / ours-normal's msg/s, everything
``full`` does but the fsync. ``ours-full`` against that one says how much of the time it
waits for fsync beyond what the ceiling counts; against the first, how much the store's work
costs.

The probe also reports the processor time an fsync takes (the kernel's own work). The broker's
database thread spends it on the broker's core, which the event loop shares; the ceilings count
the whole fsync as waiting.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

from . import procfs

FSYNC_SAMPLES = 200
FSYNC_BYTES = 4096  # one SQLite page appended to the write-ahead log
TARGET = 0.80  # of the ceiling (issue 18)

DEFINITION = (
    "ceiling of ours-full = P x W / (fsync + commit work): fsync = write 4 KiB + fsync in the "
    f"run's data directory, median of {FSYNC_SAMPLES}; commit work = P x W / ours-memory's "
    "msg/s in this run"
)


def fsync_cost(
    directory: str, samples: int = FSYNC_SAMPLES, size: int = FSYNC_BYTES
) -> tuple[float, float]:
    """Median time to append ``size`` bytes to a file in ``directory`` and fsync it, and the
    median processor time the calling thread spends on it (the kernel's work: the fsync of a
    commit is done on the database thread, on the broker's core)."""
    block = os.urandom(size)
    fd, path = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    times = []
    cpu = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            c0 = time.thread_time()
            os.write(fd, block)
            os.fsync(fd)
            cpu.append(time.thread_time() - c0)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times), statistics.median(cpu)


def probe(directory: str) -> dict[str, Any]:
    """What the runner adds to an ours-full record: fsync_ms, fsync_cpu_ms and the filesystem
    it was on."""
    seconds, cpu = fsync_cost(directory)
    return {
        "fsync_ms": round(seconds * 1000, 4),
        "fsync_cpu_ms": round(cpu * 1000, 4),
        "fsync_fs": procfs.filesystem(directory),
    }


def ceiling(publishers: int, window: int, fsync_s: float, commit_s: float) -> float:
    """P x W / (fsync time + commit work), in messages per second."""
    return publishers * window / (fsync_s + commit_s)


def commit_work(publishers: int, window: int, memory_rate: float | None) -> float:
    """Our broker's time for one batch of P x W messages without a store (0 if unknown)."""
    return publishers * window / memory_rate if memory_rate else 0.0


def _median(records: list[dict[str, Any]], broker: str, key: str) -> float | None:
    values = [
        (r.get("metrics") or {}).get(key, r.get(key))
        for r in records
        if r["scenario"] == "8" and r["broker"] == broker and not r.get("error")
    ]
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None


def lines(records: list[dict[str, Any]], publishers: int) -> list[str]:
    """The ceiling under scenario 8's table, from the medians of the runs; nothing when no
    ours-full run measured its fsync time."""
    fsync_ms = _median(records, "ours-full", "fsync_ms")
    if fsync_ms is None:
        return []
    fsync_cpu_ms = _median(records, "ours-full", "fsync_cpu_ms")
    windows = [r["window"] for r in records if r["scenario"] == "8" and r.get("window")]
    window = min(windows) if windows else 0
    if not window:
        return []
    memory = _median(records, "ours-memory", "msgs_per_s")
    full = _median(records, "ours-full", "msgs_per_s")
    work = commit_work(publishers, window, memory)
    top = ceiling(publishers, window, fsync_ms / 1000, work)
    fs = next(
        (r.get("fsync_fs") for r in records if r["broker"] == "ours-full" and r.get("fsync_fs")),
        None,
    )
    where = f" on {fs}" if fs else ""
    work_text = (
        f"{work * 1000:.3f} ms = {publishers} x {window} / ours-memory's {memory:,.0f} msg/s"
        if memory
        else "0 (ours-memory not measured)"
    )
    cpu_text = f", {fsync_cpu_ms:.3f} ms of it processor time" if fsync_cpu_ms is not None else ""
    out = [
        f"  8: fsync {fsync_ms:.3f} ms{cpu_text} (write {FSYNC_BYTES // 1024} KiB + fsync, median "
        f"of {FSYNC_SAMPLES}, in ours-full's data directory{where}); commit work {work_text}",
        f"  8: fsync-bound ceiling {publishers} x {window} / ({fsync_ms:.3f} + {work * 1000:.3f} ms)"
        f" = {top:,.0f} msg/s",
    ]
    if full is not None:
        out.append(
            f"  8: ours-full {full:,.0f} msg/s = {full / top:.2f}x of the ceiling "
            f"(target >= {TARGET:.2f}x)"
        )
    normal = _median(records, "ours-normal", "msgs_per_s")
    if normal:
        stored = commit_work(publishers, window, normal)
        top_stored = ceiling(publishers, window, fsync_ms / 1000, stored)
        line = (
            f"  8: with the store's work (commit work {stored * 1000:.3f} ms = {publishers} x "
            f"{window} / ours-normal's {normal:,.0f} msg/s): ceiling {top_stored:,.0f} msg/s"
        )
        if full is not None:
            line += f", ours-full at {full / top_stored:.2f}x of it"
        out.append(line)
    return out
