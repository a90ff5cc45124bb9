"""``--workers N`` and the admin server: an HTTP port cannot be shared the way the MQTT ports
are, so worker n serves its admin on the configured port plus n, and a normal start logs no
error. (That the workers share the MQTT port and behave as one broker: test_cluster.py.)"""

from __future__ import annotations

import urllib.request

import pytest
from support.launcher import free_port

pytestmark = pytest.mark.needs_redis


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        return int(response.status)


def test_each_worker_serves_its_admin_on_its_own_port(redis_server, start_broker) -> None:
    mqtt, admin = free_port(), free_port()
    supervisor = start_broker(
        extra_args=(
            "--cluster",
            redis_server.url,
            "--node-id",
            "w",
            "--workers",
            "2",
            "--port",
            str(mqtt),
            "--admin-port",
            str(admin),
        ),
        wait=False,
    )
    started = supervisor.wait_for_log("2 workers started", 20)
    assert started is not None, supervisor.log_text()
    assert f"admin servers on ports {admin} to {admin + 1}" in started.string
    for n in (0, 1):
        line = supervisor.wait_for_log(rf"admin server on http://127\.0\.0\.1:{admin + n}/", 20)
        assert line is not None, supervisor.log_text()
        assert _healthz(admin + n) == 200
    supervisor.send_signal(15)
    assert supervisor.wait_exit(20) == 0
    assert " ERROR " not in supervisor.log_text(), supervisor.log_text()
