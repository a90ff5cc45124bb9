"""The load generator process: runs one scenario against HOST:PORT and prints one JSON object.

    python -m benchmarks.generator '{"scenario": "1", "host": "127.0.0.1", "port": 1883, ...}'

The runner starts one per measured run (pinned to its own core with taskset), so every run starts
from a fresh process. It runs on uvloop when installed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from dataclasses import fields
from typing import Any

from . import client, procfs, tlscerts
from .scenarios import SCENARIOS, Ctx, Sizes, run


def _sizes(raw: dict[str, Any] | None) -> Sizes:
    sizes = Sizes()
    for f in fields(Sizes):
        if raw and f.name in raw:
            setattr(sizes, f.name, type(getattr(sizes, f.name))(raw[f.name]))
    return sizes


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    scenario = SCENARIOS[spec["scenario"]]
    tls = spec.get("tls")
    if tls:
        client.TLS_CONTEXT = tlscerts.client_context(tls["ca"], tls["version"])
    ctx = Ctx(
        host=spec["host"],
        port=int(spec["port"]),
        version=int(spec.get("version", 5)),
        warmup=float(spec.get("warmup", 1.0)),
        duration=float(spec.get("duration", 5.0)),
        broker_pid=spec.get("broker_pid"),
        run_id=str(spec.get("run_id", "0")),
        sizes=_sizes(spec.get("sizes")),
        sub_port=spec.get("sub_port"),
        c_publisher=spec.get("c_publisher"),
        c_opener=spec.get("c_opener"),
        c_one_per_write=spec.get("c_one_per_write"),
        tls=tls,
        c_tls_opener=spec.get("c_tls_opener"),
    )
    return await run(scenario, ctx)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    procfs.raise_fd_limit()
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
        loop_name = "asyncio"
    else:
        runner = uvloop.run
        loop_name = "uvloop"
    try:
        result = runner(_main(spec))
    except BaseException as exc:  # report, do not hang the runner
        traceback.print_exc(file=sys.stderr)
        result = {"error": f"{type(exc).__name__}: {exc}"}
        code = 1
    else:
        code = 0
    result["generator_loop"] = loop_name
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
