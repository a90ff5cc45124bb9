"""A test harness for the sans-I/O broker: a fake clock, fake links, and clients that speak in
packets encoded with the real codec and read back what the broker wrote.

No sockets, no sleeps: time moves only when a test calls ``clock.advance`` and enforcement
happens only when it calls ``broker.tick()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mqttbroker.broker.auth import CONTINUE, FAIL, SUCCESS, AuthOutcome, LoginRequest
from mqttbroker.broker.backplane import Backplane
from mqttbroker.broker.connection import Connection
from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.policy import OPEN, ListenerPolicy
from mqttbroker.broker.session import Session
from mqttbroker.broker.sink import Sink
from mqttbroker.broker.store import Store
from mqttbroker.broker.topics import SharedGroup
from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5
from mqttbroker.protocol.properties import PropertyId as Prop
from support.cleanup import ended_after
from support.codec import decode_packet

__all__ = [
    "GatedStore",
    "AllowAll",
    "DenySecret",
    "pair",
    "window",
    "FakeClock",
    "FakeLink",
    "Harness",
    "LinkClient",
    "Client",
    "split_packets",
    "split_raw",
    "decode_raw",
    "METHOD",
    "ToyAuthenticator",
    "Offload",
    "Prop",
    "pk",
    "MQTT_5",
    "MQTT_3_1_1",
    "PERSISTENT",
    "NOT_UTF8",
    "PFI",
    "POWERS_OF_TWO",
    "counts_logged",
    "disconnected_with",
    "queued_while_away",
    "WakeCounter",
    "RecordingBackplane",
    "make_harness",
    "h",
]


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock does not go back"
        self.now += seconds


class FakeLink:
    """A transport that records every write and whether (and how often) it was closed."""

    def __init__(self, on_write: Callable[[bytes], None] | None = None, keep: bool = True) -> None:
        self.keep = keep  # False: what is written is dropped (memory measurements)
        self.writes: list[bytes] = []
        self.closed = False
        self.close_calls = 0
        self.writes_after_close = 0
        self.reading_paused = False
        self.unread = 0  # what buffered() says: bytes the client has not taken
        self.aborted = False
        self.on_write = on_write  # sees each write as it happens

    def write(self, data: bytes) -> None:
        if self.closed:
            self.writes_after_close += 1
        if self.on_write is not None:
            self.on_write(bytes(data))
        if self.keep:
            self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True
        self.close_calls += 1

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def buffered(self) -> int:
        return self.unread

    def abort(self) -> None:
        self.closed = self.aborted = True

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)


def split_raw(data: bytes) -> list[bytes]:
    """Cut a written byte stream into whole packets (fixed header included)."""
    raw: list[bytes] = []
    pos = 0
    end = len(data)
    while pos < end:
        header = fastpath.read_fixed_header(data, pos, end)
        assert header is not None, f"truncated fixed header in the output at byte {pos}"
        length, body = header
        stop = body + length
        assert stop <= end, f"the output stops inside a packet (at byte {pos})"
        raw.append(data[pos:stop])
        pos = stop
    return raw


def decode_raw(raw: bytes, version: int) -> Any:
    header = fastpath.read_fixed_header(raw, 0, len(raw))
    assert header is not None
    return decode_packet(raw[0], raw[header[1] :], version)


def split_packets(data: bytes, version: int) -> list[Any]:
    """Cut a written byte stream into packets and decode each one with the real codec."""
    return [decode_raw(raw, version) for raw in split_raw(data)]


class LinkClient:
    """A fake network connection to ``broker`` speaking MQTT at ``version``: packets go in
    encoded with the grammar, and what the broker wrote on ``link`` comes out decoded. The
    clients of this harness and of the SQLite harness build on it."""

    def __init__(self, broker: Broker, version: int, link: FakeLink, peer: str, **connect: Any):
        self.version = version
        self.link = link
        self.conn: Connection = broker.connect(link, peer, **connect)
        self.connack: pk.Connack | None = None
        self._read = 0
        self._next_id = 1

    def send_raw(self, data: bytes) -> None:
        self.conn.data_received(data)

    def send(self, *packets: Any) -> None:
        """Encode ``packets`` with the grammar and feed them to the broker in one chunk."""
        self.send_raw(b"".join(grammar.encode(p, self.version) for p in packets))

    def next_id(self) -> int:
        packet_id = self._next_id
        self._next_id = packet_id % 65535 + 1
        return packet_id

    def publish(
        self,
        topic: str,
        payload: bytes = b"x",
        qos: int = 0,
        *,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: dict[int, Any] | None = None,
    ) -> int | None:
        """Send a PUBLISH (a QoS 1 or 2 one with the next packet id unless given); its id."""
        if qos and packet_id is None:
            packet_id = self.next_id()
        self.send(
            pk.Publish(
                topic, payload, qos, retain, dup, packet_id if qos else None, properties or {}
            )
        )
        return packet_id

    def send_subscribe(
        self,
        topic_filter: str,
        qos: int,
        *,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
        sub_id: int | None = None,
    ) -> int:
        """Send a SUBSCRIBE to one filter (with a Subscription Identifier unless ``sub_id`` is
        None); its packet id."""
        packet_id = self.next_id()
        props = {Prop.SUBSCRIPTION_IDENTIFIER: sub_id} if sub_id is not None else {}
        request = pk.SubscriptionRequest(
            topic_filter, qos, no_local, retain_as_published, retain_handling
        )
        self.send(pk.Subscribe(packet_id, [request], props))
        return packet_id

    def unread(self, limit: int | None = None) -> list[Any]:
        """Decode what the link got since the last call (at most ``limit`` packets; the rest
        stay for the next call), without flushing the broker."""
        raw = split_raw(self.link.data[self._read :])
        if limit is not None:
            raw = raw[:limit]
        self._read += sum(len(r) for r in raw)
        return [decode_raw(r, self.version) for r in raw]


class Client(LinkClient):
    """One fake network connection to the harness's broker."""

    def __init__(
        self,
        harness: Harness,
        version: int = MQTT_5,
        peer: str = "peer",
        policy: ListenerPolicy = OPEN,
        certificate_user: str | None = None,
    ) -> None:
        super().__init__(
            harness.broker,
            version,
            FakeLink(),
            peer,
            policy=policy,
            certificate_user=certificate_user,
        )
        self.h = harness
        self._connack_seen = False

    # -- sending ------------------------------------------------------------------------

    def subscribe(self, topic_filter: str, qos: int = 0, **options: Any) -> list[Any]:
        """SUBSCRIBE to one filter (``options``: those of ``send_subscribe``); returns
        everything received afterwards (SUBACK first)."""
        packet_id = self.send_subscribe(topic_filter, qos, **options)
        received = self.receive()
        assert received, "no SUBACK"
        suback = received[0]
        assert isinstance(suback, pk.Suback), received
        assert suback.packet_id == packet_id  # MQTT-3.8.4-2
        return received

    def unsubscribe(self, *filters: str) -> list[Any]:
        packet_id = self.next_id()
        self.send(pk.Unsubscribe(packet_id, list(filters)))
        return self.receive()

    def puback(self, packet_id: int) -> None:
        self.send(pk.Puback(packet_id))

    def pubrec(self, packet_id: int, reason_code: int = 0) -> None:
        self.send(pk.Pubrec(packet_id, reason_code))

    def pubrel(self, packet_id: int) -> None:
        self.send(pk.Pubrel(packet_id))

    def pubcomp(self, packet_id: int) -> None:
        self.send(pk.Pubcomp(packet_id))

    def pingreq(self) -> None:
        self.send_raw(fastpath.PINGREQ)

    def disconnect(self, reason_code: int = 0, properties: dict[int, Any] | None = None) -> None:
        self.send(pk.Disconnect(reason_code, properties or {}))

    def lose(self) -> None:
        """The network fails under the connection."""
        self.conn.connection_lost()

    # -- receiving ----------------------------------------------------------------------

    def receive(self, limit: int | None = None) -> list[Any]:
        """Flush the broker and decode whatever this client was sent since the last call (at
        most ``limit`` packets; the rest stay for the next call)."""
        self.h.broker.scheduler.flush()
        packets = self.unread(limit)
        self._check(packets)
        return packets

    def _check(self, packets: list[Any]) -> None:
        """Rules every server packet must follow, checked on everything a test reads."""
        for index, packet in enumerate(packets):
            if isinstance(packet, pk.Disconnect):
                # [MQTT-3.14.4-1] nothing after a DISCONNECT; [MQTT-3.14.4-2] then closed;
                # [MQTT-3.14.2-2] never a Session Expiry Interval from the server.
                assert index == len(packets) - 1, packets
                assert self.link.closed
                assert Prop.SESSION_EXPIRY_INTERVAL not in packet.properties
            elif isinstance(packet, pk.Connack):
                # [MQTT-3.2.0-2] one CONNACK per connection.
                assert self.connack is None and not self._connack_seen, packets
                self._connack_seen = True
                if packet.reason_code >= 0x80 or (self.version != MQTT_5 and packet.reason_code):
                    # [MQTT-3.2.2-6] [MQTT-3.2.2-7] refused: Session Present 0, then closed.
                    assert not packet.session_present
                    assert index == len(packets) - 1, packets
                    assert self.link.closed
            elif isinstance(packet, pk.Publish):
                if packet.qos == 0:
                    assert not packet.dup  # [MQTT-3.3.1-2]
                    assert packet.packet_id is None  # [MQTT-2.2.1-2]
                else:
                    assert packet.packet_id  # [MQTT-2.2.1-4]
                # [MQTT-3.1.2-27] these clients never announce a Topic Alias Maximum.
                assert Prop.TOPIC_ALIAS not in packet.properties

    def publishes(self) -> list[pk.Publish]:
        """Received packets, asserting they are all PUBLISHes."""
        received = self.receive()
        assert all(isinstance(p, pk.Publish) for p in received), received
        return received

    def one(self, cls: type) -> Any:
        """Exactly one packet was received and it is a ``cls``."""
        received = self.receive()
        assert len(received) == 1 and isinstance(received[0], cls), received
        return received[0]

    @property
    def closed(self) -> bool:
        return self.link.closed

    @property
    def session(self) -> Session:
        session = self.conn.session
        assert session is not None
        return session


