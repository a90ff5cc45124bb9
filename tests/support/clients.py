"""Clients of a real broker, shared by every test folder that runs one.

- ``PahoClient``: a paho-mqtt client (over TCP, TLS, WebSocket or WebSocket over TLS) on its own
  network thread whose ``connect``, ``subscribe`` and ``publish`` wait for the broker's
  acknowledgement (with a timeout), and which collects the messages and disconnections it
  receives; ``wait_messages(n)`` waits on a condition, not a sleep.
- ``RawClient``: a TCP socket that sends exact bytes and reads exact bytes (or the close) with a
  timeout, plus builders for the packets the tests send and a parser for the properties the
  broker sends back.
- ``assert_broker_healthy``: another client still publishes and receives, and the broker has
  logged no traceback.
"""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from mqttbroker.protocol import fastpath
from mqttbroker.protocol.fastpath import encode_vbi as vbi

TIMEOUT = 10.0  # failure guard for anything that should happen promptly

MQTT_5 = 5
MQTT_311 = 4

_ids = itertools.count(1)


class Server(Protocol):
    host: str
    port: int

    def log_text(self) -> str: ...

    def log_mark(self) -> int: ...

    def log_since(self, mark: int) -> str: ...


def unique(prefix: str = "e2e") -> str:
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


# =============================================================================================
# paho clients


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: Properties | None
    at: float = field(default_factory=time.time)  # when it arrived (wall clock)

    def prop(self, name: str, default: Any = None) -> Any:
        if self.properties is None:
            return default
        return getattr(self.properties, name, default)


@dataclass
class Disconnected:
    reason_code: int
    from_server: bool  # paho: the broker sent a DISCONNECT (MQTT 5)
    properties: Properties | None = None


@dataclass
class _Waits:
    subacks: dict[int, list[int]] = field(default_factory=dict)
    unsubacks: dict[int, list[int]] = field(default_factory=dict)


