"""A session belongs to the identity that created it; for a client certificate (mutual TLS with
tls_certificate_username) that is the certificate's name, whatever user name CONNECT claims."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk


def _connect(h: Harness, client_id: str, certificate: str | None, claimed: str | None) -> Any:
    client = h.client(peer=f"peer-{certificate}", certificate_user=certificate)
    client.send(
        pk.Connect(
            client_id=client_id,
            clean_start=False,
            username=claimed,
            properties={Prop.SESSION_EXPIRY_INTERVAL: 60},
        )
    )
    (connack,) = client.receive(limit=1)
    assert isinstance(connack, pk.Connack)
    return client, connack


def test_certificate_name_owns_the_session(h: Harness) -> None:
    alice, ack = _connect(h, "meter-1", "alice", None)
    assert ack.reason_code == 0 and alice.session.username == "alice"
    alice.lose()
    _, ack = _connect(h, "meter-1", "bob", "alice")  # bob's certificate, alice's name claimed
    assert (ack.reason_code, ack.session_present) == (0x87, False)
    _, ack = _connect(h, "meter-1", "alice", None)
    assert (ack.reason_code, ack.session_present) == (0, True)
