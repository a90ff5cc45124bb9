"""Enhanced authentication (section 4.12), password checks, redirection and Response Information,
through the Authenticator interface with a toy challenge/response method."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import METHOD, Harness, Offload, Prop, ToyAuthenticator, pk

from mqttbroker.broker.auth import SUCCESS, AuthOutcome


@pytest.fixture
def ha(make_harness: Any) -> Harness:
    harness: Harness = make_harness()
    harness.broker.authenticator = ToyAuthenticator()
    return harness


def connect_with_method(h: Harness, method: str = METHOD, data: bytes | None = None) -> Any:
    client = h.client()
    props: dict[int, Any] = {Prop.AUTHENTICATION_METHOD: method}
    if data is not None:
        props[Prop.AUTHENTICATION_DATA] = data
    client.send(pk.Connect(client_id="toy", properties=props))
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


def test_challenge_response_then_connack(ha: Harness) -> None:
    """[MQTT-4.12.0-2] [MQTT-4.12.0-5] The server's AUTH continues with 0x18; every AUTH and the
    successful CONNACK carry the method named in CONNECT."""
    client = connect_with_method(ha)
    auth = client.one(pk.Auth)
    assert auth.reason_code == 0x18
    assert auth.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    assert auth.properties[Prop.AUTHENTICATION_DATA] == b"nonce"
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
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


def test_re_authentication(ha: Harness) -> None:
    """[MQTT-4.12.1-1] Re-authentication (AUTH 0x19) uses the original method; it ends with
    AUTH 0x00 on success."""
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    client.one(pk.Connack)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Auth).reason_code == 0x18
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    done = client.one(pk.Auth)
    assert done.reason_code == 0
    assert done.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    assert not client.closed


def test_failed_re_authentication_disconnects(ha: Harness) -> None:
    """[MQTT-4.12.1-2] A failed re-authentication ends with DISCONNECT and a closed connection."""
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    client.one(pk.Connack)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"bad"})
    )
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x87  # 0x86 is no DISCONNECT code: Not authorized
    assert client.closed


def test_re_authentication_with_another_method_is_refused(ha: Harness) -> None:
    client = connect_with_method(ha)
    client.one(pk.Auth)
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    client.one(pk.Connack)
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
def test_password_refused(
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
    offload = Offload()
    ha.broker.offload = offload
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
    offload = Offload()
    ha.broker.offload = offload
    client = ha.client()
    client.send(
        pk.Connect(client_id="bad", username="alice", password=b"wrong"),
        pk.Subscribe(1, [pk.SubscriptionRequest("a/b")]),
    )
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0x86
    assert client.closed


def test_connection_lost_during_the_check(ha: Harness) -> None:
    offload = Offload()
    ha.broker.offload = offload
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
