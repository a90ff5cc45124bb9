"""Flow control (Receive Maximum, section 4.9 and 3.3.4) and message ordering (section 4.6)."""

from __future__ import annotations

import pytest

from .mqtt import PUBACK, PUBCOMP, PUBREC, PUBREL, P, ack, publish, unsubscribe


def _window_client(clients, topic, receive_maximum, qos=1):
    s = clients.connected(props=[(P.RECEIVE_MAXIMUM, receive_maximum)])
    s.subscribe(topic, qos=qos)
    return s


def test_receive_maximum_initial_window(clients, topic):
    """The broker starts with no more unacknowledged QoS 1 PUBLISHes to a client than its
    Receive Maximum: with 2, exactly two of five queued messages arrive.
    [MQTT-3.3.4-9] [MQTT-4.9.0-1]"""
    s = _window_client(clients, topic, 2)
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    first = s.drain()
    assert [p.payload for p in first] == [b"0", b"1"], first


def test_receive_maximum_one_more_per_puback(clients, topic):
    """Each PUBACK frees one place in the client's Receive Maximum, no more: with 2, each PUBACK
    lets exactly one further message go, in order. [MQTT-3.3.4-9] [MQTT-4.9.0-2]"""
    s = _window_client(clients, topic, 2)
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    got = s.drain()
    assert len(got) == 2, got
    for i in range(2, 5):
        s.send(ack(PUBACK, got[i - 2].packet_id))
        more = s.drain()
        assert [p.payload for p in more] == [b"%d" % i], f"after PUBACK {i - 1}: {more!r}"
        got += more
    for p in got[3:]:
        s.send(ack(PUBACK, p.packet_id))
    assert s.drain() == []


def test_receive_maximum_counts_qos2_until_pubcomp(clients, topic):
    """A QoS 2 delivery uses the client's Receive Maximum until its PUBCOMP, not just its
    PUBREC. [MQTT-3.3.4-9] [MQTT-4.9.0-2]"""
    s = _window_client(clients, topic, 1, qos=2)
    pub = clients.connected()
    pub.publish_acked(topic, b"a", qos=2)
    pub.publish_acked(topic, b"b", qos=2)
    (a,) = s.drain()
    s.send(ack(PUBREC, a.packet_id))
    before = s.ping()
    assert [p.type for p in before] == [PUBREL], f"only the PUBREL may come: {before!r}"
    s.send(ack(PUBCOMP, a.packet_id))
    (b,) = s.drain()
    assert b.payload == b"b"
    s.acknowledge(b)


def test_other_packets_not_held_back_by_receive_maximum(clients, topic):
    """With the client's Receive Maximum used up the broker still answers PINGREQ, SUBSCRIBE,
    UNSUBSCRIBE and the client's own PUBLISHes. [MQTT-3.3.4-10] [MQTT-4.9.0-3]"""
    s = _window_client(clients, topic, 1)
    pub = clients.connected()
    pub.publish_acked(topic, b"0", qos=1)
    pub.publish_acked(topic, b"1", qos=1)
    (first,) = s.drain()
    assert s.ping() == []
    assert s.subscribe(topic + "/other", qos=1).reason_codes == [1]
    s.send(unsubscribe(50, [topic + "/other"]))
    assert s.expect(11).packet_id == 50
    s.publish(topic + "/mine", b"x", qos=1, packet_id=60)
    assert s.expect(PUBACK).packet_id == 60
    s.publish(topic + "/mine", b"x", qos=2, packet_id=61)
    assert s.expect(PUBREC).packet_id == 61
    s.send(ack(PUBREL, 61))
    assert s.expect(PUBCOMP).packet_id == 61
    s.send(ack(PUBACK, first.packet_id))
    (second,) = s.drain()
    assert second.payload == b"1"
    s.acknowledge(second)


def _one_past_receive_maximum(clients, topic):
    """A connected client, the broker's Receive Maximum, and that many QoS 2 PUBLISHes plus one,
    never released."""
    c = clients.connected()
    assert c.connack is not None
    maximum = c.connack.prop(P.RECEIVE_MAXIMUM, 65535)
    if maximum > 5000:
        pytest.skip(f"Receive Maximum {maximum} too large to exceed quickly")
    burst = b"".join(publish(topic, b"x", qos=2, packet_id=i + 1) for i in range(maximum + 1))
    return c, maximum, burst


