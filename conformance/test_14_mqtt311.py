"""MQTT 3.1.1 (protocol level 4): the statements of spec/mqtt311-normative.tsv, tagged
``[MQTT311-x.y.z-n]`` (the same numbers mean other rules in MQTT 5.0). Every client here speaks
3.1.1."""

from __future__ import annotations

import time

import pytest

from .mqtt import (
    CONNACK,
    MQTT_311,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    ConnectionClosed,
    ack,
    connect,
    packet,
    publish,
    string,
    subscribe,
    u16,
    unsubscribe,
)

V = MQTT_311


@pytest.fixture
def c311(clients):
    def make(client_id=None, **kw):
        return clients.connected(client_id, version=V, **kw)

    return make


def _refused_without_connack(clients, data):
    c = clients.new(version=V)
    c.send(data)
    assert c.is_closed(), f"{c!r}: still open"


def test_connect_connack(clients):
    """CONNECT first, CONNACK first back: accepted with return code 0 and Session Present 0 for
    a clean session, exact bytes; a ClientId of letters and digits. [MQTT311-3.1.0-1]
    [MQTT311-3.2.0-1] [MQTT311-3.2.2-1] [MQTT311-3.1.4-4] [MQTT311-3.1.4-3] [MQTT311-3.1.3-3]
    [MQTT311-3.1.3-4] [MQTT311-3.1.3-5] [MQTT311-7.1.1-1]"""
    c = clients.new(version=V)
    c.send(connect("Abc123xyz", version=V))
    assert c.read_raw() == b"\x20\x02\x00\x00"


def test_second_connect_closes(c311):
    """[MQTT311-3.1.0-2] [MQTT311-4.8.0-1]"""
    c = c311()
    c.send(connect(c.name, version=V))
    assert c.is_closed()


def test_unsupported_protocol_level(clients):
    """Protocol level 3 under the name "MQTT" (3.1 was "MQIsdp"): CONNACK 0x01 (Session Present
    0), then closed. [MQTT311-3.1.2-2] [MQTT311-3.2.2-4] [MQTT311-3.2.2-5]"""
    c = clients.new(version=V)
    c.send(connect(c.name, version=3))
    c.expect_refused({0x01}, required=True)


def test_wrong_protocol_name(clients):
    """Another protocol name: the broker may close, or answer under another specification (an
    MQTT 5 CONNACK 0x84), but does not go on under this one: the connection closes.
    [MQTT311-3.1.2-1]"""
    c = clients.new(version=V)
    c.send(connect(c.name, version=V, protocol_name="MQTX"))
    with pytest.raises(ConnectionClosed):
        for _ in range(3):
            c.read_raw()


@pytest.mark.parametrize(
    "flags",
    [
        0x03,  # reserved bit set
        0x02 | 0x04 | 0x18,  # will QoS 3
        0x02 | 0x08,  # will QoS 1 without a will
        0x02 | 0x20,  # will retain without a will
    ],
    ids=["reserved", "will-qos-3", "qos-without-will", "retain-without-will"],
)
def test_invalid_connect_flags_close_without_connack(clients, flags):
    """A CONNECT that does not conform: closed, no CONNACK (no return code fits).
    [MQTT311-3.1.2-3] [MQTT311-3.1.4-1] [MQTT311-3.2.2-6] [MQTT311-3.1.2-11] [MQTT311-3.1.2-13]
    [MQTT311-3.1.2-14] [MQTT311-3.1.2-15]"""
    body = string("MQTT") + bytes([V, flags]) + u16(60) + string("cf-flags")
    if flags & 0x04:
        body += string("w/t") + string("x")
    _refused_without_connack(clients, packet(0x10, body))


def test_password_without_user_name_refused(clients):
    """[MQTT311-3.1.2-22] [MQTT311-3.1.2-18] [MQTT311-3.1.2-20]"""
    c = clients.new(version=V)
    c.send(connect(c.name, version=V, flags=0x42) + u16(1) + b"p")
    c.expect_refused()


