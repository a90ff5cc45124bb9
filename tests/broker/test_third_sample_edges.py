"""Edges a third mutation sample left unchecked: the per-address connection slot given back
once, what the password check off the loop and the enhanced-authentication exchange are told,
the reasons of a take-over, of a retained PUBLISH refused, of an AUTH without a method and of
too many filters, a packet's size measured where it starts in a read, an integration's message
with an expiry, and the log of a subscription the rules removed."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import (
    METHOD,
    AllowAll,
    Harness,
    Offload,
    Prop,
    ToyAuthenticator,
    ToyExchange,
    pk,
)

from mqttbroker.broker.sink import Outbox, Sink


def test_per_address_slot_given_back_once(make_harness: Any) -> None:
    h: Harness = make_harness(max_connections_per_address=2)
    first = h.client(peer="10.0.0.1:1")
    h.client(peer="10.0.0.1:2")
    first.lose()
    assert not h.client(peer="10.0.0.1:3").closed
    assert h.client(peer="10.0.0.1:4").closed  # two open again: the limit


def test_offloaded_password_check_is_told_the_address(h: Harness) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder(ToyAuthenticator):
        def check_password(self, *args: Any) -> int:
            asked.append(args)
            return 0

    h.broker.authenticator = Recorder()
    offload = h.broker.offload = Offload()
    client = h.client(peer="10.9.8.7:6543")
    client.send(pk.Connect(client_id="c", username="u", password=b"p"))
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0
    assert asked == [("c", "u", b"p", None, "10.9.8.7")]


def test_exchange_is_told_the_user_name(h: Harness) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder(ToyAuthenticator):
        def exchange(self, *args: Any) -> ToyExchange | None:
            asked.append(args)
            return ToyExchange()

    h.broker.authenticator = Recorder()
    client = h.client(peer="10.9.8.7:6543")
    props = {Prop.AUTHENTICATION_METHOD: METHOD}
    client.send(pk.Connect(client_id="c", username="carol", properties=props))
    assert client.one(pk.Auth).reason_code == 0x18
    assert asked == [(METHOD, "c", "carol", "10.9.8.7")]


def test_take_over_says_why(h: Harness) -> None:
    """[MQTT-3.1.4-3] The old connection gets DISCONNECT 0x8E with the reason."""
    old = h.connect("c")
    h.connect("c")
    disconnect = old.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x8E,
        "another connection took over the session",
    )


def test_auth_without_method_says_why(h: Harness) -> None:
    client = h.connect("c")
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x82,
        "AUTH without an Authentication Method in CONNECT",
    )


def test_too_many_filters_says_how_many(make_harness: Any) -> None:
    client = make_harness(max_subscriptions_per_client=2).connect("c")
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest(f) for f in ("a", "b", "c")]))
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x97,
        "SUBSCRIBE with more than 2 topic filters",
    )


def test_packet_size_measured_from_its_own_start(make_harness: Any) -> None:
    """A packet just within max_packet_size that follows another one in the same read is
    accepted: its size is its own, wherever it starts."""
    h: Harness = make_harness(max_packet_size=64, max_connect_size=32)  # checked past 32
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    publish = b"\x30\x3e\x00\x01t\x00" + b"x" * 58  # 64 bytes in all
    pub.send_raw(b"\xc0\x00" * 20 + publish)
    assert not pub.closed
    assert [len(p.payload) for p in sub.publishes()] == [58]


def test_integration_message_with_expiry(h: Harness) -> None:
    class Quiet(Sink):
        def wake(self) -> None:
            pass

    watcher = h.connect("w")
    watcher.subscribe("out", 1)
    outbox = Outbox(h.broker, "$bridge/b", Quiet(), 10, 1 << 20)
    outbox.publish("out", b"x", 1, False, {Prop.MESSAGE_EXPIRY_INTERVAL: 30})
    (message,) = watcher.publishes()
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 30


def test_removed_subscription_is_logged(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")

    class Rules(AllowAll):
        allowed = True

        def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
            return self.allowed

    rules = Rules()
    h.broker.authorizer = rules
    h.connect("s").subscribe("a/#")
    rules.allowed = False
    rules.generation += 1
    assert h.broker.recheck_subscriptions() == 1
    assert "session s: subscription 'a/#' removed: no longer authorized" in [
        r.getMessage() for r in caplog.records
    ]
