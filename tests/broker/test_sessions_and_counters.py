"""More session edges: a per-user cap met by taking over another user's client id, reserved
client ids refused with a reason, a will without delay leaving the store, sticky shared
publishers kept when another member leaves, and a fresh broker's counters."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import AllowAll, Harness, Prop, pk

from mqttbroker.broker.core import Broker

PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}


def connect_as(h: Harness, client_id: str, username: str | None) -> pk.Connack:
    client = h.client()
    client.send(pk.Connect(client_id=client_id, username=username, properties=PERSISTENT))
    connack: pk.Connack = client.receive()[0]
    client.lose()
    return connack


def test_taking_over_another_users_client_id_counts_for_the_cap(make_harness: Any) -> None:
    """session_owner_mismatch "new": bob taking alice's client id gets a new session, which
    counts against bob's max_sessions_per_user (the one it replaces was alice's)."""
    h: Harness = make_harness(max_sessions_per_user=1, session_owner_mismatch="new")
    assert connect_as(h, "x", "alice").reason_code == 0
    assert connect_as(h, "b1", "bob").reason_code == 0
    assert connect_as(h, "x", "bob").reason_code == 0x97
    assert h.broker.sessions["x"].username == "alice"


@pytest.mark.parametrize("client_id", ["$bridge/x", "$webhook/y"])
def test_reserved_client_id_says_why(h: Harness, client_id: str) -> None:
    client = h.client()
    client.send(pk.Connect(client_id=client_id))
    connack = client.one(pk.Connack)
    assert connack.properties[Prop.REASON_STRING] == f"client identifier {client_id!r} is reserved"


def test_will_without_delay_leaves_the_store(make_harness: Any) -> None:
    from test_store_mirror import MirrorStore

    h: Harness = make_harness()
    store = MirrorStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    client = h.connect("s", will=pk.Will("will/s", b"gone"), properties=PERSISTENT)
    assert store.wills == {"s": ("will/s", None)}
    client.lose()  # published at once
    assert store.wills == {}


def test_sticky_publishers_stay_when_another_member_leaves(make_harness: Any) -> None:
    h: Harness = make_harness(shared_subscription_strategy="sticky")
    members = [h.connect(f"m{i}") for i in range(3)]
    for member in members:
        member.subscribe("$share/g/t", 1)
    publishers = [h.connect(f"p{i}") for i in range(3)]
    for publisher in publishers:
        publisher.publish("t", publisher.conn.client_id.encode(), 1)
    first = [[p.payload for p in m.publishes()] for m in members]
    assert sorted(len(f) for f in first) == [1, 1, 1]
    members[2].unsubscribe("$share/g/t")
    publishers[0].publish("t", b"again", 1)
    holder = next(i for i, f in enumerate(first) if f == [b"p0"])
    assert [p.payload for p in members[holder].publishes()] == [b"again"]


def test_fresh_broker_counters(h: Harness) -> None:
    broker = h.broker
    assert (broker.bytes_sent, broker.bytes_received, broker.received, broker.denied) == (
        0,
        0,
        0,
        0,
    )


def test_denied_publish_log_names_the_user(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")

    class Rules(AllowAll):
        def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
            return False

    h.broker.authorizer = Rules()
    client = h.client(peer="10.0.0.1:99")
    client.send(pk.Connect(client_id="c", username="carol"))
    client.receive()
    client.publish("t", b"x", 1)
    assert client.one(pk.Puback).reason_code == 0x87
    assert (
        "client c from 10.0.0.1:99 (user 'carol'): not authorized to publish to 't' "
        "(1 refused so far)"
    ) in [r.getMessage() for r in caplog.records]
