"""``client_id_pattern``: a client id must match the pattern, "%u" standing for the user name
and "*" for any characters; anonymous clients cannot match a pattern with "%u"; a client id
the server assigned is not checked."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import Harness, Prop, pk


def connack(h: Harness, client_id: str, username: str | None) -> pk.Connack:
    client = h.client()
    client.send(pk.Connect(client_id=client_id, username=username))
    reply: pk.Connack = client.one(pk.Connack)
    return reply


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
