#!/usr/bin/env python3
"""A pool of workers sharing a job queue: competing consumers on one MQTT 5 shared
subscription (``$share/<group>/<topic>``), each job processed at least once and its effect
applied exactly once.

- Each worker keeps a session (Clean Start 0, ``--session-expiry``) and acknowledges a job
  (PUBACK, paho's manual acknowledgement) only after its result is committed. A worker that dies
  before acknowledging leaves the job unacknowledged: the broker sends it again to the same
  worker if it comes back within the session expiry, or else to another worker of the group.
- The handler is idempotent: results go to SQLite keyed by the job id, in the same transaction
  that checks whether the job was done already. A job delivered again after it was committed is
  recognised and skipped, so a redelivery never applies its effect twice. Every delivery is
  logged (table ``deliveries``), duplicates included, so the record shows what happened.
- ``--prefetch`` (the Receive Maximum) bounds the jobs a worker holds unacknowledged.

    python examples/worker_pool.py demo           # 3 workers, 200 jobs, one killed midway

or, piece by piece:

    python examples/worker_pool.py worker --name w1 --db jobs.db   # as many as you like
    python examples/worker_pool.py publish --jobs 100
    python examples/worker_pool.py report --db jobs.db
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger("worker_pool")

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (
    job_id TEXT PRIMARY KEY, worker TEXT NOT NULL, result INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (
    job_id TEXT NOT NULL, worker TEXT NOT NULL, dup INTEGER NOT NULL,
    duplicate INTEGER NOT NULL, at REAL NOT NULL);
"""


def open_db(path: str) -> sqlite3.Connection:
    # Autocommit mode: transactions are the explicit BEGIN IMMEDIATE ... COMMIT below.
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    return db


# -- the worker ----------------------------------------------------------------------------


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name
        self.db = open_db(args.db)
        self.done = 0  # jobs this process committed
        self.filter = f"$share/{args.group}/{args.topic}"
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"worker-{args.group}-{args.name}",
            protocol=mqtt.MQTTv5,
            manual_ack=True,  # PUBACK only when we say so: after the commit
        )
        self.client.on_connect = self.on_connect
        self.client.on_subscribe = self.on_subscribe
        self.client.on_message = self.on_message

    def run(self) -> None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = self.args.session_expiry
        properties.ReceiveMaximum = self.args.prefetch
        self.client.connect(
            self.args.host, self.args.port, keepalive=30, clean_start=False, properties=properties
        )
        self.client.loop_forever()

    def stop(self) -> None:
        self.client.disconnect()

    def on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any
    ) -> None:
        if reason_code.is_failure:
            log.error("worker %s: connection refused: %s", self.name, reason_code)
            client.disconnect()
        elif flags.session_present:  # the broker kept our subscription and unacknowledged jobs
            self.ready()
        else:
            client.subscribe(self.filter, qos=1)

    def on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any
    ) -> None:
        if any(code.is_failure for code in reason_codes):
            log.error("worker %s: subscription refused: %s", self.name, reason_codes)
            client.disconnect()
        else:
            self.ready()

    def ready(self) -> None:
        log.info(
            "worker %s ready on %s:%d (%s)", self.name, self.args.host, self.args.port, self.filter
        )

    def on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            job = json.loads(message.payload)
            job_id, number = str(job["id"]), int(job["n"])
        except (ValueError, KeyError, TypeError):
            log.warning("worker %s: not a job, dropped: %r", self.name, message.payload[:100])
        else:
            self.handle(job_id, number, message.dup)
        client.ack(message.mid, message.qos)

    def handle(self, job_id: str, number: int, dup: bool) -> None:
        """Apply the job's effect once: a job already in ``processed`` is not done again, and the
        result is inserted only if no one inserted it meanwhile, in the transaction that logs
        the delivery."""
        duplicate = (
            self.db.execute("SELECT 1 FROM processed WHERE job_id = ?", (job_id,)).fetchone()
            is not None
        )
        result = 0
        if not duplicate:
            time.sleep(self.args.work_time)  # the work itself, outside the transaction
            result = number * number
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if not duplicate:
                duplicate = (
                    self.db.execute(
                        "INSERT OR IGNORE INTO processed VALUES (?, ?, ?, ?)",
                        (job_id, self.name, result, now),
                    ).rowcount
                    == 0
                )
            self.db.execute(
                "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?)",
                (job_id, self.name, int(dup), int(duplicate), now),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if duplicate:
            log.info("worker %s: job %s was done already, acknowledged again", self.name, job_id)
            return
        self.done += 1
        if self.done == self.args.crash_after:
            log.warning(
                "worker %s: crashing after committing job %s, before its PUBACK", self.name, job_id
            )
            os._exit(3)


def worker(args: argparse.Namespace) -> int:
    pool_worker = Worker(args)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: pool_worker.stop())
    pool_worker.run()
    log.info("worker %s stopped after %d jobs", args.name, pool_worker.done)
    return 0


# -- the producer --------------------------------------------------------------------------


