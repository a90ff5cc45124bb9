"""CONNECT -> CONNACK, the first-packet and second-CONNECT rules, protocol levels, client ids,
session present, session takeover, keep alive and the CONNECT timeout."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import MQTT_5, Harness, Prop, pk

from mqttbroker.protocol import grammar

MQTT_3_1_1 = 4


def connect_bytes(client_id: str = "c", level: int = MQTT_5, **kwargs: object) -> bytes:
    return grammar.encode(pk.Connect(client_id=client_id, protocol_level=level, **kwargs), level)  # type: ignore[arg-type]


def test_connack_v5_properties(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.1.4-5] [MQTT-3.2.2-2] A v5 CONNECT is accepted with CONNACK 0x00, Session Present 0,
    and the server's limits: Maximum Packet Size, Topic Alias Maximum, Receive Maximum."""
    h = make_harness(max_packet_size=4096, topic_alias_maximum=10, receive_maximum=20)
    client = h.connect("c1")
    connack = client.connack
    assert connack is not None
    assert connack.reason_code == 0
    assert connack.session_present is False
    props = connack.properties
    assert props[Prop.MAXIMUM_PACKET_SIZE] == 4096
    assert props[Prop.TOPIC_ALIAS_MAXIMUM] == 10
    assert props[Prop.RECEIVE_MAXIMUM] == 20
    assert Prop.ASSIGNED_CLIENT_IDENTIFIER not in props
    assert Prop.AUTHENTICATION_METHOD not in props  # MQTT-4.12.0-6
    assert not client.closed


def test_connack_maximum_qos_and_retain_available(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-9] A server without QoS 2 says so with Maximum QoS; Retain Available 0 when
    retain is switched off."""
    h = make_harness(maximum_qos=1, retain_available=False)
    props = h.connect("c1").connack.properties  # type: ignore[union-attr]
    assert props[Prop.MAXIMUM_QOS] == 1
    assert props[Prop.RETAIN_AVAILABLE] == 0


def test_subscribe_above_maximum_qos_is_granted_lower(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-10] With Maximum QoS 1 the server still accepts a QoS 2 SUBSCRIBE (granting 1)."""
    h = make_harness(maximum_qos=1)
    client = h.connect("c1")
    assert client.subscribe("t", 2)[0].reason_codes == [1]


def test_assigned_client_identifier(h: Harness) -> None:
    """[MQTT-3.1.3-6] [MQTT-3.1.3-7] [MQTT-3.2.2-16] An empty client id gets a unique Assigned
    Client Identifier in CONNACK, and the session is known by it."""
    first = h.connect("")
    second = h.connect("")
    id1 = first.connack.properties[Prop.ASSIGNED_CLIENT_IDENTIFIER]  # type: ignore[union-attr]
    id2 = second.connack.properties[Prop.ASSIGNED_CLIENT_IDENTIFIER]  # type: ignore[union-attr]
    assert id1 and id2 and id1 != id2
    assert h.broker.sessions[id1].connection is first.conn
    assert h.broker.sessions[id2].connection is second.conn
    assert first.conn.client_id == id1


def test_connect_v311(h: Harness) -> None:
    """[MQTT-3.1.4-5] A 3.1.1 CONNECT gets the 4-byte 3.1.1 CONNACK: flags 0, return code 0."""
    client = h.client(version=MQTT_3_1_1)
    client.send_raw(connect_bytes("c311", MQTT_3_1_1))
    h.broker.flush()
    assert client.link.data == b"\x20\x02\x00\x00"
    assert not client.closed


def test_v311_empty_client_id_clean_session_accepted(h: Harness) -> None:
    """MQTT 3.1.1 allows an empty client id with Clean Session 1: the server assigns one (3.1.1
    has no property to report it)."""
    client = h.connect("", version=MQTT_3_1_1, clean_start=True)
    assert client.connack.properties == {}  # type: ignore[union-attr]
    assert client.conn.client_id
    assert h.broker.sessions[client.conn.client_id].connection is client.conn


def test_v311_empty_client_id_persistent_session_rejected(h: Harness) -> None:
    """MQTT 3.1.1 [MQTT-3.1.3-8] (3.1.1 numbering): empty client id with Clean Session 0 gets
    CONNACK return code 2 (identifier rejected) and the connection is closed."""
    client = h.client(version=MQTT_3_1_1)
    client.send_raw(connect_bytes("", MQTT_3_1_1, clean_start=False))
    h.broker.flush()
    assert client.link.data == b"\x20\x02\x00\x02"
    assert client.closed
    assert h.broker.sessions == {}


