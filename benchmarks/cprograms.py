"""The benchmark's C programs (benchmarks/c/), compiled by the runner once per suite.

Each does, in C, a part of the generator that would otherwise make the generator, not the broker,
the limit: scenario 8's windowed publisher (``windowed_pub``, see benchmarks/windowed.py), the
setting up of thousands of connections (``open_many``, see benchmarks/client.py; over TLS
``open_many_tls``, linked with OpenSSL, see benchmarks/tls_fleet.py) and scenario 1w's
publishers (``one_per_write``, see benchmarks/devices.py). Every byte they send is encoded in
Python (benchmarks/wire.py). Without a C compiler, or when one fails, the
Python code that does the same runs instead, and the runner's header says which ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "c"
FLAGS = ("-O2",)
# What a program links with beyond libc (after its source, as the linker wants).
LIBS: dict[str, tuple[str, ...]] = {"open_many_tls": ("-lssl", "-lcrypto")}


def source(name: str) -> Path:
    return SOURCES / f"{name}.c"


def libs(name: str) -> tuple[str, ...]:
    """The libraries program ``name`` links with."""
    return LIBS.get(name, ())


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else cc, else gcc; None if none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def build(name: str, directory: str | Path) -> tuple[str | None, str]:
    """Compile ``c/<name>.c`` into ``directory``: (the program, how it was built) or (None,
    why not)."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc) found"
    src = source(name)
    binary = Path(directory) / name
    cmd = [cc, *FLAGS, "-o", str(binary), str(src), *libs(name)]
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    except subprocess.CalledProcessError as exc:
        cause = (exc.stderr.strip().splitlines() or [f"exit status {exc.returncode}"])[-1]
        return None, f"{Path(cc).name} failed on {src.name}: {cause}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{Path(cc).name} failed on {src.name}: {exc}"
    return str(binary), f"benchmarks/c/{src.name}, {Path(cc).name} {' '.join(FLAGS + libs(name))}"
