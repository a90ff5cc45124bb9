"""The openssl commands of config/README.md ("A test CA, a server and a client certificate"),
run as they are written there: the broker serves TLS with the server certificate they make and
takes the client certificate's CN as the user name; a client that trusts their CA, and checks
the server's name, connects with the client certificate. (test_mtls.py checks refusals.)"""

from __future__ import annotations

import re
import ssl
import subprocess
from pathlib import Path

import pytest
from support.clients import TIMEOUT, PahoClient
from support.launcher import ROOT, BrokerProcess
from support.listeners import toml_listener

GUIDE = ROOT / "config" / "README.md"
MARKER = "<!-- tests/transports/test_tls_guide.py runs the block below as it is -->"


def guide_commands() -> str:
    """The shell block that follows the marker in config/README.md."""
    text = GUIDE.read_text(encoding="utf-8")
    assert MARKER in text, f"{GUIDE}: the marker of the certificate commands is gone"
    found = re.search(r"```sh\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert found is not None, f"{GUIDE}: no sh block after the marker"
    return found.group(1)


@pytest.mark.needs_openssl
def test_certificates_made_as_the_guide_says(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    made = subprocess.run(
        ["sh", "-e", "-c", guide_commands()],
        cwd=certs,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    config = tmp_path / "tls.toml"
    config.write_text(
        toml_listener(
            host="127.0.0.1",
            port=0,
            tls_cert_file=str(certs / "server.pem"),
            tls_key_file=str(certs / "server.key"),
            tls_ca_file=str(certs / "ca.pem"),
            tls_require_certificate=True,
            tls_certificate_username="cn",
        )
        + '\n[storage]\nbackend = "memory"\n'
    )
    broker = BrokerProcess(tmp_path, "debug", config=config).start()
    try:
        [address] = broker.addresses
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))  # checks the name
        context.load_cert_chain(str(certs / "sensor-17.pem"), str(certs / "sensor-17.key"))
        device = PahoClient("localhost", address.port, tls=context)
        try:
            device.connect()
        finally:
            device.close()
        assert broker.wait_for_log(r"client certificate user 'sensor-17'", timeout=TIMEOUT)
    finally:
        broker.stop()