def test_v5_empty_client_id_clean_start_0_gets_an_id(h: Harness) -> None:
    """[MQTT-3.1.3-6] MQTT 5 allows an empty client id whatever Clean Start says."""
    client = h.connect("", clean_start=False)
    assert client.connack.properties[Prop.ASSIGNED_CLIENT_IDENTIFIER]  # type: ignore[union-attr]


@pytest.mark.parametrize("level", [6, 7, 255])
def test_unsupported_protocol_level_v5_style(h: Harness, level: int) -> None:
    """[MQTT-3.1.2-2] [MQTT-3.2.2-6] [MQTT-3.2.2-7] An unknown (newer) protocol level gets
    CONNACK 0x84 with Session Present 0 and the connection is closed."""
    data = bytearray(connect_bytes("c1"))
    assert data[2:8] == b"\x00\x04MQTT" and data[8] == MQTT_5
    data[8] = level
    client = h.client()
    client.send_raw(bytes(data))
    received = client.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Connack), received
    assert received[0].reason_code == 0x84
    assert received[0].session_present is False
    assert client.closed
    assert "c1" not in h.broker.sessions


@pytest.mark.parametrize("level", [0, 1, 2])
def test_unsupported_old_protocol_level(h: Harness, level: int) -> None:
    """[MQTT-3.1.2-2] An old level under the name "MQTT" gets the 3.1.1-form CONNACK with return
    code 1 (unacceptable protocol version) and the connection is closed."""
    data = bytearray(connect_bytes("c1", MQTT_3_1_1))
    data[8] = level
    client = h.client(version=MQTT_3_1_1)
    client.send_raw(bytes(data))
    h.broker.flush()
    assert client.link.data == b"\x20\x02\x00\x01"
    assert client.closed


def test_wrong_protocol_name(h: Harness) -> None:
    """[MQTT-3.1.2-1] A protocol name other than "MQTT" gets no accepting CONNACK and the
    connection is closed."""
    data = bytearray(connect_bytes("c1"))
    data[4:8] = b"MQTX"
    client = h.client()
    client.send_raw(bytes(data))
    received = client.receive()
    assert all(isinstance(p, pk.Connack) and p.reason_code >= 0x80 for p in received), received
    assert client.closed


def test_nothing_processed_after_refused_connect(h: Harness) -> None:
    """[MQTT-3.1.4-6] After a refused CONNECT nothing the client sent afterwards is processed."""
    watcher = h.connect("watcher")
    watcher.subscribe("t")
    data = bytearray(connect_bytes("c1"))
    data[8] = 6
    client = h.client()
    client.send_raw(bytes(data) + b"\xc0\x00" + grammar.encode(pk.Publish("t", b"x"), MQTT_5))
    client.send_raw(b"\xc0\x00")
    received = client.receive()
    assert [type(p) for p in received] == [pk.Connack]
    assert watcher.receive() == []


def test_connect_reserved_flag_is_malformed(h: Harness) -> None:
    """[MQTT-3.1.2-3] [MQTT-3.1.4-1] A CONNECT whose reserved flag is 1 is refused and closed."""
    data = bytearray(connect_bytes("c1"))
    data[9] |= 0x01  # connect flags byte
    client = h.client()
    client.send_raw(bytes(data))
    received = client.receive()
    assert all(isinstance(p, pk.Connack) and p.reason_code == 0x81 for p in received), received
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_connect_timeout(h: Harness) -> None:
    """A connection that sends no CONNECT within connect_timeout is closed without a word."""
    client = h.client()
    h.tick(h.options.connect_timeout - 0.5)
    assert not client.closed
    h.tick(1.0)
    assert client.closed
    assert client.link.data == b""


def test_connect_split_across_reads(h: Harness) -> None:
    """A CONNECT arriving one byte at a time is assembled and answered once complete."""
    client = h.client()
    data = connect_bytes("c1")
    for index in range(len(data) - 1):
        client.send_raw(data[index : index + 1])
        assert client.receive() == []
    client.send_raw(data[-1:])
    received = client.receive()
    assert len(received) == 1 and received[0].reason_code == 0


