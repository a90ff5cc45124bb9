"""Helpers of the transport tests (TLS, mutual TLS, WebSocket).

- ``make_certificates``: a throwaway CA, a server certificate for localhost/127.0.0.1, a client
  certificate (CN ``alice``, SAN e-mail ``alice@example.test``) and a client certificate from
  another CA, written as PEM files into a temporary directory (nothing is committed).
- ``BrokerRun``: ``python -m mqttbroker --config FILE`` in a subprocess; the address of every
  listener comes from its "listening on HOST:PORT (MQTT over ...)" log line, in config order.
- ``Paho``: a paho-mqtt client over TCP, TLS, WebSocket or WebSocket+TLS whose ``connect``,
  ``subscribe`` and ``publish`` wait for the broker's answer (with a timeout).
- ``RawWebSocket``: a WebSocket client on a plain socket that sends exact frames (fragmented or
  not, binary or text) and reads frames, checking that every data frame the broker sends is
  binary; ``read_packet`` reassembles MQTT packets from them.
- Packet builders for MQTT 3.1.1 (CONNECT, SUBSCRIBE, PUBLISH, PINGREQ).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from support.clients import binary, utf8
from support.clients import packet as mqtt_packet

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The conformance suite's WebSocket handshake and client frames serve the transport tests too.
from conformance.websocket import client_frame, open_handshake  # noqa: E402

TIMEOUT = 10.0  # failure guard for anything that should happen promptly
LISTENING = re.compile(r"listening on (\S+):(\d+) \((MQTT over [A-Za-z+]+)\)")


def unique(prefix: str = "tr") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# =============================================================================================
# certificates


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


# =============================================================================================
# the broker


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
class Address:
    host: str
    port: int
    kind: str  # "MQTT over TCP", "MQTT over TLS", "MQTT over WebSocket", ...


def terminate(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within TIMEOUT."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)


class BrokerRun:
    """``python -m mqttbroker`` with the given arguments; every output line is kept."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        self.args = [sys.executable, "-m", "mqttbroker", "--data-dir", str(workdir), *args]
        self.proc: subprocess.Popen[str] | None = None
        self.addresses: list[Address] = []
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._thread: threading.Thread | None = None

    def start(self, listeners: int) -> BrokerRun:
        """Start, and wait for ``listeners`` "listening on" lines."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=str(self.workdir),
            env=env,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20.0
        with self._cond:
            while True:
                found = [m for m in map(LISTENING.search, self._lines) if m]
                if len(found) >= listeners:
                    break
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    self.stop()
                    raise RuntimeError(
                        f"the broker did not log {listeners} listening lines; its output:\n"
                        + "\n".join(self._lines)
                    )
                self._cond.wait(left)
        self.addresses = [Address(m.group(1), int(m.group(2)), m.group(3)) for m in found]
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def log_text(self) -> str:
        with self._cond:
            return "\n".join(self._lines)

    def log_mark(self) -> int:
        with self._cond:
            return len(self._lines)

    def wait_for_log(self, pattern: str, since: int = 0, timeout: float = TIMEOUT) -> bool:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if any(regex.search(line) for line in self._lines[since:]):
                    return True
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return False
                self._cond.wait(left)

    def stop(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        terminate(proc)
        if self._thread is not None:
            self._thread.join(TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def assert_clean_log(self) -> None:
        text = self.log_text()
        assert "Traceback" not in text, text
        assert "internal error" not in text, text


@dataclass(frozen=True)
class Listeners:
    broker: BrokerRun
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


def run_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the broker's command line expecting it to exit by itself (a configuration error)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "mqttbroker", "--data-dir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=str(workdir),
        env=env,
    )


# =============================================================================================
# paho


class Paho:
    """A paho-mqtt 2.x client on its own network thread."""

    def __init__(
        self,
        version: int = mqtt.MQTTv5,
        transport: str = "tcp",
        path: str = "/mqtt",
        tls: ssl.SSLContext | None = None,
        client_id: str | None = None,
    ) -> None:
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,  # type: ignore[attr-defined]
            client_id=client_id or unique("paho"),
            protocol=version,  # type: ignore[arg-type]
            transport=transport,  # type: ignore[arg-type]
        )
        if transport == "websockets":
            self.client.ws_set_options(path=path)
        if tls is not None:
            self.client.tls_set_context(tls)
        self._cond = threading.Condition()
        self.connack: Any = None
        self.granted: dict[int, list[Any]] = {}
        self.messages: list[mqtt.MQTTMessage] = []
        self.disconnected = False
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect
        self._started = False

    def _on_connect(self, client: Any, userdata: Any, flags: Any, code: Any, props: Any) -> None:
        with self._cond:
            self.connack = code
            self._cond.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._cond:
            self.granted[mid] = list(codes)
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, code: Any, props: Any) -> None:
        with self._cond:
            self.disconnected = True
            self._cond.notify_all()

    def connect(self, host: str, port: int, bind_address: str = "") -> int:
        """Connect (from ``bind_address`` if given) and wait for CONNACK; its reason code (0:
        success)."""
        self.client.connect(host, port, keepalive=30, bind_address=bind_address)
        self.client.loop_start()
        self._started = True
        with self._cond:
            ok = self._cond.wait_for(lambda: self.connack is not None or self.disconnected, TIMEOUT)
        assert ok, "no CONNACK"
        assert self.connack is not None, "disconnected before CONNACK"
        return int(self.connack.value)

    def subscribe(self, topic: str, qos: int = 1) -> int:
        result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS and mid is not None
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self.granted, TIMEOUT), "no SUBACK"
            return int(self.granted[mid][0].value)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), "publish not acknowledged"

    def wait_messages(self, count: int) -> list[mqtt.MQTTMessage]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.messages) >= count, TIMEOUT)
            return list(self.messages)

    def close(self) -> None:
        if self._started:
            self.client.disconnect()
            self.client.loop_stop()


# =============================================================================================
# MQTT 3.1.1 packets


def connect_packet(
    client_id: str,
    keep_alive: int = 30,
    will: tuple[str, bytes] | None = None,
    version: int = 4,
) -> bytes:
    """CONNECT (3.1.1, or MQTT 5 with ``version=5`` and no properties; clean start), with a
    QoS 0 will ``(topic, message)`` if given."""
    flags = 0x02 | (0x04 if will else 0)
    props = b"\x00" if version == 5 else b""
    body = utf8("MQTT") + bytes([version, flags]) + struct.pack("!H", keep_alive) + props
    body += utf8(client_id)
    if will:
        body += props + utf8(will[0]) + binary(will[1])
    return mqtt_packet(0x10, body)


def subscribe_packet(packet_id: int, topic: str, qos: int = 0) -> bytes:
    return mqtt_packet(0x82, struct.pack("!H", packet_id) + utf8(topic) + bytes([qos]))


def publish_packet(topic: str, payload: bytes) -> bytes:
    return mqtt_packet(0x30, utf8(topic) + payload)


PINGREQ = b"\xc0\x00"
CONNACK_OK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"


def packet_type(packet: bytes) -> int:
    return packet[0] >> 4


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
        if len(data) < 2:
            return None
        length, multiplier, pos = 0, 1, 1
        while True:
            if pos >= len(data):
                return None
            byte = data[pos]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            pos += 1
            if not byte & 0x80:
                break
        end = pos + length
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
