"""broker/publish.py: PUBLISH from the client: topic names and aliases, property rules (Payload
Format Indicator, Response Topic, Subscription Identifier), maximum QoS and Retain Available,
publish rights and their log, the publish rate, the retained quota, QoS 2 exactly once in (PUBREL
-> PUBCOMP), the client's Receive Maximum."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.harness import (
    MQTT_3_1_1,
    NOT_UTF8,
    PERSISTENT,
    PFI,
    POWERS_OF_TWO,
    AllowAll,
    DenySecret,
    Harness,
    Prop,
    counts_logged,
    disconnected_with,
    pair,
    pk,
)

from mqttbroker.protocol import grammar
from mqttbroker.protocol.reasons import ReasonCode


class _PublishOnlyTo:
    """An authorizer that lets clients publish only under ``prefix``."""

    generation = 0

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return topic.startswith(self.prefix)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return True

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return True


def test_topic_alias_set_and_reuse(h: Harness) -> None:
    """[MQTT-3.3.2-12] [MQTT-3.1.2-27] An alias set with a topic is used for later PUBLISHes with
    an empty topic, can be remapped, and subscribers see the real topic (no alias: they announced
    no Topic Alias Maximum)."""
    subscriber = h.connect("sub")
    subscriber.subscribe("#", 1)
    publisher = h.connect("pub")
    maximum = publisher.connack.properties[Prop.TOPIC_ALIAS_MAXIMUM]  # type: ignore[union-attr]
    publisher.publish("a/b", b"1", 0, properties={Prop.TOPIC_ALIAS: 1})
    publisher.publish("", b"2", 1, properties={Prop.TOPIC_ALIAS: 1})
    publisher.publish("c", b"3", 0, properties={Prop.TOPIC_ALIAS: 1})  # remap
    publisher.publish("", b"4", 0, properties={Prop.TOPIC_ALIAS: 1})
    publisher.publish("max", b"5", 0, properties={Prop.TOPIC_ALIAS: maximum})
    publisher.publish("", b"6", 0, properties={Prop.TOPIC_ALIAS: maximum})
    assert [type(p) for p in publisher.receive()] == [pk.Puback]
    received = subscriber.publishes()
    assert [(p.topic, p.payload) for p in received] == [
        ("a/b", b"1"),
        ("a/b", b"2"),
        ("c", b"3"),
        ("c", b"4"),
        ("max", b"5"),
        ("max", b"6"),
    ]
    assert not publisher.closed


@pytest.mark.parametrize("alias", [0, 65, 65535])
def test_topic_alias_out_of_range(h: Harness, alias: int) -> None:
    """[MQTT-3.3.2-8] [MQTT-3.3.2-9] [MQTT-3.2.2-17] Topic Alias 0 or above the Topic Alias
    Maximum (64): DISCONNECT 0x94 and close; the message is not delivered."""
    subscriber = h.connect("sub")
    subscriber.subscribe("#")
    publisher = h.connect("pub")
    assert publisher.connack.properties[Prop.TOPIC_ALIAS_MAXIMUM] == 64  # type: ignore[union-attr]
    publisher.publish("t", b"x", 0, properties={Prop.TOPIC_ALIAS: alias})
    disconnected_with(publisher, 0x94)
    assert subscriber.receive() == []


def test_topic_alias_when_server_announced_none(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-18] With Topic Alias Maximum 0 (not announced) any alias is invalid: 0x94."""
    h = make_harness(topic_alias_maximum=0)
    publisher = h.connect("pub")
    assert Prop.TOPIC_ALIAS_MAXIMUM not in publisher.connack.properties  # type: ignore[union-attr]
    publisher.publish("t", b"x", 0, properties={Prop.TOPIC_ALIAS: 1})
    disconnected_with(publisher, 0x94)