class Harness:
    """A broker with a fake clock, and the clients connected to it."""

    def __init__(self, **options: Any) -> None:
        self.clock = FakeClock()
        self.options = BrokerOptions(**options)
        self.broker = Broker(self.options, clock=self.clock)
        self.clients: list[Client] = []

    def client(
        self,
        version: int = MQTT_5,
        peer: str = "peer",
        policy: ListenerPolicy = OPEN,
        certificate_user: str | None = None,
    ) -> Client:
        """A new connection, on a listener with ``policy``; ``certificate_user``: the name of
        a client certificate its listener verified."""
        client = Client(self, version, peer, policy, certificate_user)
        self.clients.append(client)
        return client

    def connect(
        self,
        client_id: str = "c",
        *,
        version: int = MQTT_5,
        clean_start: bool = True,
        keep_alive: int = 0,
        properties: dict[int, Any] | None = None,
        will: pk.Will | None = None,
        expect_present: bool | None = None,
    ) -> Client:
        """Open a connection, send CONNECT and check the CONNACK says success."""
        client = self.client(version, peer=f"peer-{client_id or 'anon'}")
        client.send(
            pk.Connect(
                client_id=client_id,
                protocol_level=version,
                clean_start=clean_start,
                keep_alive=keep_alive,
                will=will,
                properties=properties or {},
            )
        )
        # Only the CONNACK: what follows it (a resumed session's resends) is left for the test.
        received = client.receive(limit=1)
        assert received and isinstance(received[0], pk.Connack), received
        connack = received[0]
        assert connack.reason_code == 0, connack
        if expect_present is not None:
            assert connack.session_present == expect_present, connack
        client.connack = connack
        return client

    def tick(self, advance: float = 0.0) -> None:
        if advance:
            self.clock.advance(advance)
        self.broker.tick()

    def check_no_write_after_close(self) -> None:
        """[MQTT-3.14.4-1] nothing is written on a connection after it was closed, and a link is
        closed at most once."""
        for client in self.clients:
            assert client.link.writes_after_close == 0, client.conn
            assert client.link.close_calls <= 1, client.conn