def test_user_name_and_password(clients, pytestconfig):
    """User Name and Password flags with both fields, in order after the ClientId: accepted.
    [MQTT311-3.1.2-19] [MQTT311-3.1.2-21] [MQTT311-3.1.3-11] [MQTT311-3.1.3-1]"""
    c = clients.new(version=V)
    user = pytestconfig.getoption("--auth-user")
    password = pytestconfig.getoption("--auth-password").encode()
    c.connect(c.name, version=V, username=user, password=password)


def _will_client(clients, topic, retain=False):
    c = clients.new(version=V)
    c.connect(c.name, version=V, will_topic=topic, will_payload=b"gone", will_retain=retain)
    return c


def test_will_published_not_retained(clients, topic):
    """A network failure publishes the will, RETAIN 0. [MQTT311-3.1.2-8] [MQTT311-3.1.2-9]
    [MQTT311-3.1.2-16] [MQTT311-3.1.3-10]"""
    s = clients.connected(version=V)
    s.subscribe(topic)
    _will_client(clients, topic).close()
    pkt = s.expect_publish(topic, b"gone")
    assert not pkt.retain


def test_will_published_retained(clients, topic, retained):
    """[MQTT311-3.1.2-17]"""
    retained(topic)
    _will_client(clients, topic, retain=True).close()
    s = clients.connected(version=V)
    s.subscribe(topic)
    pkt = s.expect_publish(topic, b"gone")
    assert pkt.retain


def test_will_deleted_by_disconnect(clients, topic):
    """[MQTT311-3.1.2-10] [MQTT311-3.14.4-3] [MQTT311-3.1.2-12]"""
    s = clients.connected(version=V)
    s.subscribe(topic)
    _will_client(clients, topic).disconnect()
    clients.connected(version=V).close()  # no will at all
    assert s.drain() == []


def test_disconnect_with_reserved_flags_is_an_error(clients, topic):
    """A DISCONNECT with flags 0001 is not a normal disconnection: the will is published.
    [MQTT311-3.14.1-1] [MQTT311-2.2.2-1] [MQTT311-2.2.2-2]"""
    s = clients.connected(version=V)
    s.subscribe(topic)
    c = _will_client(clients, topic)
    c.send(b"\xe1\x00")
    assert c.is_closed()
    s.expect_publish(topic, b"gone")


def test_persistent_session(clients, topic):
    """CleanSession 0: the session (subscription, QoS 1 messages queued while away) is kept and
    Session Present says so; CleanSession 1 then discards it. [MQTT311-3.1.2-4]
    [MQTT311-3.1.2-5] [MQTT311-3.2.2-2] [MQTT311-3.2.2-3] [MQTT311-3.1.3-2] [MQTT311-4.1.0-1]
    [MQTT311-4.5.0-1] [MQTT311-3.1.2-6] [MQTT311-4.1.0-2]"""
    cid = clients.uid + "-p"
    s = clients.new(version=V)
    assert not s.connect(cid, version=V, clean_start=False).session_present
    s.subscribe(topic, qos=1)
    s.disconnect()
    clients.connected(version=V).publish_acked(topic, b"while-away", qos=1)
    again = clients.new(version=V)
    assert again.connect(cid, version=V, clean_start=False).session_present
    again.acknowledge(again.expect_publish(topic, b"while-away"))
    again.disconnect()
    clean = clients.new(version=V)
    assert not clean.connect(cid, version=V, clean_start=True).session_present
    clean.disconnect()
    last = clients.new(version=V)
    assert not last.connect(cid, version=V, clean_start=False).session_present
    clients.connected(version=V).publish_acked(topic, b"later", qos=1)
    assert last.drain() == []  # the subscription went with the clean session


