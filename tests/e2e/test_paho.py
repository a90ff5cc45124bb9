"""End to end with paho-mqtt clients (MQTT 5 and 3.1.1) against the broker subprocess."""

from __future__ import annotations

import time

import pytest
from support.clients import (
    DISCONNECT,
    MQTT_5,
    MQTT_311,
    PINGREQ,
    PINGRESP,
    TIMEOUT,
    PahoClient,
    RawClient,
    parse_disconnect_v5,
    publish_properties,
    unique,
)

VERSIONS = [pytest.param(MQTT_5, id="v5"), pytest.param(MQTT_311, id="v311")]
QOS = [pytest.param(q, id=f"qos{q}") for q in (0, 1, 2)]

PAYLOADS = [
    b"hello",
    b"",
    bytes(range(256)),
    "h\u00e9llo w\u00f6rld \u2603 \U0001f600".encode(),
    bytes((i * 7919) % 251 for i in range(100_000)),  # larger than any socket read
]


def summary(messages):
    return [(m.topic, m.payload, m.qos, m.retain) for m in messages]


# ---------------------------------------------------------------------------------------------
# Delivery


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_publish_subscribe_delivers_payload_intact(make_client, topic, version, qos):
    """[MQTT-4.5.0-1] A published message reaches the matching subscriber, with its payload byte
    for byte, at the QoS it was published and subscribed with, RETAIN and DUP clear."""
    sub = make_client(version)
    assert sub.subscribe(topic, qos) == [qos]
    pub = make_client(version)
    for payload in PAYLOADS:
        pub.publish(topic, payload, qos)
    got = sub.wait_messages(len(PAYLOADS))
    assert len(got) == len(PAYLOADS)
    for message, payload in zip(got, PAYLOADS, strict=True):
        assert message.topic == topic
        assert message.payload == payload
        assert message.qos == qos
        assert message.retain is False
        assert message.dup is False


