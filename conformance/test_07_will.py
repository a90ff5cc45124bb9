"""Will messages (sections 3.1.2.5 to 3.1.2.7, 3.1.3.2, 3.14.4)."""

from __future__ import annotations

import time

from .mqtt import P, connect, disconnect, sub_options


def _watch(clients, topic, rap=True):
    w = clients.connected()
    w.subscribe((topic, sub_options(qos=1, rap=rap)))
    return w


def _with_will(clients, topic, payload=b"will", expiry=0, **kw):
    c = clients.new()
    props = [(P.SESSION_EXPIRY_INTERVAL, expiry)] if expiry else None
    c.connect(c.name, will_topic=topic, will_payload=payload, props=props, **kw)
    return c


def test_will_published_on_network_failure(clients, topic, retained):
    """A connection closed without DISCONNECT gets its Will published, with its properties and
    the RETAIN flag 0 when Will Retain is 0 (nothing is retained).
    [MQTT-3.1.2-7] [MQTT-3.1.2-8] [MQTT-3.1.2-14] [MQTT-3.1.2-9]"""
    retained(topic)
    w = _watch(clients, topic)
    c = _with_will(
        clients,
        topic,
        b"lost",
        will_qos=1,
        will_props=[(P.CONTENT_TYPE, "text/plain"), (P.USER_PROPERTY, ("k", "v"))],
    )
    c.close()
    pkt = w.expect_publish(topic, b"lost")
    assert not pkt.retain and pkt.qos == 1, pkt
    assert pkt.prop(P.CONTENT_TYPE) == "text/plain" and pkt.prop(P.USER_PROPERTY) == ("k", "v")
    w.acknowledge(pkt)
    late = clients.connected()
    late.subscribe(topic)
    assert late.drain() == [], "a Will with Will Retain 0 was retained"


def test_will_retained(clients, topic, retained):
    """Will Retain 1: the Will is published as a retained message. [MQTT-3.1.2-15]"""
    retained(topic)
    w = _watch(clients, topic)
    c = _with_will(clients, topic, b"retained-will", will_retain=True)
    c.close()
    assert w.expect_publish(topic, b"retained-will").retain
    late = clients.connected()
    late.subscribe(topic)
    pkt = late.expect_publish(topic, b"retained-will")
    assert pkt.retain


def test_will_not_published_on_normal_disconnect(clients, topic):
    """DISCONNECT with reason 0x00 deletes the Will without publishing it.
    [MQTT-3.1.2-10] [MQTT-3.14.4-3] [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    c = _with_will(clients, topic)
    c.send(disconnect())
    assert c.is_closed(), "broker kept the connection open after DISCONNECT"
    clients.connected().publish_acked(topic, b"sentinel", qos=1)
    pkt = w.expect_publish(topic)
    assert pkt.payload == b"sentinel", f"Will published after a normal DISCONNECT: {pkt!r}"


def test_will_published_after_disconnect_with_other_reason(clients, topic):
    """Only DISCONNECT with reason 0x00 deletes the Will: after 0x04 (Disconnect with Will
    Message) or an error reason such as 0x80 the Will is published. [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    for reason in (0x04, 0x80):
        payload = b"reason-%02x" % reason
        c = _with_will(clients, topic, payload)
        c.send(disconnect(reason))
        assert c.is_closed(), "broker kept the connection open after DISCONNECT"
        pkt = w.expect_publish(topic)
        assert pkt.payload == payload, f"DISCONNECT 0x{reason:02X}: Will not published ({pkt!r})"


def test_will_published_after_invalid_disconnect(clients, topic):
    """A DISCONNECT with an undefined reason code (0x05) is not a normal disconnection: the
    connection is closed and the Will is published. [MQTT-3.14.2-1] [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    c = _with_will(clients, topic, b"bad-disconnect")
    c.send(disconnect(0x05))
    c.expect_disconnect({0x81, 0x82})
    w.expect_publish(topic, b"bad-disconnect")


def test_will_published_on_protocol_error(clients, topic):
    """A connection the broker closes for a Protocol Error publishes its Will. [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    c = _with_will(clients, topic, b"protocol-error")
    c.send(connect(c.name))
    c.expect_disconnect({0x82})
    w.expect_publish(topic, b"protocol-error")


def test_will_deleted_once_published(clients, topic, uid):
    """A published Will is deleted: when the resumed session's connection fails again, without a
    new Will, nothing is published. [MQTT-3.1.2-10]"""
    w = _watch(clients, topic)
    c = clients.new()
    c.connect(uid, will_topic=topic, will_payload=b"once", props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    c.close()
    w.expect_publish(topic, b"once")
    c2 = clients.new()
    assert c2.connect(
        uid, clean_start=False, props=[(P.SESSION_EXPIRY_INTERVAL, 60)]
    ).session_present
    c2.close()
    w.expect_nothing(0.8)


def test_will_delay(clients, topic):
    """With a Will Delay Interval the Will is published only when the delay has passed.
    [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    c = _with_will(clients, topic, b"delayed", expiry=30, will_props=[(P.WILL_DELAY_INTERVAL, 1)])
    c.close()
    start = time.monotonic()
    w.expect_publish(topic, b"delayed", timeout=4)
    assert time.monotonic() - start >= 0.9, "Will published before its delay"


def test_will_published_when_session_ends_first(clients, topic):
    """If the session ends before the Will Delay Interval, the Will is published then.
    [MQTT-3.1.2-8]"""
    w = _watch(clients, topic)
    c = _with_will(
        clients, topic, b"session-ended", expiry=1, will_props=[(P.WILL_DELAY_INTERVAL, 60)]
    )
    c.close()
    w.expect_publish(topic, b"session-ended", timeout=4)


def test_reconnect_before_will_delay_cancels_will(clients, topic, uid):
    """A client that reconnects to its session before the Will Delay Interval ends does not get
    its Will published. [MQTT-3.1.3-9]"""
    w = _watch(clients, topic)
    c = clients.new()
    c.connect(
        uid,
        will_topic=topic,
        will_payload=b"cancelled",
        props=[(P.SESSION_EXPIRY_INTERVAL, 30)],
        will_props=[(P.WILL_DELAY_INTERVAL, 1)],
    )
    c.close()
    c2 = clients.new()
    assert c2.connect(
        uid, clean_start=False, props=[(P.SESSION_EXPIRY_INTERVAL, 30)]
    ).session_present
    w.expect_nothing(2.0)


def test_will_user_properties_keep_order(clients, topic):
    """The Will's User Properties are published unchanged and in their original order.
    [MQTT-3.1.3-10]"""
    order = [("z", "1"), ("a", "2"), ("z", "3"), ("m", ""), ("a", "2")]
    w = _watch(clients, topic)
    c = _with_will(
        clients, topic, b"ordered", will_props=[(P.USER_PROPERTY, pair) for pair in order]
    )
    c.close()
    pkt = w.expect_publish(topic, b"ordered")
    assert pkt.prop_all(P.USER_PROPERTY) == order, pkt
