"""server/memory.py: the allocator's free memory given back once a burst of connections is
over (Trimmer, on the broker's periodic pass), and glibc's malloc_trim doing so."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from mqttbroker.server.memory import Trimmer, malloc_trim


def test_a_burst_is_trimmed_once_it_is_over_and_steady_churn_never() -> None:
    """The counts are the broker's CONNECT packets so far and its open connections, one pair
    per period: 64 connections come or gone since the last trim, then a period with fewer than
    16, trims; within the burst, or with 20 a period on end, it does not. A connection that
    comes and goes within a period counts twice."""
    trims: list[int] = []
    trimmer = Trimmer(lambda: trims.append(1), burst=64, quiet=16)
    ticks = [
        (0, 0),  # idle
        (70, 70),  # a burst: 70 came
        (70, 70),  # over: trim
        (70, 70),  # idle again: nothing to give back
        (75, 75),  # a few: 5 since the trim
        (75, 0),  # all 75 leave at once: 80 since the trim, but 75 in this period
        (75, 0),  # over: trim
    ]
    done = [trimmer.tick(connects, open_) for connects, open_ in ticks]
    assert done == [False, False, True, False, False, False, True]
    # 5 come and go a period (10 < 16: quiet): a trim every 7 periods (70)
    steady = [trimmer.tick(75 + 5 * i, 0) for i in range(1, 20)]
    assert [i for i, done in enumerate(steady, 1) if done] == [7, 14]
    busy = Trimmer(lambda: trims.append(1), burst=64, quiet=16)
    assert not any(busy.tick(20 * i, 20 * i) for i in range(1, 50))  # 20 a period: never
    assert not any(busy.tick(980 + 10 * i, 0) for i in range(1, 50))  # 10 come and go: never
    assert len(trims) == trimmer.trims == 4


def test_without_malloc_trim_nothing_is_done() -> None:
    trimmer = Trimmer(None)
    assert not trimmer.tick(1000, 1000) and not trimmer.tick(1000, 1000)
    assert trimmer.trims == 0


PROBE = textwrap.dedent(
    """
    import sys
    from mqttbroker.server.memory import malloc_trim

    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

    # 64 MiB of 4 KiB chunks from malloc (bytes past pymalloc's 512), every 16th kept: once
    # the rest is freed, the kept ones pin the heap's top and free() gives nothing back
    chunks = [bytes(4000) for _ in range(16384)]
    kept = chunks[::16]
    del chunks
    before = rss()
    if sys.argv[1] == "trim":
        malloc_trim()
    print(before - rss(), len(kept))
    """
)


def test_malloc_trim_gives_back_the_pages_of_free_chunks_between_kept_ones() -> None:
    """What a storm leaves (freed chunks between lasting ones) stays resident until
    malloc_trim; then at least half of it goes. Run in a process of its own."""
    assert malloc_trim is not None  # glibc (Linux)

    def given_back(how: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, how], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[0])

    assert given_back("keep") < 4 * 1024  # KiB: free() alone gave (nearly) nothing back
    assert given_back("trim") > 30 * 1024  # of the 60 MiB freed
