"""CONNECT and CONNACK (sections 3.1 and 3.2), keep alive, and the first-packet rules."""

from __future__ import annotations

import time

import pytest

from .mqtt import (
    CONNACK,
    MQTT_5,
    MQTT_311,
    ConnectionClosed,
    P,
    body_of,
    connect,
    packet,
    parse,
    properties,
    string,
    subscribe,
    u16,
    with_body,
)

# -- accepted connections ----------------------------------------------------------------------


def test_connect_accepted(clients):
    """A well-formed CONNECT is answered by CONNACK with reason code 0x00, Session Present 0 for a
    Clean Start, reserved acknowledge-flag bits 0 and a Property Length present.
    [MQTT-3.1.4-5] [MQTT-3.2.2-1] [MQTT-3.2.2-2] [MQTT-3.2.2-8] [MQTT-2.2.2-1] [MQTT-4.2.0-1]"""
    c = clients.new()
    c.send(connect(c.name))
    raw = c.read_raw()
    assert raw[0] == 0x20, f"first packet is not CONNACK: {raw.hex(' ')}"
    body = body_of(raw)
    assert body[0] == 0x00, "acknowledge flags: reserved bits and Session Present must be 0"
    assert body[1] == 0x00, f"reason code 0x{body[1]:02X}"
    assert len(body) >= 3, "CONNACK without a Property Length"
    pkt = parse(raw)
    assert pkt.reason_code == 0


def test_connect_v311_exact_bytes(clients):
    """An MQTT 3.1.1 client gets the 3.1.1 CONNACK, exactly 20 02 00 00 (no properties)."""
    c = clients.new(version=MQTT_311)
    c.send(connect(c.name, version=MQTT_311))
    assert c.read_raw() == b"\x20\x02\x00\x00"
    c.send(b"\xc0\x00")
    assert c.read_raw() == b"\xd0\x00"


def test_client_id_of_23_letters_and_digits_accepted(clients, uid):
    """A ClientID of 1 to 23 ASCII letters and digits is accepted. [MQTT-3.1.3-5]"""
    client_id = (uid + "Zz09AbCdEfGhIjKlMnOpQr")[:23]
    assert len(client_id) == 23 and client_id.isalnum()
    c = clients.new()
    c.connect(client_id)
    short = clients.new()
    short.connect(uid[-1])  # one character


def test_username_and_password_in_payload_order(clients, topic, pytestconfig):
    """A CONNECT carrying every payload field (ClientID, Will Properties, Will Topic, Will
    Payload, User Name, Password) in that order is accepted, with the user the broker knows
    (``--auth-user``/``--auth-password``; a broker without authentication takes any).
    [MQTT-3.1.3-1] [MQTT-3.1.2-9] [MQTT-3.1.2-17] [MQTT-3.1.2-19] [MQTT-3.1.3-12]"""
    c = clients.new()
    c.connect(
        c.name,
        will_topic=topic,
        will_payload=b"will",
        will_props=[(P.CONTENT_TYPE, "text/plain")],
        username=pytestconfig.getoption("--auth-user"),
        password=pytestconfig.getoption("--auth-password").encode(),
    )
    assert c.ping() == []


def test_password_without_user_name_accepted(clients):
    """MQTT 5 allows a Password without a User Name (the Password Flag alone). [MQTT-3.1.2-19]"""
    c = clients.new()
    c.connect(c.name, password=b"secret")


# -- assigned client identifiers ---------------------------------------------------------------


def _connect_empty_id(c, **kw):
    c.send(connect("", **kw))
    pkt = c.expect(CONNACK)
    if pkt.reason_code == 0x85:
        c.expect_closed()
        pytest.skip("the broker refuses empty ClientIDs (CONNACK 0x85), which it may do")
    assert pkt.reason_code == 0, pkt
    return pkt


