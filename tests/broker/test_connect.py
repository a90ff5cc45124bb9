"""broker/connect.py: CONNECT -> CONNACK (protocol levels, client ids and their pattern, CONNACK
properties, refusals and the reasons and log lines they carry), password checks on and off the
event loop, enhanced authentication and re-authentication (section 4.12) with a toy
challenge/response method, DISCONNECT."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.codec import encoded_connect
from support.harness import (
    METHOD,
    MQTT_3_1_1,
    MQTT_5,
    NOT_UTF8,
    PFI,
    POWERS_OF_TWO,
    GatedStore,
    Harness,
    Offload,
    Prop,
    ToyAuthenticator,
    ToyExchange,
    counts_logged,
    disconnected_with,
    pk,
    split_packets,
)

from mqttbroker.broker.auth import SUCCESS, AuthOutcome, LoginRequest
from mqttbroker.broker.core import Broker
from mqttbroker.broker.policy import ListenerPolicy
from mqttbroker.protocol import grammar


def connect_with_method(h: Harness, method: str = METHOD, data: bytes | None = None) -> Any:
    client = h.client()
    props: dict[int, Any] = {Prop.AUTHENTICATION_METHOD: method}
    if data is not None:
        props[Prop.AUTHENTICATION_DATA] = data
    client.send(pk.Connect(client_id="toy", properties=props))
    return client


def answer(client: Any) -> None:
    """The client's answer to the toy challenge ("nonce" reversed)."""
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )


def logged_in_with_method(h: Harness) -> Any:
    """A client that answered the toy challenge and got its CONNACK."""
    client = connect_with_method(h)
    assert client.one(pk.Auth).reason_code == 0x18
    answer(client)
    assert client.one(pk.Connack).reason_code == 0
    return client


class NamedExchange:
    """Succeeds at once, establishing the user name ``user``."""

    def __init__(self, user: str) -> None:
        self.user = user

    def step(self, data: bytes | None) -> AuthOutcome:
        return AuthOutcome(SUCCESS, None, username=self.user)


class NamingAuthenticator(ToyAuthenticator):
    def __init__(self) -> None:
        super().__init__()
        self.users = ["alice"]

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> NamedExchange | None:
        return NamedExchange(self.users.pop(0)) if method == METHOD else None


def refused(h: Harness, packet: pk.Connect) -> pk.Connack:
    client = h.client()
    client.send(packet)
    connack: pk.Connack = client.one(pk.Connack)
    assert connack.reason_code >= 0x80 and client.closed
    return connack