def test_topic_alias_is_per_connection(h: Harness) -> None:
    """[MQTT-3.3.2-7] Alias mappings do not survive the connection, even when the session does:
    an unknown alias with an empty topic is an error (0x82 or 0x94)."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    publisher = h.connect("pub", properties=expiry)
    publisher.publish("t", b"x", 0, properties={Prop.TOPIC_ALIAS: 3})
    publisher.lose()
    publisher = h.connect("pub", clean_start=False, properties=expiry, expect_present=True)
    publisher.publish("", b"y", 0, properties={Prop.TOPIC_ALIAS: 3})
    received = publisher.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code in (0x82, 0x94)
    assert publisher.closed


def test_empty_topic_without_alias(h: Harness) -> None:
    """A zero-length Topic Name without a Topic Alias is a Protocol Error (0x82)."""
    publisher = h.connect("pub")
    publisher.publish("", b"x", 0)
    disconnected_with(publisher, 0x82)


def test_empty_topic_v311(h: Harness) -> None:
    """[MQTT-4.7.3-1] A 3.1.1 PUBLISH with an empty topic closes the connection."""
    publisher = h.connect("pub", version=MQTT_3_1_1)
    publisher.publish("", b"x", 0)
    assert publisher.receive() == []
    assert publisher.closed


@pytest.mark.parametrize("topic", ["a/+", "+", "#", "a/#", "a/b#", "+/x"])
def test_publish_with_wildcard_topic(h: Harness, topic: str) -> None:
    """[MQTT-3.3.2-2] [MQTT-4.7.0-1] A wildcard in a PUBLISH Topic Name: DISCONNECT 0x90 (Topic
    Name invalid), close, and nothing delivered."""
    subscriber = h.connect("sub")
    subscriber.subscribe("#")
    publisher = h.connect("pub")
    publisher.publish(topic, b"x", 1)
    disconnected_with(publisher, 0x90)
    assert subscriber.receive() == []


def test_publish_topic_with_nul_is_malformed(h: Harness) -> None:
    """[MQTT-4.7.3-2] [MQTT-1.5.4-2] U+0000 in a Topic Name: Malformed Packet (0x81)."""
    publisher = h.connect("pub")
    good = grammar.encode(pk.Publish("ab", b"x"), 5)
    publisher.send_raw(good.replace(b"ab", b"a\x00"))
    disconnected_with(publisher, 0x81)


def test_response_topic_with_wildcard(h: Harness) -> None:
    """[MQTT-3.3.2-14] A Response Topic with a wildcard closes the connection with 0x82."""
    publisher = h.connect("pub")
    publisher.publish("t", b"x", 0, properties={Prop.RESPONSE_TOPIC: "reply/#"})
    disconnected_with(publisher, 0x82)


def test_subscription_identifier_from_client(h: Harness) -> None:
    """[MQTT-3.3.4-6] A PUBLISH from a client with a Subscription Identifier: Protocol Error."""
    publisher = h.connect("pub")
    publisher.publish("t", b"x", 0, properties={Prop.SUBSCRIPTION_IDENTIFIER: [5]})
    disconnected_with(publisher, 0x82)


@pytest.mark.parametrize(
    "topic_bytes",
    [
        pytest.param(b"\xed\xa0\x80", id="surrogate-U+D800"),  # MQTT-1.5.4-1
        pytest.param(b"a\xc0\xafb", id="overlong-slash"),
        pytest.param(b"\xff", id="invalid-byte"),
    ],
)
@pytest.mark.parametrize("qos", [0, 1])
def test_topic_not_well_formed_utf8(h: Harness, topic_bytes: bytes, qos: int) -> None:
    """[MQTT-1.5.4-1] A topic that is not well-formed UTF-8 (surrogates and overlong forms
    included) is a Malformed Packet, with or without properties."""
    client = h.connect("c1")
    body = len(topic_bytes).to_bytes(2, "big") + topic_bytes
    body += b"\x00\x01" if qos else b""
    body += b"\x00" + b"payload"
    client.send_raw(bytes((0x30 | qos << 1, len(body))) + body)
    disconnected_with(client, 0x81)


def test_bom_kept_in_topic(h: Harness) -> None:
    """[MQTT-1.5.4-3] [MQTT-4.7.3-4] A leading U+FEFF in a topic is part of it: not stripped,
    not matched against the topic without it."""
    bom = h.connect("bom")
    bom.subscribe("\ufeffa")
    plain = h.connect("plain")
    plain.subscribe("a")
    h.connect("pub").publish("\ufeffa", b"x")
    assert [p.topic for p in bom.publishes()] == ["\ufeffa"]
    assert plain.receive() == []


def test_qos1_publisher_dup_not_forwarded(h: Harness) -> None:
    """[MQTT-3.3.1-3] [MQTT-4.3.2-5] DUP on the inbound PUBLISH does not carry over to the
    outbound one; a QoS 1 resend after PUBACK is a new message."""
    subscriber, publisher = pair(h)
    publisher.publish("t", b"m", 1, packet_id=3, dup=True)
    publisher.publish("t", b"m", 1, packet_id=3, dup=True)
    assert [type(p) for p in publisher.receive()] == [pk.Puback, pk.Puback]
    received = subscriber.publishes()
    assert [p.dup for p in received] == [False, False]


def test_qos2_duplicate_before_pubrel_not_delivered_twice(h: Harness) -> None:
    """[MQTT-4.3.3-10] [MQTT-4.3.3-12] A QoS 2 PUBLISH repeated before PUBREL is acknowledged
    again but not delivered again; after PUBCOMP the same id starts a new message."""
    subscriber, publisher = pair(h, sub_qos=0)
    publisher.publish("t", b"first", 2, packet_id=9)
    publisher.publish("t", b"first", 2, packet_id=9, dup=True)
    publisher.publish("t", b"first", 2, packet_id=9, dup=True)
    recs = publisher.receive()
    assert [(type(p), p.packet_id) for p in recs] == [(pk.Pubrec, 9)] * 3
    assert [p.payload for p in subscriber.publishes()] == [b"first"]
    publisher.pubrel(9)
    assert publisher.one(pk.Pubcomp).packet_id == 9
    publisher.publish("t", b"second", 2, packet_id=9)
    assert publisher.one(pk.Pubrec).packet_id == 9
    assert [p.payload for p in subscriber.publishes()] == [b"second"]


def test_inbound_qos2_state_survives_reconnect(h: Harness) -> None:
    """[MQTT-4.3.3-10] [MQTT-3.1.2-23] A publisher's QoS 2 id awaiting PUBREL is remembered across
    a reconnect: the resent PUBLISH is not delivered again, and PUBREL gets PUBCOMP 0x00."""
    subscriber = h.connect("sub")
    subscriber.subscribe("t", 0)
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 300}
    publisher = h.connect("pub", properties=expiry)
    publisher.publish("t", b"once", 2, packet_id=11)
    publisher.receive()
    publisher.lose()
    publisher = h.connect("pub", clean_start=False, properties=expiry, expect_present=True)
    publisher.publish("t", b"once", 2, packet_id=11, dup=True)
    assert publisher.one(pk.Pubrec).packet_id == 11
    publisher.pubrel(11)
    comp = publisher.one(pk.Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (11, 0)
    assert [p.payload for p in subscriber.publishes()] == [b"once"]


def test_inbound_receive_maximum_exceeded(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.3.4-7] More unacknowledged QoS 2 PUBLISHes from a client than the server's Receive
    Maximum: DISCONNECT 0x93."""
    h = make_harness(receive_maximum=2)
    publisher = h.connect("pub")
    assert publisher.connack.properties[Prop.RECEIVE_MAXIMUM] == 2  # type: ignore[union-attr]
    publisher.publish("t", b"1", 2)
    publisher.publish("t", b"2", 2)
    assert [type(p) for p in publisher.receive()] == [pk.Pubrec, pk.Pubrec]
    publisher.pubrel(1)  # frees one
    assert [type(p) for p in publisher.receive()] == [pk.Pubcomp]
    publisher.publish("t", b"3", 2)
    assert [type(p) for p in publisher.receive()] == [pk.Pubrec]
    publisher.publish("t", b"4", 2)
    received = publisher.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x93)]
    assert publisher.closed


