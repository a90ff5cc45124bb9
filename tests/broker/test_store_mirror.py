"""What the broker tells its durable store (broker/store.py), checked against a store that keeps
a model of what a restart would find: for a persistent session through its life (subscriptions,
queued and in-flight QoS 1/2 messages, PUBREC/PUBREL state both ways, wills, expiry) and for
retained messages. A call left out, or made with the wrong object, shows as a model that no
longer matches the broker."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import AllowAll, Harness, Prop, pk

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.session import Delivery, Session
from mqttbroker.broker.store import Store
from mqttbroker.broker.topics import Subscription
from mqttbroker.protocol.packets import Will

PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}


class MirrorStore(Store):
    """Keeps what a durable store would hold; every change counts as a write."""

    def __init__(self) -> None:
        self.sessions: dict[str, tuple[int, float | None]] = {}
        self.subscriptions: dict[tuple[str, str], int] = {}
        self.deliveries: dict[tuple[str, int], tuple[bytes, int, int | None, bool]] = {}
        self.releases: set[tuple[str, int]] = set()
        self.wills: dict[str, tuple[str, float | None]] = {}
        self.retained: dict[str, bytes] = {}

    def _write(self) -> None:
        self.writes += 1

    def save_session(self, session: Session) -> None:
        self._write()
        self.sessions[session.client_id] = (session.expiry_interval, session.expires_at)
        session.stored = 1  # recorded: the broker deletes it when it ends

    def delete_session(self, session: Session) -> None:
        self._write()
        cid = session.client_id
        self.sessions.pop(cid, None)
        self.wills.pop(cid, None)
        for table in (self.subscriptions, self.deliveries):
            for key in [k for k in table if k[0] == cid]:
                del table[key]  # type: ignore[attr-defined]
        self.releases = {r for r in self.releases if r[0] != cid}

    def save_subscription(self, session: Session, sub: Subscription) -> None:
        self._write()
        self.subscriptions[(session.client_id, sub.topic_filter)] = sub.qos

    def delete_subscription(self, session: Session, topic_filter: str) -> None:
        self._write()
        del self.subscriptions[(session.client_id, topic_filter)]

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        self._write()
        super().save_delivery(session, delivery)  # numbers a new one (delivery.stored)
        assert delivery.stored > 0
        self.deliveries[(session.client_id, delivery.stored)] = (
            delivery.message.payload,
            delivery.qos,
            delivery.packet_id,
            delivery.released,
        )

    def delete_delivery(self, session: Session, delivery: Delivery) -> None:
        self._write()
        del self.deliveries[(session.client_id, delivery.stored)]

    def save_release(self, session: Session, packet_id: int) -> None:
        self._write()
        self.releases.add((session.client_id, packet_id))

    def delete_release(self, session: Session, packet_id: int) -> None:
        self._write()
        self.releases.remove((session.client_id, packet_id))

    def save_retained(self, message: Message) -> None:
        self._write()
        self.retained[message.topic] = message.payload

    def delete_retained(self, topic: str) -> None:
        self._write()
        self.retained.pop(topic, None)

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
        self._write()
        self.wills[session.client_id] = (will.topic, due)

    def delete_will(self, session: Session) -> None:
        self._write()
        del self.wills[session.client_id]

    def payloads(self, client_id: str) -> list[tuple[bytes, int | None, bool]]:
        """The session's stored messages in their order: (payload, packet id, released)."""
        rows = sorted((seq, v) for (cid, seq), v in self.deliveries.items() if cid == client_id)
        return [(v[0], v[2], v[3]) for _, v in rows]


@pytest.fixture
def hs(make_harness: Any) -> tuple[Harness, MirrorStore]:
    h: Harness = make_harness()
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    return h, store