def test_empty_client_id_gets_unique_assigned_id(clients):
    """An empty ClientID is given a unique ClientID, returned as Assigned Client Identifier.
    [MQTT-3.1.3-6] [MQTT-3.1.3-7] [MQTT-3.2.2-16]"""
    ids = []
    for _ in range(3):
        pkt = _connect_empty_id(clients.new())
        assigned = pkt.prop(P.ASSIGNED_CLIENT_IDENTIFIER)
        assert assigned, f"CONNACK without Assigned Client Identifier: {pkt!r}"
        ids.append(assigned)
    assert len(set(ids)) == 3, f"assigned ids not unique: {ids}"


def test_assigned_id_names_the_session(clients, topic):
    """The broker treats the CONNECT as if it carried the assigned ClientID: the session can be
    resumed under it. [MQTT-3.1.3-7] [MQTT-3.1.3-2]"""
    c = clients.new()
    pkt = _connect_empty_id(c, props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    assigned = pkt.prop(P.ASSIGNED_CLIENT_IDENTIFIER)
    c.subscribe(topic, qos=1)
    c.disconnect()
    again = clients.new()
    ack = again.connect(assigned, clean_start=False, props=[(P.SESSION_EXPIRY_INTERVAL, 0)])
    assert ack.session_present, "session of the assigned ClientID not found"
    clients.connected().publish_acked(topic, b"x", qos=1)
    again.expect_publish(topic, b"x")


def test_client_id_rejected_then_closed(clients):
    """A rejected ClientID may be answered with an identifier-rejected CONNACK, then the
    connection is closed. Triggered with MQTT 3.1.1's rule: an empty ClientID with
    CleanSession 0 must be rejected (return code 0x02). [MQTT-3.1.3-8] [MQTT-3.2.2-7]"""
    c = clients.new(version=MQTT_311)
    c.send(connect("", version=MQTT_311, clean_start=False))
    c.expect_refused({0x02})


def test_client_id_ill_formed_utf8_refused(clients):
    """A ClientID that is not well-formed UTF-8 makes the CONNECT malformed: refused (0x81 or
    0x85) and closed. [MQTT-3.1.3-4] [MQTT-1.5.4-1] [MQTT-3.1.4-1] [MQTT-3.2.2-8]"""
    for bad in (b"cf\xff\xfe", b"cf\xed\xa0\x80x", b"cf\xc0\xafx"):
        c = clients.new()
        c.send(connect(bad))
        c.expect_refused({0x81, 0x85})


def test_client_id_with_null_character_refused(clients):
    """U+0000 in the ClientID makes the CONNECT malformed: refused (0x81 or 0x85) and closed.
    [MQTT-1.5.4-2] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(b"cf\x00x"))
    c.expect_refused({0x81, 0x85})


def test_client_id_missing(clients):
    """A CONNECT whose payload lacks the ClientID is malformed: refused and closed.
    [MQTT-3.1.3-3] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(packet(0x10, string("MQTT") + bytes([5, 0x02]) + u16(60) + properties(None)))
    c.expect_refused({0x81})


# -- the first packet and the second CONNECT ---------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [b"\xc0\x00", b"\x30\x06\x00\x01a\x00hi", subscribe(1, [("a", 0)])],
    ids=["PINGREQ", "PUBLISH", "SUBSCRIBE"],
)
def test_first_packet_must_be_connect(clients, first):
    """A connection whose first packet is not CONNECT is closed, and the broker sends nothing:
    no CONNACK, and no DISCONNECT before a CONNACK. [MQTT-3.1.0-1] [MQTT-3.14.0-1]
    [MQTT-4.13.1-1]"""
    c = clients.new()
    c.send(first)
    assert c.is_closed(), "connection still open"