@pytest.mark.parametrize(
    "pub_version, sub_version",
    [
        pytest.param(MQTT_5, MQTT_311, id="v5-to-v311"),
        pytest.param(MQTT_311, MQTT_5, id="v311-to-v5"),
    ],
)
def test_delivery_between_protocol_versions(make_client, topic, pub_version, sub_version):
    """[MQTT-4.5.0-1] A message published over one protocol version reaches a subscriber using
    the other one, at every QoS."""
    sub = make_client(sub_version)
    assert sub.subscribe(topic, 2) == [2]
    pub = make_client(pub_version)
    for qos in (0, 1, 2):
        pub.publish(topic, f"q{qos}".encode(), qos)
    got = sub.wait_messages(3)
    assert sorted(summary(got)) == [(topic, f"q{q}".encode(), q, False) for q in (0, 1, 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_delivered_qos_is_the_lower_of_publish_and_subscription(make_client, topic, version):
    """[MQTT-3.8.4-8] Each subscriber gets each message at min(publish QoS, granted QoS)."""
    subs = {}
    for sub_qos in (0, 1, 2):
        subs[sub_qos] = make_client(version)
        assert subs[sub_qos].subscribe(topic, sub_qos) == [sub_qos]
    pub = make_client(version)
    for pub_qos in (0, 1, 2):
        pub.publish(topic, f"published at {pub_qos}".encode(), pub_qos)
    for sub_qos, sub in subs.items():
        got = sub.wait_messages(3)
        assert sorted((m.payload, m.qos) for m in got) == [
            (f"published at {p}".encode(), min(p, sub_qos)) for p in (0, 1, 2)
        ], f"subscriber at QoS {sub_qos}"


# ---------------------------------------------------------------------------------------------
# Wildcards


# (filter, topics it matches, topics it does not match, the last topic published); "{t}" stands
# for the test's own topic.
WILDCARDS = {
    # [MQTT-4.7.1-2] '+' matches exactly one level, an empty one included, and nothing else.
    "single-level": (
        "{t}/+/temp",
        ["{t}/a/temp", "{t}/b/temp", "{t}//temp"],
        ["{t}/a/b/temp", "{t}/temp", "{t}/a/temp/x", "{t}/a/humid", "{t}"],
        "{t}/end/temp",
    ),
    # [MQTT-4.7.1-1] 'x/#' matches 'x' itself and every topic below it, and nothing else.
    "multi-level": (
        "{t}/x/#",
        ["{t}/x", "{t}/x/y", "{t}/x/y/z", "{t}/x/"],
        ["{t}/xy", "{t}/y/x", "{t}", "{t}/y"],
        "{t}/x/end",
    ),
}


@pytest.mark.parametrize("wildcard", WILDCARDS)
@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_wildcard_matches_what_the_spec_says(make_client, topic, version, qos, wildcard):
    """A subscriber to a wildcard filter gets every matching topic published, once each, at the
    QoS used, and none of the others."""
    pattern, matching_patterns, other_patterns, end_pattern = WILDCARDS[wildcard]
    topic_filter, end = pattern.format(t=topic), end_pattern.format(t=topic)
    matching = [name.format(t=topic) for name in matching_patterns]
    other = [name.format(t=topic) for name in other_patterns]
    sub = make_client(version)
    assert sub.subscribe(topic_filter, qos) == [qos]
    pub = make_client(version)
    for name in matching + other:
        pub.publish(name, name.encode(), qos)
    pub.publish(end, b"end", qos)
    got = sub.wait_payload(b"end")
    assert sorted(m.topic for m in got[:-1]) == sorted(matching)
    assert all(m.payload == m.topic.encode() and m.qos == qos for m in got[:-1])


@pytest.mark.parametrize("version", VERSIONS)
def test_leading_wildcards_do_not_match_dollar_topics(make_client, version):
    """[MQTT-4.7.2-1] Filters starting with '+' or '#' do not match topic names starting with '$'."""
    leaf = unique()
    sub = make_client(version)
    assert sub.subscribe(f"+/{leaf}", 1) == [1]
    assert sub.subscribe(f"+/+/{leaf}", 1) == [1]
    pub = make_client(version)
    pub.publish(f"$e2e/{leaf}", b"dollar", 1)
    pub.publish(f"$e2e/x/{leaf}", b"dollar deeper", 1)
    pub.publish(f"plain/{leaf}", b"plain", 1)
    pub.publish(f"plain/x/{leaf}", b"end", 1)
    got = sub.wait_payload(b"end")
    assert sorted(m.payload for m in got) == [b"end", b"plain"]


# ---------------------------------------------------------------------------------------------
# Retained messages


def wait_retained(client: PahoClient, pub: PahoClient, marker_topic: str):
    """The messages a fresh subscription delivered before a marker published after its SUBACK:
    i.e. the retained messages it got. The marker goes at QoS 2 because paho hands a QoS 2
    message to the application only at PUBREL, after any QoS 0/1 message sent before it."""
    marker = unique("marker").encode()
    pub.publish(marker_topic, marker, 2)
    got = client.wait_payload(marker)
    return got[:-1]


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_is_delivered_to_new_subscriber(make_client, topic, version, qos):
    """[MQTT-3.3.1-5] [MQTT-3.3.1-9] A retained message is stored and sent, with RETAIN set, to
    a later subscriber, at min(publish QoS, granted QoS)."""
    pub = make_client(version)
    pub.publish(f"{topic}/r", b"retained one", qos, retain=True)
    for sub_qos in (0, 2):
        sub = make_client(version)
        assert sub.subscribe(f"{topic}/#", sub_qos) == [sub_qos]
        got = wait_retained(sub, pub, f"{topic}/marker")
        assert summary(got) == [(f"{topic}/r", b"retained one", min(qos, sub_qos), True)]


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_is_replaced(make_client, topic, version, qos):
    """[MQTT-3.3.1-5] A new retained message on a topic replaces the one stored before."""
    pub = make_client(version)
    pub.publish(f"{topic}/r", b"first", qos, retain=True)
    pub.publish(f"{topic}/r", b"second", qos, retain=True)
    sub = make_client(version)
    assert sub.subscribe(f"{topic}/r", 2) == [2]
    got = wait_retained(sub, pub, f"{topic}/r")
    assert summary(got) == [(f"{topic}/r", b"second", qos, True)]


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_retained_publish_reaches_live_subscriber_without_retain_flag(
    make_client, topic, version, qos
):
    """[MQTT-3.3.1-12] A retained PUBLISH forwarded to an existing subscription (Retain As
    Published 0) has RETAIN cleared."""
    sub = make_client(version)
    assert sub.subscribe(f"{topic}/r", qos) == [qos]
    pub = make_client(version)
    pub.publish(f"{topic}/r", b"live", qos, retain=True)
    got = sub.wait_messages(1)
    assert summary(got) == [(f"{topic}/r", b"live", qos, False)]


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", VERSIONS)
def test_empty_retained_payload_clears_the_retained_message(make_client, topic, version, qos):
    """[MQTT-3.3.1-6] [MQTT-3.3.1-7] A retained PUBLISH with an empty payload is delivered
    normally and removes the stored message; it is not stored itself."""
    pub = make_client(version)
    pub.publish(f"{topic}/r", b"to be cleared", qos, retain=True)
    live = make_client(version)
    assert live.subscribe(f"{topic}/r", qos) == [qos]
    assert summary(wait_retained(live, pub, f"{topic}/r")) == [
        (f"{topic}/r", b"to be cleared", qos, True)
    ]
    pub.publish(f"{topic}/r", b"", qos, retain=True)
    got = live.wait_messages(3)  # retained copy, marker, then the empty message
    assert summary(got[2:]) == [(f"{topic}/r", b"", qos, False)]
    later = make_client(version)
    assert later.subscribe(f"{topic}/#", 2) == [2]
    assert wait_retained(later, pub, f"{topic}/marker") == []


@pytest.mark.parametrize("version", VERSIONS)
def test_non_retained_publish_leaves_retained_message_alone(make_client, topic, version):
    """[MQTT-3.3.1-8] A PUBLISH with RETAIN 0 neither replaces nor removes the retained message."""
    pub = make_client(version)
    pub.publish(f"{topic}/r", b"kept", 1, retain=True)
    pub.publish(f"{topic}/r", b"passing by", 1)
    pub.publish(f"{topic}/r", b"", 1)
    sub = make_client(version)
    assert sub.subscribe(f"{topic}/#", 1) == [1]
    got = wait_retained(sub, pub, f"{topic}/marker")
    assert summary(got) == [(f"{topic}/r", b"kept", 1, True)]


@pytest.mark.parametrize("version", VERSIONS)
def test_wildcard_subscription_gets_every_matching_retained_message(make_client, topic, version):
    """[MQTT-3.3.1-9] A wildcard subscription gets the retained messages of every matching topic,
    and only those."""
    pub = make_client(version)
    names = [f"{topic}/a", f"{topic}/b/c", f"{topic}/b/d/e"]
    for name in names:
        pub.publish(name, name.encode(), 1, retain=True)
    pub.publish(f"{topic}/other/z", b"elsewhere", 1, retain=True)
    sub = make_client(version)
    assert sub.subscribe(f"{topic}/+", 1) == [1]
    assert sub.subscribe(f"{topic}/b/#", 1) == [1]
    got = wait_retained(sub, pub, f"{topic}/marker")
    assert sorted(summary(got)) == sorted((n, n.encode(), 1, True) for n in names)
    for name in names + [f"{topic}/other/z"]:
        pub.publish(name, b"", 1, retain=True)  # tidy up the shared broker


# ---------------------------------------------------------------------------------------------
# Overlapping subscriptions


@pytest.mark.parametrize("version", VERSIONS)
def test_overlapping_subscriptions_deliver_one_copy_at_highest_qos(make_client, topic, version):
    """[MQTT-3.3.4-2] [MQTT-3.3.4-3] [MQTT-3.3.4-4] A message matching two subscriptions of one
    client arrives once, at the highest QoS granted, carrying (MQTT 5) both Subscription
    Identifiers."""
    sub = make_client(version)
    v5 = version == MQTT_5
    assert sub.subscribe(f"{topic}/a/+", 1, subscription_id=11 if v5 else None) == [1]
    assert sub.subscribe(f"{topic}/#", 2, subscription_id=22 if v5 else None) == [2]
    pub = make_client(version)
    pub.publish(f"{topic}/a/b", b"overlap at 2", 2)
    pub.publish(f"{topic}/a/b", b"overlap at 1", 1)
    pub.publish(f"{topic}/a/b", b"overlap at 0", 0)
    pub.publish(f"{topic}/c", b"only #", 2)
    pub.publish(f"{topic}/a/b", b"end", 2)
    got = sub.wait_payload(b"end")  # QoS 2, so everything published before it is in
    assert sorted((m.payload, m.qos) for m in got) == [
        (b"end", 2),
        (b"only #", 2),
        (b"overlap at 0", 0),
        (b"overlap at 1", 1),
        (b"overlap at 2", 2),
    ]
    if v5:
        for message in got:
            expected = [22] if message.payload == b"only #" else [11, 22]
            assert sorted(message.prop("SubscriptionIdentifier", [])) == expected, message


@pytest.mark.parametrize("version", VERSIONS)
def test_resubscribing_replaces_the_subscription(make_client, topic, version):
    """[MQTT-3.8.4-3] Subscribing again to the same filter replaces the subscription (new QoS),
    and messages are not delivered twice."""
    sub = make_client(version)
    assert sub.subscribe(topic, 0) == [0]
    assert sub.subscribe(topic, 2) == [2]
    pub = make_client(version)
    pub.publish(topic, b"once", 2)
    pub.publish(topic, b"end", 2)
    got = sub.wait_payload(b"end")
    assert [(m.payload, m.qos) for m in got] == [(b"once", 2), (b"end", 2)]


# ---------------------------------------------------------------------------------------------
# Session takeover


@pytest.mark.parametrize("version", VERSIONS)
def test_session_takeover_disconnects_the_first_connection(make_client, topic, version):
    """[MQTT-3.1.4-3] A second connection with the same Client Identifier takes the session over:
    the first is disconnected (MQTT 5: DISCONNECT 0x8E Session taken over), the second keeps the
    session's subscriptions and works."""
    client_id = unique("takeover")
    first = make_client(version, client_id=client_id, clean=False, expiry=60)
    assert first.subscribe(topic, 1) == [1]
    second = make_client(version, client_id=client_id, clean=False, expiry=60)
    assert second.session_present
    gone = first.wait_disconnected()
    if version == MQTT_5:
        assert gone.from_server, gone
        assert gone.reason_code == 0x8E, f"DISCONNECT reason 0x{gone.reason_code:02X}"
    pub = make_client(version)
    pub.publish(topic, b"to the new connection", 1)
    got = second.wait_messages(1)
    assert summary(got) == [(topic, b"to the new connection", 1, False)]
    assert second.disconnects == []
    assert first.received() == []
    # Clean up: end the session (clean start, then a normal disconnect).
    last = make_client(version, client_id=client_id, clean=True)
    last.disconnect()


# ---------------------------------------------------------------------------------------------
# Keep alive


@pytest.mark.parametrize("version", VERSIONS)
def test_silent_client_is_disconnected_after_keep_alive(fresh_broker, version):
    """[MQTT-3.1.2-22] A client that stays silent for 1.5 x its Keep Alive (1 s) is disconnected:
    in MQTT 5 with DISCONNECT 0x8D (Keep Alive timeout) first, in 3.1.1 by closing alone."""
    with RawClient(fresh_broker.host, fresh_broker.port) as raw:
        raw.connect(unique("silent"), version, keep_alive=1)
        start = time.monotonic()
        data = raw.read_until_closed(timeout=4.5)  # the spec asks for 1.5 s
        elapsed = time.monotonic() - start
    assert elapsed >= 1.0, f"closed after {elapsed:.2f}s, before the Keep Alive itself ran out"
    if version == MQTT_5:
        code, props = parse_disconnect_v5(data)
        assert code == 0x8D, f"DISCONNECT {data.hex(' ')}"
    else:
        assert data == b"", f"3.1.1 has no server DISCONNECT; got {data.hex(' ')}"
    assert "Traceback" not in fresh_broker.log_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_pinging_client_stays_connected(broker, version):
    """[MQTT-3.12.4-1] [MQTT-3.1.2-22] A client with Keep Alive 1 s that sends PINGREQ every
    0.4 s gets a PINGRESP each time and stays connected well past 1.5 x its Keep Alive."""
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique("pinger"), version, keep_alive=1)
        for _ in range(6):
            time.sleep(0.4)  # pacing the client, not waiting for the broker
            raw.send(PINGREQ)
            assert raw.read_packet() == PINGRESP
        raw.send(DISCONNECT)
        assert raw.read_until_closed() == b""


# ---------------------------------------------------------------------------------------------
# Volume and order


@pytest.mark.parametrize(
    "version, qos, count",
    [
        pytest.param(MQTT_5, 1, 2000, id="v5-qos1"),
        pytest.param(MQTT_311, 1, 2000, id="v311-qos1"),
        pytest.param(MQTT_5, 2, 1000, id="v5-qos2"),
        pytest.param(MQTT_311, 0, 2000, id="v311-qos0"),
    ],
)
def test_many_messages_arrive_in_order(make_client, topic, version, qos, count):
    """[MQTT-4.6.0-5] [MQTT-4.6.0-6] Many messages from one publisher on one topic all arrive, in
    the order they were published, none lost or duplicated."""
    sub = make_client(version)
    assert sub.subscribe(topic, qos) == [qos]
    pub = make_client(version)
    infos = [pub.publish(topic, str(i).encode(), qos, wait=False) for i in range(count)]
    pub.wait_published(infos[-1], timeout=30)
    got = sub.wait_messages(count, timeout=30)
    assert [m.payload for m in got] == [str(i).encode() for i in range(count)]
    assert {m.qos for m in got} == {qos}
    assert not any(m.dup for m in got)
    assert all(info.is_published() for info in infos)


# ---------------------------------------------------------------------------------------------
# MQTT 5 properties


@pytest.mark.parametrize("qos", QOS)
def test_publish_properties_are_forwarded_unchanged(make_client, topic, qos):
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20] Payload Format Indicator, Response Topic, Correlation Data, User Properties
    (order and repeats kept) and Content Type reach the subscriber unchanged."""
    sub = make_client(MQTT_5)
    assert sub.subscribe(topic, qos) == [qos]
    pub = make_client(MQTT_5)
    user = [("k", "1"), ("z", "\u00e9t\u00e9"), ("k", "2"), ("", ""), ("a", "last")]
    props = publish_properties(
        PayloadFormatIndicator=1,
        ContentType="application/json; charset=utf-8",
        ResponseTopic=f"{topic}/reply/\u00fc",
        CorrelationData=b"\x00\x01\xfe\xffcorrelation",
        UserProperty=user,
    )
    pub.publish(topic, b'{"x": 1}', qos, properties=props)
    (message,) = sub.wait_messages(1)
    assert message.payload == b'{"x": 1}'
    assert message.prop("PayloadFormatIndicator") == 1
    assert message.prop("ContentType") == "application/json; charset=utf-8"
    assert message.prop("ResponseTopic") == f"{topic}/reply/\u00fc"
    assert message.prop("CorrelationData") == b"\x00\x01\xfe\xffcorrelation"
    assert message.prop("UserProperty") == user
    assert message.prop("MessageExpiryInterval") is None
    assert message.prop("TopicAlias") is None


def test_message_expiry_interval_is_forwarded_and_not_increased(make_client, topic):
    """[MQTT-3.3.2-6] The Message Expiry Interval reaches the subscriber reduced by the time the
    message waited, never larger than sent. The intervals are 2^k - 1: the broker's clock plus
    such an interval crosses a power of two, where a floating-point deadline loses precision, so
    computing "deadline - now" and rounding up can give one second more than was sent."""
    sub = make_client(MQTT_5)
    assert sub.subscribe(topic, 1) == [1]
    pub = make_client(MQTT_5)
    intervals = [2**k - 1 for k in range(12, 32)] * 2  # each goes wrong about 1 time in 4
    for interval in intervals:
        props = publish_properties(MessageExpiryInterval=interval)
        pub.publish(topic, str(interval).encode(), 1, properties=props)
    got = sub.wait_messages(len(intervals))
    forwarded = [(int(m.payload), m.prop("MessageExpiryInterval")) for m in got]
    wrong = [
        (sent, back) for sent, back in forwarded if back is None or not sent - 30 <= back <= sent
    ]
    assert not wrong, f"(sent interval, forwarded interval): {wrong}"


def test_maximum_message_expiry_interval_is_forwarded(broker, make_client, topic):
    """[MQTT-3.3.2-6] [MQTT-4.5.0-1] A PUBLISH with the largest Message Expiry Interval
    (4294967295 s) is accepted and delivered, with an interval that still fits its four bytes;
    the publisher is not disconnected. Many messages, as rounding goes up only about 1 time in
    4 (see the test above)."""
    mark = broker.log_mark()
    sub = make_client(MQTT_5)
    assert sub.subscribe(topic, 1) == [1]
    pub = make_client(MQTT_5)
    count = 32
    for i in range(count):
        props = publish_properties(MessageExpiryInterval=0xFFFFFFFF)
        pub.publish(topic, f"long-lived {i}".encode(), 1, properties=props)
    got = sub.wait_messages(count)
    assert [m.payload for m in got] == [f"long-lived {i}".encode() for i in range(count)]
    assert all(0xFFFFFFFF - 30 <= m.prop("MessageExpiryInterval", -1) <= 0xFFFFFFFF for m in got)
    assert pub.disconnects == []
    assert "Traceback" not in broker.log_since(mark), broker.log_since(mark)


def test_properties_do_not_reach_a_311_subscriber_but_the_message_does(make_client, topic):
    """[MQTT-4.5.0-1] An MQTT 5 message with properties reaches a 3.1.1 subscriber intact."""
    sub = make_client(MQTT_311)
    assert sub.subscribe(topic, 1) == [1]
    pub = make_client(MQTT_5)
    props = publish_properties(ContentType="text/plain", UserProperty=[("a", "b")])
    pub.publish(topic, b"plain old message", 1, properties=props)
    got = sub.wait_messages(1, timeout=TIMEOUT)
    assert summary(got) == [(topic, b"plain old message", 1, False)]