def test_client_exceeding_receive_maximum(clients, topic):
    """A client with more unacknowledged QoS 2 PUBLISHes than the broker's Receive Maximum
    (no PUBREL sent) is disconnected with 0x93 (Receive Maximum exceeded). [MQTT-3.3.4-7]"""
    c, maximum, burst = _one_past_receive_maximum(clients, topic)
    c.send(burst)
    for _ in range(maximum):
        assert c.expect(PUBREC).reason_code < 0x80
    c.expect_disconnect({0x93})


def test_receive_maximum_exceeded_heard_while_still_sending(clients, topic):
    """The same excess, from a client that answers each PUBREC with PUBREL as it reads it: its
    PUBRELs reach a connection the broker is closing, and the client must still read the
    DISCONNECT 0x93: a broker that closes at once answers them with a reset, and the client's
    next write fails (broken pipe) before it reads the DISCONNECT, or the reset discards what
    it has not read. A lingering close (as nginx's) avoids both: shut down the sending side,
    read and discard for a bounded time, then close. [MQTT-3.3.4-7]"""
    c, maximum, burst = _one_past_receive_maximum(clients, topic)
    c.recv_size = 4  # one PUBREC per read, as a client reading packet by packet does
    c.send(burst)
    for _ in range(maximum):
        rec = c.expect(PUBREC)
        assert rec.reason_code < 0x80
        # A client library stops at a failed write and never reads what came before it.
        try:
            c.send(ack(PUBREL, rec.packet_id))
        except OSError as exc:
            raise AssertionError(f"{exc!r} before the DISCONNECT 0x93 was read") from None
    c.expect_disconnect({0x93}, required=True)


def test_ordering_per_topic(clients, topic):
    """Messages of one publisher on one topic at one QoS arrive in the order sent, for each
    topic (non-shared subscriptions make every topic an Ordered Topic). The publisher pipelines
    as many QoS 1/2 PUBLISHes as the broker's Receive Maximum allows.
    [MQTT-4.6.0-5] [MQTT-4.6.0-6] [MQTT-4.2.0-1]"""
    s = clients.connected()
    s.subscribe(f"{topic}/#", qos=2)
    pub = clients.connected()
    assert pub.connack is not None
    window = min(pub.connack.prop(P.RECEIVE_MAXIMUM, 65535), 20) // 2  # QoS 1 + QoS 2 per round
    count = 60
    received: dict[str, list[int]] = {f"{topic}/q{q}": [] for q in range(3)}
    expected = 0
    for start in range(0, count, window):
        rounds = range(start, min(start + window, count))
        burst = b""
        for i in rounds:
            for qos in (0, 1, 2):
                pid = (i * 3 + qos) % 65535 + 1 if qos else None
                burst += publish(f"{topic}/q{qos}", b"%d" % i, qos=qos, packet_id=pid)
        pub.send(burst)
        releases = b""
        for _ in range(2 * len(rounds)):
            a = pub.read()
            assert a.type in (PUBACK, PUBREC) and a.reason_code < 0x80, a
            if a.type == PUBREC:
                releases += ack(PUBREL, a.packet_id)
        pub.send(releases)
        for _ in range(len(rounds)):
            assert pub.expect(PUBCOMP).reason_code == 0
        expected += 3 * len(rounds)
        while sum(map(len, received.values())) < expected:
            pkt = s.expect(3)
            received[pkt.topic].append(int(pkt.payload))
            s.acknowledge(pkt)
    for name, seq in received.items():
        assert seq == list(range(count)), f"{name}: out of order {seq}"


def test_ordering_of_queued_messages(clients, uid, topic):
    """Messages queued for an absent client are delivered in the order published, after the
    in-flight one resent first. [MQTT-4.6.0-5] [MQTT-4.4.0-1]"""
    s = clients.new()
    s.connect(uid, props=[(P.SESSION_EXPIRY_INTERVAL, 60), (P.RECEIVE_MAXIMUM, 1)])
    s.subscribe(topic, qos=1)
    pub = clients.connected()
    pub.publish_acked(topic, b"0", qos=1)
    s.expect_publish(topic, b"0")
    s.close()
    for i in range(1, 20):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    s2 = clients.new()
    s2.connect(uid, clean_start=False, props=[(P.SESSION_EXPIRY_INTERVAL, 0)])
    order = []
    for _ in range(20):
        pkt = s2.expect_publish(topic)
        order.append(int(pkt.payload))
        s2.send(ack(PUBACK, pkt.packet_id))
    assert order == list(range(20)), order
