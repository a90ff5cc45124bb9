"""``--workers N``: N broker processes on one machine, sharing every listening port
(SO_REUSEPORT: the kernel spreads new connections over them), each a node of the cluster on the
configured Redis. The process started by the user only supervises: it starts the workers, passes
SIGINT, SIGTERM and SIGHUP on to them, and when one of them exits with an error stops the others
and exits with that status.

A worker is the same command line run again with ``MQTTBROKER_WORKER=<n>`` in its environment:
its node id is ``<node_id>-<n>``, its data directory ``<data_dir>/worker-<n>`` and its admin
server's port the configured one plus ``n`` (an HTTP port cannot be shared the way MQTT's are:
each request would reach a worker at random), so worker 0 keeps the port a single broker has.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from ..config import Config

WORKER = "MQTTBROKER_WORKER"
STOP_SECONDS = 15.0

log = logging.getLogger("mqttbroker")


def worker_index() -> int | None:
    """This process's worker number, or None when it is not a worker."""
    value = os.environ.get(WORKER)
    return None if value is None else int(value)


def as_worker(config: Config, index: int) -> None:
    """Make ``config`` that of worker ``index``."""
    config.cluster.node_id = f"{config.cluster.node_id}-{index}"
    config.data_dir = os.path.join(config.data_dir, f"worker-{index}")
    if config.admin.port:
        config.admin.port += index


def _die_with_parent() -> None:
    """In a worker (Linux): SIGTERM when the supervisor dies, however it dies (SIGKILL too),
    so that no worker outlives it holding the ports."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(argv: Sequence[str], config: Config, stop_requested: Sequence[int]) -> int:
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    for index in range(config.workers):
        env = dict(os.environ, **{WORKER: str(index)})
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "mqttbroker", *argv], env=env, preexec_fn=_die_with_parent
            )
        )
    log.info(
        "%d workers started (pids %s), nodes %s-0 to -%d%s",
        len(children),
        ", ".join(str(c.pid) for c in children),
        config.cluster.node_id,
        len(children) - 1,
        (
            f", admin servers on ports {config.admin.port} to "
            f"{config.admin.port + len(children) - 1} (worker n: {config.admin.port} + n)"
            if config.admin.port
            else ""
        ),
    )
    for requested in stop_requested:  # a stop asked for before the workers existed
        forward(requested, None)
    status = 0
    while True:
        running = [c for c in children if c.poll() is None]
        failed = [c for c in children if c.returncode not in (None, 0)]
        if failed and not status:
            code = int(failed[0].returncode)
            log.error(
                "worker pid %d exited with status %d: stopping the others", failed[0].pid, code
            )
            status = code if code > 0 else 1  # (killed by a signal: negative)
            forward(signal.SIGTERM, None)
            deadline = time.monotonic() + STOP_SECONDS
            for child in running:
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
        if not running:
            return status
        time.sleep(0.1)
