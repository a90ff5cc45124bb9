"""PUBLISH properties forwarded to subscribers, message expiry, topic aliases, subscription
identifiers, request/response and problem information, and the client's Maximum Packet Size
(sections 3.1.2.11, 3.3.2.3, 3.3.4, and the "left out if too large" rules of 3.4 to 3.14)."""

from __future__ import annotations

import time

import pytest

from .mqtt import (
    CONNACK,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    P,
    ack,
    connect,
    read_any,
    subscribe,
)

FORWARDED = [
    (P.PAYLOAD_FORMAT_INDICATOR, 1),
    (P.CONTENT_TYPE, "application/json; charset=utf-8"),
    (P.RESPONSE_TOPIC, "reply/\u00e9/here"),
    (P.CORRELATION_DATA, b"\x00\x01\xfe\xff"),
    (P.USER_PROPERTY, ("z", "last")),
    (P.USER_PROPERTY, ("a", "first")),
    (P.USER_PROPERTY, ("z", "last")),
    (P.USER_PROPERTY, ("", "")),
    (P.USER_PROPERTY, ("dup", "1")),
    (P.USER_PROPERTY, ("dup", "2")),
]


def _forwarded(pkt):
    keys = {P.PAYLOAD_FORMAT_INDICATOR, P.CONTENT_TYPE, P.RESPONSE_TOPIC, P.CORRELATION_DATA}
    single = {k: pkt.prop(k) for k in keys}
    return single, pkt.prop_all(P.USER_PROPERTY)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_application_properties_forwarded_unchanged(clients, topic, qos):
    """Payload Format Indicator, Content Type, Response Topic, Correlation Data and every User
    Property reach every subscriber unchanged, User Properties in their original order.
    [MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20]"""
    subs = [clients.connected(), clients.connected()]
    for s in subs:
        s.subscribe(topic, qos=2)
    clients.connected().publish_acked(topic, "d\u00e9j\u00e0".encode(), qos=qos, props=FORWARDED)
    expected_single = {k: v for k, v in FORWARDED if k != P.USER_PROPERTY}
    expected_users = [v for k, v in FORWARDED if k == P.USER_PROPERTY]
    for s in subs:
        pkt = s.expect_publish(topic, "d\u00e9j\u00e0".encode())
        single, users = _forwarded(pkt)
        assert single == expected_single, pkt
        assert users == expected_users, pkt
        s.acknowledge(pkt)


def test_response_topic_with_wildcard(clients, topic):
    """A Response Topic is a Topic Name: it may not contain wildcards (Protocol Error).
    [MQTT-3.3.2-14] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.RESPONSE_TOPIC, f"{topic}/#")])
    c.expect_disconnect({0x81, 0x82})


def test_response_topic_ill_formed_utf8(clients, topic):
    """The Response Topic is a UTF-8 Encoded String: ill-formed UTF-8 is malformed.
    [MQTT-3.3.2-13] [MQTT-1.5.4-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.RESPONSE_TOPIC, b"reply/\xff")])
    c.expect_disconnect({0x81})


