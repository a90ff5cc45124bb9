"""A bridge to another MQTT broker: a client of the remote broker, written on the project's own
codec (protocol/grammar.py, fastpath.py) over asyncio streams.

- ``out`` rules are the subscriptions of the bridge's session (``$bridge/<name>``, see
  broker/sink.py): matching messages wait in the SQLite store until the remote acknowledged them
  (PUBACK, or PUBCOMP for QoS 2), across remote outages and local crashes, bounded by
  ``max_queued_messages``/``max_queued_bytes`` (drops counted). Packet ids are the session's.
- ``in`` rules are the bridge's subscriptions on the remote (No Local with MQTT 5). Each message
  is published locally as the bridge's session (ACLs, retained and routing as for a client) and
  acknowledged to the remote only once the local store committed it.
- MQTT 5: Clean Start 0 with a Session Expiry Interval (``session_expiry``, default one hour), so
  the remote keeps the bridge's subscriptions and queue across an outage; properties (user
  properties, content type, response topic, correlation data, message expiry with the time
  left) are carried both ways. MQTT 3.1.1: Clean Session 0.
- No loops: the bridge's local subscriptions have No Local (a message that came in over this
  bridge never goes back out over it); on the remote, No Local as well. Between our own brokers
  (MQTT 5), each broker announces a random id as the retained ``$SYS/broker/id``, which a bridge
  subscribes to, and a bridged message carries the ids of the brokers it has been in as user
  properties ``mqttbroker-via``: a bridge sends nothing to a broker that already had it, and
  takes in nothing that was already here, so bridges in a cycle (two brokers each bridged to
  the other) stop every message after one round.
- Reconnects with exponential backoff and jitter (capped at 60 s); the reason for a failure is
  logged once per outage, not once per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import time
from typing import Any

from ..broker.core import Broker
from ..broker.session import Delivery
from ..broker.sink import Outbox, Sink
from ..broker.topics import matches
from ..config import BridgeConfig, TopicRule
from ..protocol import fastpath, grammar
from ..protocol import packets as pk
from ..protocol.errors import MQTTError
from ..protocol.fastpath import encode_properties, encode_publish_raw, encode_topic
from ..protocol.packets import MQTT_5, PacketType
from ..protocol.properties import PropertyId as Prop
from ..protocol.reasons import ReasonCode

log = logging.getLogger("mqttbroker.bridge")

VIA = "mqttbroker-via"  # user property: the brokers a bridged message has been in
ID_TOPIC = "$SYS/broker/id"  # retained: this broker's id (see Integrations)
FIRST_RETRY = 0.5  # seconds before the first reconnection attempt; doubles per failure
MAX_RETRY = 60.0
STABLE = 10.0  # seconds a connection must last for the backoff to start again from the first
CONNECT_TIMEOUT = 10.0
HIGH_WATER = 1 << 20  # bytes buffered towards the remote before waiting for it to drain
BATCH = 1000  # deliveries sent per pass before yielding to the event loop
ECHO_MEMORY = 10_000  # 3.1.1: messages sent out remembered to recognise their echo


# The acknowledgements the remote sends for our PUBLISHes, and its PUBREL for its QoS 2 ones.
_ACKS = frozenset((PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBCOMP, PacketType.PUBREL))


class BridgeError(Exception):
    """The remote broker refused or broke the protocol; the message says how."""


class Bridge(Sink):
    def __init__(self, broker: Broker, config: BridgeConfig, broker_id: str) -> None:
        self.broker = broker
        self.config = config
        self.broker_id = broker_id
        self.name = config.name
        self.version = MQTT_5 if config.protocol == "5" else 4
        self.outbox = Outbox(
            broker,
            "$bridge/" + config.name,
            self,
            config.max_queued_messages,
            config.max_queued_bytes,
        )
        self.session = self.outbox.session
        self.out_rules = [r for r in config.topics if r.direction != "in"]
        self.in_rules = [r for r in config.topics if r.direction != "out"]
        filters: dict[str, int] = {}
        for rule in self.out_rules:
            filters[rule.local_filter] = max(rule.qos, filters.get(rule.local_filter, 0))
        self.outbox.subscribe(filters)
        # status
        self.connected = False
        self.since = time.time()  # when `connected` last changed
        self.forwarded_out = 0
        self.forwarded_in = 0
        self.last_error = ""
        self._reported: str | None = None  # the failure logged in the current outage
        self._writer: asyncio.StreamWriter | None = None
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._send_quota = 65535  # the remote's Receive Maximum
        self._keep_alive = config.keep_alive
        self._echo: dict[tuple[str, bytes], int] = {}  # 3.1.1: (remote topic, payload) -> sent
        self.remote_id: str | None = None  # the remote's $SYS/broker/id, if it is one of ours
        self._unmatched: set[str] = set()  # topics logged as matching no in rule
        # The properties of a forwarded message that had none: only our mark
        self._via_only = encode_properties({Prop.USER_PROPERTY: [(VIA, broker_id)]})

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    # -- the broker's side ------------------------------------------------------------------

    def wake(self) -> None:
        self._work.set()

    def status(self) -> dict[str, Any]:
        """Figures for $SYS, the admin API and /metrics."""
        session = self.session
        return {
            "connected": self.connected,
            "since": self.since,
            "remote": self.address,
            "queued": len(session.queue),
            "inflight": len(session.inflight),
            "queued_bytes": session.queued_bytes,
            "dropped": session.dropped,
            "forwarded_out": self.forwarded_out,
            "forwarded_in": self.forwarded_in,
            "last_error": self.last_error,
        }

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bridge {self.name}")

    async def stop(self) -> None:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            try:
                writer.write(grammar.encode(pk.Disconnect(), self.version))
            except (OSError, RuntimeError):
                pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if writer is not None:
            writer.close()

    # -- connecting -------------------------------------------------------------------------

    def _failed(self, why: str) -> None:
        self.last_error = why
        if why != self._reported:  # once per outage (and when the reason changes)
            self._reported = why
            log.warning("bridge %s: %s (%s); retrying with backoff", self.name, why, self.address)
        else:
            log.debug("bridge %s: %s", self.name, why)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                reader, writer, present = await self._connect()
            except Exception as exc:
                failures += 1
                if isinstance(exc, _CONNECTION_ERRORS):
                    self._failed(f"cannot connect: {_describe(exc)}")
                else:  # a bug of ours: logged, and the bridge goes on trying
                    log.exception("bridge %s: internal error while connecting", self.name)
                    self._failed(f"cannot connect: internal error: {type(exc).__name__}")
                delay = min(MAX_RETRY, FIRST_RETRY * 2 ** min(failures - 1, 10))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                continue
            connected_at = time.monotonic()
            log.info(
                "bridge %s: connected to %s (MQTT %s, remote session %s)",
                self.name,
                self.address,
                "5.0" if self.version == MQTT_5 else "3.1.1",
                "resumed" if present else "new",
            )
            try:
                await self._serve(reader, writer, present)
                why = "the remote broker closed the connection"
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                why = f"connection lost: {_describe(exc)}"
            except (BridgeError, MQTTError) as exc:
                why = f"protocol error: {_describe(exc)}"
            except Exception as exc:  # a bug of ours: logged, and the bridge goes on
                log.exception("bridge %s: internal error", self.name)
                why = f"internal error: {type(exc).__name__}"
            finally:
                self._writer = None
                self.connected = False
                self.since = time.time()
                writer.close()
            self._failed(why)
            # A connection that ends soon after it began counts as a failed attempt: a remote
            # that accepts and then drops the bridge is not hammered.
            failures = 0 if time.monotonic() - connected_at > STABLE else failures + 1
            delay = min(MAX_RETRY, FIRST_RETRY * 2 ** min(failures, 10))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    def _tls(self) -> ssl.SSLContext:
        cfg = self.config
        context = ssl.create_default_context(cafile=cfg.tls_ca_file or None)
        if cfg.tls_cert_file:
            context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file or None)
        if cfg.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        cfg = self.config
        tls = self._tls() if cfg.tls else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                cfg.host,
                cfg.port,
                ssl=tls,
                server_hostname=(cfg.tls_server_name or cfg.host) if tls else None,
            ),
            CONNECT_TIMEOUT,
        )
        try:
            if writer.is_closing():  # (reset already: on uvloop, writing would raise RuntimeError)
                raise ConnectionResetError("the remote broker reset the connection")
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            props: dict[int, Any] = {}
            if self.version == MQTT_5 and cfg.session_expiry:
                props[Prop.SESSION_EXPIRY_INTERVAL] = cfg.session_expiry
            connect = pk.Connect(
                cfg.client_id,
                self.version,
                "MQTT",
                False,  # Clean Start 0: resume the remote session
                cfg.keep_alive,
                cfg.username,
                cfg.password,
                None,
                props,
            )
            writer.write(grammar.encode(connect, self.version))
            first, body = await asyncio.wait_for(_read_packet(reader), CONNECT_TIMEOUT)
            if first >> 4 != PacketType.CONNACK:
                raise BridgeError(f"expected CONNACK, got packet type {first >> 4}")
            connack = grammar.decode(first >> 4, first & 0x0F, body, self.version)
            assert isinstance(connack, pk.Connack)
            if connack.reason_code:
                raise BridgeError(f"refused by the remote broker: {_reason(connack.reason_code)}")
            props = connack.properties
            self._send_quota = props.get(Prop.RECEIVE_MAXIMUM, 65535)
            self._keep_alive = props.get(Prop.SERVER_KEEP_ALIVE, cfg.keep_alive) or cfg.keep_alive
        except BaseException:
            writer.close()
            raise
        return reader, writer, connack.session_present

    # -- one connection ---------------------------------------------------------------------

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, present: bool
    ) -> None:
        session = self.session
        if not present:
            # A new remote session: the inbound QoS 2 ids of the old one will never be released.
            for packet_id in list(session.awaiting_release):
                session.release(packet_id)
        self.remote_id = None
        v5 = self.version == MQTT_5
        requests: dict[str, int] = {}
        for rule in self.in_rules:
            requests[rule.remote_filter] = max(rule.qos, requests.get(rule.remote_filter, 0))
        subscriptions = [
            pk.SubscriptionRequest(
                topic_filter, qos, no_local=v5, retain_as_published=v5, retain_handling=int(v5)
            )
            for topic_filter, qos in requests.items()
        ]
        if v5:
            subscriptions.append(pk.SubscriptionRequest(ID_TOPIC, 0))
        if subscriptions:
            writer.write(grammar.encode(pk.Subscribe(1, subscriptions), self.version))
        self._writer = writer
        self.connected = True
        self.since = time.time()
        self.last_error = ""
        # Unacknowledged messages again, in their order, DUP set; PUBREL for those released.
        for packet_id, delivery in list(session.inflight.items()):
            if delivery.released:
                writer.write(
                    fastpath.encode_ack(PacketType.PUBREL, packet_id, 0, None, self.version)
                )
                continue
            data = self._encode(packet_id, delivery, True)
            if data is None:
                self.outbox.done(packet_id)
            else:
                writer.write(data)
        pump = asyncio.create_task(self._pump(writer))
        pinger = asyncio.create_task(self._ping(writer))
        try:
            while True:
                first, body = await asyncio.wait_for(_read_packet(reader), self._keep_alive * 1.5)
                self._handle(writer, first, body)
        finally:
            pump.cancel()
            pinger.cancel()

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self._keep_alive / 2)
            writer.write(fastpath.PINGREQ)

    async def _pump(self, writer: asyncio.StreamWriter) -> None:
        """Send queued messages while the remote's Receive Maximum leaves room."""
        try:
            await self._pump_until_closed(writer)
        except (OSError, RuntimeError):  # the connection went; the reader sees it too
            pass

    async def _pump_until_closed(self, writer: asyncio.StreamWriter) -> None:
        outbox = self.outbox
        session = self.session
        while True:
            self._work.clear()
            sent = 0
            out: list[bytes] = []
            # (session.inflight read each time: its first delivery gives it a dict of its own)
            while sent < BATCH and len(session.inflight) < self._send_quota:
                item = outbox.take()
                if item is None:
                    break
                packet_id, delivery = item
                data = self._encode(packet_id, delivery, False)
                if data is not None:
                    out.append(data)
                if data is None or not delivery.qos:
                    outbox.done(packet_id)
                sent += 1
            if out:
                writer.write(b"".join(out))  # one write per pass, not per message
            if writer.transport.get_write_buffer_size() > HIGH_WATER:
                await writer.drain()
            if sent < BATCH:
                await self._work.wait()
            else:
                await asyncio.sleep(0)

    def _encode(self, packet_id: int, delivery: Delivery, dup: bool) -> bytes | None:
        """The PUBLISH of one delivery to the remote; None if it is not to be sent (the remote
        had it already, or no out rule maps it any more)."""
        message = delivery.message
        rule = _rule(self.out_rules, message.topic, local=True)
        if rule is None:
            return None
        if rule.local_prefix == rule.remote_prefix:
            topic, topic_bytes = message.topic, message.topic_bytes
        else:
            topic = rule.remote_prefix + message.topic[len(rule.local_prefix) :]
            topic_bytes = encode_topic(topic)
        qos = delivery.qos
        props = message.properties
        encoded: bytes | None = None
        if self.version == MQTT_5:
            if not props and message.expires_at is None:  # the common case: encoded once
                encoded = self._via_only
            else:
                users = props.get(Prop.USER_PROPERTY, ())
                been = {value for key, value in users if key == VIA}
                if self.remote_id is not None and self.remote_id in been:
                    return None  # the remote had it already
                if self.broker_id not in been:
                    props = {**props, Prop.USER_PROPERTY: [*users, (VIA, self.broker_id)]}
                if message.expires_at is not None:  # what is left of it (MQTT-3.3.2-6)
                    props = {**props, Prop.MESSAGE_EXPIRY_INTERVAL: message.remaining_expiry(
                        self.broker.clock()
                    )}  # fmt: skip
                encoded = encode_properties(props)
        elif _rule(self.in_rules, topic, local=False) is not None:  # it will come back
            self._remember(topic, message.payload)
        if not dup:
            self.forwarded_out += 1
        flags = (dup << 3) | (qos << 1) | delivery.retain
        return encode_publish_raw(
            flags, topic_bytes, packet_id if qos else None, encoded, message.payload
        )

    def _remember(self, topic: str, payload: bytes) -> None:
        """3.1.1 has no No Local: remember what was sent, to drop its echo."""
        echo = self._echo
        if len(echo) >= ECHO_MEMORY:
            echo.clear()
        key = (topic, payload)
        echo[key] = echo.get(key, 0) + 1

    # -- packets from the remote ------------------------------------------------------------

    def _handle(self, writer: asyncio.StreamWriter, first: int, body: bytes) -> None:
        ptype = first >> 4
        session = self.session
        now = self.broker.clock()
        self._reported = None  # the remote answers: the outage is over
        if ptype == PacketType.PUBLISH:
            publish = fastpath.decode_publish(first & 0x0F, body, 0, len(body), self.version)
            if publish.topic == ID_TOPIC:
                self.remote_id = publish.payload.decode(errors="replace")
                if publish.qos:  # we asked for QoS 0; be polite anyway
                    self._ack_after_commit(writer, PacketType.PUBACK, publish.packet_id or 0, 0)
                return
            self._inbound(writer, publish)
        elif ptype in _ACKS:
            ack = fastpath.decode_ack(ptype, first & 0x0F, body, 0, len(body), self.version)
            packet_id = ack.packet_id
            if ptype == PacketType.PUBREL:
                session.release(packet_id)
                self._ack_after_commit(writer, PacketType.PUBCOMP, packet_id, 0)
            elif ptype == PacketType.PUBREC and session.received(packet_id, ack.reason_code, now):
                writer.write(
                    fastpath.encode_ack(PacketType.PUBREL, packet_id, 0, None, self.version)
                )
            else:
                if ptype == PacketType.PUBACK:
                    session.acknowledge(packet_id, now)
                elif ptype == PacketType.PUBCOMP:
                    session.completed(packet_id, now)
                self._work.set()  # a place in the window is free (or a PUBREC refused one)
        elif ptype == PacketType.SUBACK:
            suback = grammar.decode(ptype, first & 0x0F, body, self.version)
            assert isinstance(suback, pk.Suback)
            refused = [code for code in suback.reason_codes if code >= 0x80]
            log.info(
                "bridge %s: subscribed on the remote broker (%d of %d filters)",
                self.name,
                len(suback.reason_codes) - len(refused),
                len(suback.reason_codes),
            )
            if refused:
                log.warning(
                    "bridge %s: the remote broker refused %d of its subscriptions (%s)",
                    self.name,
                    len(refused),
                    ", ".join(_reason(code) for code in refused),
                )
        elif ptype == PacketType.DISCONNECT:
            packet = grammar.decode(ptype, first & 0x0F, body, self.version)
            assert isinstance(packet, pk.Disconnect)
            raise BridgeError(f"DISCONNECT from the remote broker: {_reason(packet.reason_code)}")
        elif ptype != PacketType.PINGRESP:
            raise BridgeError(f"unexpected packet type {ptype} from the remote broker")

    def _inbound(self, writer: asyncio.StreamWriter, publish: pk.Publish) -> None:
        """A message from the remote: published locally, acknowledged once committed."""
        qos = publish.qos
        packet_id = publish.packet_id or 0
        session = self.session
        if qos == 2 and packet_id in session.awaiting_release:  # a resend before PUBREL
            self._ack_after_commit(writer, PacketType.PUBREC, packet_id, 0)
            return
        code = self._publish_locally(publish)
        if qos == 2:
            if code < 0x80:
                session.await_release(packet_id)
            self._ack_after_commit(writer, PacketType.PUBREC, packet_id, code)
        elif qos == 1:
            self._ack_after_commit(writer, PacketType.PUBACK, packet_id, code)

    def _publish_locally(self, publish: pk.Publish) -> int:
        topic = publish.topic
        props = publish.properties
        if self.version == MQTT_5:
            users = props.get(Prop.USER_PROPERTY, ())
            been = {value for key, value in users if key == VIA}
            if self.broker_id in been:
                return ReasonCode.SUCCESS  # it was here before: not again
            if self.remote_id is not None and self.remote_id not in been:
                props = {**props, Prop.USER_PROPERTY: [*users, (VIA, self.remote_id)]}
        else:
            key = (topic, publish.payload)
            sent = self._echo.get(key)
            if sent:  # our own message come back (3.1.1 has no No Local)
                if sent == 1:
                    del self._echo[key]
                else:
                    self._echo[key] = sent - 1
                return ReasonCode.SUCCESS
        rule = _rule(self.in_rules, topic, local=False)
        if rule is None:
            # e.g. a subscription an earlier configuration left in the remote session
            if len(self._unmatched) < 1000 and topic not in self._unmatched:
                self._unmatched.add(topic)
                log.warning(
                    "bridge %s: message on %r matches no in rule; dropped", self.name, topic
                )
            return ReasonCode.TOPIC_NAME_INVALID
        local = rule.local_prefix + topic[len(rule.remote_prefix) :]
        code = self.outbox.publish(local, publish.payload, publish.qos, publish.retain, props)
        if code >= 0x80:
            log.warning(
                "bridge %s: message on %r not published locally: %s",
                self.name,
                local,
                _reason(code),
            )
        else:
            self.forwarded_in += 1
        return code

    def _ack_after_commit(
        self, writer: asyncio.StreamWriter, ptype: int, packet_id: int, code: int
    ) -> None:
        data = fastpath.encode_ack(ptype, packet_id, code, None, self.version)

        def send() -> None:
            if self._writer is writer and not writer.is_closing():
                writer.write(data)

        self.broker.store.after_commit(send)


def _rule(rules: list[TopicRule], topic: str, local: bool) -> TopicRule | None:
    for rule in rules:
        if matches(rule.local_filter if local else rule.remote_filter, topic):
            return rule
    return None


# How connecting to the remote broker fails when it is not a bug of ours. OSError takes in
# timeouts and TLS errors; IncompleteReadError: the remote closed the connection before its
# CONNACK.
_CONNECTION_ERRORS = (OSError, asyncio.IncompleteReadError, BridgeError, MQTTError)


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One packet: (first byte, body)."""
    first = (await reader.readexactly(1))[0]
    length = 0
    for shift in (0, 7, 14, 21):
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
    else:
        raise BridgeError("malformed remaining length from the remote broker")
    return first, await reader.readexactly(length) if length else b""


def _reason(code: int) -> str:
    try:
        return f"0x{code:02X} {ReasonCode(code).name.lower().replace('_', ' ')}"
    except ValueError:
        return f"0x{code:02X}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the remote broker closed the connection"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, MQTTError):
        return exc.message
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)
