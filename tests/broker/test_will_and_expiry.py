"""Wills (3.1.2.5, 3.1.3.2), the Will Delay Interval, and session expiry, all on the fake clock."""

from __future__ import annotations

from support.harness import Client, Harness, Prop, pk

MQTT_3_1_1 = 4


def watcher(h: Harness, topic_filter: str = "will/#") -> Client:
    client = h.connect("watcher")
    client.subscribe(topic_filter, 2)
    return client


def will(delay: int | None = None, **kwargs: object) -> pk.Will:
    props = {} if delay is None else {Prop.WILL_DELAY_INTERVAL: delay}
    props.update(kwargs.pop("properties", {}))  # type: ignore[call-overload]
    return pk.Will("will/c", b"gone", properties=props, **kwargs)  # type: ignore[arg-type]


def expiry(seconds: int) -> dict[int, int]:
    return {Prop.SESSION_EXPIRY_INTERVAL: seconds}


def test_will_published_on_connection_lost(h: Harness) -> None:
    """[MQTT-3.1.2-8] [MQTT-3.1.2-7] [MQTT-3.1.2-14] The network failing publishes the will, not
    retained (Will Retain 0), at the will QoS."""
    w = watcher(h)
    client = h.connect("c", will=will(qos=1))
    assert w.receive() == []
    client.lose()
    (message,) = w.publishes()
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "will/c",
        b"gone",
        1,
        False,
    )
    assert len(h.broker.router.retained) == 0


def test_will_published_once(h: Harness) -> None:
    """[MQTT-3.1.2-10] Once published the will is deleted: nothing more on later ticks."""
    w = watcher(h)
    h.connect("c", will=will()).lose()
    assert len(w.publishes()) == 1
    h.tick(1000)
    assert w.receive() == []


def test_will_not_published_on_normal_disconnect(h: Harness) -> None:
    """[MQTT-3.14.4-3] [MQTT-3.1.2-10] DISCONNECT 0x00 deletes the will unpublished."""
    w = watcher(h)
    client = h.connect("c", will=will(), properties=expiry(100))
    client.disconnect(0x00)
    h.tick(1000)
    assert w.receive() == []


