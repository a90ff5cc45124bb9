"""Helpers of the persistence tests: paho clients that wait for the broker's answers, and a raw
socket client. The broker runs as support.launcher.BrokerProcess on a data directory that
outlives it (``kill()`` is SIGKILL, ``terminate()`` SIGTERM).

- ``Paho``: a paho-mqtt 2.x client (MQTT 5 or 3.1.1) on its own network thread; ``connect``,
  ``subscribe`` and ``wait_messages`` wait on a condition with a timeout.
- ``raw_connect``: a TCP socket that has sent CONNECT (built with the broker's own codec) and read
  the CONNACK; closing it is a network failure without DISCONNECT.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.launcher import BrokerProcess

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk

TIMEOUT = 15.0  # failure guard for anything that should happen promptly

MQTT_5 = 5
MQTT_311 = 4


# ---------------------------------------------------------------------------------------------
# paho


@dataclass
class Got:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    at: float  # time.time() when it arrived


class Paho:
    """A paho client whose operations wait for the broker's answer (with a timeout)."""

    def __init__(
        self,
        broker: BrokerProcess,
        client_id: str,
        version: int = MQTT_5,
        *,
        clean: bool = True,
        expiry: int | None = None,
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.version = version
        self.clean = clean
        self.expiry = expiry
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if version == MQTT_5 else mqtt.MQTTv311,
            clean_session=None if version == MQTT_5 else clean,
            reconnect_on_failure=False,
        )
        self.cond = threading.Condition()
        self.messages: list[Got] = []
        self.connack: tuple[int, bool] | None = None  # (reason code, session present)
        self.subacks: dict[int, list[int]] = {}
        self.publish_codes: dict[int, int] = {}  # mid -> reason code of PUBACK/PUBCOMP
        self.disconnected = False
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_publish = self._on_publish
        c.on_disconnect = self._on_disconnect

    # -- callbacks (network thread) ---------------------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        with self.cond:
            self.connack = (int(rc.value), bool(flags.session_present))
            self.cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.cond:
            self.messages.append(
                Got(
                    msg.topic,
                    bytes(msg.payload),
                    msg.qos,
                    bool(msg.retain),
                    bool(msg.dup),
                    time.time(),
                )
            )
            self.cond.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self.cond:
            self.subacks[mid] = [int(c.value) for c in codes]
            self.cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        with self.cond:
            self.publish_codes[mid] = int(rc.value)
            self.cond.notify_all()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    # -- operations -------------------------------------------------------------------------

    def _wait(self, predicate: Any, what: str, timeout: float = TIMEOUT) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise AssertionError(f"{self.client_id}: timed out waiting for {what}")

    def connect(self) -> bool:
        """Connect and wait for the CONNACK; returns Session Present."""
        kwargs: dict[str, Any] = {}
        if self.version == MQTT_5:
            kwargs["clean_start"] = self.clean
            if self.expiry is not None:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self.expiry
                kwargs["properties"] = props
        self.client.connect(self.broker.host, self.broker.port, keepalive=60, **kwargs)
        self.client.loop_start()
        self._wait(lambda: self.connack is not None, "CONNACK")
        assert self.connack is not None
        code, present = self.connack
        assert code == 0, f"CONNACK refused: {code}"
        return present

    def subscribe(self, topic_filter: str, qos: int) -> None:
        rc, mid = self.client.subscribe(topic_filter, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        self._wait(lambda: mid in self.subacks, f"SUBACK of {topic_filter}")
        assert self.subacks[mid] == [qos], self.subacks[mid]

    def publish_all(
        self, items: list[tuple[str, bytes, int, bool]], *, matched: bool = True
    ) -> None:
        """Publish (topic, payload, qos, retain) each and wait for every PUBACK/PUBCOMP. With
        ``matched``, all must report success (MQTT 5: not "no matching subscribers")."""
        infos = [self.client.publish(t, p, q, r) for t, p, q, r in items]
        deadline = time.monotonic() + 4 * TIMEOUT
        for info in infos:
            info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            assert info.is_published(), f"message {info.mid} was not acknowledged"
        with self.cond:
            codes = {self.publish_codes.get(i.mid) for i in infos}
        if self.version == MQTT_5 and matched:
            assert codes <= {0}, f"acknowledgements with reason codes {codes}"

    def wait_messages(self, count: int, timeout: float = TIMEOUT) -> list[Got]:
        self._wait(lambda: len(self.messages) >= count, f"{count} messages", timeout)
        with self.cond:
            return list(self.messages)

    def disconnect(self) -> None:
        """A normal DISCONNECT (the session stays, per its expiry)."""
        self.client.disconnect()
        self._wait(lambda: self.disconnected, "the disconnection")
        self.client.loop_stop()

    def abandon(self) -> None:
        """Stop the network thread (quickly: a DISCONNECT, if the connection is still up, wakes
        it); used after the broker went away and at the end of a test."""
        try:
            self.client.disconnect()
        except Exception:
            pass
        self.client.loop_stop()
        try:
            sock = self.client.socket()
            if sock is not None:
                sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# raw socket


def raw_connect(broker: BrokerProcess, connect: pk.Connect) -> socket.socket:
    """A socket that has sent ``connect`` and read a successful CONNACK."""
    sock = socket.create_connection((broker.host, broker.port), timeout=TIMEOUT)
    sock.sendall(grammar.encode(connect, connect.protocol_level))
    data = b""
    while len(data) < 2 or len(data) < 2 + data[1]:  # CONNACK is short: one length byte
        chunk = sock.recv(4096)
        assert chunk, "the broker closed the connection instead of sending CONNACK"
        data += chunk
    assert data[0] == 0x20, data
    reason = data[3]
    assert reason == 0, f"CONNACK refused: {reason:#x}"
    return sock