def test_empty_client_id(clients):
    """Empty ClientId with CleanSession 1: accepted (a unique id assigned); with CleanSession 0:
    CONNACK 0x02, closed. [MQTT311-3.1.3-6] [MQTT311-3.1.3-7] [MQTT311-3.1.3-8]
    [MQTT311-3.1.3-9]"""
    c = clients.new(version=V)
    c.connect("", version=V)
    assert c.ping() == []
    d = clients.new(version=V)
    d.send(connect("", version=V, clean_start=False))
    d.expect_refused({0x02}, required=True)


def test_take_over_closes_the_older_connection(clients):
    """[MQTT311-3.1.4-2]"""
    first = clients.new(version=V)
    first.connect(clients.uid + "-t", version=V)
    second = clients.new(version=V)
    second.connect(clients.uid + "-t", version=V)
    assert first.is_closed()
    assert second.ping() == []


def test_input_after_a_refused_connect_ignored(clients, topic):
    """A PUBLISH sent right behind a refused CONNECT is not processed. [MQTT311-3.1.4-5]"""
    c = clients.new(version=V)
    c.send(
        connect("", version=V, clean_start=False)
        + publish(topic, b"ignored", retain=True, version=V)
    )
    c.expect_refused({0x02})
    s = clients.connected(version=V)
    s.subscribe(topic)
    assert s.drain() == []


def test_keep_alive_enforced(clients):
    """Keep Alive 1: silent for 1.5 s, the client is disconnected. [MQTT311-3.1.2-24]"""
    c = clients.new(version=V)
    c.connect(c.name, version=V, keepalive=1)
    started = time.monotonic()
    assert c.is_closed(timeout=5)
    assert time.monotonic() - started >= 1.0


def test_qos_flows_to_and_from_the_broker(clients, topic):
    """QoS 0: no packet id, DUP 0, no acknowledgement; QoS 1: PUBACK with the PUBLISH's id;
    QoS 2: PUBREC, PUBREL, PUBCOMP with it. The broker's own PUBLISHes: QoS 1 and 2 with a
    non-zero id and DUP 0, QoS 0 without an id. [MQTT311-2.3.1-1] [MQTT311-2.3.1-5]
    [MQTT311-2.3.1-6] [MQTT311-3.3.1-2] [MQTT311-3.3.4-1] [MQTT311-4.3.1-1] [MQTT311-4.3.2-1]
    [MQTT311-4.3.2-2] [MQTT311-4.3.3-1] [MQTT311-4.3.3-2] [MQTT311-3.3.2-1] [MQTT311-3.3.2-3]"""
    s = clients.connected(version=V)
    s.subscribe(f"{topic}/+", qos=2)
    pub = clients.connected(version=V)
    pub.publish(f"{topic}/0", b"q0")
    assert pub.ping() == []  # nothing acknowledges QoS 0
    got = s.expect_publish(f"{topic}/0", b"q0")
    assert got.qos == 0 and got.packet_id is None and not got.dup
    pub.send(publish(f"{topic}/1", b"q1", qos=1, packet_id=11, version=V))
    assert pub.expect(PUBACK).packet_id == 11
    got = s.expect_publish(f"{topic}/1", b"q1")
    assert got.qos == 1 and got.packet_id and not got.dup
    s.send(ack(PUBACK, got.packet_id, version=V))
    pub.send(publish(f"{topic}/2", b"q2", qos=2, packet_id=12, version=V))
    assert pub.expect(PUBREC).packet_id == 12
    pub.send(publish(f"{topic}/2", b"q2", qos=2, packet_id=12, dup=True, version=V))
    assert pub.expect(PUBREC).packet_id == 12  # again, and not delivered twice
    pub.send(ack(PUBREL, 12, version=V))
    assert pub.expect(PUBCOMP).packet_id == 12
    got = s.expect_publish(f"{topic}/2", b"q2")
    assert got.qos == 2 and got.packet_id and not got.dup
    s.send(ack(PUBREC, got.packet_id, version=V))
    assert s.expect(PUBREL).packet_id == got.packet_id
    s.send(ack(PUBCOMP, got.packet_id, version=V))
    assert s.drain() == []
    pub.send(publish(f"{topic}/1", b"again", qos=1, packet_id=11, version=V))  # id reusable
    assert pub.expect(PUBACK).packet_id == 11
    s.acknowledge(s.expect_publish(f"{topic}/1", b"again"))


