"""Violations and limits: topic aliases, wildcards in a Topic Name, malformed packets, the
server's Maximum Packet Size, DISCONNECT rules, and the isolation of one bad connection."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import Harness, Prop, pk

from mqttbroker.protocol import fastpath, grammar

MQTT_3_1_1 = 4


def disconnected_with(client, code: int) -> None:  # type: ignore[no-untyped-def]
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, code)], received
    assert client.closed


# -- topic aliases from the client -----------------------------------------------------------


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


# -- invalid topic names ------------------------------------------------------------------


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


# -- malformed packets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x36\x05\x00\x01t\x00\x01", id="PUBLISH-QoS3"),  # MQTT-3.3.1-4
        pytest.param(b"\x60\x02\x00\x01", id="PUBREL-flags-0000"),  # MQTT-3.6.1-1
        pytest.param(b"\x42\x02\x00\x01", id="PUBACK-flags-0010"),  # MQTT-2.1.3-1
        pytest.param(b"\x71\x02\x00\x01", id="PUBCOMP-flags-0001"),  # MQTT-2.1.3-1
        pytest.param(b"\x52\x02\x00\x01", id="PUBREC-flags-0010"),  # MQTT-2.1.3-1
        pytest.param(b"\x80\x06\x00\x01\x00\x00\x01t", id="SUBSCRIBE-flags-0000"),  # MQTT-3.8.1-1
        pytest.param(b"\xa0\x05\x00\x01\x00\x00\x01", id="UNSUBSCRIBE-flags-0000"),  # 3.10.1-1
        pytest.param(b"\xe1\x00", id="DISCONNECT-flags"),  # MQTT-3.14.1-1
        pytest.param(b"\xc1\x00", id="PINGREQ-flags"),  # MQTT-2.1.3-1
        pytest.param(b"\x30\x80\x80\x80\x80\x01", id="remaining-length-5-bytes"),
        pytest.param(b"\x30\x80\x00", id="remaining-length-not-minimal"),  # MQTT-1.5.5-1
        pytest.param(b"\x30\x04\x00\x05ab", id="topic-runs-past-end"),
        pytest.param(b"\x30\x05\x00\x02\xc3\x28\x00", id="topic-invalid-utf8"),  # 1.5.4-1
        pytest.param(b"\x30\x07\x00\x01t\x03\x63\x00\x01", id="unknown-property"),
    ],
)
def test_malformed_packet_disconnect(h: Harness, raw: bytes) -> None:
    """[MQTT-4.13.1-1] [MQTT-3.3.1-4] [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1]
    [MQTT-3.14.1-1] [MQTT-2.1.3-1] [MQTT-1.5.5-1] [MQTT-1.5.4-1] A Malformed Packet gets
    DISCONNECT 0x81 and the connection is closed."""
    client = h.connect("c1")
    client.send_raw(raw)
    disconnected_with(client, 0x81)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x82\x03\x00\x01\x00", id="SUBSCRIBE-no-filter"),  # MQTT-3.8.3-2
        pytest.param(b"\xa2\x03\x00\x01\x00", id="UNSUBSCRIBE-no-filter"),  # MQTT-3.10.3-2
        pytest.param(b"\x32\x06\x00\x01t\x00\x00\x00", id="PUBLISH-packet-id-0"),
        pytest.param(b"\x20\x03\x00\x00\x00", id="CONNACK-from-client"),
        pytest.param(b"\xf0\x00", id="AUTH-without-method"),  # MQTT-4.12.0-7
    ],
)
def test_protocol_error_disconnect(h: Harness, raw: bytes) -> None:
    """[MQTT-3.8.3-2] [MQTT-3.10.3-2] [MQTT-2.2.1-3] [MQTT-4.12.0-7] [MQTT-4.13.1-1] A Protocol Error gets
    DISCONNECT 0x82 and the connection is closed."""
    client = h.connect("c1")
    client.send_raw(raw)
    disconnected_with(client, 0x82)


def test_malformed_packet_v311_closes_silently(h: Harness) -> None:
    """[MQTT-4.13.1-1] A 3.1.1 client is closed without a DISCONNECT (3.1.1 has none)."""
    client = h.connect("c1", version=MQTT_3_1_1)
    client.send_raw(b"\x36\x05\x00\x01t\x00\x01")
    assert client.receive() == []
    assert client.closed


def test_malformed_packet_does_not_affect_others(h: Harness) -> None:
    """A malformed packet closes only its own connection; the others go on publishing and
    receiving, including in the same flush."""
    subscriber = h.connect("sub")
    subscriber.subscribe("t", 1)
    bad = h.connect("bad")
    bad.subscribe("t", 1)
    good = h.connect("good")
    good.publish("t", b"before", 1)
    assert [p.payload for p in bad.publishes()] == [b"before"]
    bad.send_raw(b"\x36\x05\x00\x01t\x00\x01" + grammar.encode(pk.Publish("t", b"after bad"), 5))
    good.publish("t", b"after", 1)
    disconnected_with(bad, 0x81)
    assert [type(p) for p in good.receive()] == [pk.Puback, pk.Puback]
    received = subscriber.publishes()
    assert [p.payload for p in received] == [b"before", b"after"]
    for p in received:
        subscriber.puback(p.packet_id)
    assert not subscriber.closed and not good.closed
    assert "bad" not in h.broker.sessions
    good.publish("t", b"later", 0)
    assert [p.payload for p in subscriber.publishes()] == [b"later"]


# -- the server's Maximum Packet Size -------------------------------------------------------


def test_packet_too_large_rejected_from_header(h: Harness) -> None:
    """[MQTT-3.2.2-15] A fixed header announcing 256 MB is refused with DISCONNECT 0x95 at once,
    before any of the body arrives."""
    client = h.connect("c1")
    client.send_raw(b"\x30" + fastpath.encode_vbi(268_435_455))
    disconnected_with(client, 0x95)


def test_connect_too_large_rejected_from_header(h: Harness) -> None:
    """[MQTT-3.2.2-15] The same for a CONNECT: CONNACK 0x95 (v5 form) and close."""
    client = h.client()
    client.send_raw(b"\x10" + fastpath.encode_vbi(268_435_455))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Connack, 0x95)]
    assert client.closed


def test_packet_size_limit_boundary(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-15] Maximum Packet Size counts the whole packet: exactly the limit is
    accepted, one byte more is refused with 0x95."""
    h = make_harness(max_packet_size=100)
    subscriber = h.connect("sub")
    subscriber.subscribe("t")
    client = h.connect("c1")
    overhead = len(grammar.encode(pk.Publish("t", b""), 5))
    exact = grammar.encode(pk.Publish("t", b"x" * (100 - overhead)), 5)
    assert len(exact) == 100
    client.send_raw(exact)
    assert [len(p.payload) for p in subscriber.publishes()] == [100 - overhead]
    client.send_raw(grammar.encode(pk.Publish("t", b"x" * (101 - overhead)), 5))
    disconnected_with(client, 0x95)
    assert subscriber.receive() == []


