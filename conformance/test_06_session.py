"""Sessions: Clean Start, Session Present, Session Expiry, take-over, and the resending of
unacknowledged messages when a session resumes (sections 3.1.2.4, 3.1.4, 3.2.2.1.1, 4.1, 4.4)."""

from __future__ import annotations

import time

from .mqtt import CONNACK, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, P, ack, connect

EXPIRY_60 = [(P.SESSION_EXPIRY_INTERVAL, 60)]


def _persistent(clients, client_id, **kw):
    c = clients.new(name=client_id)
    ack_pkt = c.connect(client_id, props=kw.pop("props", EXPIRY_60), **kw)
    return c, ack_pkt


def test_clean_start_0_without_session(clients, uid):
    """Clean Start 0 with no session for the ClientID creates a new one: Session Present 0.
    [MQTT-3.1.2-6] [MQTT-3.2.2-3] [MQTT-3.1.4-4]"""
    _, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert not ack_pkt.session_present and ack_pkt.reason_code == 0


def test_clean_start_0_resumes_session(clients, uid, topic):
    """Clean Start 0 resumes the ClientID's session: Session Present 1, subscriptions kept, and
    messages published while the client was away (Session Expiry above 0) delivered.
    [MQTT-3.1.2-5] [MQTT-3.2.2-3] [MQTT-3.1.2-23] [MQTT-3.1.3-2] [MQTT-4.5.0-1]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    c.disconnect()
    clients.connected().publish_acked(topic, b"while-away", qos=1)
    c2, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert ack_pkt.session_present, ack_pkt
    pkt = c2.expect_publish(topic, b"while-away")
    c2.acknowledge(pkt)
    clients.connected().publish_acked(topic, b"live", qos=1)
    c2.acknowledge(c2.expect_publish(topic, b"live"))


def test_sessions_are_per_client_id(clients, uid, topic):
    """Session state belongs to one ClientID: another ClientID does not see it.
    [MQTT-3.1.3-2]"""
    c, _ = _persistent(clients, uid + "a")
    c.subscribe(topic, qos=1)
    c.disconnect()
    other, ack_pkt = _persistent(clients, uid + "b", clean_start=False)
    assert not ack_pkt.session_present
    clients.connected().publish_acked(topic, b"x", qos=1)
    assert other.drain() == []


def test_clean_start_1_discards_session(clients, uid, topic):
    """Clean Start 1 discards an existing session: Session Present 0 and the old subscriptions
    are gone. [MQTT-3.1.2-4] [MQTT-3.2.2-2] [MQTT-3.1.4-4]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    c.disconnect()
    clients.connected().publish_acked(topic, b"queued", qos=1)
    c2, ack_pkt = _persistent(clients, uid, clean_start=True)
    assert not ack_pkt.session_present and ack_pkt.reason_code == 0
    clients.connected().publish_acked(topic, b"after", qos=1)
    assert c2.drain() == [], "messages of the discarded session delivered"


def test_connack_comes_first(clients, uid, topic):
    """When a resumed session has messages waiting, the CONNACK is still the first packet.
    [MQTT-3.2.0-1]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    c.disconnect()
    pub = clients.connected()
    for i in range(5):
        pub.publish_acked(topic, b"%d" % i, qos=1)
    c2 = clients.new()
    c2.send(connect(uid, clean_start=False, props=EXPIRY_60))
    first = c2.read()
    assert first.type == CONNACK and first.session_present, first
    for i in range(5):
        c2.acknowledge(c2.expect_publish(topic, b"%d" % i))


def test_session_expiry_0_ends_with_connection(clients, uid, topic):
    """With Session Expiry Interval 0 (or absent) the session ends when the connection closes.
    [MQTT-4.1.0-2]"""
    c = clients.new()
    c.connect(uid)
    c.subscribe(topic, qos=1)
    c.disconnect()
    c2, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert not ack_pkt.session_present


def test_session_expires(clients, uid, topic):
    """The broker deletes the session once the Session Expiry Interval has passed after the
    connection closed. [MQTT-4.1.0-2]"""
    c, _ = _persistent(clients, uid, props=[(P.SESSION_EXPIRY_INTERVAL, 1)])
    c.subscribe(topic, qos=1)
    c.disconnect()
    time.sleep(2.5)
    _, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert not ack_pkt.session_present, "session still present after its expiry"


def test_session_kept_while_connected(clients, uid, topic):
    """A session is not discarded while its connection is open, however short its expiry.
    [MQTT-4.1.0-1]"""
    c, _ = _persistent(clients, uid, props=[(P.SESSION_EXPIRY_INTERVAL, 1)])
    c.subscribe(topic, qos=1)
    for _ in range(4):
        time.sleep(0.5)
        assert c.ping() == []
    clients.connected().publish_acked(topic, b"still-here", qos=1)
    c.acknowledge(c.expect_publish(topic, b"still-here"))
    c.disconnect()
    _, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert ack_pkt.session_present


def test_session_expiry_changed_on_disconnect(clients, uid, topic):
    """A Session Expiry Interval on DISCONNECT replaces the one from CONNECT: set to 0, the
    session ends at once. [MQTT-4.1.0-2] [MQTT-3.1.2-23]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    c.disconnect(0, [(P.SESSION_EXPIRY_INTERVAL, 0)])
    _, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert not ack_pkt.session_present


