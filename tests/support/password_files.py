"""Password files for the tests: the cost every test's password file uses (``ITERATIONS``), and
lines in Mosquitto's documented ``$7$`` and ``$6$`` formats, written from its documentation and
independent of the code under test."""

from __future__ import annotations

import hashlib
import os

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
