"""CONNECT at its edges: the reasons a refused CONNECT reads, what the password check is told,
the CONNACK properties of features turned off, the codec's User Property limit taken from the
options, a session of another user discarded (and logged), an internal error contained to its
client, and acknowledgements released commit by commit."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import AllowAll, GatedStore, Harness, Prop, pk, split_packets

from mqttbroker.broker.core import Broker
from mqttbroker.broker.policy import ListenerPolicy


def refused(h: Harness, packet: pk.Connect) -> pk.Connack:
    client = h.client()
    client.send(packet)
    connack: pk.Connack = client.one(pk.Connack)
    assert connack.reason_code >= 0x80 and client.closed
    return connack


@pytest.mark.parametrize(
    ("options", "packet", "code", "reason"),
    [
        (
            {"maximum_qos": 1},
            pk.Connect(client_id="c", will=pk.Will("w", b"x", qos=2)),
            0x9B,
            "will QoS above the maximum",
        ),
        (
            {"retain_available": False},
            pk.Connect(client_id="c", will=pk.Will("w", b"x", retain=True)),
            0x9A,
            "retained will not supported",
        ),
        (
            {},
            pk.Connect(client_id="c", properties={Prop.AUTHENTICATION_DATA: b"x"}),
            0x82,
            "Authentication Data without an Authentication Method",
        ),
    ],
    ids=["will-qos", "will-retain", "auth-data"],
)
def test_refused_connect_says_why(
    make_harness: Any, options: dict[str, Any], packet: pk.Connect, code: int, reason: str
) -> None:
    connack = refused(make_harness(**options), packet)
    assert (connack.reason_code, connack.properties[Prop.REASON_STRING]) == (code, reason)


@pytest.mark.parametrize("allow_anonymous", [None, True])
def test_password_check_is_told_the_listener_rule_and_address(
    h: Harness, allow_anonymous: bool | None
) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder:
        def check_password(self, *args: Any) -> int:
            asked.append(args)
            return 0

        def exchange(self, *args: Any) -> None:
            return None

    h.broker.authenticator = Recorder()
    client = h.client(peer="10.2.3.4:5678", policy=ListenerPolicy(allow_anonymous=allow_anonymous))
    client.send(pk.Connect(client_id="c", username="u", password=b"p"))
    assert client.one(pk.Connack).reason_code == 0
    assert asked == [("c", "u", b"p", allow_anonymous, "10.2.3.4")]


def test_connack_announces_features_turned_off(make_harness: Any) -> None:
    """Subscription Identifiers, shared subscriptions and wildcards off: CONNACK
    says 0 for each; on (the default), the properties are left out (they default to 1)."""
    off = make_harness(
        subscription_identifiers=False, shared_subscriptions=False, wildcard_subscriptions=False
    ).connect("c")
    assert off.connack is not None
    props = off.connack.properties
    assert props[Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 0
    assert props[Prop.SHARED_SUBSCRIPTION_AVAILABLE] == 0
    assert props[Prop.WILDCARD_SUBSCRIPTION_AVAILABLE] == 0
    on = make_harness().connect("c")
    assert on.connack is not None
    for prop in (
        Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        Prop.SHARED_SUBSCRIPTION_AVAILABLE,
        Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
    ):
        assert prop not in on.connack.properties


def test_user_property_limit_comes_from_the_options(make_harness: Any) -> None:
    h: Harness = make_harness(max_user_properties=2)
    client = h.connect("c")
    props = {Prop.USER_PROPERTY: [("a", "1"), ("b", "2"), ("c", "3")]}
    client.publish("t", b"x", 1, properties=props)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x83
    assert disconnect.properties[Prop.REASON_STRING] == "more than 2 User Properties"


def test_session_of_another_user_discarded_and_logged(
    make_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")
    h: Harness = make_harness(session_owner_mismatch="new")
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    first = h.client()
    first.send(pk.Connect(client_id="x", username="alice", properties=expiry))
    first.receive()
    first.lose()
    second = h.client()
    second.send(pk.Connect(client_id="x", username="bob", clean_start=False, properties=expiry))
    assert second.one(pk.Connack).session_present is False
    assert "session x of user 'alice' discarded: its client id was taken by user 'bob'" in [
        r.getMessage() for r in caplog.records
    ]


def test_internal_error_is_contained(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """A bug of ours while handling one client's packet: that client gets DISCONNECT 0x83 and
    the traceback is logged; the others go on."""
    caplog.set_level(logging.ERROR, logger="mqttbroker.connection")

    class Broken(AllowAll):
        def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
            if topic == "boom":
                raise RuntimeError("a bug")
            return True

    h.broker.authorizer = Broken()
    other = h.connect("other")
    other.subscribe("t")
    client = h.connect("c")
    client.publish("boom", b"x", 1)
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x83,
        "internal error",
    )
    assert [r.getMessage() for r in caplog.records] == [
        "client c: internal error while handling its packet"
    ]
    h.connect("pub").publish("t", b"fine")
    assert [p.payload for p in other.publishes()] == [b"fine"]


def test_acks_released_one_commit_at_a_time(make_harness: Any) -> None:
    """Two stored PUBLISHes read apart wait for two commits: the first commit releases the
    first PUBACK and keeps the second, which the next commit releases."""
    h: Harness = make_harness()
    store = GatedStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    client = h.connect("c")
    client.publish("r/1", b"x", 1, retain=True)
    client.publish("r/2", b"x", 1, retain=True)
    h.broker.flush()
    assert split_packets(client.link.data[client._read :], 5) == []
    store.commit_one()
    h.broker.flush()
    assert [p.packet_id for p in split_packets(client.link.data[client._read :], 5)] == [1]
    store.commit_one()
    h.broker.flush()
    assert [p.packet_id for p in split_packets(client.link.data[client._read :], 5)] == [1, 2]


@pytest.mark.parametrize(("level", "name"), [(5, "5.0"), (4, "3.1.1"), (3, "3.1")])
def test_connection_logged_with_its_version(
    h: Harness, caplog: pytest.LogCaptureFixture, level: int, name: str
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    client = h.client(version=level)
    client.send(
        pk.Connect(
            client_id="c", protocol_level=level, protocol_name="MQIsdp" if level == 3 else "MQTT"
        )
    )
    assert client.one(pk.Connack).reason_code == 0
    assert (
        f"client c connected from peer (MQTT {name} over a test link, user None, keep alive 60s, "
        "session new)"
    ) in [r.getMessage() for r in caplog.records]