def test_resend_on_reconnect(clients, topic):
    """Unacknowledged QoS 1 PUBLISH and unanswered PUBREL are sent again on reconnection with
    CleanSession 0, with their ids; the PUBLISH with DUP 1. [MQTT311-4.4.0-1]
    [MQTT311-3.3.1-1] [MQTT311-2.3.1-4] [MQTT311-3.3.1-3]"""
    cid = clients.uid + "-r"
    s = clients.new(version=V)
    s.connect(cid, version=V, clean_start=False)
    s.subscribe(topic, qos=2)
    pub = clients.connected(version=V)
    pub.send(publish(topic, b"one", qos=1, packet_id=5, dup=True, version=V))
    pub.expect(PUBACK)
    first = s.expect_publish(topic, b"one")
    assert not first.dup  # the inbound DUP is not forwarded
    pub.publish_acked(topic, b"two", qos=2)
    second = s.expect_publish(topic, b"two")
    s.send(ack(PUBREC, second.packet_id, version=V))
    s.expect(PUBREL)
    s.close()
    again = clients.new(version=V)
    again.connect(cid, version=V, clean_start=False)
    resent = again.expect_publish(topic, b"one")
    assert resent.dup and resent.packet_id == first.packet_id
    rel = again.expect(PUBREL)
    assert rel.packet_id == second.packet_id
    again.send(ack(PUBACK, first.packet_id, version=V))
    again.send(ack(PUBCOMP, second.packet_id, version=V))
    assert again.drain() == []


@pytest.mark.parametrize(
    "data",
    [
        publish("t", b"x", qos=3, packet_id=1, version=V),
        b"\x60\x02\x00\x01",  # PUBREL with flags 0000
        b"\x80\x06\x00\x01" + string("t") + b"\x00",  # SUBSCRIBE with flags 0000
        b"\xa0\x05\x00\x01" + string("t"),  # UNSUBSCRIBE with flags 0000
    ],
    ids=["publish-qos-3", "pubrel-flags", "subscribe-flags", "unsubscribe-flags"],
)
def test_invalid_fixed_header_flags_close(c311, data):
    """[MQTT311-3.3.1-4] [MQTT311-3.6.1-1] [MQTT311-3.8.1-1] [MQTT311-3.10.1-1]
    [MQTT311-2.2.2-1] [MQTT311-2.2.2-2]"""
    c = c311()
    c.send(data)
    assert c.is_closed()


def test_retained_messages(clients, topic, retained):
    """A retained message is stored and sent with RETAIN 1 to new subscriptions, with RETAIN 0
    to existing ones; a retained QoS 0 message replaces it; a RETAIN 0 message leaves it; an
    empty retained message is delivered and removes it; it outlives the publisher's session.
    [MQTT311-3.3.1-5] [MQTT311-3.3.1-6] [MQTT311-3.3.1-7] [MQTT311-3.3.1-8] [MQTT311-3.3.1-9]
    [MQTT311-3.3.1-10] [MQTT311-3.3.1-11] [MQTT311-3.3.1-12] [MQTT311-3.1.2-7]"""
    retained(topic)
    live = clients.connected(version=V)
    live.subscribe(topic, qos=1)
    pub = clients.new(version=V)
    pub.connect(clients.uid + "-pub", version=V)
    pub.publish_acked(topic, b"first", qos=1, retain=True)
    assert not live.expect_publish(topic, b"first").retain
    pub.publish(topic, b"second", retain=True)  # QoS 0 replaces
    pub.publish(topic, b"not-retained")  # RETAIN 0 leaves it
    pub.disconnect()
    new = clients.connected(version=V)
    new.subscribe(topic, qos=1)
    got = new.expect_publish(topic)
    assert got.retain and got.payload == b"second"
    clients.connected(version=V).publish(topic, b"", retain=True)
    deleted = live.drain()[-1]
    assert deleted.payload == b"" and not deleted.retain
    late = clients.connected(version=V)
    late.subscribe(topic)
    assert late.drain() == []