def test_content_type_ill_formed_utf8(clients, topic):
    """The Content Type is a UTF-8 Encoded String: ill-formed UTF-8 is malformed.
    [MQTT-3.3.2-19] [MQTT-1.5.4-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.CONTENT_TYPE, b"text/\xed\xa0\x80")])
    c.expect_disconnect({0x81})


# -- message expiry ----------------------------------------------------------------------------


def test_message_expiry(clients, uid, topic, retained):
    """A queued message whose expiry passes before delivery starts is not delivered; one still
    valid carries its Message Expiry Interval reduced by the time it waited. An expired retained
    message is not sent to new subscribers. [MQTT-3.3.2-5] [MQTT-3.3.2-6]"""
    retained(topic + "/r")
    c = clients.new()
    c.connect(uid, props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    c.subscribe(topic, qos=1)
    c.disconnect()
    pub = clients.connected()
    sent = time.monotonic()
    pub.publish_acked(topic, b"expires", qos=1, props=[(P.MESSAGE_EXPIRY_INTERVAL, 1)])
    pub.publish_acked(topic, b"lasts", qos=1, props=[(P.MESSAGE_EXPIRY_INTERVAL, 60)])
    pub.publish_acked(
        topic + "/r",
        b"retained-expires",
        qos=1,
        retain=True,
        props=[(P.MESSAGE_EXPIRY_INTERVAL, 1)],
    )
    time.sleep(2.2)
    c2 = clients.new()
    c2.connect(uid, clean_start=False, props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    got = c2.drain()
    waited = time.monotonic() - sent
    assert [p.payload for p in got] == [b"lasts"], got
    remaining = got[0].prop(P.MESSAGE_EXPIRY_INTERVAL)
    assert remaining is not None, "Message Expiry Interval not forwarded"
    assert 60 - waited - 1.5 <= remaining <= 59, f"expiry {remaining} after {waited:.1f}s"
    c2.acknowledge(got[0])
    late = clients.connected()
    late.subscribe(topic + "/r", qos=1)
    assert late.drain() == [], "expired retained message delivered"


def test_message_expiry_forwarded_live(clients, topic):
    """A message delivered at once carries a Message Expiry Interval no larger than the one it
    was published with. [MQTT-3.3.2-6]"""
    s = clients.connected()
    s.subscribe(topic, qos=1)
    clients.connected().publish_acked(topic, b"x", qos=1, props=[(P.MESSAGE_EXPIRY_INTERVAL, 30)])
    pkt = s.expect_publish(topic, b"x")
    assert pkt.prop(P.MESSAGE_EXPIRY_INTERVAL) in (29, 30), pkt
    s.acknowledge(pkt)


# -- topic aliases from the client -------------------------------------------------------------


def _alias_max(c) -> int:
    assert c.connack is not None
    return int(c.connack.prop(P.TOPIC_ALIAS_MAXIMUM, 0))


def test_topic_alias_accepted_up_to_maximum(clients, topic):
    """The broker accepts every Topic Alias from 1 to the Topic Alias Maximum it announced: a
    PUBLISH with topic and alias sets the mapping, an empty topic with the alias uses it.
    Subscribers get the full topic name. [MQTT-3.3.2-12] [MQTT-3.2.2-17]"""
    s = clients.connected()
    s.subscribe(f"{topic}/#")
    c = clients.connected()
    maximum = _alias_max(c)
    if not maximum:
        pytest.skip("the broker announces no Topic Alias Maximum")
    for alias in sorted({1, maximum}):
        name = f"{topic}/alias{alias}"
        c.publish_acked(name, b"set", qos=1, props=[(P.TOPIC_ALIAS, alias)])
        c.publish_acked("", b"use", qos=1, props=[(P.TOPIC_ALIAS, alias)])
        assert [p.topic for p in s.drain()] == [name, name]
    # An alias can be remapped to another topic.
    c.publish_acked(f"{topic}/remapped", b"set", qos=1, props=[(P.TOPIC_ALIAS, 1)])
    c.publish_acked("", b"use", qos=1, props=[(P.TOPIC_ALIAS, 1)])
    assert [p.topic for p in s.drain()] == [f"{topic}/remapped"] * 2


def test_topic_alias_zero(clients, topic):
    """Topic Alias 0 is not allowed: the connection is closed (DISCONNECT 0x94 Topic Alias
    invalid, or 0x81/0x82: the spec defines 0x94 for aliases above the maximum only).
    [MQTT-3.3.2-8] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.TOPIC_ALIAS, 0)])
    c.expect_disconnect({0x81, 0x82, 0x94})


