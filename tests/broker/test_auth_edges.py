"""Enhanced authentication and password checks at their edges: what the authenticator is told,
and the reason a refused client reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.harness import METHOD, Harness, Offload, Prop, ToyAuthenticator, ToyExchange, pk


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
    client.send(
        pk.Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"})
    )
    assert client.one(pk.Connack).reason_code == 0
    return client


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