class PahoClient:
    """A paho client (MQTT 5 or 3.1.1) whose operations wait for the broker's answer."""

    def __init__(
        self,
        host: str,
        port: int,
        version: int = MQTT_5,
        client_id: str | None = None,
        clean: bool = True,
        keepalive: int = 60,
        connect_properties: Properties | None = None,
        *,
        expiry: int | None = None,
        transport: str = "tcp",
        path: str = "/mqtt",
        tls: ssl.SSLContext | None = None,
        bind_address: str = "",
        reconnect: bool = False,
    ) -> None:
        """``expiry``: the Session Expiry Interval its CONNECT asks for (MQTT 5);
        ``transport``: "tcp" or "websockets" (on ``path``); ``tls``: the client's context for
        TLS; ``bind_address``: the local address to connect from; ``reconnect``: connect again
        (within half a second) whenever the connection is lost."""
        if expiry is not None and version == MQTT_5:
            connect_properties = connect_properties or Properties(PacketTypes.CONNECT)
            connect_properties.SessionExpiryInterval = expiry
        self.host = host
        self.port = port
        self.version = version
        self.client_id = unique("paho") if client_id is None else client_id
        self.clean = clean
        self.keepalive = keepalive
        self.connect_properties = connect_properties
        protocol = mqtt.MQTTv5 if version == MQTT_5 else mqtt.MQTTv311
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            clean_session=None if version == MQTT_5 else clean,
            reconnect_on_failure=reconnect,  # else a disconnected client stays disconnected
            transport=transport,  # type: ignore[arg-type]
        )
        if reconnect:
            self.client.reconnect_delay_set(0.05, 0.5)
        if transport == "websockets":
            self.client.ws_set_options(path=path)
        if tls is not None:
            self.client.tls_set_context(tls)
        self.bind_address = bind_address
        self._cond = threading.Condition()
        self.messages: list[Received] = []
        self.disconnects: list[Disconnected] = []
        self.connack: tuple[int, bool, Properties | None] | None = None  # (code, present, props)
        self._waits = _Waits()
        self._started = False
        c = self.client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe
        c.on_socket_open = self._on_socket_open
        c.on_publish = self._on_publish
        self.acked: dict[int, int] = {}  # mid -> PUBACK/PUBREC reason code (0 for QoS 0)

    def __repr__(self) -> str:
        return f"PahoClient({self.client_id!r}, MQTT {'5' if self.version == 5 else '3.1.1'})"

    # -- callbacks (network thread) ---------------------------------------------------------

    def _on_socket_open(self, client: Any, userdata: Any, sock: Any) -> None:
        # Small packets go out at once instead of waiting for the previous one's ACK (Nagle).
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any):
        with self._cond:
            self.connack = (rc.value, bool(flags.session_present), props)
            self._cond.notify_all()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any):
        with self._cond:
            self.disconnects.append(
                Disconnected(rc.value, bool(flags.is_disconnect_packet_from_server), props)
            )
            self._cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: ReasonCode, props: Any) -> None:
        with self._cond:
            self.acked[mid] = rc.value
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        received = Received(
            msg.topic,
            bytes(msg.payload),
            msg.qos,
            bool(msg.retain),
            bool(msg.dup),
            getattr(msg, "properties", None),
        )
        with self._cond:
            self.messages.append(received)
            self._cond.notify_all()

    def _on_subscribe(
        self, client: Any, userdata: Any, mid: int, codes: list[ReasonCode], props: Any
    ):
        with self._cond:
            self._waits.subacks[mid] = [c.value for c in codes]
            self._cond.notify_all()

    def _on_unsubscribe(
        self, client: Any, userdata: Any, mid: int, codes: list[ReasonCode], props: Any
    ):
        with self._cond:
            self._waits.unsubacks[mid] = [c.value for c in codes]
            self._cond.notify_all()

    # -- waiting ----------------------------------------------------------------------------

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (on the condition the callbacks notify) until ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self}: timed out after {timeout}s waiting for {what}; "
                        f"received {len(self.messages)} messages "
                        f"{[(m.topic, m.payload[:40]) for m in self.messages[-10:]]} (last 10), "
                        f"disconnects {self.disconnects}"
                    )
                self._cond.wait(left)

    def wait_messages(self, count: int, timeout: float = TIMEOUT) -> list[Received]:
        """Wait until at least ``count`` messages arrived; all received so far."""
        self.wait_until(lambda: len(self.messages) >= count, timeout, f"{count} messages")
        with self._cond:
            return list(self.messages)

    def wait_payload(self, payload: bytes, timeout: float = TIMEOUT) -> list[Received]:
        """Wait until a message with ``payload`` arrived; all received up to and including it."""

        def seen() -> bool:
            return any(m.payload == payload for m in self.messages)

        self.wait_until(seen, timeout, f"a message with payload {payload!r}")
        with self._cond:
            index = next(i for i, m in enumerate(self.messages) if m.payload == payload)
            return list(self.messages[: index + 1])

    def wait_published(self, info: mqtt.MQTTMessageInfo, timeout: float = TIMEOUT) -> int:
        """Wait for the acknowledgement of an earlier ``publish(wait=False)``; its reason code."""
        self.wait_until(
            lambda: info.mid in self.acked or bool(self.disconnects), timeout, "acknowledgement"
        )
        assert info.mid in self.acked, f"{self}: disconnected: {self.disconnects}"
        with self._cond:
            return self.acked[info.mid]

    @property
    def session_present(self) -> bool:
        """The Session Present flag of the CONNACK (False before it)."""
        return self.connack is not None and self.connack[1]

    def wait_disconnected(self, timeout: float = TIMEOUT) -> Disconnected:
        self.wait_until(lambda: bool(self.disconnects), timeout, "a disconnection")
        with self._cond:
            return self.disconnects[0]

    def received(self) -> list[Received]:
        with self._cond:
            return list(self.messages)

    # -- operations -------------------------------------------------------------------------

    def connect(self, timeout: float = TIMEOUT, expect_success: bool = True) -> int:
        """Connect and wait for CONNACK; returns its reason code."""
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.version == MQTT_5:
            kwargs["clean_start"] = self.clean
            if self.connect_properties is not None:
                kwargs["properties"] = self.connect_properties
        self.client.connect(self.host, self.port, bind_address=self.bind_address, **kwargs)
        self.client.loop_start()
        self._started = True
        self.wait_until(
            lambda: self.connack is not None or bool(self.disconnects), timeout, "CONNACK"
        )
        assert self.connack is not None, f"{self}: closed before CONNACK: {self.disconnects}"
        code = self.connack[0]
        if expect_success:
            assert code == 0, f"{self}: CONNACK reason code 0x{code:02X}"
        return code

    def subscribe(
        self,
        topic_filter: str,
        qos: int = 0,
        subscription_id: int | None = None,
        options: SubscribeOptions | None = None,
        timeout: float = TIMEOUT,
    ) -> list[int]:
        """Subscribe to one filter and wait for SUBACK; the reason codes / granted QoS."""
        kwargs: dict[str, Any] = {}
        if subscription_id is not None:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = subscription_id
            kwargs["properties"] = props
        if options is not None:
            result, mid = self.client.subscribe(topic_filter, options=options, **kwargs)
        else:
            result, mid = self.client.subscribe(topic_filter, qos, **kwargs)
        assert result == mqtt.MQTT_ERR_SUCCESS, f"{self}: subscribe failed locally: {result}"
        self.wait_until(lambda: mid in self._waits.subacks, timeout, f"SUBACK {mid}")
        return self._waits.subacks[mid]

    def unsubscribe(self, topic_filter: str, timeout: float = TIMEOUT) -> list[int]:
        result, mid = self.client.unsubscribe(topic_filter)
        assert result == mqtt.MQTT_ERR_SUCCESS, f"{self}: unsubscribe failed locally: {result}"
        self.wait_until(lambda: mid in self._waits.unsubacks, timeout, f"UNSUBACK {mid}")
        return self._waits.unsubacks[mid]

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        wait: bool = True,
        timeout: float = TIMEOUT,
    ) -> mqtt.MQTTMessageInfo:
        """Publish; with ``wait``, until the broker has handled it: PUBACK (QoS 1), PUBCOMP (2),
        or for QoS 0 the answer to a packet sent after it (see ``sync``)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self}: publish failed locally: {info.rc}"
        if wait:
            self.wait_until(
                lambda: info.mid in self.acked or bool(self.disconnects),
                timeout,
                f"the acknowledgement of the PUBLISH to {topic!r}",
            )
            assert info.mid in self.acked, (
                f"{self}: disconnected before the PUBLISH to {topic!r} was acknowledged: "
                f"{self.disconnects}"
            )
            if qos == 0:
                self.sync(timeout)
        return info

    def publish_all(
        self, messages: Iterable[tuple[str, bytes, int, bool]], timeout: float = 4 * TIMEOUT
    ) -> list[int]:
        """Publish every (topic, payload, qos, retain) without waiting in between, then wait for
        all their acknowledgements (QoS 1 and 2); their reason codes."""
        infos = [self.publish(t, p, q, r, wait=False) for t, p, q, r in messages]
        self.wait_until(
            lambda: all(i.mid in self.acked for i in infos) or bool(self.disconnects),
            timeout,
            f"the acknowledgements of {len(infos)} messages",
        )
        with self._cond:
            missing = [i.mid for i in infos if i.mid not in self.acked]
            assert not missing, f"{self}: disconnected before {missing} were acknowledged"
            return [self.acked[i.mid] for i in infos]

    def sync(self, timeout: float = TIMEOUT) -> None:
        """Wait until the broker has handled everything this client sent so far: it answers
        packets of one connection in order, so the UNSUBACK to an UNSUBSCRIBE sent now (of a
        filter never subscribed, so without side effects) comes after all of them."""
        self.unsubscribe(f"sync/{unique()}", timeout)

    def disconnect(self) -> None:
        self.client.disconnect()

    def close(self) -> None:
        """Disconnect (if still connected) and stop the network thread."""
        try:
            self.client.disconnect()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        if self._started:
            self.client.loop_stop()
            self._started = False


Paho = Callable[..., PahoClient]  # the paho fixture (tests/conftest.py)


class Collector(PahoClient):
    """A paho client of a broker on 127.0.0.1 that subscribes to ``topics`` on every
    (re)connection and keeps what it receives, across restarts of that broker; with
    ``persistent``, on a session that outlives its connections."""

    def __init__(
        self,
        port: int,
        topics: list[str],
        qos: int = 1,
        version: int = MQTT_5,
        persistent: bool = False,
        client_id: str | None = None,
    ) -> None:
        super().__init__(
            "127.0.0.1",
            port,
            version,
            client_id or unique("collector"),
            clean=not persistent,
            expiry=3600 if persistent else None,
            reconnect=True,
        )
        self.topics = topics
        self.qos = qos
        self.connect()
        self.wait_until(lambda: bool(self._waits.subacks), TIMEOUT, "the first SUBACK")

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any):
        super()._on_connect(client, userdata, flags, rc, props)
        client.subscribe([(topic, self.qos) for topic in self.topics])

    def payloads(self, prefix: bytes = b"") -> list[bytes]:
        """The payloads received so far that start with ``prefix``."""
        with self._cond:
            return [m.payload for m in self.messages if m.payload.startswith(prefix)]

    def wait_count(self, count: int, prefix: bytes = b"", timeout: float = 2 * TIMEOUT) -> None:
        """Wait until ``count`` payloads starting with ``prefix`` arrived."""
        self.wait_until(
            lambda: len(self.payloads(prefix)) >= count,
            timeout,
            f"{count} messages starting {prefix!r}",
        )


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 2 * TIMEOUT) -> None:
    """Poll ``predicate`` (for what no client callback announces: a web hook's endpoint, a
    figure in $SYS) until it holds; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def publish_properties(**values: Any) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def assert_broker_healthy(server: Server, version: int = MQTT_5, since: int = 0) -> None:
    """A new client can still subscribe, publish and receive (QoS 1), and the broker's log (from
    the mark ``since``) has no traceback."""
    topic = f"health/{unique()}"
    sub = PahoClient(server.host, server.port, version)
    pub = PahoClient(server.host, server.port, version)
    try:
        sub.connect()
        assert sub.subscribe(topic, 1) == [1]
        pub.connect()
        pub.publish(topic, b"still alive", 1)
        got = sub.wait_messages(1)
        assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, b"still alive", 1)]
    finally:
        sub.close()
        pub.close()
    log = server.log_since(since)
    assert "Traceback" not in log, f"the broker logged a traceback:\n{log}"