def test_payload_format_invalid(h: Harness) -> None:
    """[MQTT-3.4.2-1] [MQTT-3.5.2-1] [MQTT-4.3.3-9] A payload that is not UTF-8 despite Payload
    Format Indicator 1 is refused with 0x99 (PUBACK or PUBREC) and not delivered; after a PUBREC
    >= 0x80 the same packet id starts a new message."""
    subscriber, publisher = pair(h)
    utf8 = {Prop.PAYLOAD_FORMAT_INDICATOR: 1}
    publisher.publish("t", b"\xff\xfe", 1, packet_id=4, properties=utf8)
    ack = publisher.one(pk.Puback)
    assert (ack.packet_id, ack.reason_code) == (4, 0x99)
    publisher.publish("t", b"\xff\xfe", 2, packet_id=5, properties=utf8)
    rec = publisher.one(pk.Pubrec)
    assert (rec.packet_id, rec.reason_code) == (5, 0x99)
    assert subscriber.receive() == []
    publisher.publish("t", "ok ✓".encode(), 2, packet_id=5, properties=utf8)
    rec = publisher.one(pk.Pubrec)
    assert (rec.packet_id, rec.reason_code) == (5, 0)
    assert [p.payload for p in subscriber.publishes()] == ["ok ✓".encode()]


