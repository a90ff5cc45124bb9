"""Shared subscriptions (section 4.8.2)."""

from __future__ import annotations

import pytest

from .mqtt import PUBACK, PUBREC, NoPacket, P, ack, read_any, sub_options, subscribe


def _members(clients, group, topic, qos=1, count=2, **kw):
    members = []
    for _ in range(count):
        m = clients.connected(**kw)
        assert m.subscribe(f"$share/{group}/{topic}", qos=qos).reason_codes == [qos]
        members.append(m)
    return members


def test_shared_subscription_each_message_once(clients, uid, topic):
    """A well-formed '$share/<name>/<filter>' is accepted; each message goes to exactly one
    member of the group. [MQTT-4.8.2-1] [MQTT-4.8.2-2]"""
    members = _members(clients, uid, topic)
    pub = clients.connected()
    for i in range(10):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    got = []
    for m in members:
        for pkt in m.drain():
            got.append(int(pkt.payload))
            m.acknowledge(pkt)
    assert sorted(got) == list(range(10)), f"each message once: {sorted(got)}"


def test_shared_and_normal_subscriptions_both_receive(clients, uid, topic):
    """A client's normal subscription still gets every message alongside a shared group."""
    members = _members(clients, uid, topic)
    normal = clients.connected()
    normal.subscribe(topic, qos=1)
    clients.connected().publish_acked(topic, b"x", qos=1)
    normal.acknowledge(normal.expect_publish(topic, b"x"))
    assert sum(len(m.drain()) for m in members) == 1


def _expect_share_refused(c, topic_filter):
    c.send(subscribe(3, [(topic_filter, 1)]))
    pkt = c.read()
    if pkt.type == 9:
        assert pkt.reason_codes == [0x8F], f"{topic_filter!r}: {pkt!r}"
    else:
        assert pkt.type == 14 and pkt.reason_code in (0x81, 0x82, 0x8F), pkt
        c.expect_closed()


def test_shared_subscription_needs_share_name(clients, topic):
    """A Shared Subscription's ShareName is at least one character: '$share//<filter>' is
    refused (SUBACK 0x8F or DISCONNECT). [MQTT-4.8.2-1]"""
    _expect_share_refused(clients.connected(), f"$share//{topic}")


@pytest.mark.parametrize("name", ["$share/a+b/{t}", "$share/a#/{t}", "$share/{u}", "$share/{u}/"])
def test_invalid_shared_subscription_names(clients, uid, topic, name):
    """The ShareName holds no '/', '+' or '#' and is followed by '/' and a Topic Filter; other
    '$share/' filters are refused (SUBACK 0x8F or DISCONNECT). [MQTT-4.8.2-2]"""
    _expect_share_refused(clients.connected(), name.format(t=topic, u=uid))


def test_shared_subscription_respects_each_members_qos(clients, uid, topic):
    """Each member receives at the QoS granted to its own subscription. [MQTT-4.8.2-3]"""
    q0 = clients.connected()
    q0.subscribe(f"$share/{uid}/{topic}", qos=0)
    q2 = clients.connected()
    q2.subscribe(f"$share/{uid}/{topic}", qos=2)
    pub = clients.connected()
    for i in range(8):
        pub.publish_acked(topic, b"%d" % i, qos=2)
    seen = {0: 0, 2: 0}
    for granted, m in ((0, q0), (2, q2)):
        for pkt in m.drain():
            assert pkt.qos == granted, f"member with QoS {granted}: {pkt!r}"
            seen[granted] += 1
            m.acknowledge(pkt)
    assert sum(seen.values()) == 8, seen


def test_no_local_on_shared_subscription(clients, uid, topic):
    """No Local 1 on a Shared Subscription is a Protocol Error. [MQTT-3.8.3-4]"""
    c = clients.connected()
    c.send(subscribe(4, [(f"$share/{uid}/{topic}", sub_options(qos=1, nl=True))]))
    c.expect_disconnect({0x82})


def test_no_retained_messages_on_shared_subscribe(clients, uid, topic, retained):
    """Retained messages are not sent when a Shared Subscription is made."""
    retained(topic)
    clients.connected().publish_acked(topic, b"kept", qos=1, retain=True)
    (m,) = _members(clients, uid, topic, count=1)
    assert m.drain() == []


def _deliver_one(clients, members, topic, qos, payload=b"m"):
    clients.connected().publish_acked(topic, payload, qos=qos)
    who, pkt = read_any(members)
    assert pkt.type == 3 and pkt.payload == payload, pkt
    return who, pkt


def test_shared_qos2_resumed_to_same_member(clients, uid, topic):
    """A QoS 2 delivery to a group member interrupted by disconnection is completed to that same
    member when it reconnects; the other member does not get it. [MQTT-4.8.2-4]"""
    expiry = [(P.SESSION_EXPIRY_INTERVAL, 60)]
    members = _members(clients, uid, topic, qos=2, props=expiry)
    who, pkt = _deliver_one(clients, members, topic, qos=2)
    other = members[1 - members.index(who)]
    who.close()
    again = clients.new()
    assert again.connect(who.client_id, clean_start=False, props=expiry).session_present
    resent = again.expect_publish(topic, b"m")
    assert resent.dup and resent.packet_id == pkt.packet_id, resent
    again.acknowledge(resent)
    assert other.drain() == []


def test_shared_qos2_not_given_to_another_member_when_session_ends(clients, uid, topic):
    """If the member's session ends before it reconnects, the interrupted QoS 2 message is not
    sent to another member. [MQTT-4.8.2-5]"""
    members = _members(clients, uid, topic, qos=2)  # Session Expiry 0: ends with the connection
    who, _ = _deliver_one(clients, members, topic, qos=2, payload=b"interrupted")
    other = members[1 - members.index(who)]
    who.close()
    clients.connected().publish_acked(topic, b"sentinel", qos=2)
    pkt = other.expect_publish(topic)
    assert pkt.payload == b"sentinel", f"interrupted QoS 2 message redistributed: {pkt!r}"
    other.acknowledge(pkt)
    with pytest.raises(NoPacket):
        other.read(0.3)


@pytest.mark.parametrize("qos", [1, 2])
def test_shared_refused_message_not_redistributed(clients, uid, topic, qos):
    """A message a member refuses (PUBACK/PUBREC 0x80) is discarded, not sent to another member.
    [MQTT-4.8.2-6] [MQTT-4.4.0-2]"""
    members = _members(clients, uid, topic, qos=qos)
    who, pkt = _deliver_one(clients, members, topic, qos=qos, payload=b"refused")
    who.send(ack(PUBACK if qos == 1 else PUBREC, pkt.packet_id, 0x80))
    assert all(m.drain() == [] for m in members), "refused message sent again"


@pytest.mark.feature
def test_feature_shared_round_robin(clients, uid, topic):
    """Feature (issue 4: round robin by default; the spec leaves the choice to the broker): two
    online members of a group get alternate messages."""
    members = _members(clients, uid, topic, count=2)
    pub = clients.connected()
    for i in range(10):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    shares = []
    for m in members:
        got = m.drain()
        shares.append(sorted(int(p.payload) for p in got))
        for p in got:
            m.acknowledge(p)
    assert sorted(len(s) for s in shares) == [5, 5], shares
