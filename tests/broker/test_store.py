"""broker/store.py: what the broker tells its durable store, checked against a store that models
what a restart would find, and the broker built again from a store's records (Broker.restore,
Broker.restored): sessions, subscriptions, deliveries, QoS 2 ids, wills and retained messages come
back as they were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.harness import MQTT_3_1_1, PERSISTENT, AllowAll, Harness, Prop, pk, queued_while_away

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.session import NEVER, Delivery, Session
from mqttbroker.broker.store import (
    DeliveryRecord,
    Restored,
    SessionRecord,
    Store,
    SubscriptionRecord,
)
from mqttbroker.broker.topics import Subscription
from mqttbroker.protocol.packets import Will


def record(client_id: str = "s", expiry: int = 100, **fields: object) -> SessionRecord:
    return SessionRecord(client_id, expiry, fields.pop("expires_at", None), None, **fields)  # type: ignore[arg-type]


def subscription(
    topic_filter: str, qos: int = 1, identifier: int | None = None, **flags: object
) -> SubscriptionRecord:
    return SubscriptionRecord(
        topic_filter,
        qos,
        bool(flags.get("no_local", False)),
        bool(flags.get("retain_as_published", False)),
        int(flags.get("retain_handling", 0)),  # type: ignore[call-overload]
        identifier,
    )


def delivery(
    seq: int, payload: bytes, qos: int = 1, packet_id: int | None = None, released: bool = False
) -> DeliveryRecord:
    return DeliveryRecord(
        seq, Message("t", payload, qos), qos, False, (), packet_id, released, None
    )


def restore(h: Harness, *sessions: SessionRecord, retained: list[Message] | None = None) -> None:
    h.broker.restore(Restored(list(sessions), retained or []))
    h.broker.restored()


def resume(h: Harness, client_id: str = "s", expiry: int = 100, **kw: object) -> object:
    return h.connect(
        client_id,
        clean_start=False,
        properties={Prop.SESSION_EXPIRY_INTERVAL: expiry},
        **kw,  # type: ignore[arg-type]
    )


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

    def save_session(self, session: Session, early: bool = False) -> None:
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


def mirrored(make_harness: Any) -> tuple[Harness, MirrorStore]:
    h: Harness = make_harness()
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    return h, store


def test_expiry_starts_at_restore_for_a_session_that_was_connected(h: Harness) -> None:
    """[MQTT-3.1.2-23] A session whose client was connected when the broker stopped (no
    deadline stored) expires its interval after the restore: there just before, gone after."""
    restore(h, record(expiry=10))
    h.tick(9.9)
    assert "s" in h.broker.sessions
    h.tick(0.1)
    assert "s" not in h.broker.sessions


def test_stored_deadline_is_kept(h: Harness) -> None:
    """A session that was already waiting out its expiry keeps its deadline (broker clock)."""
    now = h.clock()
    restore(h, record(expiry=1000, expires_at=now + 5))
    h.tick(4.9)
    assert "s" in h.broker.sessions
    h.tick(0.1)
    assert "s" not in h.broker.sessions


def test_never_expiring_session_is_kept(h: Harness) -> None:
    """[MQTT-3.1.2-23] 0xFFFFFFFF: the restored session never expires."""
    restore(h, record(expiry=NEVER))
    h.tick(10.0**9)
    assert h.broker.sessions["s"].expiry_interval == NEVER
    resume(h, expiry=NEVER, expect_present=True)


def test_restored_sessions_count_against_max_sessions(make_harness: Callable[..., Harness]) -> None:
    """The restored persistent sessions are counted: one more new one is refused (0x97)."""
    h = make_harness(max_sessions=2)
    restore(h, record("a"), record("b"))
    assert h.broker.persistent_sessions == 2
    client = h.client()
    client.send(pk.Connect(client_id="c", properties={Prop.SESSION_EXPIRY_INTERVAL: 10}))
    assert client.one(pk.Connack).reason_code == 0x97
    resume(h, "a", expect_present=True)  # an existing one still resumes


def test_subscriptions_route_again_with_their_options(h: Harness) -> None:
    """Restored subscriptions match (queued while offline), at their QoS, with their
    Subscription Identifier; No Local and Retain As Published come back too."""
    restore(
        h,
        record(
            subscriptions=[
                subscription("a/+", 1, identifier=7),
                subscription("b", 0),
                subscription("own", 1, no_local=True),
                subscription("rap", 1, retain_as_published=True),
            ]
        ),
    )
    session = h.broker.sessions["s"]
    assert sorted(session.subscriptions) == ["a/+", "b", "own", "rap"]
    assert session.subscriptions["own"].no_local
    assert session.subscriptions["rap"].retain_as_published
    pub = h.connect("pub")
    pub.publish("a/1", b"one", 2)
    pub.publish("b", b"zero", 1)  # QoS 0 subscription: not queued offline
    client = resume(h, expect_present=True)
    (message,) = client.publishes()  # type: ignore[attr-defined]
    assert (message.topic, message.payload, message.qos) == ("a/1", b"one", 1)
    assert message.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [7]
    client.publish("own", b"mine", 1)  # type: ignore[attr-defined]
    client.publish("rap", b"kept flag", 1, retain=True)  # type: ignore[attr-defined]
    received = client.receive()  # type: ignore[attr-defined]
    publishes = [p for p in received if isinstance(p, pk.Publish)]
    assert [(p.topic, p.retain) for p in publishes] == [("rap", True)]


def test_deliveries_resume_in_order_with_dup_and_pubrel(h: Harness) -> None:
    """[MQTT-4.4.0-1] On resumption the messages in flight are resent under their packet ids
    with DUP set, a QoS 2 one whose PUBREC came back gets its PUBREL again, then the queue
    follows; new messages take the packet ids after the restored ones."""
    restore(
        h,
        record(
            subscriptions=[subscription("t", 2)],
            deliveries=[
                delivery(1, b"released", qos=2, packet_id=4, released=True),
                delivery(2, b"in flight", qos=1, packet_id=5),
                delivery(3, b"queued", qos=1),
            ],
        ),
    )
    session = h.broker.sessions["s"]
    assert sorted(session.inflight) == [4, 5]
    assert len(session.queue) == 1 and session.queued_bytes == session.queue[0].message.size
    client = resume(h, expect_present=True)
    received = client.receive()  # type: ignore[attr-defined]
    assert isinstance(received[0], pk.Pubrel) and received[0].packet_id == 4
    resent, queued = received[1:]
    assert (resent.packet_id, resent.payload, resent.dup, resent.qos) == (5, b"in flight", True, 1)
    assert (queued.payload, queued.dup, queued.packet_id) == (b"queued", False, 6)
    client.pubcomp(4)  # type: ignore[attr-defined]
    client.puback(5)  # type: ignore[attr-defined]
    client.puback(6)  # type: ignore[attr-defined]
    assert session.inflight == {} and not session.queue
    h.connect("pub").publish("t", b"new", 1)
    (new,) = client.publishes()  # type: ignore[attr-defined]
    assert new.packet_id == 7


def test_queued_message_age_counts_from_restore(h: Harness) -> None:
    """A restored queued message's expiry keeps running: past it, it is not delivered."""
    message = Message("t", b"short-lived", 1, expires_at=h.clock() + 5, expiry_interval=5)
    restore(
        h,
        record(
            subscriptions=[subscription("t", 1)],
            deliveries=[DeliveryRecord(1, message, 1, False, (), None, False, None)],
        ),
    )
    h.tick(6)
    client = resume(h, expect_present=True)
    assert client.receive() == []  # type: ignore[attr-defined]


