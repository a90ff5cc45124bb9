"""More session edges: a per-user cap met by taking over another user's client id, reserved
client ids refused with a reason, a will without delay leaving the store, sticky shared
publishers kept when another member leaves, and a fresh broker's counters."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import Harness, Prop, pk

PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}


def connect_as(h: Harness, client_id: str, username: str | None) -> pk.Connack:
    client = h.client()
    client.send(pk.Connect(client_id=client_id, username=username, properties=PERSISTENT))
    connack: pk.Connack = client.receive()[0]
    client.lose()
    return connack


def test_taking_over_another_users_client_id_counts_for_the_cap(make_harness: Any) -> None:
    """session_owner_mismatch "new": bob taking alice's client id gets a new session, which
    counts against bob's max_sessions_per_user (the one it replaces was alice's)."""
    h: Harness = make_harness(max_sessions_per_user=1, session_owner_mismatch="new")
    assert connect_as(h, "x", "alice").reason_code == 0
    assert connect_as(h, "b1", "bob").reason_code == 0
    assert connect_as(h, "x", "bob").reason_code == 0x97
    assert h.broker.sessions["x"].username == "alice"


@pytest.mark.parametrize("client_id", ["$bridge/x", "$webhook/y"])
def test_reserved_client_id_says_why(h: Harness, client_id: str) -> None:
    client = h.client()
    client.send(pk.Connect(client_id=client_id))
    connack = client.one(pk.Connack)
    assert connack.properties[Prop.REASON_STRING] == f"client identifier {client_id!r} is reserved"


def test_fresh_broker_counters(h: Harness) -> None:
    broker = h.broker
    assert (broker.bytes_sent, broker.bytes_received, broker.received, broker.denied) == (
        0,
        0,
        0,
        0,
    )
