"""Fixtures of the transport tests: throwaway certificates, and one broker (for the whole
session) with a listener of every kind, started from a generated TOML file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.certs import Certificates, make_certificates
from support.external_tools import program
from support.launcher import BrokerProcess
from support.listeners import CUSTOM_PATH, TLS12_CIPHER, Listeners, toml_listener

NODE_DIR = Path(__file__).resolve().parent / "node"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def listeners(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[Listeners]:
    workdir = tmp_path_factory.mktemp("transport-broker")
    tls = {"tls_cert_file": str(certs.server_cert), "tls_key_file": str(certs.server_key)}
    mtls = {
        **tls,
        "tls_ca_file": str(certs.ca),
        "tls_require_certificate": True,
    }
    tables = [
        toml_listener(host="127.0.0.1", port=0),
        toml_listener(host="127.0.0.1", port=0, tls_ciphers=TLS12_CIPHER, **tls),
        toml_listener(host="127.0.0.1", port=0, tls_min_version="1.3", **tls),
        toml_listener(host="127.0.0.1", port=0, tls_certificate_username="cn", **mtls),
        toml_listener(host="127.0.0.1", port=0, protocol="ws"),
        toml_listener(host="127.0.0.1", port=0, protocol="ws", **tls),
        toml_listener(host="127.0.0.1", port=0, protocol="ws", ws_path=CUSTOM_PATH),
        toml_listener(
            host="127.0.0.1", port=0, protocol="ws", tls_certificate_username="san", **mtls
        ),
    ]
    config = workdir / "transports.toml"
    config.write_text("\n".join(tables) + '\n[storage]\nbackend = "memory"\n')
    broker = BrokerProcess(workdir, config=config, listeners=len(tables)).start()
    try:
        a = broker.addresses
        yield Listeners(broker, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def mqttjs() -> Path:
    """The folder whose node_modules holds MQTT.js (the version tests/transports/node/package.json
    pins), installed with npm when it is not there yet (tests using it are ``needs_node``)."""
    npm = program("npm")
    wanted = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]["mqtt"]
    installed = NODE_DIR / "node_modules" / "mqtt" / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != wanted:
        result = subprocess.run(
            [npm, "install", "--no-package-lock", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"npm install failed:\n{result.stdout}\n{result.stderr}"
    assert installed.exists(), "npm install did not install mqtt"
    return NODE_DIR