def test_unreleased_qos2_ids_are_kept(h: Harness) -> None:
    """[MQTT-4.3.3-10] A QoS 2 id the broker had not released yet: the PUBREL is answered with
    PUBCOMP 0x00 (not 0x92), and the same id again before it is not a new message."""
    restore(h, record(subscriptions=[], releases=[9]))
    watcher = h.connect("w")
    watcher.subscribe("t", 2)
    client = resume(h, expect_present=True)
    client.publish("t", b"again", 2, packet_id=9, dup=True)  # type: ignore[attr-defined]
    assert client.one(pk.Pubrec).reason_code == 0  # type: ignore[attr-defined]
    assert watcher.receive() == []  # a duplicate, not delivered again
    client.pubrel(9)  # type: ignore[attr-defined]
    assert client.one(pk.Pubcomp).reason_code == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("version", "due_after"),
    [pytest.param(5, 30, id="v5-delay"), pytest.param(MQTT_3_1_1, 0, id="v311-now")],
)
def test_will_of_a_session_that_was_connected(h: Harness, version: int, due_after: int) -> None:
    """[MQTT-3.1.2-8] The client of a restored session is gone: its will is due after its Will
    Delay Interval (MQTT 5; a 3.1.1 will has none: at once)."""
    will = pk.Will("will/s", b"gone", 1, properties={Prop.WILL_DELAY_INTERVAL: 30})
    watcher = h.connect("w")
    watcher.subscribe("will/#", 1)
    restore(h, record(expiry=1000, will=will, will_version=version))
    if due_after:
        h.tick(due_after - 0.1)
        assert watcher.receive() == []
        h.tick(0.1)
    else:
        h.tick()
    (message,) = watcher.publishes()
    assert (message.topic, message.payload) == ("will/s", b"gone")
    assert h.broker.sessions["s"].will is None


def test_will_keeps_its_stored_due_time(h: Harness) -> None:
    will = pk.Will("will/s", b"later", 0)
    watcher = h.connect("w")
    watcher.subscribe("will/#", 0)
    restore(h, record(expiry=1000, will=will, will_due=h.clock() + 3))
    h.tick(2.9)
    assert watcher.receive() == []
    h.tick(0.1)
    assert [p.payload for p in watcher.publishes()] == [b"later"]