def test_resubscribe_replaces_and_resends_retained(clients, topic, retained):
    """[MQTT311-3.8.4-3]"""
    retained(topic)
    clients.connected(version=V).publish_acked(topic, b"r", qos=1, retain=True)
    s = clients.connected(version=V)
    s.subscribe(topic, qos=1)
    s.acknowledge(s.expect_publish(topic, b"r"))
    s.subscribe(topic, qos=0)
    got = s.expect_publish(topic, b"r")
    assert got.qos == 0  # the new subscription's QoS: replaced, not added
    assert s.drain() == []


def test_subscribe_and_suback(c311, topic):
    """One SUBACK per SUBSCRIBE, its id echoed, one return code per filter in order: the QoS
    granted (wildcards supported). [MQTT311-3.8.4-1] [MQTT311-3.8.4-2] [MQTT311-2.3.1-7]
    [MQTT311-3.8.4-4] [MQTT311-3.8.4-5] [MQTT311-3.9.3-1] [MQTT311-3.9.3-2] [MQTT311-3.8.3-1]
    [MQTT311-4.7.1-3] [MQTT311-3.8.3-2]"""
    c = c311()
    filters = [(f"{topic}/a", 2), (f"{topic}/+/b", 0), (f"{topic}/#", 1), ("+", 0)]
    c.send(subscribe(4321, filters, version=V))
    pkt = c.expect(SUBACK)
    assert pkt.packet_id == 4321
    assert pkt.reason_codes == [2, 0, 1, 0], pkt


@pytest.mark.parametrize("bad", ["{t}/#/x", "{t}/b+", "{t}#"])
def test_invalid_filter_refused(c311, topic, bad):
    """An invalid filter: SUBACK 0x80 for it (the other filters granted), or the connection
    closed. [MQTT311-4.7.1-2] [MQTT311-4.7.1-3]"""
    c = c311()
    c.send(subscribe(7, [(f"{topic}/a", 1), (bad.format(t=topic), 0)], version=V))
    try:
        pkt = c.read()
    except ConnectionClosed:
        return
    assert pkt.type == SUBACK and pkt.reason_codes == [1, 0x80], pkt


def test_invalid_subscribes_close(c311):
    """No filter at all, or Requested QoS 3, or reserved option bits: closed.
    [MQTT311-3.8.3-3] [MQTT311-3.8.3-4]"""
    for body in (u16(1), u16(1) + string("t") + b"\x03", u16(1) + string("t") + b"\x04"):
        c = c311()
        c.send(packet(0x82, body))
        assert c.is_closed(), body


def test_granted_qos_caps_delivery(clients, topic):
    """Delivered at the lower of the published and the granted QoS; overlapping subscriptions
    of one client: the highest. [MQTT311-3.8.4-6] [MQTT311-3.3.5-1]"""
    s = clients.connected(version=V)
    s.subscribe(topic, qos=0)
    pub = clients.connected(version=V)
    pub.publish_acked(topic, b"a", qos=2)
    assert s.expect_publish(topic, b"a").qos == 0
    s.subscribe(f"{topic}/#", qos=1)
    pub.publish_acked(topic, b"b", qos=2)
    got = s.drain()  # one copy, or one per subscription: the highest QoS is 1
    assert got and max(p.qos for p in got) == 1, got
    for p in got:
        s.acknowledge(p)


