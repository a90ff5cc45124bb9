"""The broker built from a store's records (Broker.restore, Broker.restored): sessions with their
expiry, subscriptions, messages queued and in flight, unreleased QoS 2 ids, wills and retained
messages come back as they were; and the shutdown that precedes a restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import Harness, Prop, pk

from mqttbroker.broker.message import Message
from mqttbroker.broker.session import NEVER
from mqttbroker.broker.store import (
    DeliveryRecord,
    Restored,
    SessionRecord,
    SubscriptionRecord,
)

MQTT_3_1_1 = 4


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


# -- expiry --------------------------------------------------------------------------------


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


# -- subscriptions -------------------------------------------------------------------------


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


# -- messages queued and in flight ---------------------------------------------------------


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


# -- wills ---------------------------------------------------------------------------------


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


# -- retained messages ---------------------------------------------------------------------


def test_retained_messages_come_back(h: Harness) -> None:
    restore(h, retained=[Message("r/1", b"kept", 1, retain=True)])
    client = h.connect("c")
    received = client.subscribe("r/#", 1)
    (message,) = received[1:]
    assert (message.topic, message.payload, message.retain) == ("r/1", b"kept", True)


# -- shutdown ------------------------------------------------------------------------------


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
    assert h.broker.connections == set()