def test_will_cancelled_by_resuming_in_time(h: Harness) -> None:
    """[MQTT-3.1.3-9] The client coming back before the will is due cancels it."""
    will = pk.Will("will/s", b"gone", 0, properties={Prop.WILL_DELAY_INTERVAL: 30})
    watcher = h.connect("w")
    watcher.subscribe("will/#", 0)
    restore(h, record(expiry=1000, will=will))
    resume(h, expect_present=True)
    h.tick(100)
    assert watcher.receive() == []


def test_retained_messages_come_back(h: Harness) -> None:
    restore(h, retained=[Message("r/1", b"kept", 1, retain=True)])
    client = h.connect("c")
    received = client.subscribe("r/#", 1)
    (message,) = received[1:]
    assert (message.topic, message.payload, message.retain) == ("r/1", b"kept", True)


def test_shutdown_tells_every_client_and_publishes_no_will(h: Harness) -> None:
    """[MQTT-3.14.0-1] The server shutting down sends DISCONNECT 0x8B to MQTT 5 clients (3.1.1
    clients are just closed), and wills are kept for the restart, not published."""
    watcher = h.connect("w")
    watcher.subscribe("will/#", 0)
    five = h.connect("five", will=pk.Will("will/five", b"x"))
    old = h.connect("old", version=MQTT_3_1_1)
    h.broker.shutdown()
    assert five.one(pk.Disconnect).reason_code == 0x8B
    assert old.receive() == [] and old.closed
    assert watcher.one(pk.Disconnect).reason_code == 0x8B
    assert not h.broker.connections


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
    queued_while_away(h)
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


def stored_session(
    client_id: str,
    expiry: int,
    subscriptions: list[SubscriptionRecord],
    deliveries: list[DeliveryRecord],
) -> SessionRecord:
    """A session as the store reads it back: offline, no user name, the store's handle 1 (its
    deliveries are numbered from it)."""
    return SessionRecord(client_id, expiry, None, None, 1, subscriptions, deliveries)


def test_restored_in_flight_delivery_keeps_ids_and_packet_id(make_harness: Any) -> None:
    h, store = mirrored(make_harness)
    record = stored_session(
        "s",
        100,
        [SubscriptionRecord("t", 2, False, False, 0, 7)],
        [DeliveryRecord(1, Message("t", b"m", 2), 2, False, (7,), 4, False, None)],
    )
    h.broker.restore(Restored([record], []))
    h.broker.restored()
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    (resent,) = client.publishes()
    assert (resent.packet_id, resent.dup) == (4, True)
    assert resent.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [7]
    client.pubrec(4)
    client.receive()
    assert store.payloads("s") == [(b"m", 4, True)]  # the PUBREC recorded under its id


def test_restored_queued_share_is_handed_over(make_harness: Any) -> None:
    """A message queued for a member when the broker stopped still belongs to its shared
    subscription: when that session ends, another member gets it."""
    h, _ = mirrored(make_harness)
    record = stored_session(
        "away",
        5,
        [SubscriptionRecord("$share/g/job", 1, False, False, 0, None)],
        [DeliveryRecord(1, Message("job", b"kept", 1), 1, False, (), None, False, "$share/g/job")],
    )
    h.broker.restore(Restored([record], []))
    h.broker.restored()
    other = h.connect("other")
    other.subscribe("$share/g/job", 1)
    h.tick(5)  # the restored session expires
    assert [p.payload for p in other.publishes()] == [b"kept"]


def test_stored_message_too_large_for_the_returning_client(make_harness: Any) -> None:
    """[MQTT-3.1.2-25] Queued while the client was away, too large for the Maximum Packet Size
    it comes back with: dropped as delivered, and gone from the store."""
    h, store = mirrored(make_harness)
    sub = h.connect("s", properties=PERSISTENT)
    sub.subscribe("t", 1)
    sub.lose()
    h.connect("pub").publish("t", b"x" * 500, 1)
    assert len(store.payloads("s")) == 1
    small = {**PERSISTENT, Prop.MAXIMUM_PACKET_SIZE: 100}
    sub = h.connect("s", clean_start=False, properties=small, expect_present=True)
    assert sub.receive() == []
    assert store.payloads("s") == []


def test_pubrec_of_restored_qos2_alone(make_harness: Any) -> None:
    h, _ = mirrored(make_harness)
    record = stored_session(
        "s", 100, [], [DeliveryRecord(1, Message("t", b"m", 2), 2, False, (), 9, False, None)]
    )
    h.broker.restore(Restored([record], []))
    client = h.connect("s", clean_start=False, properties=PERSISTENT, expect_present=True)
    client.receive()
    client.pubrec(9)
    assert client.one(pk.Pubrel).packet_id == 9


def test_will_without_delay_leaves_the_store(make_harness: Any) -> None:

    h: Harness = make_harness()
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    client = h.connect("s", will=pk.Will("will/s", b"gone"), properties=PERSISTENT)
    assert store.wills == {"s": ("will/s", None)}
    client.lose()  # published at once
    assert store.wills == {}