def test_session_present_flag(h: Harness) -> None:
    """[MQTT-3.2.2-2] [MQTT-3.2.2-3] [MQTT-3.1.2-4] [MQTT-3.1.2-5] [MQTT-3.1.2-6] Session Present
    reflects whether a session was resumed; Clean Start 1 discards the old one."""
    expiry = {Prop.SESSION_EXPIRY_INTERVAL: 100}
    client = h.connect("s", clean_start=False, properties=expiry, expect_present=False)
    client.subscribe("t", 1)
    client.lose()
    client = h.connect("s", clean_start=False, properties=expiry, expect_present=True)
    assert list(client.session.subscriptions) == ["t"]
    client.lose()
    client = h.connect("s", clean_start=True, properties=expiry, expect_present=False)
    assert client.session.subscriptions == {}
    publisher = h.connect("p")
    publisher.publish("t", b"x", 1)
    assert publisher.one(pk.Puback).reason_code == 0x10  # no matching subscribers
    assert client.receive() == []


def test_v311_persistent_session(h: Harness) -> None:
    """[MQTT-3.1.2-5] [MQTT-3.1.2-23] A 3.1.1 Clean Session 0 session survives the connection
    and is resumed with Session Present 1 and its subscriptions."""
    client = h.connect("old", version=MQTT_3_1_1, clean_start=False, expect_present=False)
    client.subscribe("t", 1)
    client.lose()
    h.tick(1e6)
    publisher = h.connect("p")
    publisher.publish("t", b"while away", 1)
    client = h.connect("old", version=MQTT_3_1_1, clean_start=False, expect_present=True)
    assert [p.payload for p in client.publishes()] == [b"while away"]


def test_session_takeover(h: Harness) -> None:
    """[MQTT-3.1.4-3] A second connection with the same client id takes the session over: the old
    one gets DISCONNECT 0x8E and is closed, the new one gets the messages."""
    old = h.connect("same", properties={Prop.SESSION_EXPIRY_INTERVAL: 60})
    old.subscribe("t", 1)
    new = h.connect("same", clean_start=False, expect_present=True)
    received = old.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code == 0x8E
    assert old.closed
    assert not new.closed
    assert h.broker.sessions["same"].connection is new.conn
    publisher = h.connect("p")
    publisher.publish("t", b"m", 1)
    assert [p.payload for p in new.publishes()] == [b"m"]
    assert old.receive() == []


def test_session_takeover_v311_closes_without_disconnect(h: Harness) -> None:
    """[MQTT-3.1.4-3] A 3.1.1 connection taken over is closed; 3.1.1 has no server DISCONNECT."""
    old = h.connect("same", version=MQTT_3_1_1)
    h.connect("same", version=MQTT_3_1_1)
    assert old.receive() == []
    assert old.closed


def test_takeover_publishes_will_of_old_connection(h: Harness) -> None:
    """[MQTT-3.1.4-3] [MQTT-3.1.2-8] The taken-over connection was closed without DISCONNECT 0x00,
    so its Will (no delay) is published."""
    watcher = h.connect("watcher")
    watcher.subscribe("will/#")
    h.connect("same", will=pk.Will("will/same", b"gone"))
    h.connect("same")
    assert [p.payload for p in watcher.publishes()] == [b"gone"]


def test_pingreq_pingresp(h: Harness) -> None:
    """[MQTT-3.12.4-1] Every PINGREQ gets a PINGRESP."""
    client = h.connect("c1")
    client.pingreq()
    client.pingreq()
    assert [type(p) for p in client.receive()] == [pk.Pingresp, pk.Pingresp]


def test_keep_alive_timeout(h: Harness) -> None:
    """[MQTT-3.1.2-22] [MQTT-3.2.2-22] No packet for more than 1.5 x Keep Alive: DISCONNECT 0x8D
    and the connection is closed (on the next tick)."""
    client = h.connect("c1", keep_alive=10)
    h.tick(15.0)
    assert not client.closed
    assert client.receive() == []
    h.clock.advance(0.5)
    assert not client.closed  # nothing happens between ticks
    h.tick()
    received = client.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code == 0x8D
    assert client.closed


def test_keep_alive_reset_by_any_packet(h: Harness) -> None:
    """[MQTT-3.1.2-22] The 1.5 x Keep Alive period counts from the last packet received."""
    client = h.connect("c1", keep_alive=10)
    h.tick(14.0)
    client.pingreq()
    assert [type(p) for p in client.receive()] == [pk.Pingresp]
    h.tick(14.0)
    client.publish("x", b"1")
    h.tick(15.0)
    assert not client.closed
    h.tick(0.5)
    assert client.closed


