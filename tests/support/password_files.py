"""Password files for the tests: the cost every test's password file uses (``ITERATIONS``), a
file of users in our format (``password_file``) and a configuration naming it
(``security_config``), lines in Mosquitto's documented ``$7$`` and ``$6$`` formats, written from
its documentation and independent of the code under test, and a file of weak entries
(``weak_file``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from mqttbroker.security.passwords import ScramCredential, make_entry_line
from support.scram_client import b64

# A fast iteration count for the tests' password files (RFC 7677's minimum).
ITERATIONS = 4096


def mosquitto_pbkdf2_line(username: str, password: bytes, iterations: int = 101) -> str:
    """``mosquitto_passwd -H sha512-pbkdf2``: ``$7$<iterations>$<salt>$<hash>``, with
    hash = PBKDF2-HMAC-SHA512(password, salt, iterations), 64 bytes, 12-byte salt."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password, salt, iterations, 64)
    return f"{username}:$7${iterations}${b64(salt)}${b64(digest)}"


def mosquitto_sha512_line(username: str, password: bytes) -> str:
    """``mosquitto_passwd -H sha512``: ``$6$<salt>$<hash>`` with hash = SHA-512(password + salt)."""
    salt = os.urandom(12)
    return f"{username}:$6${b64(salt)}${b64(hashlib.sha512(password + salt).digest())}"


def password_file(path: Path, users: dict[str, bytes], iterations: int = ITERATIONS) -> Path:
    """A password file of ``users`` (name: password) in our format, written to ``path``."""
    path.write_text("".join(make_entry_line(u, p, iterations) + "\n" for u, p in users.items()))
    return path


def security_config(passwords: Path, more: str = "") -> tuple[str, ...]:
    """broker.toml beside ``passwords``, its [security] table naming them (``more``: lines
    after that one): the broker's arguments that load it."""
    config = passwords.parent / "broker.toml"
    config.write_text(f"[security]\npassword_file = {str(passwords)!r}\n{more}")
    return ("--config", str(config))


def weak_file() -> str:
    """A password file's text: a strong entry, then weak ones (lines 2 to 4: ``scram1``, a
    SCRAM-SHA-256 of 1 iteration; ``sha``, Mosquitto's ``$6$``; ``pbkdf``, ``$7$`` of 101)."""
    one = ScramCredential.derive("SCRAM-SHA-256", b"pw", 1)
    return "\n".join(
        [
            make_entry_line("strong", b"pw", ITERATIONS),
            f"scram1:{one.text()}",
            mosquitto_sha512_line("sha", b"pw"),
            mosquitto_pbkdf2_line("pbkdf", b"pw", 101),
        ]
    )
