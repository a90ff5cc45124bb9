"""The chaos run's devices: MQTT clients on asyncio, written for the run, that keep a persistent
session, publish QoS 1 and QoS 2 messages with sequence numbers, receive the other devices'
messages, reconnect whenever dropped, and record everything the checker (chaos_check.py) needs.

A device speaks MQTT 5 (Session Expiry Interval 3600 s) or 3.1.1 (Clean Session 0: the broker
keeps the session as long as it is configured to). Its client id is its name; it publishes on
``chaos/<name>/q1`` at QoS 1 and ``chaos/<name>/q2`` at QoS 2, the payload being the message's
sequence number on that topic (1, 2, ...), and subscribes once, with its first connection, to
both topics of every other device (or of ``fanout`` of them), each at its own QoS.

As MQTT requires of a client with a session (MQTT-4.4.0-1), on every reconnection whose CONNACK
says Session Present it first sends again, in their original order and with their original
packet identifiers, every PUBLISH not yet acknowledged (DUP set) and every PUBREL not yet
completed; a CONNACK without Session Present is recorded (``connack`` with ``sp`` false while
``expected_sp`` is true), the device's own session state is discarded as MQTT says
(MQTT-3.2.2-5: what was not acknowledged is given up, recorded as ``abandoned``) and it
subscribes again. As a receiver it keeps the packet identifiers of the QoS 2 messages it has
received and not yet seen released (PUBREL), across connections, so a QoS 2 PUBLISH sent again
with the same identifier is not a second delivery (MQTT 4.3.3, method B): the checker's "QoS 2
duplicate" is a message the broker sent again as a new one.

A connection is given up when it closes, when the broker sends DISCONNECT, or when nothing has
come from the broker for ``DEAD_AFTER`` seconds while something is waiting for an answer (the
device sends PINGREQ every ``PING_EVERY`` seconds, so that is always the case after a while):
a stopped node. A connection given up without being closed (the last case) is kept open, read
only, for ``ZOMBIE_HOLD`` seconds: a message that arrives on it although its publisher sent it
after the device's newer connection got its CONNACK means the old connection's node still
served the client id after another had taken it (``zombie_deliver``; the checker's "double
owner"). Nothing is answered there and nothing is counted as delivered.

Events are tuples appended to ``Recorder.events`` (see chaos_check.py for their fields): the
device's clock is the process's ``time.monotonic()``, shared by every device and the nemesis.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .wire import s16, vbi

MQTT_5 = 5
MQTT_311 = 4

CONNECT_TIMEOUT = 5.0  # TCP connect + CONNACK
SUBACK_TIMEOUT = 10.0
PING_EVERY = 2.0
DEAD_AFTER = 6.0  # nothing received for this long while waiting for an answer: given up
KEEP_ALIVE = 20  # what CONNECT says (the broker closes after 1.5 x this without a packet)
ZOMBIE_HOLD = 30.0  # a connection given up unclosed is read this long (longer than a SIGSTOP)
BACKOFF = (0.05, 0.5)  # seconds, uniform, before each reconnection attempt
MAX_INFLIGHT = 20
SESSION_EXPIRY = 3600


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def connect_packet(client_id: str, version: int, clean: bool, keep_alive: int) -> bytes:
    flags = 0x02 if clean else 0x00
    body = s16("MQTT") + bytes([version, flags]) + keep_alive.to_bytes(2, "big")
    if version == MQTT_5:
        props = b"\x11" + SESSION_EXPIRY.to_bytes(4, "big")
        body += vbi(len(props)) + props
    return packet(0x10, body + s16(client_id))


def publish_packet(
    topic: str, payload: bytes, qos: int, packet_id: int, dup: bool, version: int
) -> bytes:
    body = s16(topic) + (packet_id.to_bytes(2, "big") if qos else b"")
    if version == MQTT_5:
        body += b"\x00"
    return packet(0x30 | (0x08 if dup else 0) | (qos << 1), body + payload)


def ack_packet(kind: int, packet_id: int) -> bytes:
    """PUBACK (4), PUBREC (5), PUBREL (6, flags 0b0010), PUBCOMP (7): success, no properties
    (both versions: a 2-byte body means reason code 0 in MQTT 5)."""
    return bytes([(kind << 4) | (0x02 if kind == 6 else 0), 2]) + packet_id.to_bytes(2, "big")


def subscribe_packet(packet_id: int, filters: list[tuple[str, int]], version: int) -> bytes:
    body = packet_id.to_bytes(2, "big") + (b"\x00" if version == MQTT_5 else b"")
    for topic, qos in filters:
        body += s16(topic) + bytes([qos])
    return packet(0x82, body)


PINGREQ = b"\xc0\x00"


def disconnect_packet(version: int) -> bytes:
    return b"\xe0\x01\x00" if version == MQTT_5 else b"\xe0\x00"


def topic_of(name: str, qos: int) -> str:
    return f"chaos/{name}/q{qos}"


def parse_topic(topic: str) -> tuple[str, int] | None:
    """``chaos/<name>/q<qos>`` -> (name, qos)."""
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != "chaos" or parts[2] not in ("q1", "q2"):
        return None
    return parts[1], int(parts[2][1])


class Recorder:
    """Every device's events, in the order they happened, on one clock."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.clock: Callable[[], float] = time.monotonic

    def add(self, *event: Any) -> None:
        self.events.append((self.clock(), *event))