def pair(
    h: Harness, sub_qos: int = 2, topic_filter: str = "t", **connect: Any
) -> tuple[Client, Client]:
    """A subscriber on ``topic_filter`` (``connect``: its CONNECT's options) and a publisher."""
    subscriber = h.connect("sub", **connect)
    assert subscriber.subscribe(topic_filter, sub_qos)[0].reason_codes == [sub_qos]
    publisher = h.connect("pub")
    return subscriber, publisher


def window(h: Harness, client_id: str = "sub", **props: int) -> Client:
    """A subscriber to ``t`` at QoS 2 with a receive window of one message (``props``: more
    CONNECT properties by name, ``maximum_packet_size=...``)."""
    properties = {
        Prop.RECEIVE_MAXIMUM: 1,
        **{getattr(Prop, k.upper()): v for k, v in props.items()},
    }
    client = h.connect(client_id, properties=properties)
    client.subscribe("t", 2)
    return client


# -- stand-ins for the security edge -----------------------------------------------------------


class RecordingBackplane(Backplane):
    """A cluster's backplane that records what the broker tells it and holds each claim until
    the test answers it (``claims``, or ``grant_all``)."""

    def __init__(self, remote_nodes: int = 0, keep_groups: bool = True) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.users: list[str | None] = []  # the user of each claim
        self.remote_nodes = remote_nodes
        self.keep_groups = keep_groups
        self.claims: list[Callable[[MQTTError | None], None]] = []

    def publish(
        self, message: Message, groups: list[SharedGroup], publisher: Session | None
    ) -> tuple[int, list[SharedGroup]]:
        who = publisher.client_id if publisher is not None else None
        self.events.append(("publish", message.topic, who, len(groups)))
        return self.remote_nodes, groups if self.keep_groups else []

    def route_added(self, topic_filter: str) -> None:
        self.events.append(("added", topic_filter))

    def route_removed(self, topic_filter: str) -> None:
        self.events.append(("removed", topic_filter))

    def claim(
        self,
        client_id: str,
        clean_start: bool,
        username: str | None,
        done: Callable[[MQTTError | None], None],
    ) -> None:
        self.events.append(("claim", client_id, clean_start))
        self.users.append(username)
        self.claims.append(done)

    def session_ended(self, client_id: str) -> None:
        self.events.append(("ended", client_id))

    def grant_all(self) -> None:
        """Grant every claim not answered yet."""
        claims, self.claims = self.claims, []
        for done in claims:
            done(None)