def test_second_connect_is_protocol_error(clients):
    """A second CONNECT on a connection is a Protocol Error: DISCONNECT 0x82 (if any), close, and
    never a second CONNACK; after its DISCONNECT the broker sends nothing more and closes.
    [MQTT-3.1.0-2] [MQTT-3.2.0-2] [MQTT-4.13.1-1] [MQTT-4.13.2-1] [MQTT-3.14.4-1]
    [MQTT-3.14.4-2] [MQTT-3.14.0-1]"""
    c = clients.connected()
    c.send(connect(c.name))
    c.expect_disconnect({0x82})


# -- protocol name and level -------------------------------------------------------------------


def test_wrong_protocol_name(clients):
    """A CONNECT with a protocol name other than "MQTT" is refused: at most a CONNACK 0x84 then
    the connection is closed. [MQTT-3.1.2-1] [MQTT-3.2.2-7]"""
    c = clients.new()
    c.send(connect(c.name, protocol_name="MQTX"))
    c.expect_refused({0x84})


@pytest.mark.parametrize("level", [6, 2, 0])
def test_unsupported_protocol_level(clients, level):
    """An unsupported Protocol Version is refused: at most a CONNACK 0x84 then the connection is
    closed. [MQTT-3.1.2-2] [MQTT-3.2.2-7] [MQTT-3.2.2-6]"""
    c = clients.new()
    c.send(connect(c.name, version=level))
    try:
        raw = c.read_raw()
    except ConnectionClosed:
        return  # closed without an answer: allowed
    # The broker may answer in the 3.1.1 format (20 02 00 01) or the MQTT 5 one.
    if raw[:2] == b"\x20\x02":
        assert raw in (b"\x20\x02\x00\x01", b"\x20\x02\x00\x84"), raw.hex(" ")
    else:
        pkt = parse(raw)
        assert pkt.type == CONNACK and pkt.reason_code == 0x84, pkt
        assert not pkt.session_present
    c.expect_closed()


# -- Connect Flags -----------------------------------------------------------------------------


def test_connect_reserved_flag_set(clients):
    """The reserved bit of the Connect Flags must be 0; otherwise the CONNECT is malformed and
    the connection closed. [MQTT-3.1.2-3] [MQTT-3.1.4-1] [MQTT-4.13.1-1]"""
    c = clients.new()
    c.send(connect(c.name, flags=0x03))
    c.expect_refused({0x81})


def test_will_qos_without_will_flag(clients):
    """Will Flag 0 requires Will QoS 0. [MQTT-3.1.2-11] [MQTT-3.1.4-1]"""
    for qos_bits in (0x08, 0x10):
        c = clients.new()
        c.send(connect(c.name, flags=0x02 | qos_bits))
        c.expect_refused({0x81})


def test_will_qos_3(clients, topic):
    """Will QoS 3 is invalid. [MQTT-3.1.2-12] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, will_topic=topic, will_payload=b"w", will_qos=3))
    c.expect_refused({0x81})


def test_will_retain_without_will_flag(clients):
    """Will Flag 0 requires Will Retain 0. [MQTT-3.1.2-13] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, flags=0x22))
    c.expect_refused({0x81})


def test_will_flag_without_will_fields(clients):
    """Will Flag 1 requires Will Properties, Will Topic and Will Payload in the payload; a
    CONNECT without them is malformed. [MQTT-3.1.2-9] [MQTT-3.1.3-1] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, flags=0x06))
    c.expect_refused({0x81})


def test_will_without_will_properties(clients, topic):
    """In MQTT 5 the Will Properties come before the Will Topic; a will written in the 3.1.1
    order (no Will Properties) does not parse. [MQTT-3.1.3-1] [MQTT-3.1.4-1]"""
    good = connect("cfx", will_topic=topic + "/will", will_payload=b"will-payload")
    body = body_of(good)
    # Drop the Will Properties length byte (0x00) that follows the ClientID.
    cut = body.index(string("cfx")) + len(string("cfx"))
    assert body[cut] == 0
    c = clients.new()
    c.send(with_body(good, body[:cut] + body[cut + 1 :]))
    c.expect_refused({0x81})


def test_user_name_present_without_flag(clients):
    """User Name Flag 0: no User Name may follow; extra bytes make the CONNECT malformed.
    [MQTT-3.1.2-16] [MQTT-3.1.4-1]"""
    c = clients.new()
    raw = connect(c.name)
    c.send(with_body(raw, body_of(raw) + string("user")))
    c.expect_refused({0x81})


def test_user_name_flag_without_user_name(clients):
    """User Name Flag 1 requires a User Name in the payload. [MQTT-3.1.2-17] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, flags=0x82))
    c.expect_refused({0x81})


