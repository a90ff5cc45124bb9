"""The client side of SCRAM (RFC 5802 section 3, RFC 7677), written from the specifications and
independent of the code under test."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

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