# Values and a log reader the broker tests share.
PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}  # CONNECT properties of a persistent session
NOT_UTF8 = b"\xff\xfe"
PFI = {Prop.PAYLOAD_FORMAT_INDICATOR: 1}  # the payload says it is UTF-8
POWERS_OF_TWO = [1, 2, 4, 8]


class WakeCounter(Sink):
    """A sink (an integration's side of an Outbox) that counts the broker's wake-ups."""

    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def queued_while_away(h: Harness) -> Client:
    """Session "s" (persistent) subscribed to "t" at QoS 1 and its client gone without a
    DISCONNECT; then "pub" publishes ``stale`` (Message Expiry Interval 5 s) and ``fresh`` for
    it. The publisher."""
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("t", 1)
    sub.lose()
    pub = h.connect("pub")
    pub.publish("t", b"stale", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("t", b"fresh", 1)
    return pub


def disconnected_with(client: Client, code: int) -> None:
    """The broker's last word to ``client`` was a DISCONNECT with ``code``, and it closed."""
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, code)], received
    assert client.closed


def counts_logged(caplog: pytest.LogCaptureFixture, marker: str) -> list[int]:
    """The "(N refused so far)" counts of the log lines containing ``marker``."""
    return [
        int(r.getMessage().rsplit("(", 1)[1].split()[0])
        for r in caplog.records
        if marker in r.getMessage()
    ]