def test_will_published_on_disconnect_with_will(h: Harness) -> None:
    """[MQTT-3.1.2-8] DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    w = watcher(h)
    client = h.connect("c", will=will())
    client.disconnect(0x04)
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_will_published_on_protocol_error(h: Harness) -> None:
    """[MQTT-3.1.2-8] A connection the server closes for a protocol error publishes the will."""
    w = watcher(h)
    client = h.connect("c", will=will())
    client.publish("bad/#", b"x")
    assert client.closed
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_will_published_on_keep_alive_timeout(h: Harness) -> None:
    """[MQTT-3.1.2-22] [MQTT-3.1.2-8] Closing on keep alive is as if the network failed: the will
    is published."""
    w = watcher(h)
    h.connect("c", keep_alive=2, will=will())
    h.tick(3.5)
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_will_v311(h: Harness) -> None:
    """[MQTT-3.1.2-8] A 3.1.1 will: published on connection loss, not after DISCONNECT."""
    w = watcher(h)
    h.connect("c1", version=MQTT_3_1_1, will=pk.Will("will/1", b"x")).lose()
    assert [p.topic for p in w.publishes()] == ["will/1"]
    client = h.connect("c2", version=MQTT_3_1_1, will=pk.Will("will/2", b"x"))
    client.send_raw(b"\xe0\x00")
    assert client.closed
    assert w.receive() == []


def test_will_retained(h: Harness) -> None:
    """[MQTT-3.1.2-15] Will Retain 1: the will is published as a retained message."""
    w = watcher(h)
    h.connect("c", will=will(retain=True)).lose()
    assert [p.payload for p in w.publishes()] == [b"gone"]
    late = h.connect("late")
    (message,) = late.subscribe("will/c")[1:]
    assert (message.payload, message.retain) == (b"gone", True)


def test_will_properties_forwarded(h: Harness) -> None:
    """[MQTT-3.1.3-10] [MQTT-3.3.2-17] [MQTT-3.3.2-18] The will's User Properties arrive unchanged
    and in order, with its Content Type; the Will Delay Interval is not forwarded."""
    w = watcher(h)
    users = [("b", "1"), ("a", "2"), ("b", "0")]
    props = {Prop.USER_PROPERTY: users, Prop.CONTENT_TYPE: "text/x"}
    h.connect("c", will=will(delay=0, properties=props)).lose()
    (message,) = w.publishes()
    assert message.properties[Prop.USER_PROPERTY] == users
    assert message.properties[Prop.CONTENT_TYPE] == "text/x"
    assert Prop.WILL_DELAY_INTERVAL not in message.properties


def test_will_delay_honoured(h: Harness) -> None:
    """[MQTT-3.1.2-8] With a Will Delay Interval the will waits out the delay after the
    connection is lost, then is published on the next tick."""
    w = watcher(h)
    h.connect("c", will=will(delay=5), properties=expiry(100)).lose()
    assert w.receive() == []
    h.tick(4.9)
    assert w.receive() == []
    h.tick(0.1)
    assert [p.payload for p in w.publishes()] == [b"gone"]
    h.tick(100)
    assert w.receive() == []


def test_will_delay_cancelled_by_reconnect(h: Harness) -> None:
    """[MQTT-3.1.3-9] [MQTT-3.1.2-8] Reconnecting to the session before the delay runs out
    cancels the will."""
    w = watcher(h)
    h.connect("c", will=will(delay=10), properties=expiry(100)).lose()
    h.tick(5)
    client = h.connect("c", clean_start=False, properties=expiry(100), expect_present=True)
    h.tick(10)
    h.tick(200)
    assert w.receive() == []
    assert not client.closed


def test_will_delay_ends_with_session(h: Harness) -> None:
    """[MQTT-3.1.2-8] [MQTT-4.1.0-2] A session that expires before the will delay does publishes
    the will when it ends."""
    w = watcher(h)
    h.connect("c", will=will(delay=60), properties=expiry(3)).lose()
    h.tick(2.9)
    assert w.receive() == []
    h.tick(0.1)
    assert [p.payload for p in w.publishes()] == [b"gone"]
    assert "c" not in h.broker.sessions


def test_will_delay_with_no_session_expiry(h: Harness) -> None:
    """[MQTT-3.1.2-8] Session Expiry 0: the session ends with the connection, so a delayed will
    is published at once."""
    w = watcher(h)
    h.connect("c", will=will(delay=60)).lose()
    assert [p.payload for p in w.publishes()] == [b"gone"]


def test_new_will_replaces_old_after_reconnect(h: Harness) -> None:
    """[MQTT-3.1.3-9] The will of the new connection is the one that counts; the old delayed one
    stays cancelled."""
    w = watcher(h)
    h.connect("c", will=will(delay=10), properties=expiry(100)).lose()
    h.tick(1)
    second = h.connect(
        "c",
        clean_start=False,
        properties=expiry(100),
        will=pk.Will("will/second", b"2"),
        expect_present=True,
    )
    second.lose()
    h.tick(50)
    assert [p.topic for p in w.publishes()] == ["will/second"]


def test_session_expiry_after_disconnect(h: Harness) -> None:
    """[MQTT-3.1.2-23] [MQTT-4.1.0-2] A session is kept for its Session Expiry Interval after the
    connection closes (queuing its messages), and deleted, on the tick, once it has run out."""
    client = h.connect("s", properties=expiry(10))
    client.subscribe("t", 1)
    client.lose()
    publisher = h.connect("pub")
    h.tick(9.9)
    assert "s" in h.broker.sessions
    publisher.publish("t", b"kept", 1)
    assert publisher.one(pk.Puback).reason_code == 0  # matched the offline session
    client = h.connect("s", clean_start=False, properties=expiry(10), expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"kept"]
    client.lose()
    h.tick(10)
    assert "s" not in h.broker.sessions
    publisher.publish("t", b"lost", 1)
    assert publisher.one(pk.Puback).reason_code == 0x10  # no matching subscribers any more
    client = h.connect("s", clean_start=False, properties=expiry(10), expect_present=False)
    assert client.receive() == []
    assert client.session.subscriptions == {}


def test_session_expiry_zero_ends_with_connection(h: Harness) -> None:
    """[MQTT-4.1.0-2] Session Expiry 0 (the default): the session ends when the connection does."""
    client = h.connect("s", clean_start=False)
    client.subscribe("t", 1)
    client.lose()
    assert "s" not in h.broker.sessions
    h.connect("s", clean_start=False, expect_present=False)


def test_session_never_expires(h: Harness) -> None:
    """[MQTT-3.1.2-23] Session Expiry 0xFFFFFFFF: the session does not expire."""
    client = h.connect("s", properties=expiry(0xFFFFFFFF))
    client.subscribe("t", 1)
    client.lose()
    h.tick(10**9)
    h.connect("s", clean_start=False, expect_present=True)


def test_session_kept_while_connected(h: Harness) -> None:
    """[MQTT-4.1.0-1] Session state is not dropped while the connection is open, however long."""
    client = h.connect("s", properties=expiry(1))
    client.subscribe("t", 1)
    h.tick(1000)
    assert h.broker.sessions["s"].connection is client.conn
    h.connect("pub").publish("t", b"m", 1)
    assert [p.payload for p in client.publishes()] == [b"m"]


def test_disconnect_can_change_session_expiry(h: Harness) -> None:
    """[MQTT-3.1.2-23] A DISCONNECT may change a non-zero Session Expiry Interval: 0 ends the
    session at once, a longer one keeps it longer."""
    client = h.connect("a", properties=expiry(10))
    client.disconnect(0, expiry(0))
    assert "a" not in h.broker.sessions
    client = h.connect("b", properties=expiry(10))
    client.disconnect(0, expiry(100))
    h.tick(50)
    h.connect("b", clean_start=False, expect_present=True)


def test_session_expiry_capped_by_server(make_harness) -> None:  # type: ignore[no-untyped-def]
    """[MQTT-3.1.2-23] A server maximum below the request is announced in CONNACK and used."""
    h = make_harness(max_session_expiry=60)
    client = h.connect("s", properties=expiry(3600))
    assert client.connack.properties[Prop.SESSION_EXPIRY_INTERVAL] == 60
    client.lose()
    h.tick(60)
    assert "s" not in h.broker.sessions