def test_v311_qos1_publish_with_empty_payload(h: Harness) -> None:
    """A 3.1.1 QoS 1 PUBLISH ends right after its packet identifier (no properties, no
    payload): accepted, acknowledged and delivered with its empty payload."""
    sub = h.connect("sub")
    sub.subscribe("t", 1)
    pub = h.connect("pub", version=MQTT_3_1_1)
    pub.send_raw(b"\x32\x05\x00\x01t\x00\x07")
    (puback,) = pub.receive()
    assert isinstance(puback, pk.Puback) and puback.packet_id == 7
    assert [p.payload for p in sub.publishes()] == [b""]


def test_a_client_past_max_publish_rate_is_disconnected_0x96(make_harness: Any) -> None:
    """A client publishing faster than max_publish_rate is disconnected with 0x96; others keep
    publishing."""
    h = make_harness(max_publish_rate=10.0, max_publish_burst=3)
    fast = h.connect("fast")
    calm = h.connect("calm")
    sub = h.connect("sub")
    sub.subscribe("t")
    for _ in range(3):
        fast.publish("t")
    assert len(sub.publishes()) == 3
    fast.publish("t")
    assert fast.one(pk.Disconnect).reason_code == 0x96
    h.clock.advance(0.2)  # two tokens back for everyone
    calm.publish("t")
    calm.publish("t")
    assert len(sub.publishes()) == 2


def test_max_retained(make_harness: Any) -> None:
    h = make_harness(max_retained=1)
    client = h.connect("c")
    client.publish("r/1", b"one", 1, retain=True)
    assert client.one(pk.Puback).reason_code in (0, 0x10)
    client.publish("r/2", b"two", 1, retain=True)
    assert client.one(pk.Puback).reason_code == 0x97
    client.publish("r/1", b"uno", 1, retain=True)  # replacing the one there is fine
    assert client.one(pk.Puback).reason_code in (0, 0x10)
    assert len(h.broker.router.retained) == 1
    assert h.broker.router.retained.get("r/1").payload == b"uno"


def test_denied_topics_are_not_cached(make_harness: Any) -> None:
    """Authorization comes before the match cache: topics a client may not publish to do not
    fill it, nor its own cache of rights past its bound."""
    h: Harness = make_harness(max_topic_length=65535)
    h.broker.authorizer = _PublishOnlyTo("ok/")
    client = h.connect("c")
    for index in range(20):
        client.publish(f"denied/{index}/" + "x" * 10_000)
    client.publish("ok/1")
    assert list(h.broker.router.cache) == [b"\x00\x04ok/1"]
    rights = client.conn.rights
    assert rights is not None and rights.allowed is not None
    assert rights.size <= 65_536 and len(rights.allowed) < 21


