"""``--workers N``: the workers share the MQTT port and behave as one broker; an HTTP port cannot
be shared that way, so worker n serves its admin on the configured port plus n, and a normal
start logs no error; more than one worker needs a cluster."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from support.clients import unique, wait_for
from support.cluster_clients import client, close_all, subscriber
from support.launcher import free_port, free_ports
from support.redis_server import RedisServer

pytestmark = pytest.mark.needs_redis


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        return int(response.status)


def start_workers(
    start_broker: Callable[..., Any], redis_server: RedisServer, port: int, *args: str
) -> tuple[Any, str]:
    """Two workers of node ``w`` on MQTT port ``port`` (``args``: more of the command line):
    their supervisor, and the line it logs once they started."""
    supervisor = start_broker(
        extra_args=(
            *("--cluster", redis_server.url, "--node-id", "w", "--workers", "2"),
            *("--port", str(port), *args),
        ),
        wait=False,
    )
    started = supervisor.wait_for_log("2 workers started", 20)
    assert started is not None, supervisor.log_text()
    return supervisor, started.string


def stop_workers(supervisor: Any) -> None:
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait_exit(20) == 0


def test_workers_share_the_port_and_behave_as_one_broker(
    redis_server: RedisServer, start_broker: Callable[..., Any]
) -> None:
    port = free_port()
    supervisor, _ = start_workers(start_broker, redis_server, port)
    # Both workers listen on the one port, each a node of the cluster.
    wait_for(
        lambda: (
            len([line for line in supervisor.log_lines() if f":{port} (MQTT over TCP)" in line])
            == 2
        ),
        "both workers listening",
        20,
    )
    with redis_server.client() as r:
        assert {n.decode() for n in r.smembers("mqttbroker:nodes")} == {"w-0", "w-1"}
    supervisor.host, supervisor.port = "127.0.0.1", port
    # Clients land on either worker; messages reach every subscriber whichever it is on.
    topic = unique("workers")
    subs = [subscriber(supervisor, topic, 0) for _ in range(6)]
    pub = client(supervisor)
    pub.publish(topic, b"hello", qos=1)
    for s in subs:
        s.wait_payload(b"hello")
    close_all(*subs, pub)
    stop_workers(supervisor)


def test_each_worker_serves_its_admin_on_its_own_port(
    redis_server: RedisServer, start_broker: Callable[..., Any]
) -> None:
    admin = free_ports(2)  # one per worker
    supervisor, started = start_workers(
        start_broker, redis_server, free_port(), "--admin-port", str(admin)
    )
    assert f"admin servers on ports {admin} to {admin + 1}" in started
    for n in (0, 1):
        line = supervisor.wait_for_log(rf"admin server on http://127\.0\.0\.1:{admin + n}/", 20)
        assert line is not None, supervisor.log_text()
        assert _healthz(admin + n) == 200
    stop_workers(supervisor)
    assert " ERROR " not in supervisor.log_text(), supervisor.log_text()


def test_more_than_one_worker_needs_a_cluster(start_broker: Callable[..., Any]) -> None:
    node = start_broker(extra_args=("--workers", "2", "--port", "18830"), wait=False)
    assert node.wait_exit() == 2
    assert "workers: more than 1 needs [cluster] redis" in node.log_text()
