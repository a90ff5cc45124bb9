"""Helpers of the security tests, written from the specifications and independent of the code
under test:

- ``ScramClient``: the client side of SCRAM (RFC 5802 section 3, RFC 7677);
- ``mosquitto_pbkdf2_line`` / ``mosquitto_sha512_line``: password-file lines in Mosquitto's
  documented ``$7$`` and ``$6$`` formats;
- raw MQTT packets the paho client cannot send: CONNECT with a will, user name and password or an
  Authentication Method, and AUTH.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from support.clients import (
    MQTT_5,
    binary,
    connect_packet,
    decode_vbi,
    packet,
    parse_properties,
    prop,
    utf8,
    vbi,
)
from support.sessions import ITERATIONS as ITERATIONS  # password files' cost, one for all tests

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class ScramClient:
    """SCRAM, client side, without channel binding. ``password`` is used as is (the tests use
    ASCII passwords, which SASLprep leaves unchanged)."""

    def __init__(
        self, mechanism: str, username: str, password: bytes, nonce: str | None = None
    ) -> None:
        self.hash = HASHES[mechanism]
        self.username = username
        self.password = password
        self.nonce = nonce if nonce is not None else b64(os.urandom(18))
        self.gs2_header = "n,,"
        self.bare = ""
        self.server_signature = b""

    def first(self) -> bytes:
        name = self.username.replace("=", "=3D").replace(",", "=2C")
        self.bare = f"n={name},r={self.nonce}"
        return (self.gs2_header + self.bare).encode()

    def final(self, server_first: bytes, *, tamper_proof: bool = False) -> bytes:
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        combined = attrs["r"]
        assert combined.startswith(self.nonce) and len(combined) > len(self.nonce), text
        salt = base64.b64decode(attrs["s"])
        iterations = int(attrs["i"])
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self.hash)
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = f"c={b64(self.gs2_header.encode())},r={combined}"
        auth_message = f"{self.bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if tamper_proof:
            proof = bytes([proof[0] ^ 1]) + proof[1:]
        server_key = hmac.digest(salted, b"Server Key", self.hash)
        self.server_signature = hmac.digest(server_key, auth_message, self.hash)
        return f"{without_proof},p={b64(proof)}".encode()

    def verify_server(self, server_final: bytes) -> bool:
        return server_final == b"v=" + base64.b64encode(self.server_signature)


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


# -- raw packets ------------------------------------------------------------------------------


def connect_bytes(
    client_id: str,
    version: int = MQTT_5,
    *,
    username: str | None = None,
    password: bytes | None = None,
    will_topic: str | None = None,
    will_payload: bytes = b"",
    will_qos: int = 0,
    auth_method: str | None = None,
    auth_data: bytes | None = None,
    keep_alive: int = 60,
) -> bytes:
    """A CONNECT (clean start) with the optional parts the tests need."""
    props = b""
    if auth_method is not None:
        props += prop(0x15, utf8(auth_method))
    if auth_data is not None:
        props += prop(0x16, binary(auth_data))
    return connect_packet(
        client_id,
        version,
        keep_alive,
        properties=props,
        will=None if will_topic is None else (will_topic, will_payload),
        will_qos=will_qos,
        username=username,
        password=password,
    )


def auth_bytes(reason_code: int, method: str, data: bytes | None) -> bytes:
    props = prop(0x15, utf8(method))
    if data is not None:
        props += prop(0x16, binary(data))
    return packet(0xF0, bytes((reason_code,)) + vbi(len(props)) + props)


def parse_reason_and_properties(data: bytes, first: int) -> tuple[int, dict[str, object]]:
    """An MQTT 5 AUTH (``first`` 0xF0) or CONNACK (0x20): its reason code and properties."""
    assert data[0] == first, f"expected packet 0x{first:02X}, got {data.hex(' ')}"
    _, pos = decode_vbi(data, 1)  # the Remaining Length
    if first == 0x20:
        pos += 1  # acknowledge flags
    code = data[pos]
    props, _ = parse_properties(data, pos + 1)
    return code, dict(props)
