"""SCRAM-SHA-256/512 as MQTT 5 enhanced authentication: the RFC 7677 example, then full exchanges
against the broker state machine (fake clock, fake links) with a SCRAM client written from
RFC 5802, the failures, re-authentication, and the identity SCRAM establishes feeding the ACL."""

from __future__ import annotations

import base64
import hashlib
import sys
from typing import Any

import pytest
from support.harness import Client, Harness, Prop, pk
from support.password_files import ITERATIONS, mosquitto_pbkdf2_line
from support.scram_client import ScramClient

from mqttbroker.broker.auth import CONTINUE, FAIL, SUCCESS
from mqttbroker.security import AclAuthorizer, AclRules, FileAuthenticator, PasswordFile
from mqttbroker.security.passwords import ScramCredential, make_entry_line
from mqttbroker.security.scram import ScramExchange

MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]


# -- RFC 7677 section 3 -----------------------------------------------------------------------


def test_rfc_7677_example() -> None:
    """The exchange printed in RFC 7677 (user "user", password "pencil"), byte for byte."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = ScramCredential.derive("SCRAM-SHA-256", b"pencil", 4096, salt=salt)

    def lookup(user: str, mechanism: str) -> ScramCredential | None:
        return cred if (user, mechanism) == ("user", "SCRAM-SHA-256") else None

    exchange = ScramExchange(
        "SCRAM-SHA-256", lookup, b"k" * 32, "c", nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    first = exchange.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first.status == CONTINUE
    assert first.data == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = exchange.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final.status == SUCCESS
    assert final.data == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert final.username == "user"
    assert exchange.step(b"more").status == FAIL  # the exchange is over


# -- against the broker -----------------------------------------------------------------------

ACL = """
user alice
topic readwrite alice/#
user o=dd,name
topic readwrite odd/#
"""


def password_file() -> PasswordFile:
    lines = [
        make_entry_line("alice", b"alice-pw", ITERATIONS),
        make_entry_line("o=dd,name", b"odd-pw", ITERATIONS),
        mosquitto_pbkdf2_line("roger", b"roger-pw"),
    ]
    return PasswordFile.parse("\n".join(lines).encode(), "pw.txt")


@pytest.fixture
def h() -> Any:
    harness = Harness()
    harness.broker.authenticator = FileAuthenticator(password_file(), allow_anonymous=False)
    harness.broker.authorizer = AclAuthorizer(AclRules.parse(ACL.encode(), "acl.txt"))
    yield harness
    harness.check_no_write_after_close()


def auth_packet(method: str, data: bytes, code: int = 0x18) -> pk.Auth:
    return pk.Auth(code, {Prop.AUTHENTICATION_METHOD: method, Prop.AUTHENTICATION_DATA: data})


def start(
    h: Harness, scram: ScramClient, method: str, username: str | None = None
) -> tuple[Client, pk.Auth]:
    """CONNECT with the client-first-message; returns the client and the server's AUTH."""
    client = h.client()
    props = {Prop.AUTHENTICATION_METHOD: method, Prop.AUTHENTICATION_DATA: scram.first()}
    client.send(pk.Connect(client_id="scram-client", username=username, properties=props))
    challenge = client.one(pk.Auth)
    assert challenge.reason_code == 0x18
    assert challenge.properties[Prop.AUTHENTICATION_METHOD] == method
    return client, challenge


@pytest.mark.parametrize("method", MECHANISMS)
def test_full_exchange_then_connack(h: Harness, method: str) -> None:
    scram = ScramClient(method, "alice", b"alice-pw")
    client, challenge = start(h, scram, method)
    server_first = challenge.properties[Prop.AUTHENTICATION_DATA]
    assert f"i={ITERATIONS}".encode() in server_first
    client.send(auth_packet(method, scram.final(server_first)))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0
    assert connack.properties[Prop.AUTHENTICATION_METHOD] == method
    assert scram.verify_server(connack.properties[Prop.AUTHENTICATION_DATA])  # mutual
    assert client.conn.username == "alice"
    assert client.session.username == "alice"
    # The identity SCRAM established is the one the ACL sees.
    assert client.subscribe("alice/#")[0].reason_codes == [0]
    assert client.subscribe("bob/#")[0].reason_codes == [0x87]


def test_user_name_with_escaped_characters(h: Harness) -> None:
    scram = ScramClient("SCRAM-SHA-256", "o=dd,name", b"odd-pw")
    assert b"n=o=3Ddd=2Cname," in scram.first()
    client, challenge = start(h, scram, "SCRAM-SHA-256")
    client.send(
        auth_packet("SCRAM-SHA-256", scram.final(challenge.properties[Prop.AUTHENTICATION_DATA]))
    )
    assert client.one(pk.Connack).reason_code == 0
    assert client.conn.username == "o=dd,name"