def test_topic_alias_above_maximum(clients, topic):
    """A Topic Alias above the announced Topic Alias Maximum is answered with DISCONNECT 0x94.
    [MQTT-3.3.2-9] [MQTT-3.2.2-17] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic, b"x", props=[(P.TOPIC_ALIAS, _alias_max(c) + 1)])
    c.expect_disconnect({0x94})


def test_topic_alias_when_maximum_is_zero(limited_clients, topic):
    """A broker announcing no Topic Alias Maximum (or 0) accepts no Topic Alias: DISCONNECT 0x94.
    [MQTT-3.2.2-18] [MQTT-4.13.1-1]"""
    c = limited_clients.connected()
    assert _alias_max(c) == 0, c.connack
    c.publish(topic, b"x", props=[(P.TOPIC_ALIAS, 1)])
    c.expect_disconnect({0x94})


def test_topic_alias_mapping_is_per_connection(clients, uid, topic):
    """Topic Alias mappings end with their connection: after reconnecting (same session) an
    alias set before is unknown, and using it is a Protocol Error. [MQTT-3.3.2-7]"""
    c = clients.new()
    c.connect(uid, props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    if not _alias_max(c):
        pytest.skip("the broker announces no Topic Alias Maximum")
    c.publish_acked(topic, b"set", qos=1, props=[(P.TOPIC_ALIAS, 1)])
    c.disconnect()
    c2 = clients.new()
    assert c2.connect(uid, clean_start=False).session_present
    c2.publish("", b"use", props=[(P.TOPIC_ALIAS, 1)])
    c2.expect_disconnect({0x82, 0x94})


# -- topic aliases to the client ---------------------------------------------------------------


def _resolve(pkts, aliases):
    """Topic names of PUBLISH packets, resolving Topic Aliases as a client would."""
    names = []
    for p in pkts:
        alias = p.prop(P.TOPIC_ALIAS)
        if alias is not None:
            if p.topic:
                aliases[alias] = p.topic
            else:
                assert alias in aliases, f"alias {alias} used before being set: {p!r}"
        names.append(p.topic or aliases[alias])
    return names


def test_no_topic_alias_to_client_without_maximum(clients, topic):
    """A client that sent no Topic Alias Maximum never gets a Topic Alias. [MQTT-3.1.2-27]"""
    s = clients.connected()
    s.subscribe(topic, qos=1)
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    for p in s.drain():
        assert not p.has(P.TOPIC_ALIAS) and p.topic == topic, p
        s.acknowledge(p)


def test_no_topic_alias_to_client_with_maximum_zero(clients, topic):
    """A client with Topic Alias Maximum 0 never gets a Topic Alias. [MQTT-3.1.2-27]"""
    s = clients.connected(props=[(P.TOPIC_ALIAS_MAXIMUM, 0)])
    s.subscribe(topic)
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    assert all(not p.has(P.TOPIC_ALIAS) for p in s.drain())


def test_topic_aliases_to_client_within_its_maximum(clients, topic):
    """Topic Aliases the broker sends stay within the client's Topic Alias Maximum, and resolve
    to the right topics. [MQTT-3.1.2-26] [MQTT-3.3.2-11]"""
    s = clients.connected(props=[(P.TOPIC_ALIAS_MAXIMUM, 2)])
    s.subscribe(f"{topic}/#")
    pub = clients.connected()
    names = [f"{topic}/{n}" for n in "abcab" * 3]
    for name in names:
        pub.publish_acked(name, name.encode(), qos=1)
    got = s.drain()
    for p in got:
        alias = p.prop(P.TOPIC_ALIAS)
        assert alias is None or 1 <= alias <= 2, p
    assert _resolve(got, {}) == names
    assert [p.payload for p in got] == [n.encode() for n in names]


@pytest.mark.feature
def test_feature_outbound_topic_aliases_used(clients, topic):
    """Feature (issue 4, a MAY in the spec): to a client that allows Topic Aliases, the broker
    sends repeated topics as an alias with an empty Topic Name."""
    s = clients.connected(props=[(P.TOPIC_ALIAS_MAXIMUM, 10)])
    s.subscribe(topic)
    pub = clients.connected()
    for i in range(3):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    got = s.drain()
    assert _resolve(got, {}) == [topic] * 3
    assert any(p.topic == "" for p in got), f"no alias used: {got!r}"


# -- subscription identifiers ------------------------------------------------------------------


def test_subscription_identifier_forwarded(clients, topic, retained):
    """A message matching a subscription made with a Subscription Identifier carries it, live
    and retained; a subscription without one adds none. [MQTT-3.3.4-3]"""
    retained(topic)
    clients.connected().publish_acked(topic, b"retained", qos=1, retain=True)
    s = clients.connected()
    s.subscribe(topic, qos=1, props=[(P.SUBSCRIPTION_IDENTIFIER, 268435455)])
    pkt = s.expect_publish(topic, b"retained")
    assert pkt.prop_all(P.SUBSCRIPTION_IDENTIFIER) == [268435455], pkt
    s.acknowledge(pkt)
    plain = clients.connected()
    plain.subscribe((topic, 0x21))  # QoS 1, Retain Handling 2
    clients.connected().publish_acked(topic, b"live", qos=1)
    pkt = s.expect_publish(topic, b"live")
    assert pkt.prop_all(P.SUBSCRIPTION_IDENTIFIER) == [268435455], pkt
    s.acknowledge(pkt)
    other = plain.expect_publish(topic, b"live")
    assert not other.has(P.SUBSCRIPTION_IDENTIFIER), other
    plain.acknowledge(other)


def test_subscription_identifier_replaced_with_subscription(clients, topic):
    """Re-subscribing replaces the subscription, its Subscription Identifier included.
    [MQTT-3.8.4-3] [MQTT-3.3.4-3]"""
    s = clients.connected()
    s.subscribe(topic, props=[(P.SUBSCRIPTION_IDENTIFIER, 7)])
    s.subscribe(topic, props=[(P.SUBSCRIPTION_IDENTIFIER, 8)])
    pub = clients.connected()
    pub.publish_acked(topic, b"a", qos=1)
    assert [p.prop_all(P.SUBSCRIPTION_IDENTIFIER) for p in s.drain()] == [[8]]
    s.subscribe(topic)
    pub.publish_acked(topic, b"b", qos=1)
    assert [p.prop_all(P.SUBSCRIPTION_IDENTIFIER) for p in s.drain()] == [[]]


def _overlap(clients, topic):
    s = clients.connected()
    s.subscribe(f"{topic}/+", props=[(P.SUBSCRIPTION_IDENTIFIER, 1)])
    s.subscribe(f"{topic}/#", props=[(P.SUBSCRIPTION_IDENTIFIER, 2)])
    s.subscribe(f"{topic}/x")  # no identifier
    clients.connected().publish_acked(f"{topic}/x", b"m", qos=1)
    return s.drain()


def test_overlapping_subscriptions_carry_their_identifiers(clients, topic):
    """Overlapping subscriptions: a broker may send one copy, which then carries every
    matching Subscription Identifier [MQTT-3.3.4-4], or one copy per subscription, each with its
    own identifier (none for a subscription without one; MQTT-3.3.4-5, listed in UNTESTED.md
    because only brokers that choose separate copies can be held to it). [MQTT-3.3.4-3]"""
    copies = _overlap(clients, topic)
    if len(copies) == 1:
        assert sorted(copies[0].prop_all(P.SUBSCRIPTION_IDENTIFIER)) == [1, 2], copies
    else:
        ids = sorted(tuple(p.prop_all(P.SUBSCRIPTION_IDENTIFIER)) for p in copies)
        assert ids == [(), (1,), (2,)], copies


def test_subscription_identifier_zero(clients, topic):
    """Subscription Identifier 0 in SUBSCRIBE is a Protocol Error. [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic, 0)], [(P.SUBSCRIPTION_IDENTIFIER, 0)]))
    c.expect_disconnect({0x81, 0x82})