class OnceAuthenticator(ToyAuthenticator):
    """Lets a client authenticate once; a re-authentication is refused (no exchange)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, str | None, str | None]] = []

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> ToyExchange | None:
        self.asked.append((method, client_id, username, address))
        return ToyExchange() if len(self.asked) == 1 else None


def authenticated(h: Harness, client_id: str = "toy") -> Any:
    client = h.client(peer="10.1.2.3:4000")
    client.send(pk.Connect(client_id=client_id, properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Auth).reason_code == 0x18
    answer(client)
    assert client.one(pk.Connack).reason_code == 0
    return client


def connack(h: Harness, client_id: str, username: str | None) -> pk.Connack:
    client = h.client()
    client.send(pk.Connect(client_id=client_id, username=username))
    reply: pk.Connack = client.one(pk.Connack)
    return reply


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    return lambda: [r.getMessage() for r in caplog.records]


def test_challenge_response_then_connack(ha: Harness) -> None:
    """[MQTT-4.12.0-2] [MQTT-4.12.0-5] The server's AUTH continues with 0x18; every AUTH and the
    successful CONNACK carry the method named in CONNECT."""
    client = connect_with_method(ha)
    auth = client.one(pk.Auth)
    assert auth.reason_code == 0x18
    assert auth.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    assert auth.properties[Prop.AUTHENTICATION_DATA] == b"nonce"
    answer(client)
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0
    assert connack.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    assert connack.properties[Prop.AUTHENTICATION_DATA] == b"welcome"
    client.subscribe("a/b")  # the session works


def test_wrong_answer_gets_connack_failure_and_close(ha: Harness) -> None:
    """[MQTT-4.12.0-4] The server may refuse at any step: CONNACK 0x80+ and close."""
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"nope"})
    )
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x86
    assert client.closed


def test_unsupported_method_is_refused(ha: Harness) -> None:
    """[MQTT-4.12.0-1] An unsupported Authentication Method gets CONNACK 0x8C and a close."""
    client = connect_with_method(ha, "NOT-KNOWN")
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x8C
    assert client.closed


def test_only_auth_or_disconnect_while_authenticating(ha: Harness) -> None:
    """[MQTT-3.1.2-30] Until CONNACK the client may send only AUTH or DISCONNECT; anything else
    is a protocol error, answered with CONNACK 0x82 (no CONNACK was sent yet)."""
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest("a")]))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x82
    assert client.closed


def test_auth_with_another_method_is_a_protocol_error(ha: Harness) -> None:
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: "OTHER", Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    assert client.one(pk.Connack).reason_code == 0x82


def test_re_authentication_uses_the_first_method_and_ends_with_auth_0x00(ha: Harness) -> None:
    """[MQTT-4.12.1-1] Re-authentication (AUTH 0x19) uses the original method; it ends with
    AUTH 0x00 on success."""
    client = logged_in_with_method(ha)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Auth).reason_code == 0x18
    answer(client)
    done = client.one(pk.Auth)
    assert done.reason_code == 0
    assert done.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    assert not client.closed


def test_failed_re_authentication_disconnects(ha: Harness) -> None:
    """[MQTT-4.12.1-2] A failed re-authentication ends with DISCONNECT and a closed connection."""
    client = logged_in_with_method(ha)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"bad"})
    )
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x87  # 0x86 is no DISCONNECT code: Not authorized
    assert client.closed


def test_re_authentication_with_another_method_is_refused(ha: Harness) -> None:
    client = logged_in_with_method(ha)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: "OTHER"}))
    assert client.one(pk.Disconnect).reason_code == 0x82


def test_no_auth_without_a_method(ha: Harness) -> None:
    """[MQTT-4.12.0-6] [MQTT-4.12.0-7] Without a method in CONNECT the server sends no AUTH and
    no method in CONNACK, and an AUTH from the client is a protocol error."""
    client = ha.client()
    client.send(pk.Connect(client_id="plain", username="alice", password=b"secret"))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0
    assert Prop.AUTHENTICATION_METHOD not in connack.properties
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Disconnect).reason_code == 0x82


@pytest.mark.parametrize(
    ("username", "password", "v5_code", "v311_code"),
    [("alice", b"wrong", 0x86, 4), (None, None, 0x87, 5)],
)
def test_a_refused_password_closes_with_the_authenticators_code(
    ha: Harness, username: str | None, password: bytes | None, v5_code: int, v311_code: int
) -> None:
    """[MQTT-3.1.4-2] A failed check closes the connection, with the authenticator's code in
    MQTT 5 and the matching 3.1.1 return code."""
    for version, code in ((5, v5_code), (4, v311_code)):
        client = ha.client(version)
        client.send(
            pk.Connect(
                client_id=f"p{version}",
                protocol_level=version,
                username=username,
                password=password,
            )
        )
        connack = client.one(pk.Connack)
        assert connack.reason_code == code
        assert client.closed


def test_authentication_data_without_method(h: Harness) -> None:
    client = h.client()
    client.send(pk.Connect(client_id="x", properties={Prop.AUTHENTICATION_DATA: b"d"}))
    assert client.one(pk.Connack).reason_code == 0x82


@pytest.mark.parametrize(("moved", "code"), [(False, 0x9C), (True, 0x9D)])
def test_redirect(make_harness: Any, moved: bool, code: int) -> None:
    """A broker configured to send clients elsewhere answers CONNACK 0x9C/0x9D with the Server
    Reference, and closes."""
    h = make_harness(server_reference="other.example:1883", server_moved=moved)
    client = h.client()
    client.send(pk.Connect(client_id="r"))
    connack = client.one(pk.Connack)
    assert connack.reason_code == code
    assert connack.properties[Prop.SERVER_REFERENCE] == "other.example:1883"
    assert client.closed


def test_response_information_only_when_requested(make_harness: Any) -> None:
    """[MQTT-3.1.2-28] Response Information is returned only to a client that asks for it."""
    h = make_harness(response_information="replies/%c/")
    asked = h.connect("asker", properties={Prop.REQUEST_RESPONSE_INFORMATION: 1})
    assert asked.connack is not None
    assert asked.connack.properties[Prop.RESPONSE_INFORMATION] == "replies/asker/"
    silent = h.connect("silent", properties={Prop.REQUEST_RESPONSE_INFORMATION: 0})
    assert silent.connack is not None
    assert Prop.RESPONSE_INFORMATION not in silent.connack.properties


def test_certificate_user_replaces_the_password_check(ha: Harness) -> None:
    """A link whose listener verified a client certificate names the user: the CONNECT's own
    user name is replaced and no password is asked for."""
    client = ha.client(certificate_user="alice")
    client.send(pk.Connect(client_id="cert", username="mallory", password=b"nothing"))
    assert client.one(pk.Connack).reason_code == 0
    assert client.conn.username == "alice"
    plain = ha.client()  # the same credentials without a certificate are refused
    plain.send(pk.Connect(client_id="nocert", username="mallory", password=b"nothing"))
    assert plain.one(pk.Connack).reason_code == 0x86


def test_password_check_off_the_loop_holds_pipelined_packets(ha: Harness) -> None:
    """While the password is checked elsewhere, packets the client sent right after CONNECT
    wait; once accepted, CONNACK comes first and then their answers, in order."""
    offload = ha.broker.offload = Offload()
    client = ha.client()
    client.send(
        pk.Connect(client_id="fast", username="alice", password=b"secret"),
        pk.Subscribe(1, [pk.SubscriptionRequest("a/b")]),
        pk.Pingreq(),
    )
    assert client.receive() == []  # nothing before the check's answer
    client.send_raw(b"\xc0\x00")  # more arrives meanwhile
    assert len(offload.pending) == 1
    offload.run_all()
    got = client.receive()
    assert [type(p) for p in got] == [pk.Connack, pk.Suback, pk.Pingresp, pk.Pingresp]
    assert got[0].reason_code == 0


def test_refused_password_off_the_loop(ha: Harness) -> None:
    offload = ha.broker.offload = Offload()
    client = ha.client()
    client.send(
        pk.Connect(client_id="bad", username="alice", password=b"wrong"),
        pk.Subscribe(1, [pk.SubscriptionRequest("a/b")]),
    )
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0x86
    assert client.closed


def test_connection_lost_during_the_check(ha: Harness) -> None:
    offload = ha.broker.offload = Offload()
    client = ha.client()
    client.send(pk.Connect(client_id="gone", username="alice", password=b"secret"))
    client.lose()
    offload.run_all()  # the answer finds the connection closed: nothing happens
    assert "gone" not in ha.broker.sessions
    assert client.link.data == b""


def test_reauthentication_must_keep_the_user(make_harness: Any) -> None:
    """The exchange's user name becomes the connection's; re-authenticating as the same user
    succeeds (AUTH 0x00), as another one ends the connection (DISCONNECT 0x87)."""
    h: Harness = make_harness()
    auth = NamingAuthenticator()
    h.broker.authenticator = auth
    client = connect_with_method(h)
    assert client.one(pk.Connack).reason_code == 0
    assert client.conn.username == "alice"
    auth.users = ["alice", "mallory"]
    for expected in ("same", "other"):
        client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
        packets = client.receive()
        if expected == "same":
            assert isinstance(packets[0], pk.Auth) and packets[0].reason_code == 0
        else:
            assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x87


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


def test_a_311_connect_gets_the_4_byte_connack(h: Harness) -> None:
    """[MQTT-3.1.4-5] A 3.1.1 CONNECT gets the 4-byte 3.1.1 CONNACK: flags 0, return code 0."""
    client = h.client(version=MQTT_3_1_1)
    client.send_raw(encoded_connect("c311", MQTT_3_1_1))
    h.broker.scheduler.flush()
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
    client.send_raw(encoded_connect("", MQTT_3_1_1, clean_start=False))
    h.broker.scheduler.flush()
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
    data = bytearray(encoded_connect("c1"))
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
    data = bytearray(encoded_connect("c1", MQTT_3_1_1))
    data[8] = level
    client = h.client(version=MQTT_3_1_1)
    client.send_raw(bytes(data))
    h.broker.scheduler.flush()
    assert client.link.data == b"\x20\x02\x00\x01"
    assert client.closed


def test_wrong_protocol_name(h: Harness) -> None:
    """[MQTT-3.1.2-1] A protocol name other than "MQTT" gets no accepting CONNACK and the
    connection is closed."""
    data = bytearray(encoded_connect("c1"))
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
    data = bytearray(encoded_connect("c1"))
    data[8] = 6
    client = h.client()
    client.send_raw(bytes(data) + b"\xc0\x00" + grammar.encode(pk.Publish("t", b"x"), MQTT_5))
    client.send_raw(b"\xc0\x00")
    received = client.receive()
    assert [type(p) for p in received] == [pk.Connack]
    assert watcher.receive() == []


def test_connect_reserved_flag_is_malformed(h: Harness) -> None:
    """[MQTT-3.1.2-3] [MQTT-3.1.4-1] A CONNECT whose reserved flag is 1 is refused and closed."""
    data = bytearray(encoded_connect("c1"))
    data[9] |= 0x01  # connect flags byte
    client = h.client()
    client.send_raw(bytes(data))
    received = client.receive()
    assert all(isinstance(p, pk.Connack) and p.reason_code == 0x81 for p in received), received
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_no_connect_within_connect_timeout_closes_without_a_word(h: Harness) -> None:
    """A connection that sends no CONNECT within connect_timeout is closed without a word."""
    client = h.client()
    h.tick(h.options.connect_timeout - 0.5)
    assert not client.closed
    h.tick(1.0)
    assert client.closed
    assert client.link.data == b""


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
def test_a_connect_that_cannot_be_accepted_gets_its_reason_and_is_closed(
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


@pytest.mark.parametrize(
    ("options", "packet", "code", "reason"),
    [
        (
            {"maximum_qos": 1},
            pk.Connect(client_id="c", will=pk.Will("w", b"x", qos=2)),
            0x9B,
            "will QoS above the maximum",
        ),
        (
            {"retain_available": False},
            pk.Connect(client_id="c", will=pk.Will("w", b"x", retain=True)),
            0x9A,
            "retained will not supported",
        ),
        (
            {},
            pk.Connect(client_id="c", properties={Prop.AUTHENTICATION_DATA: b"x"}),
            0x82,
            "Authentication Data without an Authentication Method",
        ),
    ],
    ids=["will-qos", "will-retain", "auth-data"],
)
def test_refused_connect_says_why(
    make_harness: Any, options: dict[str, Any], packet: pk.Connect, code: int, reason: str
) -> None:
    connack = refused(make_harness(**options), packet)
    assert (connack.reason_code, connack.properties[Prop.REASON_STRING]) == (code, reason)


@pytest.mark.parametrize("allow_anonymous", [None, True])
def test_password_check_is_told_the_listener_rule_and_address(
    h: Harness, allow_anonymous: bool | None
) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder:
        def check_password(self, *args: Any) -> int:
            asked.append(args)
            return 0

        def exchange(self, *args: Any) -> None:
            return None

    h.broker.authenticator = Recorder()
    client = h.client(peer="10.2.3.4:5678", policy=ListenerPolicy(allow_anonymous=allow_anonymous))
    client.send(pk.Connect(client_id="c", username="u", password=b"p"))
    assert client.one(pk.Connack).reason_code == 0
    assert asked == [(LoginRequest("c", "u", b"p", allow_anonymous, "10.2.3.4"),)]


def test_connack_announces_features_turned_off(make_harness: Any) -> None:
    """Subscription Identifiers, shared subscriptions and wildcards off: CONNACK
    says 0 for each; on (the default), the properties are left out (they default to 1)."""
    off = make_harness(
        subscription_identifiers=False, shared_subscriptions=False, wildcard_subscriptions=False
    ).connect("c")
    assert off.connack is not None
    props = off.connack.properties
    assert props[Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 0
    assert props[Prop.SHARED_SUBSCRIPTION_AVAILABLE] == 0
    assert props[Prop.WILDCARD_SUBSCRIPTION_AVAILABLE] == 0
    on = make_harness().connect("c")
    assert on.connack is not None
    for prop in (
        Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        Prop.SHARED_SUBSCRIPTION_AVAILABLE,
        Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
    ):
        assert prop not in on.connack.properties


@pytest.mark.parametrize(("level", "name"), [(5, "5.0"), (4, "3.1.1"), (3, "3.1")])
def test_connection_logged_with_its_version(
    h: Harness, caplog: pytest.LogCaptureFixture, level: int, name: str
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    client = h.client(version=level)
    client.send(
        pk.Connect(
            client_id="c", protocol_level=level, protocol_name="MQIsdp" if level == 3 else "MQTT"
        )
    )
    assert client.one(pk.Connack).reason_code == 0
    assert (
        f"client c connected from peer (MQTT {name} over a test link, user None, keep alive 60s, "
        "session new)"
    ) in [r.getMessage() for r in caplog.records]


def test_refused_re_authentication(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-4.12.1-2] The authenticator, asked with the connection's client id, user and
    address, has no exchange for a re-authentication: DISCONNECT 0x87 saying why."""
    h = make_harness()
    auth = h.broker.authenticator = OnceAuthenticator()
    client = authenticated(h)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x87
    assert disconnect.properties[Prop.REASON_STRING] == "re-authentication refused"
    assert client.closed
    assert auth.asked == [(METHOD, "toy", None, "10.1.2.3")] * 2