def test_password_present_without_flag(clients):
    """Password Flag 0: no Password may follow. [MQTT-3.1.2-18] [MQTT-3.1.4-1]"""
    c = clients.new()
    raw = connect(c.name, username="user")
    c.send(with_body(raw, body_of(raw) + string("password")))
    c.expect_refused({0x81})


def test_password_flag_without_password(clients):
    """Password Flag 1 requires a Password in the payload. [MQTT-3.1.2-19] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, flags=0xC2) + b"")  # no user name, no password follow
    c.expect_refused({0x81})


def test_user_name_ill_formed_utf8(clients):
    """The User Name is a UTF-8 Encoded String; ill-formed UTF-8 is a Malformed Packet.
    [MQTT-3.1.3-12] [MQTT-1.5.4-1] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, username=b"us\xffer"))
    c.expect_refused({0x81, 0x86})


def test_will_topic_ill_formed_utf8(clients, topic):
    """The Will Topic is a UTF-8 Encoded String; ill-formed UTF-8 is a Malformed Packet.
    [MQTT-3.1.3-11] [MQTT-1.5.4-1] [MQTT-3.1.4-1]"""
    c = clients.new()
    c.send(connect(c.name, will_topic=topic.encode() + b"/\xff", will_payload=b"w"))
    c.expect_refused({0x81})


# -- refusals ----------------------------------------------------------------------------------


def test_unsupported_authentication_method(clients):
    """A CONNECT naming an Authentication Method the broker does not support is refused (CONNACK
    0x8C or 0x87, Session Present 0 even when a session exists) and closed.
    [MQTT-4.12.0-1] [MQTT-3.2.2-6] [MQTT-3.2.2-7] [MQTT-3.2.2-8] [MQTT-4.13.2-1]"""
    first = clients.new()
    first.connect(first.name, props=[(P.SESSION_EXPIRY_INTERVAL, 60)])
    first.disconnect()
    c = clients.new()
    c.send(
        connect(
            first.name,
            clean_start=False,
            props=[(P.AUTHENTICATION_METHOD, "conformance-no-such-method")],
        )
    )
    c.expect_refused({0x8C, 0x87})


def test_packets_after_refused_connect_ignored(clients, topic):
    """After refusing a CONNECT the broker processes nothing else the client sent: a PUBLISH
    pipelined behind the refused CONNECT is not delivered. [MQTT-3.1.4-6]"""
    sub = clients.connected()
    sub.subscribe(topic)
    c = clients.new()
    c.send(
        connect(c.name, props=[(P.AUTHENTICATION_METHOD, "conformance-no-such-method")])
        + b"\x30"
        + bytes([len(string(topic)) + 1 + 6])
        + string(topic)
        + b"\x00ignore"
    )
    c.expect_refused({0x8C, 0x87})
    clients.connected().publish_acked(topic, b"sentinel", qos=1)
    sub.expect_publish(topic, b"sentinel")


def test_no_authentication_method_no_auth(clients):
    """Without an Authentication Method in CONNECT the broker sends no AUTH packet and no
    Authentication Method or Data in CONNACK. [MQTT-4.12.0-6]"""
    c = clients.new()
    ack = c.connect(c.name)
    assert not ack.has(P.AUTHENTICATION_METHOD) and not ack.has(P.AUTHENTICATION_DATA)
    assert c.ping() == []