# -- request/response and problem information --------------------------------------------------


def test_no_response_information_unless_requested(clients):
    """With Request Response Information 0 (or absent) CONNACK has no Response Information.
    [MQTT-3.1.2-28]"""
    c = clients.new()
    assert not c.connect(c.name, props=[(P.REQUEST_RESPONSE_INFORMATION, 0)]).has(
        P.RESPONSE_INFORMATION
    )
    d = clients.new()
    assert not d.connect(d.name).has(P.RESPONSE_INFORMATION)


@pytest.mark.feature
def test_feature_response_information_when_requested(clients):
    """Feature (issue 4, a MAY in the spec): Request Response Information 1 is answered with a
    Response Information in CONNACK."""
    c = clients.new()
    ack_pkt = c.connect(c.name, props=[(P.REQUEST_RESPONSE_INFORMATION, 1)])
    assert ack_pkt.prop(P.RESPONSE_INFORMATION), ack_pkt


def _problem_acks(c, topic):
    """Provoke acknowledgements a broker may explain: PUBACK 0x99 and PUBREC 0x99 (invalid UTF-8
    under Payload Format Indicator 1), PUBACK 0x10, PUBCOMP 0x92, UNSUBACK 0x11, and a SUBACK
    refusing a filter (if the broker refuses it with a SUBACK). Returns them by name."""
    bad = [(P.PAYLOAD_FORMAT_INDICATOR, 1)]
    seen = {}
    c.publish(topic, b"\xff", qos=1, packet_id=1, props=bad)
    seen["PUBACK 0x99"] = c.expect(PUBACK)
    c.publish(topic, b"\xff", qos=2, packet_id=2, props=bad)
    seen["PUBREC 0x99"] = c.expect(PUBREC)
    c.publish(topic + "/nobody", b"x", qos=1, packet_id=3)
    seen["PUBACK 0x10"] = c.expect(PUBACK)
    c.send(ack(PUBREL, 78))
    seen["PUBCOMP 0x92"] = c.expect(PUBCOMP)
    seen["UNSUBACK 0x11"] = c.unsubscribe(topic)
    c.send(subscribe(9, [(topic, 1), (f"{topic}/#/bad", 1)]))
    pkt = c.read()
    if pkt.type == SUBACK:
        seen["SUBACK 0x8F"] = pkt
    return seen