def test_session_subscriptions_and_expiry(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    client = h.connect("s", properties=PERSISTENT)
    assert store.sessions == {"s": (100, None)}  # connected: no deadline yet
    client.subscribe("a/#", 1)
    client.subscribe("b", 2)
    client.subscribe("a/#", 0)  # replaced
    assert store.subscriptions == {("s", "a/#"): 0, ("s", "b"): 2}
    client.unsubscribe("b")
    assert store.subscriptions == {("s", "a/#"): 0}
    now = h.clock()
    client.lose()
    assert store.sessions == {"s": (100, now + 100)}  # the deadline, saved
    h.tick(100)
    assert store.sessions == {} and store.subscriptions == {}


def test_clean_session_is_not_stored(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    client = h.connect("c")
    client.subscribe("t", 1)
    client.publish("t", b"m", 2)
    client.receive()
    assert store.sessions == {} and store.subscriptions == {} and store.releases == set()
    assert store.deliveries == {}


def test_resuming_without_expiry_forgets_the_session(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    h.connect("s", properties=PERSISTENT).subscribe("t", 1)
    h.clients[-1].lose()
    h.connect("s", clean_start=False, expect_present=True)  # expiry 0 now
    assert store.sessions == {} and store.subscriptions == {}


def test_outbound_qos1_and_qos2_state(hs: tuple[Harness, MirrorStore]) -> None:
    """Queued, in flight, PUBREC'd and completed: each change is stored, and what is done
    leaves the store."""
    h, store = hs
    sub = h.connect("s", properties={**PERSISTENT, Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", 2)
    pub = h.connect("pub")
    pub.publish("t", b"one", 2)
    pub.publish("t", b"two", 1)
    (one,) = sub.publishes()
    assert store.payloads("s") == [(b"one", one.packet_id, False), (b"two", None, False)]
    sub.pubrec(one.packet_id)
    sub.receive()
    assert store.payloads("s")[0] == (b"one", one.packet_id, True)
    sub.pubcomp(one.packet_id)
    (two,) = sub.publishes()
    assert store.payloads("s") == [(b"two", two.packet_id, False)]
    sub.puback(two.packet_id)
    assert store.payloads("s") == []


def test_offline_queue_and_expiry(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("t", 1)
    sub.lose()
    pub = h.connect("pub")
    pub.publish("t", b"stale", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("t", b"fresh", 1)
    assert store.payloads("s") == [(b"stale", None, False), (b"fresh", None, False)]
    h.tick(6)
    sub = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    (fresh,) = sub.publishes()
    assert store.payloads("s") == [(b"fresh", fresh.packet_id, False)]


def test_refused_pubrec_and_too_large_leave_the_store(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    sub = h.connect("s", properties={**PERSISTENT, Prop.MAXIMUM_PACKET_SIZE: 100})
    sub.subscribe("t", 2)
    pub = h.connect("pub")
    pub.publish("t", b"x" * 200, 2)  # too large: dropped as delivered
    pub.publish("t", b"refused", 2)
    (refused,) = sub.publishes()
    sub.pubrec(refused.packet_id, 0x80)
    assert store.payloads("s") == []


def test_inbound_qos2_ids(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    client = h.connect("s", properties=PERSISTENT)
    client.publish("t", b"m", 2, packet_id=5)
    client.receive()
    assert store.releases == {("s", 5)}
    client.pubrel(5)
    client.receive()
    assert store.releases == set()


def test_will_armed_delayed_and_published(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    will = pk.Will("will/s", b"gone", 0, properties={Prop.WILL_DELAY_INTERVAL: 10})
    client = h.connect("s", will=will, properties=PERSISTENT)
    assert store.wills == {"s": ("will/s", None)}  # armed while connected
    now = h.clock()
    client.lose()
    assert store.wills == {"s": ("will/s", now + 10)}  # waiting out its delay
    h.tick(10)
    assert store.wills == {}  # published


def test_will_cancelled_by_reconnect_and_normal_disconnect(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    will = pk.Will("will/s", b"gone", 0, properties={Prop.WILL_DELAY_INTERVAL: 10})
    h.connect("s", will=will, properties=PERSISTENT).lose()
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    assert store.wills == {}  # [MQTT-3.1.3-9] cancelled by the reconnect
    client.disconnect()
    h.connect("t", will=will, properties=PERSISTENT).disconnect(0x00)
    assert store.wills == {}  # [MQTT-3.14.4-3] deleted by DISCONNECT 0x00


def test_retained(hs: tuple[Harness, MirrorStore]) -> None:
    h, store = hs
    client = h.connect("c")
    client.publish("r/1", b"a", retain=True)
    client.publish("r/2", b"b", 1, retain=True)
    client.receive()
    assert store.retained == {"r/1": b"a", "r/2": b"b"}
    client.publish("r/1", b"", retain=True)
    assert store.retained == {"r/2": b"b"}
    client.publish("r/3", b"c", retain=True, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    h.clock.advance(6)
    client.subscribe("r/#")  # the expired one is found and removed
    assert store.retained == {"r/2": b"b"}


def test_restore_writes_back_only_the_sessions(hs: tuple[Harness, MirrorStore]) -> None:
    """Restoring from records: each session is saved again (its expiry deadline starts now),
    nothing else is written back (the store has it), and the restored session goes on telling
    the same store of its changes."""
    from mqttbroker.broker.store import Restored, SessionRecord, SubscriptionRecord

    h, store = hs
    record = SessionRecord(
        "s", 100, None, "alice", 1, [SubscriptionRecord("t", 1, False, False, 0, None)]
    )
    h.broker.restore(Restored([record], [Message("r", b"kept", 0, retain=True)]))
    h.broker.restored()
    assert store.sessions == {"s": (100, h.clock() + 100)}
    assert store.retained == {} and store.subscriptions == {}
    assert h.broker.sessions["s"].username == "alice"
    h.connect("pub").publish("t", b"queued", 1)
    assert store.payloads("s") == [(b"queued", None, False)]


def test_recheck_drops_stored_messages(hs: tuple[Harness, MirrorStore]) -> None:
    """Messages queued for a persistent session that the rules no longer let it read leave the
    store with it."""

    class Rules(AllowAll):
        denied = "nothing/"

        def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
            return not topic.startswith(self.denied)

    h, store = hs
    rules = Rules()
    h.broker.authorizer = rules
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("#", 1)
    sub.lose()
    pub = h.connect("pub")
    pub.publish("secret/1", b"1", 1)
    pub.publish("open/2", b"2", 1)
    rules.denied = "secret/"
    rules.generation += 1
    h.broker.recheck_subscriptions()
    assert store.payloads("s") == [(b"2", None, False)]


def test_queued_qos0_leaves_the_store_when_sent(make_harness: Any) -> None:
    """queue_qos0: a QoS 0 message queued for an offline persistent session is stored, and
    leaves the store once sent (no acknowledgement to wait for)."""
    h: Harness = make_harness(queue_qos0=True)
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("t", 0)
    sub.lose()
    h.connect("pub").publish("t", b"zero", 0)
    assert store.payloads("s") == [(b"zero", None, False)]
    sub = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    assert [p.payload for p in sub.publishes()] == [b"zero"]
    assert store.payloads("s") == []
