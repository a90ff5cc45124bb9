"""Certificates for ``--tls``: a self-signed server certificate for 127.0.0.1 and localhost
(ECDSA P-256 or RSA 2048), made with the ``openssl`` command, and the generator's client
context, which verifies it (the certificate is its own CA) and speaks one TLS version only."""

from __future__ import annotations

import argparse
import os
import ssl
import subprocess
from pathlib import Path

KINDS = {
    "ec": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
    "rsa": ["-newkey", "rsa:2048"],
}
VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def add_options(parser: argparse.ArgumentParser, serves: str, speaks: str) -> None:
    """``--tls ec|rsa`` and ``--tls-version 1.2|1.3``: what the brokers ``serves`` over TLS,
    and who ``speaks`` the version chosen."""
    parser.add_argument(
        "--tls",
        choices=sorted(KINDS),
        help=f"{serves} with an ECDSA P-256 (ec) or RSA 2048 (rsa) server key",
    )
    parser.add_argument(
        "--tls-version",
        choices=sorted(VERSIONS),
        default="1.3",
        help=f"the TLS version {speaks} with --tls (default 1.3)",
    )


def make(directory: str, kind: str) -> tuple[str, str]:
    """Write ``server.pem`` and ``server.key`` of ``kind`` ("ec", "rsa") in ``directory``,
    readable by all (Mosquitto drops root for its own user); their paths."""
    cert, key = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
    cmd = ["openssl", "req", "-x509", *KINDS[kind], "-nodes", "-keyout", key, "-out", cert]
    cmd += ["-days", "2", "-subj", "/CN=localhost"]
    cmd += ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    os.chmod(directory, 0o755)
    for path in (cert, key):
        os.chmod(path, 0o644)
    return cert, key


def client_context(ca_file: str, version: str) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca_file`` (host name included) and
    speaks TLS ``version`` ("1.2", "1.3") only."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = context.maximum_version = VERSIONS[version]
    return context


def listener_toml(cert: str, key: str) -> str:
    """Our broker's configuration with one TLS listener (the command line's --port sets its
    port)."""
    return (
        f'[[listener]]\nhost = "127.0.0.1"\nport = 1883\n'
        f"tls_cert_file = {str(Path(cert))!r}\ntls_key_file = {str(Path(key))!r}\n"
    ).replace("'", '"')