def _explains(pkt):
    return pkt.has(P.REASON_STRING) or pkt.has(P.USER_PROPERTY)


def test_request_problem_information_0(clients, topic, unchecked):
    """With Request Problem Information 0 the broker sends no Reason String or User Property
    except on PUBLISH, CONNACK and DISCONNECT: checked on the refused PUBACK and PUBREC (0x99),
    PUBACK 0x10, PUBCOMP 0x92, UNSUBACK 0x11 and a SUBACK refusing a filter, which a client
    asking for problem information gets explained (else nothing here can fail). [MQTT-3.1.2-29]"""
    asking = clients.connected()
    explained = {name for name, pkt in _problem_acks(asking, topic).items() if _explains(pkt)}
    if not explained:
        unchecked("MQTT-3.1.2-29")
    c = clients.new()
    c.connect(c.name, props=[(P.REQUEST_PROBLEM_INFORMATION, 0)])
    for name, pkt in _problem_acks(c, topic).items():
        assert not _explains(pkt), f"{name}: {pkt!r}"


# -- the client's Maximum Packet Size ----------------------------------------------------------


def test_oversized_message_not_sent_to_client(clients, topic):
    """The broker never sends a packet larger than the client's Maximum Packet Size: a message
    too big for it is not sent to it (other subscribers get it). [MQTT-3.1.2-24]"""
    limit = 256
    s = clients.connected(props=[(P.MAXIMUM_PACKET_SIZE, limit)])
    s.subscribe(topic, qos=1)
    big = clients.connected()
    big.subscribe(topic, qos=1)
    pub = clients.connected()
    pub.publish_acked(topic, b"B" * 400, qos=1)
    pub.publish_acked(topic, b"small", qos=1)
    pkt = s.expect(PUBLISH)
    assert len(pkt.raw) <= limit, f"{len(pkt.raw)}-byte packet to a client allowing {limit}"
    assert pkt.payload == b"small", pkt
    s.acknowledge(pkt)
    assert s.drain() == []
    for payload in (b"B" * 400, b"small"):
        big.acknowledge(big.expect_publish(topic, payload))


def test_oversized_message_counts_as_delivered(clients, topic):
    """A message dropped because it exceeds the client's Maximum Packet Size is treated as if
    delivered: it holds no place in the client's Receive Maximum (1 here), so the next message
    still arrives. [MQTT-3.1.2-25]"""
    s = clients.connected(props=[(P.MAXIMUM_PACKET_SIZE, 256), (P.RECEIVE_MAXIMUM, 1)])
    s.subscribe(topic, qos=1)
    pub = clients.connected()
    pub.publish_acked(topic, b"B" * 400, qos=1)
    pub.publish_acked(topic, b"small", qos=1)
    pkt = s.expect_publish(topic)
    assert pkt.payload == b"small", pkt
    s.acknowledge(pkt)


def _small_client(clients, limit=24, **kw):
    c = clients.new()
    c.send(connect(c.name, props=[(P.MAXIMUM_PACKET_SIZE, limit)], **kw))
    return c


def _assert_fits(pkt, limit=24):
    assert len(pkt.raw) <= limit, f"{len(pkt.raw)}-byte {pkt.name} to a client allowing {limit}"


def _room_needed(unchecked, pkt, reason_string, user_property):
    """What ``pkt``, sent to a client with room for it, shows there is to leave out: a statement
    on leaving out what the broker never sends cannot fail here."""
    if not pkt.has(P.REASON_STRING):
        unchecked(reason_string)
    if not pkt.has(P.USER_PROPERTY):
        unchecked(user_property)


def test_refusing_connack_fits_maximum_packet_size(clients, unchecked):
    """A CONNACK leaves out its Reason String and User Properties rather than exceed the
    client's Maximum Packet Size (here on a refusal, where brokers like to explain).
    [MQTT-3.2.2-19] [MQTT-3.2.2-20] [MQTT-3.1.2-24]"""
    method = (P.AUTHENTICATION_METHOD, "conformance-no-such-method")
    roomy = clients.new()
    roomy.send(connect(roomy.name, props=[method]))
    pkt = roomy.expect(CONNACK)
    _room_needed(unchecked, pkt, "MQTT-3.2.2-19", "MQTT-3.2.2-20")
    c = clients.new()
    c.send(connect(c.name, props=[(P.MAXIMUM_PACKET_SIZE, 24), method]))
    pkt = c.expect(CONNACK)
    assert pkt.reason_code in (0x8C, 0x87), pkt
    _assert_fits(pkt)
    c.expect_closed()