def test_auth_without_authentication_method_is_protocol_error(clients):
    """A client that gave no Authentication Method may not send AUTH; the broker treats it as a
    Protocol Error and closes the connection. [MQTT-4.12.0-7] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.send(b"\xf0\x02\x19\x00")  # AUTH, Re-authenticate, no properties
    c.expect_disconnect({0x82, 0x8C})


# -- CONNACK limits ----------------------------------------------------------------------------


def test_connack_advertised_maximum_qos_is_honoured(clients, topic):
    """A broker that does not advertise a Maximum QoS supports QoS 2; one that does advertises
    its highest QoS. Either way SUBSCRIBE at QoS 0, 1 and 2 is accepted, granted at most the
    advertised maximum. [MQTT-3.2.2-9] [MQTT-3.2.2-10]"""
    c = clients.new()
    ack = c.connect(c.name)
    maximum = ack.prop(P.MAXIMUM_QOS, 2)
    assert maximum in (0, 1, 2)
    suback = c.subscribe((topic + "/0", 0), (topic + "/1", 1), (topic + "/2", 2))
    assert suback.reason_codes == [min(q, maximum) for q in (0, 1, 2)], suback
    if maximum == 2:
        c.publish_acked(topic + "/2", b"x", qos=2)
        assert c.expect_publish(topic + "/2").qos == 2


def test_limited_broker_advertises_maximum_qos(limited_clients, topic):
    """A broker that does not support QoS 2 says so with Maximum QoS in CONNACK, and still
    accepts SUBSCRIBE requests for QoS 0, 1 and 2, granting at most its maximum.
    [MQTT-3.2.2-9] [MQTT-3.2.2-10]"""
    c = limited_clients.new()
    ack = c.connect(c.name)
    assert ack.prop(P.MAXIMUM_QOS) == 1, f"expected Maximum QoS 1 in {ack!r}"
    suback = c.subscribe((topic, 2), (topic + "/1", 1), (topic + "/0", 0))
    assert suback.reason_codes == [1, 1, 0], suback


def test_publish_above_maximum_qos(limited_clients, topic):
    """A PUBLISH above the advertised Maximum QoS is answered with DISCONNECT 0x9B (QoS not
    supported) and the connection is closed. [MQTT-3.2.2-11] [MQTT-4.13.1-1]"""
    c = limited_clients.connected()
    c.publish(topic, b"x", qos=2)
    c.expect_disconnect({0x9B})


def test_will_qos_above_maximum(limited_clients, topic):
    """A CONNECT whose Will QoS exceeds the broker's Maximum QoS is refused (CONNACK 0x9B) and
    closed. [MQTT-3.2.2-12] [MQTT-3.2.2-7]"""
    c = limited_clients.new()
    c.send(connect(c.name, will_topic=topic, will_payload=b"w", will_qos=2))
    c.expect_refused({0x9B})


def test_will_retain_without_retain_available(limited_clients, topic):
    """A CONNECT with Will Retain 1 to a broker without retained messages is refused (CONNACK
    0x9A) and closed. [MQTT-3.2.2-13] [MQTT-3.2.2-7]"""
    c = limited_clients.new()
    c.send(connect(c.name, will_topic=topic, will_payload=b"w", will_retain=True))
    c.expect_refused({0x9A})


def test_retained_publish_without_retain_available(limited_clients, topic):
    """After CONNACK said Retain Available 0, a PUBLISH with RETAIN 1 is answered with
    DISCONNECT 0x9A (Retain not supported). [MQTT-3.2.2-14] [MQTT-4.13.1-1]"""
    c = limited_clients.new()
    ack = c.connect(c.name)
    assert ack.prop(P.RETAIN_AVAILABLE) == 0, f"expected Retain Available 0 in {ack!r}"
    c.publish(topic, b"x", retain=True)
    c.expect_disconnect({0x9A})


def test_packet_larger_than_maximum_packet_size(limited_clients, topic):
    """A packet larger than the broker's Maximum Packet Size is answered with DISCONNECT 0x95
    (Packet too large) and the connection is closed. [MQTT-3.2.2-15] [MQTT-4.13.1-1]"""
    c = limited_clients.new()
    ack = c.connect(c.name)
    limit = ack.prop(P.MAXIMUM_PACKET_SIZE)
    assert limit is not None, f"expected a Maximum Packet Size in {ack!r}"
    c.publish(topic, b"x" * limit)
    c.expect_disconnect({0x95})


def test_packet_larger_than_default_maximum_packet_size(clients, topic):
    """The same with the default broker's own limit, if it announces one. [MQTT-3.2.2-15]"""
    c = clients.new()
    ack = c.connect(c.name)
    limit = ack.prop(P.MAXIMUM_PACKET_SIZE)
    if limit is None or limit > 64 * 1024 * 1024:
        pytest.skip("the broker announces no (testable) Maximum Packet Size")
    c.publish(topic, b"x" * limit)
    c.expect_disconnect({0x95})