# -- DISCONNECT ----------------------------------------------------------------------------


def test_disconnect_closes(h: Harness) -> None:
    """[MQTT-3.14.4-2] A DISCONNECT from the client closes the connection, with no answer."""
    client = h.connect("c1")
    client.disconnect()
    assert client.receive() == []
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_disconnect_session_expiry_after_zero_is_protocol_error(h: Harness) -> None:
    """A DISCONNECT setting a non-zero Session Expiry Interval when CONNECT had 0 is a Protocol
    Error (3.14.2.2.2): DISCONNECT 0x82, and the session does not survive."""
    client = h.connect("c1")
    client.disconnect(0, {Prop.SESSION_EXPIRY_INTERVAL: 60})
    disconnected_with(client, 0x82)
    assert "c1" not in h.broker.sessions


def test_server_disconnect_respects_client_maximum_packet_size(h: Harness) -> None:
    """[MQTT-3.14.2-3] [MQTT-3.1.2-24] The server leaves the Reason String out of its DISCONNECT
    when it would exceed the client's Maximum Packet Size."""
    client = h.connect("c1", properties={Prop.MAXIMUM_PACKET_SIZE: 20})
    client.publish("a/#", b"x")
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x90)]
    assert Prop.REASON_STRING not in received[0].properties
    assert all(len(w) <= 20 for w in client.link.writes)
    # Without the limit the same DISCONNECT carries a Reason String (so the test means something).
    roomy = h.connect("c2")
    roomy.publish("a/#", b"x")
    (disconnect,) = roomy.receive()
    assert Prop.REASON_STRING in disconnect.properties


# -- topic names on the fast path and the match cache ---------------------------------------


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


def test_invalid_topic_rejected_every_time(h: Harness) -> None:
    """[MQTT-3.3.2-2] An invalid topic is refused on every connection that sends it (an invalid
    name is never remembered as valid)."""
    for index in range(3):
        client = h.connect(f"c{index}")
        client.publish("a/+/b", b"x", index % 2)
        disconnected_with(client, 0x90)


def test_matching_follows_subscription_changes(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-4.5.0-1] [MQTT-3.10.4-2] [MQTT-3.1.2-4] Repeated topics are matched against the
    current subscriptions: after SUBSCRIBE, UNSUBSCRIBE, and a session replaced by Clean Start."""
    for cache_size in (65536, 1):
        h = make_harness(match_cache_size=cache_size)
        publisher = h.connect("pub")
        subscriber = h.connect("sub", properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
        publisher.publish("t", b"1")
        publisher.publish("u", b"1")
        subscriber.subscribe("t")
        publisher.publish("t", b"2")
        publisher.publish("u", b"2")
        assert [p.payload for p in subscriber.publishes()] == [b"2"]
        subscriber.unsubscribe("t")
        publisher.publish("t", b"3")
        assert subscriber.receive() == []
        subscriber.subscribe("t", 1)
        publisher.publish("t", b"4", 1)
        assert [p.payload for p in subscriber.publishes()] == [b"4"]
        subscriber.lose()
        fresh = h.connect("sub", clean_start=True, expect_present=False)
        publisher.publish("t", b"5", 1)
        assert publisher.receive()[-1].reason_code == 0x10
        fresh.subscribe("t", 1)
        publisher.publish("t", b"6", 1)
        assert [p.payload for p in fresh.publishes()] == [b"6"]
        assert len(h.broker.sessions["sub"].queue) == 0