def test_error_acks_fit_maximum_packet_size(clients, topic, unchecked):
    """PUBACK, PUBREC, PUBREL, PUBCOMP and UNSUBACK leave out Reason String and User Properties
    rather than exceed the client's Maximum Packet Size. [MQTT-3.4.2-2] [MQTT-3.4.2-3]
    [MQTT-3.5.2-2] [MQTT-3.5.2-3] [MQTT-3.6.2-2] [MQTT-3.6.2-3] [MQTT-3.7.2-2] [MQTT-3.7.2-3]
    [MQTT-3.11.2-1] [MQTT-3.11.2-2]"""

    def provoke(c):
        bad = [(P.PAYLOAD_FORMAT_INDICATOR, 1)]
        c.publish("t", b"\xff", qos=1, packet_id=1, props=bad)  # maybe 0x99
        got = {PUBACK: c.expect(PUBACK)}
        c.publish("t", b"\xff", qos=2, packet_id=2, props=bad)  # maybe 0x99
        got[PUBREC] = c.expect(PUBREC)
        c.send(ack(PUBREL, 3))  # unknown: 0x92
        got[PUBCOMP] = c.expect(PUBCOMP)
        c.send(ack(PUBREC, 4))  # unknown: maybe PUBREL 0x92
        for pkt in c.ping():
            got[pkt.type] = pkt
        got[UNSUBACK] = c.unsubscribe(topic)  # nothing to remove: 0x11
        return got

    ids = {
        PUBACK: ("MQTT-3.4.2-2", "MQTT-3.4.2-3"),
        PUBREC: ("MQTT-3.5.2-2", "MQTT-3.5.2-3"),
        PUBREL: ("MQTT-3.6.2-2", "MQTT-3.6.2-3"),
        PUBCOMP: ("MQTT-3.7.2-2", "MQTT-3.7.2-3"),
        UNSUBACK: ("MQTT-3.11.2-1", "MQTT-3.11.2-2"),
    }
    roomy = provoke(clients.connected())
    for ptype, (rs, up) in ids.items():
        if ptype in roomy:
            _room_needed(unchecked, roomy[ptype], rs, up)
        else:
            unchecked(rs, up)
    c = _small_client(clients)
    _assert_fits(c.expect(CONNACK))
    for pkt in provoke(c).values():
        _assert_fits(pkt)


def test_suback_fits_maximum_packet_size(clients, topic, unchecked):
    """A SUBACK refusing a filter leaves out Reason String and User Properties rather than exceed
    the client's Maximum Packet Size. [MQTT-3.9.2-1] [MQTT-3.9.2-2]"""
    roomy = clients.connected()
    roomy.send(subscribe(5, [("a/#/b", 0)]))
    pkt = roomy.read()
    if pkt.type != SUBACK:
        pytest.skip(f"the broker answered an invalid filter with {pkt!r}")
    _room_needed(unchecked, pkt, "MQTT-3.9.2-1", "MQTT-3.9.2-2")
    c = _small_client(clients)
    c.expect(CONNACK)
    c.send(subscribe(5, [("a/#/b", 0)]))
    pkt = c.expect(SUBACK)
    _assert_fits(pkt)


def test_disconnect_fits_maximum_packet_size(clients, unchecked):
    """A DISCONNECT from the broker leaves out Reason String and User Properties rather than
    exceed the client's Maximum Packet Size. [MQTT-3.14.2-3] [MQTT-3.14.2-4]"""
    roomy = clients.connected()
    roomy.send(connect(roomy.name))  # Protocol Error
    pkt = roomy.expect_disconnect({0x82})
    if pkt is None:
        unchecked("MQTT-3.14.2-3", "MQTT-3.14.2-4")
    else:
        _room_needed(unchecked, pkt, "MQTT-3.14.2-3", "MQTT-3.14.2-4")
    c = _small_client(clients)
    c.expect(CONNACK)
    c.send(connect(c.name))  # Protocol Error
    pkt = c.expect_disconnect({0x82})
    if pkt is not None:
        _assert_fits(pkt)


def test_read_any_helper(clients, topic):
    """read_any returns the packet of whichever client receives one."""
    a, b = clients.connected(), clients.connected()
    b.subscribe(topic)
    clients.connected().publish_acked(topic, b"x", qos=1)
    who, pkt = read_any([a, b])
    assert who is b and pkt.payload == b"x"