def test_a_topic_the_match_cache_knows_is_named_where_it_is_needed(make_harness: Any) -> None:
    """A topic the match cache knows is routed without decoding its name (the cache keeps only
    its wire form); what asks for the name gets it all the same: the retained store, the
    authorizer, a subscriber's copy."""
    h: Harness = make_harness()
    watcher = h.connect("watcher")
    watcher.subscribe("é/#", 1)
    client = h.connect("c")
    for payload in (b"first", b"second"):  # the second from the cache
        client.publish("é/1", payload, 1, retain=True)
        assert client.one(pk.Puback).reason_code == 0
    assert list(h.broker.router.cache) == [b"\x00\x04\xc3\xa9/1"]
    kept = h.broker.router.retained.get("é/1")
    assert kept is not None and (kept.topic, kept.payload) == ("é/1", b"second")
    h.broker.authorizer = _PublishOnlyTo("é/")
    client.publish("é/1", b"third", 1)  # from the cache, its name asked by the authorizer
    assert client.one(pk.Puback).reason_code == 0
    client.publish("x/1", b"no", 1)  # refused by name
    assert client.one(pk.Puback).reason_code == 0x87
    got = watcher.publishes()
    assert [(p.topic, p.payload) for p in got] == [
        ("é/1", b"first"),
        ("é/1", b"second"),
        ("é/1", b"third"),
    ]


def test_qos0_publish_not_utf8_disconnects(h: Harness) -> None:
    """[MQTT-3.3.2-4] A QoS 0 PUBLISH cannot be answered: DISCONNECT 0x99 saying why."""
    client = h.connect("c")
    client.publish("t", NOT_UTF8, 0, properties=PFI)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x99
    assert disconnect.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 although its Payload Format Indicator says so"
    )


@pytest.mark.parametrize("qos", [1, 2])
def test_qos1_2_publish_not_utf8_refused_in_the_ack(h: Harness, qos: int) -> None:
    """The PUBACK/PUBREC says 0x99 with a Reason String; the connection stays, nothing is
    forwarded."""
    watcher = h.connect("w")
    watcher.subscribe("t", 2)
    client = h.connect("c")
    client.publish("t", NOT_UTF8, qos, properties=PFI)
    ack = client.one(pk.Puback if qos == 1 else pk.Pubrec)
    assert ack.reason_code == 0x99
    assert ack.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 as its Payload Format Indicator says"
    )
    assert not client.closed and watcher.receive() == []


def test_persistent_inbound_qos2_is_released_once(h: Harness) -> None:
    """[MQTT-4.3.3-10] A persistent session's unreleased inbound QoS 2 id outlives the
    connection: the PUBLISH resent after a reconnect is not delivered twice."""
    watcher = h.connect("w")
    watcher.subscribe("t", 2)
    client = h.connect("c", properties=PERSISTENT)
    client.publish("t", b"once", 2, packet_id=3)
    assert client.one(pk.Pubrec).reason_code == 0
    assert [p.payload for p in watcher.publishes()] == [b"once"]
    client.lose()
    client = h.connect("c", clean_start=False, properties=PERSISTENT, expect_present=True)
    client.publish("t", b"once", 2, packet_id=3, dup=True)
    assert client.one(pk.Pubrec).reason_code == 0
    assert watcher.receive() == []
    client.pubrel(3)
    assert client.one(pk.Pubcomp).reason_code == 0


def test_publish_rate_refills_at_the_rate(make_harness: Any) -> None:
    h: Harness = make_harness(max_publish_rate=10.0, max_publish_burst=2)
    client = h.connect("c")
    client.publish("t")
    client.publish("t")  # the burst is spent
    h.clock.advance(0.1)  # one token back at 10 messages/s
    client.publish("t")
    assert client.receive() == []
    client.publish("t")
    assert client.one(pk.Disconnect).reason_code == 0x96