def publish(args: argparse.Namespace) -> int:
    run = args.run or uuid.uuid4().hex[:8]
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(args.host, args.port)
    client.loop_start()
    try:
        sent = [
            client.publish(args.topic, json.dumps({"id": f"{run}-{n}", "n": n}), qos=1)
            for n in range(args.jobs)
        ]
        for info in sent:  # PUBACK: the broker has the job
            info.wait_for_publish(timeout=30)
    finally:
        client.disconnect()
        client.loop_stop()
    log.info(
        "published %d jobs (ids %s-0 to %s-%d) to %s",
        args.jobs,
        run,
        run,
        args.jobs - 1,
        args.topic,
    )
    return 0


# -- reading the record --------------------------------------------------------------------


def summary(path: str) -> dict[str, Any]:
    db = open_db(path)
    try:
        per_worker = dict(
            db.execute("SELECT worker, COUNT(*) FROM processed GROUP BY worker ORDER BY worker")
        )
        (jobs,) = db.execute("SELECT COUNT(*) FROM processed").fetchone()
        (deliveries,) = db.execute("SELECT COUNT(*) FROM deliveries").fetchone()
        (duplicates,) = db.execute("SELECT COUNT(*) FROM deliveries WHERE duplicate").fetchone()
    finally:
        db.close()
    return {
        "jobs": jobs,
        "deliveries": deliveries,
        "duplicates_skipped": duplicates,
        "per_worker": per_worker,
    }


def report(args: argparse.Namespace) -> int:
    print(json.dumps(summary(args.db), indent=2))
    return 0


# -- the demonstration ---------------------------------------------------------------------


def relay(stream: Any) -> None:
    for line in stream:
        sys.stderr.write(line)


def demo(args: argparse.Namespace) -> int:
    """Start a pool, give it jobs, kill one worker midway (another crashes on its own right
    after a commit), wait until every job is done, and show the record."""
    folder = Path(tempfile.mkdtemp(prefix="worker-pool-"))
    db = args.db or str(folder / "jobs.db")
    base = [sys.executable, __file__]
    common = [
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--db",
        db,
        "--topic",
        args.topic,
        "--group",
        args.group,
        "--session-expiry",
        "2",
        "--work-time",
        "0.01",
    ]
    workers: dict[str, subprocess.Popen[str]] = {}
    for n in range(1, args.workers + 1):
        extra = ["--crash-after", "10"] if n == 1 else []
        name = f"w{n}"
        proc = subprocess.Popen(
            [*base, "worker", "--name", name, *common, *extra], stderr=subprocess.PIPE, text=True
        )
        workers[name] = proc
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for its ready line, then let it print on its own
            sys.stderr.write(line)
            if "ready on" in line:
                break
        threading.Thread(target=relay, args=(proc.stderr,), daemon=True).start()
    try:
        publish(argparse.Namespace(**{**vars(args), "run": None}))
        victim = f"w{args.workers}"
        deadline = time.monotonic() + 120
        killed = False
        while time.monotonic() < deadline:
            state = summary(db)
            if not killed and state["per_worker"].get(victim, 0) >= args.jobs // (3 * args.workers):
                log.warning("demo: killing worker %s (SIGKILL) midway", victim)
                workers[victim].kill()
                killed = True
            if state["jobs"] >= args.jobs:
                break
            time.sleep(0.2)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in workers.values():
            proc.wait(10)
    state = summary(db)
    print(json.dumps(state, indent=2))
    print(
        f"{state['jobs']} of {args.jobs} jobs processed, each once; "
        f"{state['duplicates_skipped']} redelivered job(s) recognised and skipped "
        f"(the record: {db})"
    )
    return 0 if state["jobs"] == args.jobs else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--host", default="127.0.0.1")
        sub.add_argument("--port", type=int, default=1883)
        sub.add_argument("--topic", default="jobs", help="where jobs are published (default jobs)")
        sub.add_argument("--group", default="workers", help="shared subscription group")
        sub.add_argument("--db", default="jobs.db", help="the handler's SQLite record")
        return sub

    run = command("worker", "run one worker")
    run.add_argument("--name", required=True, help="unique in its group; its client id")
    run.add_argument(
        "--session-expiry",
        type=int,
        default=10,
        help="seconds the broker keeps a dead worker's jobs for it (default 10)",
    )
    run.add_argument("--prefetch", type=int, default=10, help="jobs held unacknowledged")
    run.add_argument("--work-time", type=float, default=0.0, help="seconds each job takes")
    run.add_argument(
        "--crash-after",
        type=int,
        default=0,
        help="exit abruptly after committing this many jobs, before the PUBACK",
    )
    send = command("publish", "publish jobs")
    send.add_argument("--jobs", type=int, default=100)
    send.add_argument("--run", default="", help="prefix of the job ids (default: random)")
    command("report", "print the record")
    show = command("demo", "a pool of workers, one of them killed midway")
    show.add_argument("--workers", type=int, default=3)
    show.add_argument("--jobs", type=int, default=200)
    show.set_defaults(db="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "demo" and args.workers < 3:
        sys.exit("demo: --workers must be at least 3 (one crashes, one is killed)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        return {"worker": worker, "publish": publish, "report": report, "demo": demo}[args.command](
            args
        )
    except OSError as error:  # the broker is not there
        sys.exit(f"cannot connect to {args.host}:{args.port}: {error.strerror or error}")


if __name__ == "__main__":
    sys.exit(main())
