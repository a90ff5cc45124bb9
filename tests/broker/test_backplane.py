"""broker/backplane.py: the hooks a cluster's backplane gets from one node, with a recording
backplane: a filter's first subscription and its last, every routed message with the node's shared
groups, the client id claimed before CONNACK, wills routed through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.harness import Harness, RecordingBackplane, pk

from mqttbroker.broker.message import Message
from mqttbroker.protocol.errors import MQTTError


def joined(h: Harness, client_id: str, backplane: RecordingBackplane, **props: Any) -> Any:
    """A client connected through the backplane's claim."""
    client = h.client()
    client.send(pk.Connect(client_id=client_id, properties=props))
    assert client.receive() == []  # the CONNECT waits for the claim
    backplane.claims.pop()(None)
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0
    client.connack = connack
    return client


@pytest.fixture
def hb(h: Harness) -> tuple[Harness, RecordingBackplane]:
    backplane = RecordingBackplane()
    h.broker.router.backplane = backplane
    return h, backplane


def test_routes_counted_per_filter(hb: tuple[Harness, RecordingBackplane]) -> None:
    h, bp = hb
    a = joined(h, "a", bp)
    b = joined(h, "b", bp)
    bp.events.clear()
    a.subscribe("t/#")
    b.subscribe("t/#")
    a.subscribe("t/#", 1)  # replaced: no new route
    assert bp.events == [("added", "t/#")]
    a.unsubscribe("t/#")
    assert bp.events == [("added", "t/#")]  # b still has it
    b.unsubscribe("t/#")
    assert bp.events == [("added", "t/#"), ("removed", "t/#")]
    b.subscribe("t/#")
    assert bp.events[-1] == ("added", "t/#")


def test_claim_then_session_end(hb: tuple[Harness, RecordingBackplane]) -> None:
    h, bp = hb
    client = joined(h, "c", bp)
    assert bp.events == [("claim", "c", True)]
    client.lose()
    assert bp.events[-1] == ("ended", "c")


def test_a_claim_refused_refuses_the_connect_with_its_code(
    hb: tuple[Harness, RecordingBackplane],
) -> None:
    """The node that has the session (another user's) refused to hand it over: the CONNECT
    gets that node's reason code, and nothing is attached here."""
    h, bp = hb
    client = h.client()
    client.send(pk.Connect(client_id="c", clean_start=False, username="bob"))
    assert bp.users == ["bob"]
    bp.claims.pop()(MQTTError("client id in use by a connection of another user", 0x87))
    assert client.one(pk.Connack).reason_code == 0x87
    assert client.closed and "c" not in h.broker.sessions


def test_a_client_id_against_the_pattern_is_refused_before_any_claim(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(client_id_pattern="%u-*")
    bp = RecordingBackplane()
    h.broker.router.backplane = bp
    client = h.client()
    client.send(pk.Connect(client_id="alice-1", username="bob"))
    assert client.one(pk.Connack).reason_code == 0x85
    assert bp.events == []  # no other node asked for the session


def test_pipelined_packets_wait_for_the_claim(hb: tuple[Harness, RecordingBackplane]) -> None:
    h, bp = hb
    client = h.client()
    client.send(pk.Connect(client_id="c"), pk.Subscribe(1, [pk.SubscriptionRequest("a")]))
    assert client.receive() == []
    bp.claims.pop()(None)
    assert [type(p) for p in client.receive()] == [pk.Connack, pk.Suback]


def test_publish_counts_other_nodes(hb: tuple[Harness, RecordingBackplane]) -> None:
    """The backplane hears of every routed message with its publisher; the nodes it went to
    count as subscribers (no 0x10 on the PUBACK)."""
    h, bp = hb
    bp.remote_nodes = 1
    pub = joined(h, "pub", bp)
    pub.publish("t", b"x", 1)
    assert pub.one(pk.Puback).reason_code == 0
    assert ("publish", "t", "pub", 0) in bp.events
    bp.remote_nodes = 0
    pub.publish("t", b"x", 1)
    assert pub.one(pk.Puback).reason_code == 0x10


def test_router_count_adds_local_deliveries(hb: tuple[Harness, RecordingBackplane]) -> None:
    h, bp = hb
    bp.remote_nodes = 2
    for name in ("a", "b"):
        joined(h, name, bp).subscribe("t")
    c = joined(h, "c", bp)
    c.subscribe("+")
    c.subscribe("t")  # two subscriptions of one client: one copy
    router = h.broker.router
    match = router.lookup("t")
    assert match is not None
    # 2 nodes, a, b and c once
    assert router.publish(Message("t", b"x"), match, None, h.clock()) == 5


def test_shared_groups_deliver_here_only_when_the_backplane_says(
    hb: tuple[Harness, RecordingBackplane],
) -> None:
    h, bp = hb
    member = joined(h, "m", bp)
    member.subscribe("$share/g/t")
    pub = joined(h, "pub", bp)
    bp.keep_groups = False  # another node's turn
    pub.publish("t", b"elsewhere")
    assert member.receive() == []
    bp.keep_groups = True
    pub.publish("t", b"here")
    assert [p.payload for p in member.publishes()] == [b"here"]
    assert ("publish", "t", "pub", 1) in bp.events


def test_will_routed_through_the_backplane(hb: tuple[Harness, RecordingBackplane]) -> None:
    h, bp = hb
    client = h.client()
    will = pk.Will("will/c", b"gone")
    client.send(pk.Connect(client_id="c", will=will))
    bp.claims.pop()(None)
    client.receive()
    client.lose()
    assert ("publish", "will/c", "c", 0) in bp.events
