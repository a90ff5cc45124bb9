"""Listeners for the transport tests (TLS, mutual TLS, WebSocket) and clients that speak to them
byte by byte; the broker, the other clients and the certificates come from tests/support.

- ``toml_listener``: a ``[[listener]]`` table; ``Listeners``: the session broker's listeners
  (conftest.py starts it with one of every kind).
- ``RawWebSocket``: a WebSocket client on a plain socket that sends exact frames (fragmented or
  not, binary or text) and reads frames, checking that every data frame the broker sends is
  binary; ``read_packet`` reassembles MQTT packets from them.
- For the tests that run a Server or the transport in their own process, on both loops
  (streams, busy_poll_us, gather_us): ``run_on`` runs a coroutine on the loop ``LOOPS`` names;
  ``open_311``, an asyncio stream connection with MQTT 3.1.1's CONNECT answered;
  ``SUBACK_QOS0``, the answer to a one-filter SUBSCRIBE; ``memory_config``, a configuration of
  listeners on the memory store, and ``serving``, a Server started on one.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The conformance suite's WebSocket handshake and client frames serve the transport tests too.
from conformance.websocket import client_frame, open_handshake
from mqttbroker.config import Config, ListenerConfig
from mqttbroker.protocol import fastpath
from mqttbroker.server.app import Server
from support.clients import CONNACK_OK, MQTT_311, TIMEOUT, PahoClient, connect_packet, unique
from support.launcher import Address, BrokerProcess

SUBACK_QOS0 = b"\x90\x03\x00\x01\x00"  # packet id 1, QoS 0 granted (3.1.1)
LOOPS = ["asyncio", "uvloop"]


def run_on(loop: str, scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """``scenario()`` on a fresh loop of the kind ``loop`` names (one of LOOPS)."""
    if loop == "uvloop":
        import uvloop  # the [fast] extra, which the test command installs

        return uvloop.run(scenario())
    return asyncio.run(scenario())


async def open_311(port: int, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect_packet(unique(name), MQTT_311))
    assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == CONNACK_OK
    return reader, writer


def toml_listener(**values: Any) -> str:
    lines = ["[[listener]]"]
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Listeners:
    broker: BrokerProcess
    tcp: Address
    tls: Address  # TLS 1.2+, ciphers for TLS 1.2 limited to ECDHE-ECDSA-AES128-GCM-SHA256
    tls13: Address  # TLS 1.3 only
    mtls: Address  # client certificate required; its CN is the user name
    ws: Address
    wss: Address
    ws_custom: Address  # path /custom/path
    wss_mtls: Address  # client certificate required; its first SAN is the user name


TLS12_CIPHER = "ECDHE-ECDSA-AES128-GCM-SHA256"
CUSTOM_PATH = "/custom/path"


# =============================================================================================
# a raw WebSocket client

OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


class RawWebSocket:
    """A client-side WebSocket on a blocking socket (RFC 6455 framing done by hand)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str = "/mqtt",
        protocols: tuple[str, ...] = ("mqtt",),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self._buffer = b""
        self._stream = b""  # MQTT bytes received and not yet returned as packets
        self.close_code: int | None = None
        opened = open_handshake(sock, host, port, path, protocols)
        self.head, self.headers, self._buffer = opened.head, opened.headers, opened.rest

    def send_frame(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        self.sock.sendall(client_frame(opcode, payload, fin))

    def send_binary(self, payload: bytes) -> None:
        self.send_frame(OP_BINARY, payload)

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def recv_frame(self) -> tuple[bool, int, bytes]:
        """(fin, opcode, payload) of the next frame from the broker (never masked)."""
        first, second = self._read(2)
        assert not second & 0x80, "a server must not mask its frames"
        n = second & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._read(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._read(8))
        return bool(first & 0x80), first & 0x0F, self._read(n)

    def read_packet(self) -> bytes:
        """The next MQTT packet, from as many binary frames as it takes. Fails on a data frame
        that is not binary; a close frame raises EOFError (its code in ``close_code``)."""
        while True:
            packet = self._take_packet()
            if packet is not None:
                return packet
            fin, opcode, payload = self.recv_frame()
            if opcode == OP_CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if payload else None
                raise EOFError(f"close frame {self.close_code}")
            if opcode in (OP_PING, OP_PONG):
                continue
            assert opcode in (OP_BINARY, OP_CONTINUATION), f"data frame with opcode {opcode}"
            self._stream += payload

    def _take_packet(self) -> bytes | None:
        data = self._stream
        header = fastpath.read_fixed_header(data, 0, len(data))
        if header is None:
            return None
        length, body = header
        end = body + length
        if len(data) < end:
            return None
        self._stream = data[end:]
        return data[:end]

    def wait_closed(self) -> int | None:
        """Read until the broker's close frame; its close code (or None at a bare EOF)."""
        try:
            while True:
                _fin, opcode, payload = self.recv_frame()
                if opcode == OP_CLOSE:
                    self.close_code = struct.unpack("!H", payload[:2])[0] if payload else None
                    return self.close_code
        except (EOFError, ConnectionError):
            return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def echoes(client: PahoClient, topic: str, payload: bytes, qos: int = 1) -> None:
    """``client`` connects, subscribes to ``topic`` at ``qos``, publishes ``payload`` there at QoS
    1 and gets it back (topic, payload and QoS), then closes."""
    try:
        client.connect()
        assert client.subscribe(topic, qos) == [qos]
        client.publish(topic, payload, 1)
        [message] = client.wait_messages(1)
        assert (message.topic, message.payload, message.qos) == (topic, payload, qos)
    finally:
        client.close()


def memory_config(tmp_path: Path, *listeners: ListenerConfig, **keys: Any) -> Config:
    """A configuration with ``listeners`` and ``keys``, the memory store, data under
    ``tmp_path``."""
    config = Config(listeners=list(listeners), data_dir=str(tmp_path), **keys)
    config.storage.backend = "memory"
    return config


async def serving(config: Config) -> tuple[Server, list[int]]:
    """A Server started on ``config``, and the port of each of its listeners, in order."""
    server = Server(config)
    await server.start()
    return server, [listener.addresses[0][1] for listener in server.listeners]