@pytest.mark.parametrize("method", MECHANISMS)
def test_wrong_password_is_refused_with_0x86(h: Harness, method: str) -> None:
    scram = ScramClient(method, "alice", b"not-alice-pw")
    client, challenge = start(h, scram, method)
    client.send(auth_packet(method, scram.final(challenge.properties[Prop.AUTHENTICATION_DATA])))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x86
    assert Prop.AUTHENTICATION_DATA not in connack.properties
    assert client.closed


def test_tampered_proof_is_refused(h: Harness) -> None:
    scram = ScramClient("SCRAM-SHA-512", "alice", b"alice-pw")
    client, challenge = start(h, scram, "SCRAM-SHA-512")
    data = challenge.properties[Prop.AUTHENTICATION_DATA]
    client.send(auth_packet("SCRAM-SHA-512", scram.final(data, tamper_proof=True)))
    assert client.one(pk.Connack).reason_code == 0x86


def test_unknown_user_gets_a_plausible_challenge_then_0x86(h: Harness) -> None:
    """The server-first-message of an unknown user looks like a real one and is the same each
    time (no hint that the user does not exist); the proof then fails."""
    challenges = []
    for _ in range(2):
        scram = ScramClient("SCRAM-SHA-256", "mallory", b"guess")
        client, challenge = start(h, scram, "SCRAM-SHA-256")
        server_first = challenge.properties[Prop.AUTHENTICATION_DATA]
        challenges.append(dict(p.split("=", 1) for p in server_first.decode().split(",")))
        client.send(auth_packet("SCRAM-SHA-256", scram.final(server_first)))
        assert client.one(pk.Connack).reason_code == 0x86
    assert challenges[0]["s"] == challenges[1]["s"]
    assert len(base64.b64decode(challenges[0]["s"])) == 16
    assert challenges[0]["r"] != challenges[1]["r"]  # fresh nonces


def test_mosquitto_entry_cannot_use_scram_but_can_use_its_password(h: Harness) -> None:
    scram = ScramClient("SCRAM-SHA-512", "roger", b"roger-pw")
    client, challenge = start(h, scram, "SCRAM-SHA-512")
    client.send(
        auth_packet("SCRAM-SHA-512", scram.final(challenge.properties[Prop.AUTHENTICATION_DATA]))
    )
    assert client.one(pk.Connack).reason_code == 0x86
    plain = h.client()
    plain.send(pk.Connect(client_id="plain", username="roger", password=b"roger-pw"))
    assert plain.one(pk.Connack).reason_code == 0


