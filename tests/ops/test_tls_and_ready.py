"""The admin server over TLS (the listeners' keys), and /readyz: 200 while the broker can serve,
503 with the reason when the store cannot commit or the broker is shutting down."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops_support import ADMIN_LINE, TIMEOUT, free_port
from support.certs import client_context, make_certificates
from support.launcher import run_broker

from mqttbroker.config import Config
from mqttbroker.server.app import Server


def test_admin_over_tls(start_broker: Callable[..., Any], tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    port = free_port()
    config = tmp_path / "tls.toml"
    config.write_text(
        f"[admin]\nport = {port}\ntls_cert_file = {str(certs.server_cert)!r}\n"
        f"tls_key_file = {str(certs.server_key)!r}\n"
    )
    broker = start_broker(
        extra_args=("--config", str(config), "--memory", "--admin-port", str(port))
    )
    found = broker.wait_for_log(ADMIN_LINE, TIMEOUT)
    assert found is not None and found.group(1) == "https"
    context = client_context(certs)
    url = f"https://localhost:{port}/healthz"
    with urllib.request.urlopen(url, context=context, timeout=TIMEOUT) as response:
        assert json.loads(response.read()) == {"status": "alive"}


def test_a_bad_admin_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    config = tmp_path / "bad.toml"
    config.write_text(f"[admin]\ntls_cert_file = {str(certs.garbage)!r}\n")
    result = run_broker("check-config", str(config))
    assert result.returncode == 2
    assert f"{config}: admin.tls_cert_file" in result.stderr, result.stderr


def test_readyz_follows_the_store_and_the_shutdown() -> None:
    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        config = Config()
        config.storage.backend = "memory"
        config.listeners[0].port = 0
        config.admin.port = free_port()
        server = Server(config)
        assert server.ready() == "not every listener is bound yet"
        await server.start()
        url = f"http://127.0.0.1:{config.admin.port}/readyz"
        loop = asyncio.get_running_loop()

        def get() -> tuple[int, dict[str, Any]]:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        answers = [await loop.run_in_executor(None, get)]
        server.store.failing = True  # type: ignore[attr-defined]  # as SQLiteStore sets it
        answers.append(await loop.run_in_executor(None, get))
        server.store.failing = False  # type: ignore[attr-defined]
        server.stopping = True
        answers.append(await loop.run_in_executor(None, get))
        await server.stop()
        return answers

    ready, store, stopping = asyncio.run(scenario())
    assert ready == (200, {"ready": True})
    assert store == (503, {"ready": False, "reason": "the store cannot commit (see the log)"})
    assert stopping == (503, {"ready": False, "reason": "shutting down"})