def test_session_taken_over(clients, uid):
    """A second connection with the same ClientID takes the session over: the old connection gets
    DISCONNECT 0x8E (Session taken over), without Session Expiry Interval, then nothing more,
    and is closed. [MQTT-3.1.4-3]"""
    old, _ = _persistent(clients, uid)
    new, _ = _persistent(clients, uid, clean_start=False)
    pkt = old.expect_disconnect({0x8E}, required=True)
    assert pkt is not None and not pkt.has(P.SESSION_EXPIRY_INTERVAL), pkt
    assert new.ping() == []


def test_disconnect_from_server_never_carries_session_expiry(clients):
    """A DISCONNECT sent by the broker (here for a Protocol Error) has no Session Expiry
    Interval. [MQTT-3.14.2-2] [MQTT-3.14.2-1]"""
    c = clients.connected(props=EXPIRY_60)
    c.send(connect(c.name))
    pkt = c.expect_disconnect({0x82})
    if pkt is not None:
        assert not pkt.has(P.SESSION_EXPIRY_INTERVAL), pkt


# -- resending on resumption -------------------------------------------------------------------


def test_qos1_resent_with_dup_on_resume(clients, uid, topic):
    """An unacknowledged QoS 1 PUBLISH stays outstanding until its PUBACK: when the session
    resumes it is resent with DUP 1 and the same Packet Identifier; once acknowledged it is not
    sent again. [MQTT-4.4.0-1] [MQTT-3.3.1-1] [MQTT-4.3.2-3]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    clients.connected().publish_acked(topic, b"unacked", qos=1)
    first = c.expect_publish(topic, b"unacked")
    assert not first.dup
    c.close()
    c2, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert ack_pkt.session_present
    again = c2.expect_publish(topic, b"unacked")
    assert again.dup and again.qos == 1 and again.packet_id == first.packet_id, again
    c2.send(ack(PUBACK, again.packet_id))
    assert c2.drain() == []
    c2.close()
    c3, _ = _persistent(clients, uid, clean_start=False)
    assert c3.drain() == [], "acknowledged message resent"


def test_qos2_publish_then_pubrel_resent_on_resume(clients, uid, topic):
    """QoS 2 as sender: the PUBLISH is resent (DUP 1, same id) until a PUBREC arrives; after the
    PUBREL has gone out only the PUBREL is resent, never the PUBLISH, until PUBCOMP.
    [MQTT-4.4.0-1] [MQTT-4.3.3-3] [MQTT-4.3.3-5] [MQTT-4.3.3-6] [MQTT-3.3.1-1]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=2)
    clients.connected().publish_acked(topic, b"exactly-once", qos=2)
    first = c.expect_publish(topic, b"exactly-once")
    pid = first.packet_id
    c.close()
    c2, _ = _persistent(clients, uid, clean_start=False)
    again = c2.expect_publish(topic, b"exactly-once")
    assert again.dup and again.qos == 2 and again.packet_id == pid, again
    c2.send(ack(PUBREC, pid))
    rel = c2.expect(PUBREL)
    assert rel.packet_id == pid
    c2.close()
    c3, _ = _persistent(clients, uid, clean_start=False)
    resent = c3.ping()
    assert [(p.type, p.packet_id) for p in resent] == [(PUBREL, pid)], resent
    c3.send(ack(PUBCOMP, pid))
    assert c3.drain() == []
    c3.close()
    c4, _ = _persistent(clients, uid, clean_start=False)
    assert c4.ping() == []


def test_nothing_resent_on_clean_start(clients, uid, topic):
    """Reconnecting with Clean Start 1 resends nothing. [MQTT-4.4.0-1]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=1)
    clients.connected().publish_acked(topic, b"unacked", qos=1)
    c.expect_publish(topic, b"unacked")
    c.close()
    c2, ack_pkt = _persistent(clients, uid, clean_start=True)
    assert not ack_pkt.session_present
    assert c2.ping() == []


def test_refused_deliveries_not_retransmitted(clients, uid, topic):
    """A PUBLISH answered with PUBACK or PUBREC of 0x80 or above counts as acknowledged and is
    not sent again on resumption. [MQTT-4.4.0-2]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=2)
    pub = clients.connected()
    pub.publish_acked(topic, b"q1", qos=1)
    pub.publish_acked(topic, b"q2", qos=2)
    p1 = c.expect_publish(topic, b"q1")
    p2 = c.expect_publish(topic, b"q2")
    assert p1.qos == 1 and p2.qos == 2
    c.send(ack(PUBACK, p1.packet_id, 0x80) + ack(PUBREC, p2.packet_id, 0x80))
    assert c.ping() == [], "a PUBREL followed a refusing PUBREC"
    c.close()
    c2, ack_pkt = _persistent(clients, uid, clean_start=False)
    assert ack_pkt.session_present
    assert c2.ping() == [], "refused message retransmitted"


def test_message_expiry_not_applied_once_qos2_publish_sent(clients, uid, topic):
    """Once a QoS 2 PUBLISH has been sent, message expiry no longer applies to it: it is resent
    on resumption even though its Message Expiry Interval has passed. [MQTT-4.3.3-7]"""
    c, _ = _persistent(clients, uid)
    c.subscribe(topic, qos=2)
    clients.connected().publish_acked(
        topic, b"sent-once", qos=2, props=[(P.MESSAGE_EXPIRY_INTERVAL, 1)]
    )
    first = c.expect_publish(topic, b"sent-once")
    c.close()
    time.sleep(2.2)  # > 2 s: brokers that count whole seconds see it expired too
    c2, _ = _persistent(clients, uid, clean_start=False)
    again = c2.expect(PUBLISH)
    assert again.packet_id == first.packet_id and again.dup and again.payload == b"sent-once"
    c2.acknowledge(again)