def test_connect_user_name_must_match_the_scram_user(h: Harness) -> None:
    scram = ScramClient("SCRAM-SHA-256", "alice", b"alice-pw")
    client = h.client()
    props = {Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-256", Prop.AUTHENTICATION_DATA: scram.first()}
    client.send(pk.Connect(client_id="x", username="bob", properties=props))
    assert client.one(pk.Connack).reason_code == 0x86
    # The same user name in CONNECT is fine.
    client, _ = start(
        h, ScramClient("SCRAM-SHA-256", "alice", b"alice-pw"), "SCRAM-SHA-256", "alice"
    )
    assert not client.closed


@pytest.mark.parametrize(
    "first",
    [
        None,  # no Authentication Data in CONNECT
        b"p=tls-unique,,n=alice,r=abc",  # channel binding
        b"n,,m=ext,n=alice,r=abc",  # mandatory extension
        b"n,a=bob,n=alice,r=abc",  # another authorization identity
        b"n,,n=al=ice,r=abc",  # bad escape
        b"n,,r=abc,n=alice",  # wrong order
        b"n,,n=alice",  # no nonce
        b"x,,n=alice,r=abc",
        b"\xff\xfe",
    ],
)
def test_malformed_client_first_is_refused(h: Harness, first: bytes | None) -> None:
    client = h.client()
    props: dict[int, Any] = {Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-256"}
    if first is not None:
        props[Prop.AUTHENTICATION_DATA] = first
    client.send(pk.Connect(client_id="x", properties=props))
    assert client.one(pk.Connack).reason_code == 0x86
    assert client.closed


def test_client_first_with_authzid_equal_to_user_is_accepted(h: Harness) -> None:
    scram = ScramClient("SCRAM-SHA-256", "alice", b"alice-pw")
    scram.gs2_header = "n,a=alice,"
    client, challenge = start(h, scram, "SCRAM-SHA-256")
    client.send(
        auth_packet("SCRAM-SHA-256", scram.final(challenge.properties[Prop.AUTHENTICATION_DATA]))
    )
    assert client.one(pk.Connack).reason_code == 0


@pytest.mark.parametrize(
    "mangle",
    [
        lambda m: m.replace(b"c=biws", b"c=eSws"),  # channel binding data differs ("y,,")
        lambda m: m.replace(b",r=", b",r=X"),  # nonce changed
        lambda m: m.split(b",p=")[0],  # no proof
        lambda m: m.split(b",p=")[0] + b",p=AAAA",  # proof of the wrong length
        lambda m: m.replace(b",p=", b",p=*"),  # proof not base64
    ],
)
def test_malformed_client_final_is_refused(h: Harness, mangle: Any) -> None:
    scram = ScramClient("SCRAM-SHA-256", "alice", b"alice-pw")
    client, challenge = start(h, scram, "SCRAM-SHA-256")
    final = scram.final(challenge.properties[Prop.AUTHENTICATION_DATA])
    client.send(auth_packet("SCRAM-SHA-256", mangle(final)))
    assert client.one(pk.Connack).reason_code == 0x86


def test_other_methods_are_not_supported(h: Harness) -> None:
    client = h.client()
    client.send(pk.Connect(client_id="x", properties={Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}))
    assert client.one(pk.Connack).reason_code == 0x8C


def test_no_password_file_means_no_scram() -> None:
    harness = Harness()
    harness.broker.authenticator = FileAuthenticator(None, allow_anonymous=True)
    client = harness.client()
    scram = ScramClient("SCRAM-SHA-256", "alice", b"alice-pw")
    props = {Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-256", Prop.AUTHENTICATION_DATA: scram.first()}
    client.send(pk.Connect(client_id="x", properties=props))
    assert client.one(pk.Connack).reason_code == 0x8C


@pytest.mark.parametrize("good", [True, False])
def test_re_authentication(h: Harness, good: bool) -> None:
    """AUTH 0x19 starts a new exchange on the connection; success ends with AUTH 0x00 and the
    server signature, failure with DISCONNECT."""
    method = "SCRAM-SHA-512"
    scram = ScramClient(method, "alice", b"alice-pw")
    client, challenge = start(h, scram, method)
    client.send(auth_packet(method, scram.final(challenge.properties[Prop.AUTHENTICATION_DATA])))
    assert client.one(pk.Connack).reason_code == 0
    again = ScramClient(method, "alice", b"alice-pw" if good else b"wrong")
    client.send(auth_packet(method, again.first(), code=0x19))
    challenge = client.one(pk.Auth)
    assert challenge.reason_code == 0x18
    client.send(auth_packet(method, again.final(challenge.properties[Prop.AUTHENTICATION_DATA])))
    if good:
        done = client.one(pk.Auth)
        assert done.reason_code == 0
        assert again.verify_server(done.properties[Prop.AUTHENTICATION_DATA])
        assert not client.closed
    else:
        assert client.one(pk.Disconnect).reason_code == 0x87
        assert client.closed


def test_password_login_and_scram_share_the_store(h: Harness) -> None:
    plain = h.client()
    plain.send(pk.Connect(client_id="p1", username="alice", password=b"alice-pw"))
    assert plain.one(pk.Connack).reason_code == 0
    wrong = h.client()
    wrong.send(pk.Connect(client_id="p2", username="alice", password=b"nope"))
    assert wrong.one(pk.Connack).reason_code == 0x86
    anonymous = h.client()
    anonymous.send(pk.Connect(client_id="p3"))
    assert anonymous.one(pk.Connack).reason_code == 0x87


def test_the_server_derives_no_key_during_scram(h: Harness, monkeypatch: Any) -> None:
    """SCRAM runs on the event loop: the server side must never run PBKDF2 (the client derives
    the key), for a known user, a wrong proof, or an unknown user's made-up answer."""
    real = hashlib.pbkdf2_hmac

    def guarded(*args: Any, **kwargs: Any) -> bytes:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        assert not caller.startswith("mqttbroker"), f"{caller} derived a key"
        return real(*args, **kwargs)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", guarded)
    for user, password, expected in (
        ("alice", b"alice-pw", 0),
        ("alice", b"wrong", 0x86),
        ("mallory", b"guess", 0x86),
    ):
        scram = ScramClient("SCRAM-SHA-512", user, password)
        client, challenge = start(h, scram, "SCRAM-SHA-512")
        final = scram.final(challenge.properties[Prop.AUTHENTICATION_DATA])
        client.send(auth_packet("SCRAM-SHA-512", final))
        assert client.one(pk.Connack).reason_code == expected, user