# =============================================================================================
# Raw bytes


def closed_by_peer(sock: socket.socket, until: float) -> bool:
    """Read (and discard) until the broker closes the connection (True) or the monotonic
    deadline ``until`` passes (False)."""
    while time.monotonic() < until:
        sock.settimeout(max(0.05, until - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:  # reset: closed too
            return True
        if not data:
            return True
    return False


def utf8(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def binary(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def packet(first: int, body: bytes) -> bytes:
    """A whole packet: first byte, Remaining Length, body."""
    return bytes((first,)) + vbi(len(body)) + body


def prop(ident: int, value: bytes) -> bytes:
    """One property: its identifier and its encoded value."""
    return vbi(ident) + value


def connect_packet(
    client_id: str,
    version: int = MQTT_5,
    keep_alive: int = 60,
    clean: bool = True,
    flags: int | None = None,
    level: int | None = None,
    name: str = "MQTT",
    properties: bytes = b"",
    *,
    will: tuple[str, bytes] | None = None,
    will_qos: int = 0,
    username: str | None = None,
    password: bytes | None = None,
    auth_method: str | None = None,
    auth_data: bytes | None = None,
) -> bytes:
    """CONNECT, with a will ``(topic, message)`` (no will properties), a user name, a
    password and an Authentication Method and Data (MQTT 5, after ``properties``) where given.
    ``flags``/``level``/``name`` override the Connect Flags byte, the protocol level and the
    protocol name."""
    if auth_method is not None:
        properties += prop(0x15, utf8(auth_method))
    if auth_data is not None:
        properties += prop(0x16, binary(auth_data))
    if flags is None:
        flags = 0x02 if clean else 0x00
        if will is not None:
            flags |= 0x04 | will_qos << 3
        if username is not None:
            flags |= 0x80
        if password is not None:
            flags |= 0x40
    level = version if level is None else level
    body = utf8(name) + bytes((level, flags)) + keep_alive.to_bytes(2, "big")
    if version == MQTT_5:
        body += vbi(len(properties)) + properties
    body += utf8(client_id)
    if will is not None:
        if version == MQTT_5:
            body += b"\x00"
        body += utf8(will[0]) + binary(will[1])
    if username is not None:
        body += utf8(username)
    if password is not None:
        body += binary(password)
    return packet(0x10, body)


def publish_packet(
    topic: str,
    payload: bytes,
    qos: int = 0,
    packet_id: int = 1,
    version: int = MQTT_5,
    retain: bool = False,
    properties: bytes = b"",
) -> bytes:
    body = utf8(topic)
    if qos:
        body += packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += vbi(len(properties)) + properties
    return packet(0x30 | (qos << 1) | int(retain), body + payload)


def subscribe_packet(
    packet_id: int, filters: Iterable[tuple[str, int]], version: int = MQTT_5
) -> bytes:
    body = packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += b"\x00"
    for topic_filter, options in filters:
        body += utf8(topic_filter) + bytes((options,))
    return packet(0x82, body)


def auth_packet(reason_code: int, method: str, data: bytes | None) -> bytes:
    """An MQTT 5 AUTH with its Authentication Method and, where given, Data."""
    props = prop(0x15, utf8(method))
    if data is not None:
        props += prop(0x16, binary(data))
    return packet(0xF0, bytes((reason_code,)) + vbi(len(props)) + props)


def packet_type(data: bytes) -> int:
    """The type of a whole packet (the high nibble of its first byte)."""
    return data[0] >> 4


PINGREQ, PINGRESP = fastpath.PINGREQ, fastpath.PINGRESP
CONNACK_OK = b"\x20\x02\x00\x00"  # 3.1.1: accepted, no session present
DISCONNECT = b"\xe0\x00"  # 3.1.1, and MQTT 5 with reason 0x00 and no properties left out


def decode_vbi(data: bytes, pos: int) -> tuple[int, int]:
    """The Variable Byte Integer at ``pos`` in ``data``: (value, position after it)."""
    return fastpath.decode_vbi(data, pos, len(data))


# Property identifier -> (name, type) for every MQTT 5 property (section 2.2.2.2).
PROPERTY_TYPES: dict[int, tuple[str, str]] = {
    0x01: ("PayloadFormatIndicator", "byte"),
    0x02: ("MessageExpiryInterval", "int4"),
    0x03: ("ContentType", "str"),
    0x08: ("ResponseTopic", "str"),
    0x09: ("CorrelationData", "bin"),
    0x0B: ("SubscriptionIdentifier", "vbi"),
    0x11: ("SessionExpiryInterval", "int4"),
    0x12: ("AssignedClientIdentifier", "str"),
    0x13: ("ServerKeepAlive", "int2"),
    0x15: ("AuthenticationMethod", "str"),
    0x16: ("AuthenticationData", "bin"),
    0x17: ("RequestProblemInformation", "byte"),
    0x18: ("WillDelayInterval", "int4"),
    0x19: ("RequestResponseInformation", "byte"),
    0x1A: ("ResponseInformation", "str"),
    0x1C: ("ServerReference", "str"),
    0x1F: ("ReasonString", "str"),
    0x21: ("ReceiveMaximum", "int2"),
    0x22: ("TopicAliasMaximum", "int2"),
    0x23: ("TopicAlias", "int2"),
    0x24: ("MaximumQoS", "byte"),
    0x25: ("RetainAvailable", "byte"),
    0x26: ("UserProperty", "pair"),
    0x27: ("MaximumPacketSize", "int4"),
    0x28: ("WildcardSubscriptionAvailable", "byte"),
    0x29: ("SubscriptionIdentifierAvailable", "byte"),
    0x2A: ("SharedSubscriptionAvailable", "byte"),
}


def parse_properties(data: bytes, pos: int = 0) -> tuple[list[tuple[str, Any]], int]:
    """Parse a Property Length and the properties after it, strictly (an unknown identifier or a
    property running past the length fails the test); returns (name/value pairs, end)."""
    length, pos = decode_vbi(data, pos)
    end = pos + length
    assert end <= len(data), f"property length {length} runs past the packet: {data.hex(' ')}"
    out: list[tuple[str, Any]] = []

    def take(n: int) -> bytes:
        nonlocal pos
        assert pos + n <= end, f"property runs past the property length: {data.hex(' ')}"
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def string() -> str:
        return take(int.from_bytes(take(2), "big")).decode("utf-8")

    while pos < end:
        ident, pos = decode_vbi(data, pos)
        assert ident in PROPERTY_TYPES, f"unknown property 0x{ident:02X} in {data.hex(' ')}"
        name, kind = PROPERTY_TYPES[ident]
        value: Any
        if kind == "byte":
            value = take(1)[0]
        elif kind == "int2":
            value = int.from_bytes(take(2), "big")
        elif kind == "int4":
            value = int.from_bytes(take(4), "big")
        elif kind == "vbi":
            value, pos = decode_vbi(data, pos)
            assert pos <= end
        elif kind == "str":
            value = string()
        elif kind == "bin":
            value = take(int.from_bytes(take(2), "big"))
        else:
            value = (string(), string())
        out.append((name, value))
    return out, end


def parse_disconnect_v5(data: bytes) -> tuple[int, list[tuple[str, Any]]]:
    """A whole MQTT 5 DISCONNECT packet from the server -> (reason code, properties); asserts it
    is well formed, nothing follows it, and it has no Session Expiry Interval (MQTT-3.14.2-2)."""
    assert data[:1] == b"\xe0", f"not a DISCONNECT: {data.hex(' ')}"
    length, pos = decode_vbi(data, 1)
    assert pos + length == len(data), f"DISCONNECT length mismatch: {data.hex(' ')}"
    if length == 0:
        return 0, []
    code = data[pos]
    if length == 1:
        return code, []
    props, end = parse_properties(data, pos + 1)
    assert end == len(data), f"bytes after the DISCONNECT properties: {data.hex(' ')}"
    allowed = {"ReasonString", "UserProperty", "ServerReference"}
    assert {name for name, _ in props} <= allowed, f"DISCONNECT properties: {props}"
    return code, props


def parse_connack(data: bytes, version: int) -> tuple[bool, int, list[tuple[str, Any]]]:
    """A whole CONNACK -> (session present, reason/return code, properties)."""
    assert data[:1] == b"\x20", f"not a CONNACK: {data.hex(' ')}"
    length, pos = decode_vbi(data, 1)
    assert pos + length == len(data), f"CONNACK length mismatch: {data.hex(' ')}"
    if version != MQTT_5:
        assert length == 2, f"3.1.1 CONNACK is 4 bytes: {data.hex(' ')}"
        assert data[pos] in (0, 1), f"reserved acknowledge flags set: {data.hex(' ')}"
        return bool(data[pos]), data[pos + 1], []
    assert data[pos] in (0, 1), f"reserved acknowledge flags set: {data.hex(' ')}"
    present, code = bool(data[pos]), data[pos + 1]
    props, end = parse_properties(data, pos + 2)
    assert end == len(data), f"bytes after the CONNACK properties: {data.hex(' ')}"
    return present, code, props


def parse_reason_and_properties(data: bytes, first: int) -> tuple[int, dict[str, object]]:
    """An MQTT 5 AUTH (``first`` 0xF0) or CONNACK (0x20): its reason code and properties."""
    assert data[0] == first, f"expected packet 0x{first:02X}, got {data.hex(' ')}"
    _, pos = decode_vbi(data, 1)  # the Remaining Length
    if first == 0x20:
        pos += 1  # acknowledge flags
    code = data[pos]
    props, _ = parse_properties(data, pos + 1)
    return code, dict(props)


class RawClient:
    """A plain TCP connection to the broker for byte-exact exchanges."""

    def __init__(self, host: str, port: int, timeout: float = TIMEOUT, source: str = "") -> None:
        """``source``: the address of this machine to connect from (127.0.0.2: another
        loopback address, so the broker sees another client)."""
        self.sock = socket.create_connection(
            (host, port), timeout=timeout, source_address=(source, 0) if source else None
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self.eof = False

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        """Read what is available (waiting until ``deadline``); False at end of stream."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([self.sock], [], [], left)
        if not ready:
            raise TimeoutError
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self._buf += chunk
        return True

    def recv_exact(self, count: int, timeout: float = TIMEOUT) -> bytes:
        deadline = time.monotonic() + timeout
        try:
            while len(self._buf) < count:
                if not self._fill(deadline):
                    raise AssertionError(
                        f"connection closed after {len(self._buf)} of {count} expected bytes: "
                        f"{bytes(self._buf).hex(' ')}"
                    )
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout}s with {len(self._buf)} of {count} expected bytes: "
                f"{bytes(self._buf).hex(' ')}"
            ) from None
        data = bytes(self._buf[:count])
        del self._buf[:count]
        return data

    def read_packet(self, timeout: float = TIMEOUT) -> bytes:
        """One whole packet (fixed header included)."""
        deadline = time.monotonic() + timeout
        head = self.recv_exact(1, timeout)
        length_bytes = b""
        while True:
            byte = self.recv_exact(1, max(0.0, deadline - time.monotonic()))
            length_bytes += byte
            if not byte[0] & 0x80:
                break
            assert len(length_bytes) < 4, f"Remaining Length too long: {length_bytes.hex(' ')}"
        length, _ = decode_vbi(length_bytes, 0)
        body = self.recv_exact(length, max(0.0, deadline - time.monotonic()))
        return head + length_bytes + body

    def read_until_closed(self, timeout: float = TIMEOUT) -> bytes:
        """Everything the broker sends until it closes the connection; fails if it is still open
        after ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                pass
        except TimeoutError:
            raise AssertionError(
                f"the broker did not close the connection within {timeout}s; "
                f"received {bytes(self._buf).hex(' ') or 'nothing'}"
            ) from None
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def connect(
        self, client_id: str, version: int = MQTT_5, keep_alive: int = 60, clean: bool = True
    ) -> tuple[bool, int, list[tuple[str, Any]]]:
        """CONNECT and read a successful CONNACK; returns it parsed."""
        self.send(connect_packet(client_id, version, keep_alive, clean))
        present, code, props = parse_connack(self.read_packet(), version)
        assert code == 0, f"CONNACK code 0x{code:02X} {props}"
        return present, code, props


def connack_code(
    server: Server,
    version: int = MQTT_5,
    client_id: str | None = None,
    source: str = "",
    **connect: Any,
) -> int:
    """One CONNECT (``connect``: the keywords of ``connect_packet``) on a raw socket of its own,
    from ``source`` (see ``RawClient``): the CONNACK's reason code (MQTT 5) or return code
    (3.1.1)."""
    with RawClient(server.host, server.port, source=source) as raw:
        raw.send(connect_packet(client_id or unique("raw"), version, **connect))
        return parse_connack(raw.read_packet(), version)[1]


@contextmanager
def stalled_subscriber(server: Server, client_id: str, topic: str) -> Iterator[RawClient]:
    """An MQTT 5 client subscribed to ``topic`` at QoS 1 with Receive Maximum 1 that reads and
    acknowledges nothing unless told: one message is in flight to it, the rest queue."""
    with RawClient(server.host, server.port) as raw:
        raw.send(connect_packet(client_id, properties=prop(0x21, (1).to_bytes(2, "big"))))
        assert parse_connack(raw.read_packet(), MQTT_5)[1] == 0
        raw.send(subscribe_packet(1, [(topic, 1)]))
        raw.read_packet()  # SUBACK
        yield raw