@dataclass
class Outgoing:
    topic: str
    seq: int
    qos: int
    state: str = "publish"  # waiting for PUBACK/PUBREC; "pubrel": waiting for PUBCOMP
    sent_at: float = 0.0


class ConnectionLost(Exception):
    pass


def _retrieve(task: asyncio.Future[None]) -> None:
    """A reader's end (its connection closed) is handled by whoever awaits it, if anyone."""
    if not task.cancelled():
        task.exception()


@dataclass
class Link:
    """One network connection of a device."""

    number: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    local_port: int
    last_rx: float = 0.0
    ping_out: bool = False
    given_up: bool = False
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    length = 0
    shift = 0
    for _ in range(4):
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    body = await reader.readexactly(length) if length else b""
    return first, body


def skip_properties(body: bytes, pos: int) -> int:
    length = 0
    shift = 0
    for _ in range(4):
        byte = body[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return pos + length


def receive_maximum(body: bytes) -> int | None:
    """CONNACK properties (MQTT 5): the Receive Maximum, if given."""
    pos = 2
    length = 0
    shift = 0
    while True:
        byte = body[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    end = pos + length
    sizes = {0x01: 1, 0x02: 4, 0x11: 4, 0x13: 2, 0x21: 2, 0x22: 2, 0x24: 1, 0x25: 1}
    sizes |= {0x28: 1, 0x29: 1, 0x2A: 1}
    while pos < end:
        ident = body[pos]
        pos += 1
        if ident == 0x21:
            return int.from_bytes(body[pos : pos + 2], "big")
        if ident in sizes:
            pos += sizes[ident]
        elif ident == 0x26:  # user property: two strings
            for _ in range(2):
                pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
        else:  # a string or binary property
            pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
    return None


@dataclass
class Device:
    name: str
    host: str
    port: int
    peers: list[str]
    recorder: Recorder
    version: int = MQTT_5
    tick: float = 1.0  # seconds between two publications (one QoS 1 and one QoS 2 message)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.seq = {1: 0, 2: 0}
        self.outgoing: dict[int, Outgoing] = {}  # packet id -> message, in sending order
        self.unreleased: set[int] = set()  # QoS 2 ids received, PUBREL not yet seen
        self.has_session = False  # a CONNACK has been received once (then Clean Start 0)
        self.subscribed = False
        self.next_id = 0
        self.link: Link | None = None
        self.links = 0
        self.inflight_max = MAX_INFLIGHT
        self.publishing = False
        self.running = True
        self.connected = asyncio.Event()
        self.zombies: set[asyncio.Task[None]] = set()
        self.suback: asyncio.Future[list[int]] | None = None
        self.connects = 0
        self.lost_at: float | None = None

    # -- packet ids ---------------------------------------------------------------------------

    def _packet_id(self) -> int:
        for _ in range(65535):
            self.next_id = self.next_id % 65535 + 1
            if self.next_id not in self.outgoing:
                return self.next_id
        raise RuntimeError("no free packet identifier")

    # -- the connection loop ------------------------------------------------------------------

    async def run(self) -> None:
        while self.running:
            started = self.recorder.clock()
            try:
                link = await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT)
            except (OSError, TimeoutError, ConnectionLost, asyncio.IncompleteReadError) as exc:
                self.recorder.add(
                    "connect_fail", self.name, started, str(exc) or type(exc).__name__
                )
                await asyncio.sleep(self.rng.uniform(*BACKOFF))
                continue
            reading = asyncio.ensure_future(self._read(link))
            reading.add_done_callback(_retrieve)
            try:
                await self._serve(link, reading)
            except (OSError, ConnectionLost, asyncio.IncompleteReadError) as exc:
                why = str(exc) or type(exc).__name__
            else:
                why = "stopped"
            self.connected.clear()
            self.link = None
            if link.given_up and not reading.done() and self.running:
                task = asyncio.ensure_future(self._zombie(link, reading))
                self.zombies.add(task)
                task.add_done_callback(self.zombies.discard)
            else:
                reading.cancel()
                link.close()
            if self.running:
                self.lost_at = time.monotonic()
                self.recorder.add("lost_conn", self.name, link.number, why)
                await asyncio.sleep(self.rng.uniform(*BACKOFF))

    async def _connect(self) -> Link:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            local_port = writer.get_extra_info("sockname")[1]
            self.links += 1
            link = Link(self.links, reader, writer, local_port, time.monotonic())
            clean = not self.has_session
            writer.write(connect_packet(self.name, self.version, clean, KEEP_ALIVE))
            first, body = await read_packet(reader)
            if first >> 4 != 2 or len(body) < 2:
                raise ConnectionLost(f"expected CONNACK, got 0x{first:02x}")
            session_present = bool(body[0] & 1)
            code = body[1]
            if code:
                raise ConnectionLost(f"CONNACK 0x{code:02x}")
        except BaseException:
            writer.close()
            raise
        self.recorder.add(
            "connack", self.name, link.number, session_present, self.has_session, local_port
        )
        self.connects += 1
        if self.version == MQTT_5:
            self.inflight_max = min(MAX_INFLIGHT, receive_maximum(body) or 65535)
        if not session_present:
            for packet_id, out in self.outgoing.items():
                if out.state == "publish":
                    self.recorder.add(
                        "abandoned", self.name, out.topic, out.seq, out.qos, packet_id
                    )
            self.outgoing.clear()
            self.unreleased.clear()
            self.subscribed = False
        self.has_session = True
        return link

    async def _serve(self, link: Link, reading: asyncio.Future[None]) -> None:
        self.link = link
        watching = asyncio.ensure_future(self._watch(link))
        try:
            # Resend first, in the original order (MQTT-4.4.0-1, 4.6.0-1).
            for packet_id, out in list(self.outgoing.items()):
                if out.state == "publish":
                    self._send_publish(link, packet_id, out, dup=True)
                else:
                    link.writer.write(ack_packet(6, packet_id))
            if not self.subscribed:
                await self._subscribe(link, reading)
            self.connected.set()
            done, _ = await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            watching.cancel()

    async def _subscribe(self, link: Link, reading: asyncio.Future[None]) -> None:
        filters = [(topic_of(peer, qos), qos) for peer in self.peers for qos in (1, 2)]
        packet_id = self._packet_id()
        loop = asyncio.get_running_loop()
        suback: asyncio.Future[list[int]] = loop.create_future()
        self.suback = suback
        link.writer.write(subscribe_packet(packet_id, filters, self.version))
        waiting: set[asyncio.Future[Any]] = {suback, reading}
        done, _ = await asyncio.wait(
            waiting, timeout=SUBACK_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if reading in done:
            reading.result()
            raise ConnectionLost("closed before SUBACK")
        if self.suback not in done:
            link.given_up = True
            raise ConnectionLost("no SUBACK")
        codes = self.suback.result()
        if any(code >= 0x80 for code in codes):
            raise ConnectionLost(f"SUBACK refused: {codes}")
        self.recorder.add("subscribed", self.name, tuple(topic for topic, _ in filters))
        self.subscribed = True

    async def _watch(self, link: Link) -> None:
        last_ping = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            waiting = link.ping_out or bool(self.outgoing)
            if waiting and now - link.last_rx > DEAD_AFTER:
                link.given_up = True
                raise ConnectionLost(f"nothing from the broker for {DEAD_AFTER:.0f} s")
            if now - last_ping >= PING_EVERY and not link.ping_out:
                link.ping_out = True
                last_ping = now
                link.writer.write(PINGREQ)

    def _send_publish(self, link: Link, packet_id: int, out: Outgoing, dup: bool) -> None:
        out.sent_at = time.monotonic()
        self.recorder.add("send", self.name, out.topic, out.seq, out.qos, dup, packet_id)
        payload = str(out.seq).encode()
        link.writer.write(publish_packet(out.topic, payload, out.qos, packet_id, dup, self.version))

    async def _read(self, link: Link) -> None:
        version = self.version
        reader = link.reader
        write = link.writer.write
        add = self.recorder.add
        while True:
            first, body = await read_packet(reader)
            link.last_rx = time.monotonic()
            kind = first >> 4
            if link.given_up:
                if kind == 3:
                    self._zombie_publish(link, first, body)
                continue
            if kind == 3:
                qos = (first >> 1) & 3
                tlen = int.from_bytes(body[0:2], "big")
                topic = body[2 : 2 + tlen].decode()
                pos = 2 + tlen
                packet_id = 0
                if qos:
                    packet_id = int.from_bytes(body[pos : pos + 2], "big")
                    pos += 2
                if version == MQTT_5:
                    pos = skip_properties(body, pos)
                seq = int(body[pos:])
                parsed = parse_topic(topic)
                publisher = parsed[0] if parsed else "?"
                dup = bool(first & 0x08)
                if qos == 2:
                    if packet_id in self.unreleased:
                        add("redeliver", self.name, topic, publisher, seq, qos, dup, link.number)
                    else:
                        self.unreleased.add(packet_id)
                        add("deliver", self.name, topic, publisher, seq, qos, dup, link.number)
                    write(ack_packet(5, packet_id))
                else:
                    add("deliver", self.name, topic, publisher, seq, qos, dup, link.number)
                    if qos == 1:
                        write(ack_packet(4, packet_id))
            elif kind in (4, 5, 7):  # PUBACK, PUBREC, PUBCOMP
                packet_id = int.from_bytes(body[0:2], "big")
                code = body[2] if len(body) > 2 else 0
                out = self.outgoing.get(packet_id)
                if out is None:
                    continue
                if kind == 7:
                    if out.state == "pubrel":
                        del self.outgoing[packet_id]
                    continue
                if kind == 5 and out.state == "pubrel":
                    write(ack_packet(6, packet_id))  # PUBREC again: answer with PUBREL again
                    continue
                add("ack", self.name, out.topic, out.seq, out.qos, code)
                if kind == 5 and code < 0x80:
                    out.state = "pubrel"
                    write(ack_packet(6, packet_id))
                else:
                    del self.outgoing[packet_id]
            elif kind == 6:  # PUBREL
                packet_id = int.from_bytes(body[0:2], "big")
                self.unreleased.discard(packet_id)
                write(ack_packet(7, packet_id))
            elif kind == 13:
                link.ping_out = False
            elif kind == 9:
                codes = list(body[skip_properties(body, 2) :] if version == MQTT_5 else body[2:])
                if self.suback is not None and not self.suback.done():
                    self.suback.set_result(codes)
            elif kind == 14:
                code = body[0] if body else 0
                raise ConnectionLost(f"DISCONNECT 0x{code:02x}")
            else:
                raise ConnectionLost(f"unexpected packet 0x{first:02x}")

    def _zombie_publish(self, link: Link, first: int, body: bytes) -> None:
        qos = (first >> 1) & 3
        tlen = int.from_bytes(body[0:2], "big")
        topic = body[2 : 2 + tlen].decode()
        pos = 2 + tlen + (2 if qos else 0)
        if self.version == MQTT_5:
            pos = skip_properties(body, pos)
        parsed = parse_topic(topic)
        publisher = parsed[0] if parsed else "?"
        seq = int(body[pos:])
        self.recorder.add("zombie_deliver", self.name, topic, publisher, seq, qos, link.number)

    async def _zombie(self, link: Link, reading: asyncio.Future[None]) -> None:
        """Keep reading a connection given up unclosed (``_read`` records what comes as
        ``zombie_deliver`` and answers nothing), then close it."""
        try:
            await asyncio.wait({reading}, timeout=ZOMBIE_HOLD)
        finally:
            reading.cancel()
            link.close()
            if reading.done() and not reading.cancelled():
                reading.exception()  # its end (the connection closed) is no news here

    # -- publishing ---------------------------------------------------------------------------

    async def publish_loop(self, until: float) -> None:
        """One QoS 1 and one QoS 2 message every ``tick`` seconds (jittered) while connected
        and under the in-flight bound, until ``until`` (monotonic)."""
        await asyncio.sleep(self.rng.uniform(0, self.tick))
        while time.monotonic() < until and self.running:
            link = self.link
            if link is not None and self.connected.is_set():
                for qos in (1, 2):
                    if len(self.outgoing) >= self.inflight_max:
                        break
                    self.seq[qos] += 1
                    out = Outgoing(topic_of(self.name, qos), self.seq[qos], qos)
                    packet_id = self._packet_id()
                    self.outgoing[packet_id] = out
                    self._send_publish(link, packet_id, out, dup=False)
            await asyncio.sleep(self.tick * self.rng.uniform(0.8, 1.2))

    async def stop(self) -> None:
        self.running = False
        link = self.link
        if link is not None and not link.closed:
            try:
                link.writer.write(disconnect_packet(self.version))
                await asyncio.wait_for(link.writer.drain(), 1.0)
            except (TimeoutError, OSError):
                pass
            link.close()
        for task in list(self.zombies):
            task.cancel()
