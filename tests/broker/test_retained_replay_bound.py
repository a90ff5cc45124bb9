"""The retained messages of a new subscription to a client that does not read: sent while its
transport is under the high-water mark, the rest once it drains (subscribe.send_retained).
What the broker holds for the client stays within the mark, one message and
``REPLAY_WRITE``; once it reads, every retained message arrives, once, in the order of a client
that reads all along, with the QoS rules unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.harness import MQTT_5, FakeLink, Harness, LinkClient, Prop, pk

from mqttbroker.broker.subscribe import REPLAY_WRITE, RETAINED_PER_PASS

HIGH = 256 * 1024  # the transport's high-water mark in these tests
SIZE = 100_000  # payload bytes of each retained message
COUNT = 40  # retained messages: 4 MB, far more than HIGH
PASSES = 20  # event-loop passes per step: more than a step needs to settle


class MarkedLink(FakeLink):
    """A transport with a high-water mark, as the broker's: pause_writing from the write that
    takes it past ``high``; the client reads only when a test says so (then resume_writing)."""

    def __init__(self, high: int) -> None:
        super().__init__()
        self.high = high
        self.paused = False
        self.peak = 0  # the most it held unread
        self.client: LinkClient | None = None

    def write(self, data: bytes) -> None:
        super().write(data)
        self.unread += len(data)
        self.peak = max(self.peak, self.unread)
        if not self.paused and self.unread > self.high:
            self.paused = True
            assert self.client is not None
            self.client.conn.pause_writing()

    def read_all(self) -> None:
        self.unread = 0
        if self.paused:
            self.paused = False
            assert self.client is not None
            self.client.conn.resume_writing()


def marked_client(h: Harness, client_id: str, **connect: Any) -> tuple[LinkClient, MarkedLink]:
    link = MarkedLink(HIGH)
    client = LinkClient(h.broker, MQTT_5, link, f"peer-{client_id}")
    link.client = client
    client.send(pk.Connect(client_id=client_id, protocol_level=MQTT_5, **connect))
    h.broker.flush()
    (connack,) = client.unread()
    assert isinstance(connack, pk.Connack) and connack.reason_code == 0
    link.read_all()
    return client, link


def passes(h: Harness) -> None:
    for _ in range(PASSES):
        h.broker.flush()


def held(client: LinkClient, link: MarkedLink) -> int:
    """Bytes the broker holds for the client: written and unread, and not yet written."""
    return link.unread + sum(len(chunk) for chunk in client.conn.out or ())


def retained_set(make_harness: Callable[..., Harness], qos: int = 0) -> tuple[Harness, list[str]]:
    h = make_harness()
    pub = h.connect("pub")
    for i in range(COUNT):
        pub.publish(f"r/{i:02d}", bytes([i]) * SIZE, qos, retain=True)
        if qos:
            pub.receive()  # the PUBACK
    # The order of a client that reads all along.
    reader = h.connect("reader")
    received = reader.subscribe("#")[1:]
    for _ in range(PASSES):
        received += reader.receive()
    order = [p.topic for p in received]
    assert sorted(order) == [f"r/{i:02d}" for i in range(COUNT)]
    return h, order


def test_a_client_that_does_not_read_is_held_the_mark_and_about_a_message(
    make_harness: Callable[..., Harness],
) -> None:
    h, order = retained_set(make_harness)
    client, link = marked_client(h, "slow")
    client.send_subscribe("#", 0)
    passes(h)
    bound = HIGH + REPLAY_WRITE + SIZE + 64  # and a SUBACK, a PUBLISH header
    assert link.paused and client.conn.retained  # it stopped: the rest waits
    assert held(client, link) <= bound, (held(client, link), bound)
    # Unbounded, a pass sent RETAINED_PER_PASS past the mark (1.1 MB here).
    assert bound < RETAINED_PER_PASS
    # It reads a little at a time: every retained message once, in order, and the broker never
    # holds more than the bound meanwhile.
    got: list[pk.Publish] = []
    steps = 0
    while len(got) < COUNT:
        steps += 1
        assert steps <= COUNT, "the replay stalled"
        packets = client.unread()
        got += [p for p in packets if isinstance(p, pk.Publish)]
        link.read_all()
        passes(h)
        assert link.peak <= bound, (link.peak, bound)
    assert [p.topic for p in got] == order
    assert all(p.retain and p.qos == 0 for p in got)
    assert [p.payload for p in got] == [bytes([int(t[2:])]) * SIZE for t in order]
    assert steps > 2  # it did wait for the client: more than the mark in all
    assert client.conn.retained is None


def test_the_replay_after_the_suback_is_a_small_share(
    make_harness: Callable[..., Harness],
) -> None:
    """The share sent with the SUBACK is written at the pass's end (the SUBACK may wait for a
    commit): REPLAY_WRITE and one message, not a whole pass's share past the mark."""
    h, order = retained_set(make_harness)
    client, link = marked_client(h, "slow")
    link.unread = HIGH - 1  # just under the mark: live traffic it has not read yet
    client.send_subscribe("#", 0)
    h.broker.flush()
    assert link.unread - (HIGH - 1) <= REPLAY_WRITE + SIZE + 64, link.unread
    passes(h)
    assert link.peak <= HIGH + REPLAY_WRITE + SIZE + 64


def test_qos1_replay_keeps_the_window_and_order(make_harness: Callable[..., Harness]) -> None:
    """QoS 1: the client's Receive Maximum bounds what is in flight, the rest follows its
    PUBACKs, every message once and in order, while the transport pauses and resumes."""
    h, order = retained_set(make_harness, qos=1)
    client, link = marked_client(h, "slow", properties={Prop.RECEIVE_MAXIMUM: 3})
    client.send_subscribe("#", 1)
    got: list[pk.Publish] = []
    steps = 0
    while len(got) < COUNT:
        steps += 1
        assert steps <= 4 * COUNT, "the replay stalled"
        passes(h)
        assert link.peak <= HIGH + REPLAY_WRITE + SIZE + 64
        new = [p for p in client.unread() if isinstance(p, pk.Publish)]
        session = client.conn.session
        assert session is not None and len(session.inflight) <= 3
        got += new
        link.read_all()
        for publish in new:
            assert publish.qos == 1 and publish.retain and not publish.dup
            assert publish.packet_id is not None
            client.send(pk.Puback(publish.packet_id))
    assert [p.topic for p in got] == order
    passes(h)
    assert not client.unread()  # nothing twice


def test_a_client_that_goes_mid_replay_leaves_nothing_behind(
    make_harness: Callable[..., Harness],
) -> None:
    h, _ = retained_set(make_harness)
    client, link = marked_client(h, "slow")
    client.send_subscribe("#", 0)
    passes(h)
    assert link.paused and client.conn.retained
    client.conn.connection_lost()
    passes(h)
    assert client.conn not in h.broker.connections
    assert "slow" not in h.broker.sessions  # its backlog goes with it
    written = len(link.data)
    link.read_all()  # resume_writing after the close: nothing more is written
    passes(h)
    assert len(link.data) == written