def test_failed_exchange_says_why(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-4.12.0-4] A wrong answer: CONNACK 0x86 with a Reason String."""
    h = make_harness()
    h.broker.authenticator = ToyAuthenticator()
    client = h.client()
    client.send(pk.Connect(client_id="toy", properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"nope"})
    )
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x86
    assert connack.properties[Prop.REASON_STRING] == "authentication failed"


def test_password_refused_off_the_loop_says_why(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    h.broker.authenticator = ToyAuthenticator()
    offload = h.broker.offload = Offload()
    client = h.client()
    client.send(pk.Connect(client_id="c", username="alice", password=b"wrong"))
    offload.run_all()
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x86
    assert connack.properties[Prop.REASON_STRING] == "authentication failed"
    assert client.closed


@pytest.mark.parametrize(
    ("client_id", "username", "accepted"),
    [
        ("alice-1", "alice", True),
        ("alice-", "alice", True),
        ("alice-x\ny", "alice", True),  # "*" spans any character
        ("bob-1", "alice", False),
        ("alice1", "alice", False),
        ("xalice-1", "alice", False),
        ("a.b-1", "a.b", True),
        ("axb-1", "a.b", False),  # the user name is literal, not a pattern
    ],
)
def test_pattern_with_user(
    make_harness: Any, client_id: str, username: str, accepted: bool
) -> None:
    h: Harness = make_harness(client_id_pattern="%u-*")
    reply = connack(h, client_id, username)
    if accepted:
        assert reply.reason_code == 0
    else:
        assert reply.reason_code == 0x85
        assert reply.properties[Prop.REASON_STRING] == (
            f"client id does not match client_id_pattern for user {username!r}"
        )


def test_anonymous_cannot_match_a_user_pattern(make_harness: Any) -> None:
    h: Harness = make_harness(client_id_pattern="%u-*")
    reply = connack(h, "-1", None)
    assert reply.reason_code == 0x85
    assert reply.properties[Prop.REASON_STRING] == (
        "client id does not match client_id_pattern for anonymous"
    )


def test_assigned_client_id_is_not_checked(make_harness: Any) -> None:
    h: Harness = make_harness(client_id_pattern="%u-*")
    reply = connack(h, "", "alice")
    assert reply.reason_code == 0
    assert Prop.ASSIGNED_CLIENT_IDENTIFIER in reply.properties


def test_refused_connect_is_logged(make_harness: Any, lines: Any) -> None:
    h: Harness = make_harness(client_id_pattern="dev-*")
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="bad", username="alice"))
    assert client.one(pk.Connack).reason_code == 0x85
    assert (
        "client bad from 10.0.0.9:1234 (user 'alice'): client id does not match "
        "client_id_pattern for user 'alice'; refused (reason 0x85)"
    ) in lines()


def test_giving_up_authentication_is_logged(h: Harness, lines: Any) -> None:
    h.broker.authenticator = ToyAuthenticator()
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="toy", properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Auth).reason_code == 0x18
    client.disconnect()
    assert client.closed
    assert "client toy from 10.0.0.9:1234 gave up authenticating" in lines()


def test_refusal_code_logged_in_upper_case_hex(make_harness: Any, lines: Any) -> None:
    h: Harness = make_harness(maximum_qos=1)
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="c", will=pk.Will("w", b"x", qos=2)))
    assert client.one(pk.Connack).reason_code == 0x9B
    assert (
        "client c from 10.0.0.9:1234 (user None): will QoS above the maximum; refused (reason 0x9B)"
    ) in lines()


def test_offloaded_password_check_is_told_the_address(h: Harness) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder(ToyAuthenticator):
        def check_password(self, *args: Any) -> int:
            asked.append(args)
            return 0

    h.broker.authenticator = Recorder()
    offload = h.broker.offload = Offload()
    client = h.client(peer="10.9.8.7:6543")
    client.send(pk.Connect(client_id="c", username="u", password=b"p"))
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0
    assert asked == [(LoginRequest("c", "u", b"p", None, "10.9.8.7"),)]


def test_exchange_is_told_the_user_name(h: Harness) -> None:
    asked: list[tuple[Any, ...]] = []

    class Recorder(ToyAuthenticator):
        def exchange(self, *args: Any) -> ToyExchange | None:
            asked.append(args)
            return ToyExchange()

    h.broker.authenticator = Recorder()
    client = h.client(peer="10.9.8.7:6543")
    props = {Prop.AUTHENTICATION_METHOD: METHOD}
    client.send(pk.Connect(client_id="c", username="carol", properties=props))
    assert client.one(pk.Auth).reason_code == 0x18
    assert asked == [(METHOD, "c", "carol", "10.9.8.7")]


def test_auth_without_method_says_why(h: Harness) -> None:
    client = h.connect("c")
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x82,
        "AUTH without an Authentication Method in CONNECT",
    )


def test_a_disconnect_closes_with_no_answer(h: Harness) -> None:
    """[MQTT-3.14.4-2] A DISCONNECT from the client closes the connection, with no answer."""
    client = h.connect("c1")
    client.disconnect()
    assert client.receive() == []
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_disconnect_session_expiry_after_zero_is_protocol_error(h: Harness) -> None:
    """A DISCONNECT setting a non-zero Session Expiry Interval when CONNECT had 0 is a Protocol
    Error (3.14.2.2.2): DISCONNECT 0x82, and the session does not survive."""
    client = h.connect("c1")
    client.disconnect(0, {Prop.SESSION_EXPIRY_INTERVAL: 60})
    disconnected_with(client, 0x82)
    assert "c1" not in h.broker.sessions


@pytest.mark.parametrize(("expiry", "waits"), [(0, False), (60, True)])
def test_connack_after_password_check(make_harness: Any, expiry: int, waits: bool) -> None:
    h: Harness = make_harness()
    store = GatedStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    h.broker.authenticator = ToyAuthenticator()
    offload = h.broker.offload = Offload()
    client = h.client()
    props = {Prop.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {}
    client.send(pk.Connect(client_id="c", username="alice", password=b"secret", properties=props))
    offload.run_all()
    h.broker.scheduler.flush()
    sent = split_packets(client.link.data, 5)
    if waits:
        assert sent == []
        store.commit()
        h.broker.scheduler.flush()
        sent = split_packets(client.link.data, 5)
    assert [type(p) for p in sent] == [pk.Connack]


def test_session_expiry_set_on_disconnect_after_0_is_a_protocol_error(h: Harness) -> None:
    """CONNECT with Session Expiry Interval 0 then DISCONNECT with a non-zero one: a Protocol
    Error (section 3.14.2.2.2): DISCONNECT 0x82, and the will is published as after any
    error."""
    watcher = h.connect("w")
    watcher.subscribe("will/#")
    c = h.connect("c", will=pk.Will("will/c", b"gone"))
    c.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 10})
    packets = c.receive()
    assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x82
    assert [p.topic for p in watcher.publishes()] == ["will/c"]
    h.connect("c", clean_start=False, expect_present=False)


def test_unexpected_auth_reason_code_says_which(h: Harness) -> None:
    h.broker.authenticator = ToyAuthenticator()
    client = h.client()
    client.send(pk.Connect(client_id="toy", properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    client.one(pk.Auth)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))  # re-auth before CONNACK
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x82
    assert connack.properties[Prop.REASON_STRING] == "unexpected AUTH reason code 0x19"


def test_will_not_utf8_refused_at_connect(h: Harness) -> None:
    client = h.client()
    will = pk.Will("will/t", NOT_UTF8, properties=dict(PFI))
    client.send(pk.Connect(client_id="c", will=will))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x99
    assert connack.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 although its Payload Format Indicator says so"
    )


def test_refused_connections_logged_at_powers_of_two(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqttbroker.broker")
    h = make_harness(max_connections=1)
    h.connect("a")
    for _ in range(9):
        assert h.client().closed
    assert h.broker.stats.refused == 9
    assert counts_logged(caplog, "max_connections (1) reached") == POWERS_OF_TWO


@pytest.mark.parametrize("client_id", ["$bridge/x", "$webhook/y"])
def test_reserved_client_id_says_why(h: Harness, client_id: str) -> None:
    client = h.client()
    client.send(pk.Connect(client_id=client_id))
    connack = client.one(pk.Connack)
    assert connack.properties[Prop.REASON_STRING] == f"client identifier {client_id!r} is reserved"


def test_v311_empty_client_id_with_persistent_session(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """[MQTT311-3.1.3-8] An empty ClientId with CleanSession 0: return code 2 (identifier
    rejected), logged with the reason."""
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    client = h.client(version=MQTT_3_1_1)
    client.send(pk.Connect(client_id="", protocol_level=MQTT_3_1_1, clean_start=False))
    assert client.one(pk.Connack).reason_code == 2
    assert any(
        "empty client id with a persistent session; refused (reason 0x85)" in r.getMessage()
        for r in caplog.records
    )