def test_unsubscribe(clients, topic):
    """Literal comparison; UNSUBACK with the id, also when nothing was removed, one for several
    filters; no delivery afterwards. [MQTT311-3.10.4-1] [MQTT311-3.10.4-2] [MQTT311-3.10.4-4]
    [MQTT311-3.10.4-5] [MQTT311-3.10.4-6] [MQTT311-3.10.3-1]"""
    s = clients.connected(version=V)
    s.subscribe(f"{topic}/+", qos=0)
    s.send(unsubscribe(77, [f"{topic}/a", f"{topic}/#"], version=V))  # neither is literal
    assert s.expect(UNSUBACK).packet_id == 77
    pub = clients.connected(version=V)
    pub.publish(f"{topic}/a", b"still")
    s.expect_publish(f"{topic}/a", b"still")
    s.send(unsubscribe(78, [f"{topic}/+", "nothing/here"], version=V))
    assert s.expect(UNSUBACK).raw == b"\xb0\x02\x00\x4e"
    pub.publish(f"{topic}/a", b"gone")
    assert s.drain() == []


def test_empty_unsubscribe_closes(c311):
    """[MQTT311-3.10.3-2]"""
    c = c311()
    c.send(packet(0xA2, u16(1)))
    assert c.is_closed()


def test_pingresp(c311):
    """[MQTT311-3.12.4-1]"""
    c = c311()
    c.send(b"\xc0\x00")
    assert c.read_raw() == b"\xd0\x00"


@pytest.mark.parametrize(
    "name",
    [b"a/+", b"a/#", b"", b"a\x00b", b"a\xff"],
    ids=["plus", "hash", "empty", "nul", "ill-formed-utf8"],
)
def test_invalid_topic_names_close(c311, name):
    """[MQTT311-3.3.2-2] [MQTT311-4.7.1-1] [MQTT311-4.7.3-1] [MQTT311-4.7.3-2]
    [MQTT311-1.5.3-1] [MQTT311-1.5.3-2]"""
    c = c311()
    c.send(publish(name, b"x", version=V))
    assert c.is_closed()


def test_dollar_topics_not_matched_by_leading_wildcards(clients, uid):
    """[MQTT311-4.7.2-1]"""
    dollar = f"${uid}/x"
    hash_all = clients.connected(version=V)
    hash_all.subscribe("#", "+/x")
    explicit = clients.connected(version=V)
    explicit.subscribe(f"${uid}/#")
    clients.connected(version=V).publish_acked(dollar, b"dollar", qos=1)
    if not explicit.drain():
        pytest.skip("the broker does not accept PUBLISH to '$' topics from clients")
    assert not [p for p in hash_all.drain() if p.topic.startswith("$")]


def test_topic_names_compared_exactly(clients, topic):
    """Names are compared exactly: a BOM is kept, nothing is normalized. [MQTT311-4.7.3-4]
    [MQTT311-1.5.3-3]"""
    bom = f"{topic}/\ufeffx"
    t = clients.connected(version=V)
    t.subscribe(bom, f"{topic}/\u00e9")  # precomposed
    pub = clients.connected(version=V)
    pub.publish_acked(bom, b"bom", qos=1)
    pub.publish_acked(f"{topic}/e\u0301", b"decomposed", qos=1)
    assert [(p.topic, p.payload) for p in t.drain()] == [(bom, b"bom")]


def test_ordering(clients, topic):
    """One publisher's messages on one topic arrive in order. [MQTT311-4.6.0-5]
    [MQTT311-4.6.0-6]"""
    s = clients.connected(version=V)
    s.subscribe(topic, qos=1)
    pub = clients.connected(version=V)
    for i in range(20):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    got = []
    for _ in range(20):
        p = s.expect_publish(topic)
        s.acknowledge(p)
        got.append(int(p.payload))
    assert got == list(range(20))


def test_packets_split_and_packed(clients, topic):
    """Packets split byte by byte across segments, and several in one segment, are read alike.
    [MQTT311-7.1.1-1]"""
    s = clients.connected(version=V)
    s.subscribe(topic)
    c = clients.new(version=V)
    data = (
        connect(c.name, version=V)
        + publish(topic, b"one", version=V)
        + publish(topic, b"two", qos=1, packet_id=3, version=V)
    )
    for i in range(len(data)):
        c.send(data[i : i + 1])
    assert c.expect(CONNACK).reason_code == 0
    assert c.expect(PUBACK).packet_id == 3
    assert [p.payload for p in s.drain()] == [b"one", b"two"]
    c.send(publish(topic, b"3", version=V) * 3 + b"\xc0\x00")
    assert c.read_raw() == b"\xd0\x00"
    assert [p.payload for p in s.drain()] == [b"3", b"3", b"3"]


