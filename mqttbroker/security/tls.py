"""TLS certificates of the listeners and the admin server: one ``ssl.SSLContext`` per TLS
listener, built from its configuration, with errors that name the key and the file.

A listener is a TLS listener when it has ``tls_cert_file``. Mutual TLS adds ``tls_ca_file`` (the
CA that signs client certificates) and ``tls_require_certificate`` (refuse clients without one;
otherwise a certificate is verified when a client offers one). What name a verified client
certificate gives the connection is the server's (``server/tls.py``).
"""

from __future__ import annotations

import ssl

from ..config import Config, ConfigError, ListenerConfig

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(listener: ListenerConfig, where: str) -> ssl.SSLContext | None:
    """The SSL context of ``listener`` (None for a plain listener). ``where`` prefixes error
    messages, e.g. ``"config.toml: listener[1]"``; errors are ``ConfigError`` naming the key."""
    if not listener.tls_cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[listener.tls_min_version]
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # One TLS 1.3 session ticket per handshake, not OpenSSL's two: a device resumes one
    # connection at a time, and each resumption brings a new ticket; the second costs an
    # encryption and a record per handshake (benchmarks/README.md, "Fleets").
    context.num_tickets = 1
    _check_pem(listener, where)
    key_file = listener.tls_key_file or None
    try:
        context.load_cert_chain(listener.tls_cert_file, key_file, password=_no_password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        files = listener.tls_cert_file + (f" and {key_file}" if key_file else "")
        raise ConfigError(
            f"{where}.tls_cert_file: cannot load the certificate and private key from {files}: "
            f"{_reason(exc)}"
        ) from None
    if listener.tls_ciphers:
        try:
            context.set_ciphers(listener.tls_ciphers)
        except ssl.SSLError:
            raise ConfigError(
                f"{where}.tls_ciphers: no cipher matches {listener.tls_ciphers!r}"
            ) from None
    if listener.tls_ca_file:
        try:
            context.load_verify_locations(cafile=listener.tls_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{where}.tls_ca_file: cannot load CA certificates from "
                f"{listener.tls_ca_file}: {_reason(exc)}"
            ) from None
        context.verify_mode = (
            ssl.CERT_REQUIRED if listener.tls_require_certificate else ssl.CERT_OPTIONAL
        )
    return context


def check_listeners(config: Config, source: str) -> None:
    """Build every listener's SSL context once, so that a bad certificate, key, CA file or cipher
    string is a configuration error (naming ``source`` and the key) before the broker starts."""
    for index, listener in enumerate(config.listeners):
        server_context(listener, f"{source}: listener[{index}]")
    admin = config.admin
    if admin.port and admin.tls_cert_file:
        server_context(
            ListenerConfig(tls_cert_file=admin.tls_cert_file, tls_key_file=admin.tls_key_file),
            f"{source}: admin",
        )


def _no_password() -> str:
    raise ValueError("the private key is encrypted (use a key without a passphrase)")


def _check_pem(listener: ListenerConfig, where: str) -> None:
    """Name the file at fault where OpenSSL would only say "PEM lib"."""
    key_key = "tls_key_file" if listener.tls_key_file else "tls_cert_file"
    for key, marker, what in (
        ("tls_cert_file", "-----BEGIN CERTIFICATE-----", "PEM certificate"),
        (key_key, "PRIVATE KEY-----", "PEM private key"),
    ):
        path = getattr(listener, key)
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(f"{where}.{key}: cannot read {path}: {exc.strerror}") from None
        if marker not in text:
            raise ConfigError(f"{where}.{key}: {path} holds no {what}")
        if key == key_key and "ENCRYPTED" in text:
            raise ConfigError(
                f"{where}.{key}: the private key in {path} is encrypted "
                "(use a key without a passphrase, readable only by the broker)"
            )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