def test_retained_refusal_is_logged(make_harness: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    h: Harness = make_harness(max_retained=1)
    client = h.connect("c")
    client.publish("r/1", b"x", retain=True)
    denied = h.broker.stats.denied
    client.publish("r/2", b"x", 1, retain=True)
    ack = client.one(pk.Puback)
    assert ack.reason_code == 0x97
    assert h.broker.stats.denied == denied + 1  # counted ($SYS), once per refusal
    client.publish("r/3", b"x", 0, retain=True)  # QoS 0: dropped, counted
    assert h.broker.stats.denied == denied + 2
    assert "client c: retained message on 'r/2' refused: max_retained (1) reached" in [
        r.getMessage() for r in caplog.records
    ]


def test_retain_not_available(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-14] With retain unavailable a retained PUBLISH is answered with DISCONNECT
    (0x9A Retain not supported) and the connection is closed."""
    h = make_harness(retain_available=False)
    client = h.connect("c1")
    client.publish("t", b"v", 0, retain=True)
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x9A)]
    assert client.closed


def test_publish_above_maximum_qos(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-11] A PUBLISH above the server's Maximum QoS: DISCONNECT 0x9B."""
    h = make_harness(maximum_qos=1)
    client = h.connect("c1")
    client.publish("t", b"v", 2)
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x9B)]
    assert client.closed


def test_denied_publishes_logged_at_powers_of_two(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    h.broker.authorizer = DenySecret()
    client = h.connect("c")
    for _ in range(9):
        client.publish("secret/x", b"no", 1)
        assert client.one(pk.Puback).reason_code == ReasonCode.NOT_AUTHORIZED
    lines = [r.getMessage() for r in caplog.records if "not authorized" in r.getMessage()]
    assert counts_logged(caplog, "not authorized to publish to 'secret/x'") == POWERS_OF_TWO
    assert "client c from peer-c (user None)" in lines[0]


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


def test_empty_topic_without_alias_says_why(h: Harness) -> None:
    """[MQTT-3.3.2-1] An empty Topic Name needs a Topic Alias: DISCONNECT 0x82
    with the reason."""
    client = h.connect("c")
    client.publish("", b"x", 0)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x82
    assert disconnect.properties[Prop.REASON_STRING] == (
        "PUBLISH with an empty topic and no topic alias"
    )


def test_unknown_packet_identifiers_explained(h: Harness) -> None:
    """PUBCOMP and PUBREL 0x92 say which packet identifier was not found. [MQTT-3.6.2-2]
    [MQTT-3.7.2-2]"""
    c = h.connect("c")
    c.pubrel(7)
    c.pubrec(8)
    pubcomp, pubrel = c.receive()
    assert isinstance(pubcomp, pk.Pubcomp) and pubcomp.reason_code == 0x92
    assert "7" in pubcomp.properties[Prop.REASON_STRING]
    assert isinstance(pubrel, pk.Pubrel) and pubrel.reason_code == 0x92
    assert "8" in pubrel.properties[Prop.REASON_STRING]
    small = h.connect("small", properties={Prop.MAXIMUM_PACKET_SIZE: 6})
    small.pubrel(7)
    (pubcomp,) = small.receive()
    assert pubcomp.reason_code == 0x92 and not pubcomp.properties


def test_topic_with_u0000_says_why(h: Harness) -> None:
    """[MQTT-4.7.3-2] A Topic Name with U+0000 is a Malformed Packet: DISCONNECT 0x81."""
    client = h.connect("c")
    client.publish("a\x00b", b"x", 0)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x81
    assert disconnect.properties[Prop.REASON_STRING] == "topic name contains U+0000"


def test_retained_publish_refused_says_why(make_harness: Any) -> None:
    client = make_harness(retain_available=False).connect("c")
    client.publish("t", b"x", 0, retain=True)
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x9A,
        "retained PUBLISH not supported",
    )
