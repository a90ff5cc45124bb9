"""Health check of a running broker, for a container's HEALTHCHECK (deploy/Containerfile):
a real MQTT round trip, not just an open port.

    python healthcheck.py [HOST [PORT]]      # default 127.0.0.1 1883

Sends an MQTT 3.1.1 CONNECT without a user name and waits for the CONNACK. Any CONNACK counts as
healthy, a refusal too (return code 5, not authorized, where a password file is required): the
broker read the packet and answered it. Then it sends DISCONNECT. Exit status 0: healthy;
1: no connection, no answer within 5 s, or not MQTT. Standard library only.
"""

from __future__ import annotations

import os
import socket
import sys

TIMEOUT = 5.0


def connect_packet() -> bytes:
    client_id = f"healthcheck-{os.getpid()}".encode()
    # protocol name "MQTT", level 4 (3.1.1), flags: clean session, keep alive 10 s
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id
    return bytes((0x10, len(body))) + body


def check(host: str, port: int) -> str:
    """The CONNACK's meaning; raises OSError (or ValueError for an answer that is not MQTT)."""
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        sock.sendall(connect_packet())
        answer = b""
        while len(answer) < 4:
            chunk = sock.recv(4 - len(answer))
            if not chunk:
                raise ValueError(f"closed after {len(answer)} bytes, no CONNACK")
            answer += chunk
        if answer[:2] != b"\x20\x02":
            raise ValueError(f"not a CONNACK: {answer.hex()}")
        code = answer[3]
        if code == 0:
            sock.sendall(b"\xe0\x00")  # DISCONNECT
        return "connected" if code == 0 else f"answered, CONNACK return code {code}"


def main(argv: list[str]) -> int:
    host = argv[1] if len(argv) > 1 else "127.0.0.1"
    port = int(argv[2]) if len(argv) > 2 else 1883
    try:
        outcome = check(host, port)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {host}:{port}: {exc}")
        return 1
    print(f"healthy: {host}:{port}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
