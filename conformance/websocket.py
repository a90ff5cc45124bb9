"""MQTT over WebSocket for the suite (chapter 6): :class:`WsClient` is the suite's raw
:class:`~conformance.mqtt.Client` with its bytes carried in WebSocket frames (RFC 6455, done by
hand on a blocking socket, so a test can send any frame: text, fragmented, or one packet split
over several). Every operation of the plain client works the same over it.

What the broker sends is checked as it arrives: MQTT bytes only in binary frames (or their
continuations) [MQTT-6.0.0-1]; a text frame from the broker is a :class:`BrokerViolation`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import time
from collections.abc import Sequence

from .mqtt import MQTT_5, WAIT, BrokerViolation, Client, NoPacket

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class HandshakeRefused(AssertionError):
    def __init__(self, status: int, head: str) -> None:
        super().__init__(f"WebSocket handshake refused: HTTP {status}\n{head}")
        self.status = status


class WsClient(Client):
    """A raw MQTT client over a WebSocket connection to ``ws://host:port/path``."""

    def __init__(
        self,
        address: tuple[str, int],
        path: str = "/mqtt",
        version: int = MQTT_5,
        name: str = "",
        protocols: Sequence[str] = ("mqtt",),
    ) -> None:
        super().__init__(address, version, name)
        self.close_code: int | None = None
        self._frames = bytearray()  # WebSocket bytes received, not yet a whole frame
        self._opcode = 0  # of the fragmented message being received
        host, port = address
        key = base64.b64encode(os.urandom(16)).decode()
        request = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if protocols:
            request.append(f"Sec-WebSocket-Protocol: {', '.join(protocols)}")
        self.sock.sendall(("\r\n".join(request) + "\r\n\r\n").encode())
        head = bytearray()
        deadline = time.monotonic() + WAIT
        while b"\r\n\r\n" not in head:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the WebSocket handshake")
            head += chunk
        text, _, rest = bytes(head).partition(b"\r\n\r\n")
        self.head = text.decode("latin-1")
        self.status = int(self.head.split()[1])
        if self.status != 101:
            raise HandshakeRefused(self.status, self.head)
        self.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in self.head.split("\r\n")[1:])
        }
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if self.headers.get("sec-websocket-accept") != accept:
            raise BrokerViolation(f"wrong Sec-WebSocket-Accept in\n{self.head}")
        self._frames += rest

    def __repr__(self) -> str:
        return f"WsClient({self.name or self.client_id!r})"

    # frames out

    def send_frame(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        mask = os.urandom(4)
        n = len(payload)
        first = (0x80 if fin else 0) | opcode
        if n < 126:
            header = bytes([first, 0x80 | n])
        elif n < 65536:
            header = bytes([first, 0x80 | 126]) + struct.pack("!H", n)
        else:
            header = bytes([first, 0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send(self, data: bytes) -> None:
        """MQTT bytes in one binary frame."""
        self.send_frames([data])

    def send_frames(self, pieces: Sequence[bytes]) -> None:
        """MQTT bytes in one binary frame per piece (each a message of its own)."""
        for piece in pieces:
            self.log.append(f"-> [ws] {piece[:64].hex(' ')}")
            self.send_frame(BINARY, piece)

    # frames in

    def _fill(self, deadline: float) -> bool:
        """Read until a data frame adds MQTT bytes; False on a close frame or EOF. Raises
        NoPacket at the deadline."""
        while True:
            if self._eof:
                return False
            frame = self._next_frame()
            if frame is not None:
                fin, opcode, payload = frame
                if opcode in (BINARY, CONTINUATION) and (opcode == BINARY or self._opcode):
                    if opcode == BINARY:
                        self._opcode = BINARY
                    if fin:
                        self._opcode = 0
                    if payload:
                        self._buf += payload
                        return True
                    continue
                if opcode == TEXT:
                    raise BrokerViolation(
                        f"the broker sent a text frame {payload[:32]!r} [MQTT-6.0.0-1]"
                    )
                if opcode == PING:
                    self.send_frame(PONG, payload)
                elif opcode == CLOSE:
                    self.close_code = struct.unpack("!H", payload[:2])[0] if payload else None
                    self._eof = True
                    return False
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoPacket("timed out")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise NoPacket("timed out") from None
            except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self._eof = True
                return False
            self._frames += chunk

    def _next_frame(self) -> tuple[bool, int, bytes] | None:
        buf = self._frames
        if len(buf) < 2:
            return None
        fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
        if buf[1] & 0x80:
            raise BrokerViolation("a masked frame from the server (RFC 6455 section 5.1)")
        n, pos = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, pos = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, pos = struct.unpack("!Q", buf[2:10])[0], 10
        if len(buf) < pos + n:
            return None
        payload = bytes(buf[pos : pos + n])
        del buf[: pos + n]
        return fin, opcode, payload
