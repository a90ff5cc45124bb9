"""MQTT over WebSocket for the suite (chapter 6): :class:`WsClient` is the suite's raw
:class:`~conformance.mqtt.Client` with its bytes carried in WebSocket frames (RFC 6455, done by
hand on a blocking socket, so a test can send any frame it likes: a text frame, or one packet
split over several messages). The plain client's operations (connect, expect, ping, the
closing checks) work over it unchanged: received data frames are unwrapped into the bytes the
client parses packets from.

What the broker sends is checked as it arrives: MQTT bytes only in binary messages, possibly
fragmented [MQTT-6.0.0-1], and well-formed frames (unmasked, no reserved bits, control frames
whole and at most 125 bytes, continuations only inside a fragmented message, no frame cut off by
the end of the connection); anything else is a :class:`BrokerViolation`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .mqtt import MQTT_5, WAIT, BrokerViolation, Client

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class HandshakeRefused(AssertionError):
    def __init__(self, status: int, head: str) -> None:
        super().__init__(f"WebSocket handshake refused: HTTP {status}\n{head}")
        self.status = status
        self.head = head


@dataclass
class Opened:
    """A WebSocket handshake the server accepted."""

    head: str  # the response's status line and headers
    headers: dict[str, str]  # lower-case names
    rest: bytes  # bytes after the headers: the start of the first frames


def open_handshake(
    sock: socket.socket, host: str, port: int, path: str, protocols: Sequence[str]
) -> Opened:
    """The client's opening handshake on ``sock`` (RFC 6455 section 4.1). Raises
    :class:`HandshakeRefused` for a status other than 101, and BrokerViolation for a wrong
    Sec-WebSocket-Accept."""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address in the Host header
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
    sock.sendall(("\r\n".join(request) + "\r\n\r\n").encode())
    received = bytearray()
    deadline = time.monotonic() + WAIT
    while b"\r\n\r\n" not in received:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the WebSocket handshake")
        received += chunk
    text, _, rest = bytes(received).partition(b"\r\n\r\n")
    head = text.decode("latin-1")
    status = int(head.split()[1])
    if status != 101:
        raise HandshakeRefused(status, head)
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:])
    }
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    if headers.get("sec-websocket-accept") != accept:
        raise BrokerViolation(f"wrong Sec-WebSocket-Accept in\n{head}")
    return Opened(head, headers, rest)


def client_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """One frame as a client sends it: masked (RFC 6455 section 5.3)."""
    mask = os.urandom(4)
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        header = bytes([first, 0x80 | n])
    elif n < 65536:
        header = bytes([first, 0x80 | 126]) + struct.pack("!H", n)
    else:
        header = bytes([first, 0x80 | 127]) + struct.pack("!Q", n)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


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
        self._fragmented = False  # inside a fragmented binary message
        try:
            opened = open_handshake(self.sock, *address, path, protocols)
        except BaseException:
            self.sock.close()
            raise
        self.head, self.headers = opened.head, opened.headers
        self._frames += opened.rest

    def __repr__(self) -> str:
        return f"WsClient({self.name or self.client_id!r})"

    # frames out

    def send_frame(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        self.sock.sendall(client_frame(opcode, payload, fin))

    def send(self, data: bytes) -> None:
        """MQTT bytes in one binary frame."""
        self.send_frames([data])

    def send_frames(self, pieces: Sequence[bytes]) -> None:
        """MQTT bytes in one binary frame per piece (each a message of its own)."""
        for piece in pieces:
            self.log.append(f"-> [ws] {piece[:64].hex(' ')}")
            self.send_frame(BINARY, piece)

    # frames in

    def _frame(self) -> bytes | None:
        self._unwrap()
        return super()._frame()

    def _unwrap(self) -> bool:
        """Move the MQTT bytes of every whole frame received into the packet buffer, answering
        pings and noting a close; True if MQTT bytes were added."""
        added = False
        while not self._eof and (frame := self._next_frame()) is not None:
            fin, opcode, payload = frame
            if opcode == BINARY or opcode == CONTINUATION:
                if (opcode == CONTINUATION) != self._fragmented:
                    raise BrokerViolation(
                        "a continuation frame outside a fragmented message"
                        if opcode == CONTINUATION
                        else "a new binary message inside a fragmented one"
                    )
                self._fragmented = not fin
                self._buf += payload
                added = added or bool(payload)
            elif opcode == TEXT:
                raise BrokerViolation(
                    f"the broker sent a text frame {payload[:32]!r} [MQTT-6.0.0-1]"
                )
            elif opcode == PING:
                try:
                    self.send_frame(PONG, payload)
                except OSError:
                    self._eof = True
            elif opcode == CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if payload else None
                self._eof = True
            elif opcode != PONG:
                raise BrokerViolation(f"a frame with the unknown opcode {opcode}")
        return added

    def _fill(self, deadline: float) -> bool:
        """Read until data frames add MQTT bytes; False on a close frame or the end of the
        connection. Raises NoPacket at the deadline."""
        while True:
            if self._unwrap():
                return True
            if self._eof:
                return False
            chunk = self._recv(deadline)
            if not chunk:
                if self._frames:
                    raise BrokerViolation(f"connection closed inside a frame: {self._frames.hex()}")
                self._eof = True
                return False
            self._frames += chunk

    def _next_frame(self) -> tuple[bool, int, bytes] | None:
        buf = self._frames
        if len(buf) < 2:
            return None
        fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
        if buf[0] & 0x70:
            raise BrokerViolation(f"reserved bits set in a frame: 0x{buf[0]:02X} (RFC 6455 5.2)")
        if buf[1] & 0x80:
            raise BrokerViolation("a masked frame from the server (RFC 6455 section 5.1)")
        n, pos = buf[1] & 0x7F, 2
        if opcode >= CLOSE and (not fin or n > 125):
            raise BrokerViolation("a fragmented or long control frame (RFC 6455 section 5.5)")
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
