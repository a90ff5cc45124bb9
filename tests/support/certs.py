"""Throwaway certificates for the TLS tests, written as PEM files into a temporary directory
(nothing is committed): a CA, a server certificate for localhost/127.0.0.1, a client certificate
(CN ``alice``, SAN e-mail ``alice@example.test``), a client certificate from another CA, and a
file that is not PEM at all; ``client_context`` makes a client's SSL context from them."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA certificate (PEM)
    server_cert: Path
    server_key: Path
    client_cert: Path  # CN=alice, SAN email:alice@example.test, signed by the CA
    client_key: Path
    rogue_cert: Path  # CN=mallory, signed by another CA
    rogue_key: Path
    garbage: Path  # not PEM at all


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mqttbroker tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    common_name: str,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def make_certificates(folder: Path) -> Certificates:
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("mqttbroker test CA")
    server = _leaf(
        ca,
        "localhost",
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client = _leaf(
        ca, "alice", [x509.RFC822Name("alice@example.test")], ExtendedKeyUsageOID.CLIENT_AUTH
    )
    rogue_ca = _ca("someone else's CA")
    rogue = _leaf(
        rogue_ca, "mallory", [x509.DNSName("mallory.example.test")], ExtendedKeyUsageOID.CLIENT_AUTH
    )
    garbage = folder / "garbage.pem"
    garbage.write_text("this is not a certificate\n")
    return Certificates(
        ca=_write_cert(ca[0], folder / "ca.pem"),
        server_cert=_write_cert(server[0], folder / "server.pem"),
        server_key=_write_key(server[1], folder / "server.key"),
        client_cert=_write_cert(client[0], folder / "alice.pem"),
        client_key=_write_key(client[1], folder / "alice.key"),
        rogue_cert=_write_cert(rogue[0], folder / "mallory.pem"),
        rogue_key=_write_key(rogue[1], folder / "mallory.key"),
        garbage=garbage,
    )


def client_context(
    certs: Certificates,
    with_cert: bool = False,
    rogue: bool = False,
    maximum: ssl.TLSVersion | None = None,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    """A client context trusting the test CA, optionally presenting a client certificate."""
    context = ssl.create_default_context(cafile=str(certs.ca))
    if maximum is not None:
        context.maximum_version = maximum
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if rogue:
        context.load_cert_chain(str(certs.rogue_cert), str(certs.rogue_key))
    elif with_cert:
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context