def test_broker_packet_ids_not_in_use(clients, topic):
    """Messages in flight to one client have distinct packet identifiers. [MQTT311-2.3.1-2]"""
    s = clients.connected(version=V)
    s.subscribe(topic, qos=1)
    pub = clients.connected(version=V)
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    ids = [s.expect_publish(topic).packet_id for _ in range(5)]
    assert len(set(ids)) == 5 and 0 not in ids, ids


def test_unsubscribed_inflight_delivery_still_finished(clients, topic):
    """A QoS 1 message in flight when its subscription is removed is still delivered: resent on
    reconnection, with DUP 1. [MQTT311-3.10.4-3]"""
    cid = clients.uid + "-u"
    s = clients.new(version=V)
    s.connect(cid, version=V, clean_start=False)
    s.subscribe(topic, qos=1)
    clients.connected(version=V).publish_acked(topic, b"in flight", qos=1)
    first = s.expect_publish(topic, b"in flight")
    s.unsubscribe(topic)
    s.close()
    again = clients.new(version=V)
    again.connect(cid, version=V, clean_start=False)
    resent = again.expect_publish(topic, b"in flight")
    assert resent.dup and resent.packet_id == first.packet_id
    again.send(ack(PUBACK, resent.packet_id, version=V))
    clients.connected(version=V).publish_acked(topic, b"after", qos=1)
    assert again.drain() == []


def test_publish_beyond_what_the_broker_allows(limited_clients, topic):
    """A QoS 2 PUBLISH to a broker whose Maximum QoS is 1 (3.1.1 clients are not told): either
    acknowledged as QoS 2 or the connection closed. [MQTT311-3.3.5-2]"""
    c = limited_clients.connected(version=V)
    c.send(publish(topic, b"x", qos=2, packet_id=9, version=V))
    try:
        pkt = c.read()
    except ConnectionClosed:
        return
    assert pkt.type == PUBREC and pkt.packet_id == 9, pkt


def _ws311(ws_broker, name, **kw):
    from .websocket import WsClient

    host, port, path = ws_broker
    return WsClient((host, port), path, V, name, **kw)


def test_websocket(ws_broker, uid, topic):
    """MQTT 3.1.1 over WebSocket: subprotocol "mqtt" selected; packets split over frames and
    packed in one; the broker's MQTT bytes in binary frames. [MQTT311-6.0.0-4]
    [MQTT311-6.0.0-2] [MQTT311-6.0.0-1]"""
    c = _ws311(ws_broker, f"{uid}-ws", protocols=("chat", "mqtt"))
    try:
        assert c.headers.get("sec-websocket-protocol") == "mqtt", c.head
        hello = connect(c.name, version=V)
        c.send_frames([hello[:1], hello[1:5], hello[5:]])
        assert c.expect(CONNACK).raw == b"\x20\x02\x00\x00"
        c.send_frames([subscribe(1, [(topic, 0)], version=V) + publish(topic, b"x", version=V)])
        assert c.expect(SUBACK, stash_publish=True).reason_codes == [0]
        assert c.expect_publish(topic, b"x").qos == 0
    finally:
        c.sock.close()


def test_websocket_text_frame_closes(ws_broker, uid, topic):
    """[MQTT311-6.0.0-1]"""
    from .websocket import TEXT

    c = _ws311(ws_broker, f"{uid}-wst")
    try:
        c.connect(c.name, version=V)
        c.send_frame(TEXT, publish(topic, b"text", version=V))
        assert c.is_closed()
    finally:
        c.sock.close()