METHOD = "TOY-CHALLENGE"


class ToyExchange:
    """The server sends the challenge b"nonce"; the client must answer it reversed."""

    def __init__(self) -> None:
        self.challenged = False

    def step(self, data: bytes | None) -> AuthOutcome:
        if not self.challenged:
            self.challenged = True
            return AuthOutcome(CONTINUE, b"nonce")
        if data == b"ecnon":
            return AuthOutcome(SUCCESS, b"welcome")
        return AuthOutcome(FAIL, reason_code=0x86)


class ToyAuthenticator:
    def __init__(self) -> None:
        self.passwords = {"alice": b"secret"}

    def check_password(self, login: LoginRequest) -> int:
        if login.username is None:
            return 0x87
        return 0 if self.passwords.get(login.username) == login.password else 0x86

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> ToyExchange | None:
        return ToyExchange() if method == METHOD else None


class Offload:
    """Stands in for the worker threads: holds each check until the test runs it."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, Any, Any]] = []

    def __call__(self, conn: Any, packet: Any, anonymous: Any) -> None:
        self.pending.append((conn, packet, anonymous))

    def run_all(self) -> None:
        jobs, self.pending = self.pending, []
        for conn, packet, anonymous in jobs:
            code = conn.broker.authenticator.check_password(
                LoginRequest(
                    packet.client_id, packet.username, packet.password, anonymous, conn.address
                )
            )
            conn.password_checked(code)


class AllowAll:
    """An authorizer (Broker.authorizer) for tests that allows everything and needs no read
    check; a test overrides the one rule it is about."""

    generation = 0

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return True

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


class DenySecret(AllowAll):
    """An authorizer: ``users`` may publish and read everything but ``secret/#``."""

    generation = 0

    def __init__(self) -> None:
        self.denied = "secret/"
        self.calls: list[tuple[str, str | None, str]] = []

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        self.calls.append((client_id, username, topic))
        return not topic.startswith(self.denied)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return not topic_filter.startswith(self.denied)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        self.calls.append((client_id, username, topic))
        return not topic.startswith(self.denied)


class GatedStore(Store):
    """An in-memory store whose commits happen when the test says: what waits for a commit
    (``after_commit``) runs at ``commit()`` (all of it) or ``commit_one()`` (the oldest batch).
    Session and retained writes count as store writes, so the broker holds the acks behind
    them."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def save_session(self, session: Session, early: bool = False) -> None:
        self.writes += 1

    def save_retained(self, message: Message) -> None:
        self.writes += 1

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.waiting.append(callback)

    def commit(self) -> None:
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback()

    def commit_one(self) -> None:
        self.waiting.pop(0)()


# Fixtures, imported by the conftest of each folder that tests against the harness.


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    """A factory: ``make_harness(receive_maximum=10, ...)`` builds a broker with those options.
    On teardown every connection is checked for writes after close (MQTT-3.14.4-1)."""
    with ended_after(Harness.check_no_write_after_close) as keep:
        yield lambda **options: keep(Harness(**options))


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    """A broker with the default options."""
    return make_harness()