# -- keep alive --------------------------------------------------------------------------------


def test_keep_alive_enforced(clients, topic):
    """With Keep Alive 1 and no Server Keep Alive in CONNACK, the broker applies the client's
    value: it keeps the connection while packets arrive, and closes it (DISCONNECT 0x8D if any)
    once nothing arrives for 1.5 times the period; the connection counts as failed, so the Will
    is published. [MQTT-3.1.2-22] [MQTT-3.2.2-22] [MQTT-3.1.2-8]"""
    watcher = clients.connected()
    watcher.subscribe(topic)
    c = clients.new()
    ack = c.connect(c.name, keepalive=1, will_topic=topic, will_payload=b"gone")
    if ack.has(P.SERVER_KEEP_ALIVE) and ack.prop(P.SERVER_KEEP_ALIVE) != 1:
        pytest.skip(f"the broker imposed Server Keep Alive {ack.prop(P.SERVER_KEEP_ALIVE)}")
    for _ in range(4):  # 2.4 s of activity, well beyond 1.5 x 1 s
        time.sleep(0.6)
        assert c.ping() == []
    quiet_from = time.monotonic()
    c.expect_disconnect({0x8D}, timeout=4)
    elapsed = time.monotonic() - quiet_from
    assert elapsed >= 1.0, f"closed after {elapsed:.2f}s of silence, before the keep alive ran out"
    watcher.expect_publish(topic, b"gone")


def test_keep_alive_zero_not_enforced(clients):
    """Keep Alive 0 switches the mechanism off: a silent client is not disconnected (checked
    over 2 s). [MQTT-3.2.2-22]"""
    c = clients.new()
    ack = c.connect(c.name, keepalive=0)
    if ack.has(P.SERVER_KEEP_ALIVE):
        pytest.skip("the broker imposed a Server Keep Alive")
    c.expect_nothing(2.0)
    assert c.ping() == []


def test_v311_connection_accepts_publish(clients, topic):
    """MQTT 3.1.1 clients interoperate with MQTT 5 ones (PUBLISH without properties)."""
    old = clients.connected(version=MQTT_311)
    old.subscribe(topic, qos=1)
    new = clients.connected(version=MQTT_5)
    new.publish_acked(topic, b"to-311", qos=1, props=[(P.USER_PROPERTY, ("k", "v"))])
    pkt = old.expect_publish(topic, b"to-311")
    assert pkt.qos == 1
    # 3.1.1 PUBLISH: no Property Length, so exactly topic, packet id, payload.
    assert pkt.raw == packet(0x32, string(topic) + u16(pkt.packet_id) + b"to-311")
    old.acknowledge(pkt)
    assert old.ping() == []