def test_keep_alive_zero_never_times_out(h: Harness) -> None:
    """Keep Alive 0 switches the mechanism off."""
    client = h.connect("c1", keep_alive=0)
    h.tick(1e7)
    assert not client.closed


def test_keep_alive_timeout_v311(h: Harness) -> None:
    """[MQTT-3.1.2-22] A 3.1.1 client is closed too, without DISCONNECT."""
    client = h.connect("c1", version=MQTT_3_1_1, keep_alive=4)
    h.tick(6.5)
    assert client.closed
    assert client.receive() == []


@pytest.mark.parametrize(
    ("requested", "server_keep_alive", "effective"),
    [(0, 30, 30), (60, 30, 30), (20, None, 20), (30, None, 30)],
)
def test_server_keep_alive(
    make_harness: Callable[..., Harness],
    requested: int,
    server_keep_alive: int | None,
    effective: int,
) -> None:
    """[MQTT-3.2.2-21] [MQTT-3.2.2-22] Above max_keepalive (or 0) the server answers with Server
    Keep Alive and enforces that; otherwise it enforces what the client asked for."""
    h = make_harness(max_keepalive=30)
    client = h.connect("c1", keep_alive=requested)
    assert client.connack.properties.get(Prop.SERVER_KEEP_ALIVE) == server_keep_alive  # type: ignore[union-attr]
    h.tick(effective * 1.5)
    assert not client.closed
    h.tick(0.5)
    assert client.closed


@pytest.mark.parametrize(
    ("options", "connect", "code"),
    [
        pytest.param({}, {"will": pk.Will("a/#", b"w")}, 0x90, id="will-topic-wildcard"),
        pytest.param(
            {"maximum_qos": 1}, {"will": pk.Will("w", b"w", qos=2)}, 0x9B, id="will-qos"
        ),  # MQTT-3.2.2-12
        pytest.param(
            {"retain_available": False},
            {"will": pk.Will("w", b"w", retain=True)},
            0x9A,
            id="will-retain",
        ),  # MQTT-3.2.2-13
        pytest.param(
            {}, {"properties": {Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}}, 0x8C, id="auth"
        ),  # MQTT-4.12.0-1
    ],
)
def test_connect_refused(
    make_harness: Callable[..., Harness], options: dict, connect: dict, code: int
) -> None:
    """[MQTT-3.2.2-12] [MQTT-3.2.2-13] [MQTT-4.12.0-1] [MQTT-3.2.2-6] [MQTT-3.2.2-7] A CONNECT the
    server cannot accept gets a CONNACK with the reason, Session Present 0, and is closed; no
    session is created and no will is published."""
    h = make_harness(**options)
    watcher = h.connect("watcher")
    watcher.subscribe("#")
    client = h.client()
    client.send(pk.Connect(client_id="c1", **connect))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Connack, code)]
    assert client.closed
    assert "c1" not in h.broker.sessions
    assert watcher.receive() == []


def test_connack_reason_string_left_out_when_too_large(h: Harness) -> None:
    """[MQTT-3.2.2-19] [MQTT-3.1.2-24] A refusing CONNACK leaves its Reason String out when it
    would exceed the client's Maximum Packet Size, and keeps it otherwise."""
    roomy = h.client()
    roomy.send(pk.Connect(client_id="a", will=pk.Will("a/#", b"w")))
    (connack,) = roomy.receive()
    assert connack.reason_code == 0x90
    assert Prop.REASON_STRING in connack.properties
    tight = h.client()
    tight.send(
        pk.Connect(
            client_id="b", will=pk.Will("a/#", b"w"), properties={Prop.MAXIMUM_PACKET_SIZE: 10}
        )
    )
    (connack,) = tight.receive()
    assert connack.reason_code == 0x90
    assert Prop.REASON_STRING not in connack.properties
    assert all(len(w) <= 10 for w in tight.link.writes)


def test_keep_alive_not_reset_by_partial_packet(h: Harness) -> None:
    """[MQTT-3.1.2-22] Keep alive counts Control Packets: bytes that never complete a packet do
    not keep the connection alive (else a client trickling one byte at a time is never closed)."""
    client = h.connect("c1", keep_alive=10)
    data = grammar.encode(pk.Publish("t", b"x" * 50), MQTT_5)
    h.tick(5)
    client.send_raw(data[:3])
    h.tick(5)
    client.send_raw(data[3:4])
    h.tick(4)
    client.send_raw(data[4:5])
    h.tick(1.5)  # 15.5 s since the CONNECT, the last complete packet
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x8D)]
    assert client.closed
